"""Splitwise on the compiled engine against the Python engine: identical results.

Splitwise is the first policy that acts on control ticks there: every Δt one Mixed-pool worker
moves between prefill and decode (``MoveWorker``: a prefill worker's queue routed again and its
batch finished before it admits decode work; a decode worker's admission queue routed again over
the links and its running requests drained before it prefills). The compiled engine reproduces
the moves, the policy's rule (its routing history and pending tokens) and everything after them
bit for bit: requests, event log (``pool_move`` rows included), time series (each row's pool and
role) and the workers frame (pools and roles at the end).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, LinkSpec, Role, WorkerSpec
from pdopt.errors import ConfigError
from pdopt.policies import disagg, make_policy
from pdopt.policies.disagg import Splitwise
from pdopt.sim import ClosedLoop, simulate
from pdopt.sim._simulate import _compiled_codes
from pdopt.testing.strategies import kv_allocations, small_workloads, worker_limits
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import (
    COST,
    MOE_COST,
    SLO,
    WINDOW,
    check_both_engines,
    client_timeouts,
    hypothesis_event,
    note_aborts,
)

# no_fallback is armed and disarmed around each compiled run, so sharing it across examples is safe
HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@st.composite
def mixed_pool_clusters(draw):
    """1–3 prefill and 1–3 decode workers (mostly 2), each in the Mixed pool or not (at least
    one is), a dense or an MoE decode, one of three links and sometimes a slower pair link,
    sometimes a decode worker with half the KV; preempted requests re-queued at the front or the
    back; sometimes a sliding-window model's KV; the workers' KV allocated on demand or
    reserved at admission (:func:`pdopt.testing.strategies.kv_allocations`)."""
    limits = draw(worker_limits())
    cost = draw(st.sampled_from([COST, MOE_COST]))
    sizes = st.sampled_from([1, 2, 2, 3])  # a member moves only from a role with two workers
    n_p, n_d = draw(sizes), draw(sizes)
    roles = [Role.PREFILL] * n_p + [Role.DECODE] * n_d
    mixed = draw(st.lists(st.booleans(), min_size=n_p + n_d, max_size=n_p + n_d))
    if not any(mixed):
        mixed[draw(st.integers(0, n_p + n_d - 1))] = True
    workers = [
        WorkerSpec(f"w{i}", role, cost, pool="mixed" if m else str(role), **limits)
        for i, (role, m) in enumerate(zip(roles, mixed, strict=True))
    ]
    if n_d > 1 and draw(st.booleans()):
        small = max(1, limits["kv_capacity_blocks"] // 2)
        last = workers[-1]
        workers[-1] = WorkerSpec(
            last.name, Role.DECODE, cost, pool=last.pool, **{**limits, "kv_capacity_blocks": small}
        )
    link = draw(st.sampled_from([LinkSpec.nvlink(), LinkSpec.ethernet(10), LinkSpec.kv_pool()]))
    pairs = (("w0", workers[-1].name, LinkSpec.ethernet(10)),) if draw(st.booleans()) else ()
    return ClusterSpec(
        draw(kv_allocations(workers)),
        kv_bytes_per_token=2e5,
        link=link,
        pair_links=pairs,
        preempted_requeue=draw(st.sampled_from(["front", "back"])),
        sliding_window=draw(st.sampled_from([None, None, WINDOW])),
    )


@st.composite
def splitwise_flags(draw):
    """Thresholds low enough that workers move often (and high ones), Δt of 1–4 ticks."""
    return {
        "prefill_threshold_tokens": draw(st.sampled_from([50.0, 200.0, 800.0, 8192.0])),
        "decode_threshold_tokens": draw(st.sampled_from([50.0, 300.0, 1000.0, 16384.0])),
        "delta_t_s": draw(st.sampled_from([0.005, 0.01, 0.02, 0.05])),
    }


def run(driver, cluster, flags, record_timeseries, tick_s, engine, timeout=None):
    return simulate(
        driver,
        cluster,
        make_policy("splitwise", **flags),
        slo=SLO,
        record_timeseries=record_timeseries,
        tick_s=tick_s,
        engine=engine,
        client_timeout_s=timeout,
    )


def check(driver, cluster, flags, record, tick_s, no_fallback, timeout=None):
    """Both engines identical, or refusing alike (:func:`check_both_engines`); the Python
    engine's result (None on a refusal). ``timeout``: the clients' (None: they wait)."""
    python = check_both_engines(
        lambda engine: run(driver, cluster, flags, record, tick_s, engine, timeout), no_fallback
    )
    if python is not None:
        moves = int((python.events["kind"] == "pool_move").sum())
        hypothesis_event(
            f"pool moves: {'none' if not moves else '1-5' if moves <= 5 else 'over 5'}"
        )
    return python


@settings(max_examples=150, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    mixed_pool_clusters(),
    splitwise_flags(),
    st.sampled_from([None, 0.005, 0.01, 0.05]),
    client_timeouts(),
)
def test_compiled_splitwise_matches_python_engine(
    no_fallback, workload, cluster, flags, tick_s, timeout
):
    """Without a time series (the policy's ticks still run), and with one every ``tick_s``;
    with and without client timeouts (requests withdrawn from workers that move)."""
    record = tick_s is not None
    python = check(workload, cluster, flags, record, tick_s or 0.01, no_fallback, timeout)
    if python is not None:
        note_aborts(python)


@settings(max_examples=50, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    mixed_pool_clusters(),
    splitwise_flags(),
    st.integers(1, 6),
    st.sampled_from([0.0, 0.02]),
    client_timeouts(),
)
def test_compiled_splitwise_matches_in_a_closed_loop(
    no_fallback, workload, cluster, flags, clients, think_s, timeout
):
    driver = ClosedLoop(clients, think_s, workload, 3 * len(workload), start_spread_s=0.1)
    check(driver, cluster, flags, True, 0.01, no_fallback, timeout)


def _overload_cluster(requeue, cost, kv_blocks=120):
    lim = {"kv_capacity_blocks": kv_blocks, "max_running": 24}
    workers = (
        WorkerSpec("p0", Role.PREFILL, cost, **lim),
        WorkerSpec("m0", Role.PREFILL, cost, pool="mixed", **lim),
        WorkerSpec("m1", Role.DECODE, cost, pool="mixed", **lim),
        WorkerSpec("m2", Role.DECODE, cost, pool="mixed", **lim),
        WorkerSpec("d0", Role.DECODE, cost, **lim),
    )
    return ClusterSpec(workers, kv_bytes_per_token=2e5, preempted_requeue=requeue)


@pytest.mark.parametrize("cost", [COST, MOE_COST], ids=["dense", "moe"])
@pytest.mark.parametrize("requeue", ["front", "back"])
@pytest.mark.parametrize("record", [False, True], ids=["no_ts", "ts"])
def test_compiled_splitwise_matches_under_overload(cost, requeue, record, no_fallback):
    """A bursty overload with a three-worker Mixed pool: workers move both ways hundreds of
    times, with preemptions and false OOMs."""
    rng = np.random.default_rng(7)
    n = 2000
    workload = Workload(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(16, 600, n), rng.integers(2, 300, n)
    )
    flags = {"prefill_threshold_tokens": 2000.0, "decode_threshold_tokens": 3000.0}
    python = check(workload, _overload_cluster(requeue, cost), flags, record, 0.01, no_fallback)
    assert python is not None
    moves = python.events[python.events["kind"] == "pool_move"]
    assert len(moves) > 100
    assert moves["detail"].str.startswith("prefill->decode").any()
    assert moves["detail"].str.startswith("decode->prefill").any()
    assert moves["detail"].str.endswith("pool=mixed").any()
    assert python.requests["preemptions"].sum() > 0
    assert (python.events["kind"] == "false_oom").any()
    if record:
        assert set(python.timeseries[python.timeseries["worker"] == "m0"]["role"]) == {
            "prefill",
            "decode",
        }


@pytest.mark.parametrize("history", [1, 5])
def test_a_short_routing_history_wraps_the_same(history, monkeypatch, no_fallback):
    """The pending prompt tokens read at most the history the policy keeps (its deque's maxlen;
    the compiled ring of that length): a short one, so the ring wraps."""
    monkeypatch.setattr(disagg, "_HISTORY", history)
    rng = np.random.default_rng(11)
    n = 600
    workload = Workload(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(16, 600, n), rng.integers(2, 100, n)
    )
    flags = {"prefill_threshold_tokens": 300.0, "decode_threshold_tokens": 3000.0}
    python = check(workload, _overload_cluster("back", COST), flags, True, 0.01, no_fallback)
    assert python is not None
    assert (python.events["kind"] == "pool_move").sum() > 10


def test_splitwise_runs_compiled_and_other_tick_policies_do_not():
    cluster = _overload_cluster("front", COST)
    codes = _compiled_codes("compiled", Splitwise(), Splitwise().traits(), cluster, 10)
    assert codes is not None and codes[2] == 1
    assert codes[3] == (8192.0, 16384.0, 0.05, 8192.0)
    mixed = ClusterSpec.build(COST, 0, 0, 3)
    policy = make_policy("arrow", colocated=False)
    with pytest.raises(ConfigError, match="engine='compiled' cannot run"):
        _compiled_codes("compiled", policy, policy.traits(), mixed, 10)


def test_a_splitwise_subclass_with_its_own_rule_has_no_compiled_twin():
    class Eager(Splitwise):
        def pending_decode_tokens(self, view):
            return 0.0

    class Renamed(Splitwise):
        name = "renamed"

    assert Splitwise().traits().compiled_routing == ("splitwise", "least_loaded")
    assert Renamed().compiled_tick() is not None
    assert Eager().traits().compiled_routing is None
    assert Eager().compiled_tick() is None
