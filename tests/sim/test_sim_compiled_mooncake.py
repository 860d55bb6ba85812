"""Mooncake on the compiled engine against the Python engine: identical results.

Mooncake routes transfer-aware over the cluster's links: prefill to the worker whose KV would
reach a decode worker first (queued work over P_peak, its TTFT predictor and the FIFO link after
the transfers the policy has put on it), decode among the workers within the TPOT SLO by earliest
arrival (ties: least loaded). Its compiled twin (pdopt.sim._compiled._mooncake) keeps the
policy's own mirror of the links, so requests, events, time series and workers frames match bit
for bit on random disaggregated clusters with a pool link or a plain one, both values of
``transfer_aware``, open and closed loop, dense and MoE decode models.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, LinkSpec, Role, WorkerSpec
from pdopt.costmodel import TtftModel
from pdopt.model_spec import SlidingWindow
from pdopt.policies import make_policy
from pdopt.policies.mooncake import Mooncake
from pdopt.sim import ClosedLoop, simulate
from pdopt.sim._simulate import _compiled_codes
from pdopt.testing.strategies import kv_allocations, small_workloads, worker_limits
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import (
    COST,
    MOE_COST,
    SLO,
    check_both_engines,
    hypothesis_event,
)

# no_fallback is armed and disarmed around each compiled run, so sharing it across examples is safe
HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
WINDOW = SlidingWindow(128, 18, 36)  # gpt-oss-120b: 18 of 36 layers keep a 128-token window
POOL = LinkSpec.kv_pool(LinkSpec.ethernet(10))
# a prefill worker with a fitted TTFT predictor of its own (the others: the batch-of-one form),
# and one with half the peak FLOP/s
FITTED = dataclasses.replace(COST, ttft=TtftModel(3e-8, 2e-5, 0.004))
SLOW = dataclasses.replace(
    COST, prefill=dataclasses.replace(COST.prefill, p_peak_flops=COST.prefill.p_peak_flops / 2)
)


@st.composite
def disaggregated_clusters(draw):
    """1–3 prefill workers (their TTFT predictors differ) and 1–3 decode workers, a pool link
    (over 10 GbE or 100 GbE) or a plain one, sometimes a slower pair link and a decode worker
    with half the KV, sometimes a sliding window; preempted requests re-queued at the front or
    the back; the workers' KV allocated on demand or reserved at admission
    (:func:`pdopt.testing.strategies.kv_allocations`)."""
    limits = draw(worker_limits(min_kv_blocks=12))  # most prompts fit, a few are rejected
    n_p, n_d = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    roles = [Role.PREFILL] * n_p + [Role.DECODE] * n_d
    costs = [draw(st.sampled_from([COST, COST, FITTED, SLOW])) for _ in range(n_p)]
    costs += [draw(st.sampled_from([COST, COST, MOE_COST]))] * n_d  # an MoE decode model too
    workers = [
        WorkerSpec(f"w{i}", role, cost, **limits)
        for i, (role, cost) in enumerate(zip(roles, costs, strict=True))
    ]
    if n_d > 1 and draw(st.booleans()):
        small = max(1, limits["kv_capacity_blocks"] // 2)
        workers[-1] = WorkerSpec(
            workers[-1].name, Role.DECODE, COST, **{**limits, "kv_capacity_blocks": small}
        )
    link = draw(
        st.sampled_from(
            [
                POOL,
                LinkSpec.kv_pool(),
                LinkSpec.ethernet(10),
                LinkSpec.ethernet(1),
                LinkSpec.nvlink(),
            ]
        )
    )
    pairs = (("w0", workers[-1].name, LinkSpec.ethernet(1)),) if draw(st.booleans()) else ()
    return ClusterSpec(
        draw(kv_allocations(workers)),
        kv_bytes_per_token=draw(st.sampled_from([2e4, 2e5, 1e6])),
        link=link,
        pair_links=pairs,
        preempted_requeue=draw(st.sampled_from(["front", "back"])),
        sliding_window=draw(st.sampled_from([None, None, WINDOW])),
    )


@st.composite
def mooncake_flags(draw):
    """Both values of transfer_aware; the run's TPOT SLO or a tight one that leaves few or no
    decode workers within it (COST's iteration is 10 ms plus 0.1 ms a request)."""
    return {
        "transfer_aware": draw(st.booleans()),
        "tpot_slo_s": draw(st.sampled_from([None, 0.0101, 0.0105, 0.011, 0.02])),
    }


def run(driver, cluster, flags, record_timeseries, tick_s, engine):
    return simulate(
        driver,
        cluster,
        make_policy("mooncake", **flags),
        slo=SLO,
        record_timeseries=record_timeseries,
        tick_s=tick_s,
        engine=engine,
    )


def check(driver, cluster, flags, record, tick_s, no_fallback):
    """Both engines identical, or refusing alike (:func:`check_both_engines`); the Python
    engine's result (None on a refusal)."""
    python = check_both_engines(
        lambda engine: run(driver, cluster, flags, record, tick_s, engine), no_fallback
    )
    if python is not None:
        transfers = python.requests["transfer_end_s"] - python.requests["transfer_start_s"]
        hypothesis_event(f"transfers: {'none' if not (transfers > 0).any() else 'some'}")
    return python


@settings(max_examples=150, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    disaggregated_clusters(),
    mooncake_flags(),
    st.sampled_from([None, 0.005, 0.01, 0.05]),
)
def test_compiled_mooncake_matches_python_engine(no_fallback, workload, cluster, flags, tick_s):
    """Without a time series, and with one every ``tick_s``."""
    record = tick_s is not None
    check(workload, cluster, flags, record, tick_s or 0.01, no_fallback)


@settings(max_examples=50, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    disaggregated_clusters(),
    mooncake_flags(),
    st.integers(1, 6),
    st.sampled_from([0.0, 0.02]),
)
def test_compiled_mooncake_matches_in_a_closed_loop(
    no_fallback, workload, cluster, flags, clients, think_s
):
    driver = ClosedLoop(clients, think_s, workload, 3 * len(workload), start_spread_s=0.1)
    check(driver, cluster, flags, True, 0.01, no_fallback)


def _pool_cluster(requeue, window=None, link=POOL):
    """Three prefill and three decode workers over a KV pool, one decode worker with less KV,
    one prefill worker with a pair link of its own."""
    lim = {"kv_capacity_blocks": 150, "max_running": 24}
    workers = (
        WorkerSpec("p0", Role.PREFILL, COST, **lim),
        WorkerSpec("p1", Role.PREFILL, FITTED, **lim),
        WorkerSpec("p2", Role.PREFILL, SLOW, **lim),
        WorkerSpec("d0", Role.DECODE, COST, **lim),
        WorkerSpec("d1", Role.DECODE, COST, **lim),
        WorkerSpec("d2", Role.DECODE, COST, **{**lim, "kv_capacity_blocks": 90}),
    )
    return ClusterSpec(
        workers,
        kv_bytes_per_token=2e5,
        link=link,
        pair_links=(("p2", "d0", LinkSpec.ethernet(1)),),
        preempted_requeue=requeue,
        sliding_window=window,
    )


@pytest.mark.parametrize("link", [POOL, LinkSpec.ethernet(10)], ids=["pool", "plain"])
@pytest.mark.parametrize("window", [None, WINDOW], ids=["full", "window"])
@pytest.mark.parametrize("aware", [True, False], ids=["aware", "blind"])
@pytest.mark.parametrize("record", [False, True], ids=["no_ts", "ts"])
def test_compiled_mooncake_matches_under_overload(link, window, aware, record, no_fallback):
    """A bursty overload: links queue, decode workers leave the TPOT SLO, requests are
    preempted and re-prefilled (their second transfer on the policy's mirror too)."""
    rng = np.random.default_rng(5)
    n = 1500
    workload = Workload(
        np.cumsum(rng.exponential(0.003, n)), rng.integers(16, 600, n), rng.integers(1, 300, n)
    )
    flags = {"transfer_aware": aware, "tpot_slo_s": 0.0115}
    python = check(workload, _pool_cluster("back", window, link), flags, record, 0.01, no_fallback)
    assert python is not None
    assert python.requests["preemptions"].sum() > 0
    assert python.requests["decode_worker"].nunique() >= 3  # every decode worker is used


def test_mooncake_runs_compiled_with_its_constants_and_an_moe_decode(no_fallback):
    """Its twin's codes; an MoE decode model runs compiled too (the TPOT check's expert term is
    a float power, the C library's pow in both engines), identically under overload."""
    cluster = _pool_cluster("front")
    policy = Mooncake(tpot_slo_s=0.02)
    codes = _compiled_codes("compiled", policy, policy.traits(), cluster, 10)
    assert codes is not None and codes[:3] == (6, 5, 0)
    blind = Mooncake(transfer_aware=False)
    assert blind.traits().compiled_routing == ("mooncake_ttft", "mooncake_load")
    moe = ClusterSpec(
        tuple(
            WorkerSpec(w.name, w.role, MOE_COST, kv_capacity_blocks=150) for w in cluster.workers
        ),
        kv_bytes_per_token=2e5,
        link=POOL,
    )
    assert _compiled_codes("compiled", policy, policy.traits(), moe, 10) is not None
    rng = np.random.default_rng(3)
    n = 1500
    workload = Workload(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(16, 600, n), rng.integers(2, 300, n)
    )
    for flags in ({"tpot_slo_s": 0.02}, {"tpot_slo_s": 0.012, "transfer_aware": False}):
        python = check(workload, moe, flags, False, 0.01, no_fallback)
        assert python is not None


def test_compiled_params_are_the_policys_predictors_once_started():
    """The twin's TPOT SLO and TTFT predictors are the policy's own, read after ``start``
    (the run's SLO when the policy has none)."""
    cluster = _pool_cluster("front")
    policy = Mooncake()
    assert policy.compiled_params() == ()
    workload = Workload([0.0, 0.01], [100, 200], [5, 5])
    simulate(workload, cluster, policy, slo=SLO, engine="compiled")
    params = policy.compiled_params()
    assert params[0] == SLO.tpot_s
    ttft = policy._m.ttft
    assert params[1:4] == (ttft[0].a_s_per_token2, ttft[0].b_s_per_token, ttft[0].c_s)
    assert len(params) == 1 + 3 * len(cluster.workers)


def test_a_mooncake_subclass_with_its_own_rule_has_no_compiled_twin():
    class Instant(Mooncake):
        def _put_on_wire(self, src, dst, now_s, tokens):
            return None

    class Renamed(Mooncake):
        name = "renamed"

    assert Mooncake().traits().compiled_routing == ("mooncake", "mooncake")
    assert Renamed().traits().compiled_routing == ("mooncake", "mooncake")
    assert Instant().traits().compiled_routing is None
