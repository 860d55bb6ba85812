"""The compiled engine against the Python engine: identical results, or the same error.

The Python engine is the reference (validated against queueing theory elsewhere); the compiled
engine must reproduce every request column, the event log, busy times and makespan bit for bit.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, LinkSpec, Role, Slo, WorkerSpec
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ConfigError, ParameterError, PdoptError
from pdopt.model_spec import SlidingWindow
from pdopt.policies import make_policy
from pdopt.policies._baselines import LeastLoaded
from pdopt.sim import ClosedLoop, simulate
from pdopt.testing.strategies import kv_allocations, small_workloads, worker_limits
from pdopt.workload import Workload

SLO = Slo(1.0, 0.05)
COST = CostModel(PrefillModel(2e3, 2e9, 1e13, intercept_s=0.002), DecodeModel(0.01, 1e-4, 1e-6))
# An MoE decode: the expert-coverage term d3·cover(B) (E = 128 experts, k = 8 per token).
MOE_COST = CostModel(COST.prefill, DecodeModel(0.006, 2e-5, 1e-6, 6e-5, 128, 8))
WINDOW = SlidingWindow(128, 18, 36)  # gpt-oss-120b: 18 of 36 layers keep a 128-token window
HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
POLICIES = [
    ("round_robin", {}),
    ("least_loaded", {}),
    ("static_split", {}),
    ("static_split", {"prefill_routing": "round_robin"}),
    ("distserve", {}),
    ("memory_centric", {}),
]


def both(
    workload,
    cluster,
    name,
    flags,
    record_timeseries=False,
    tick_s=0.05,
    timeout=None,
    no_fallback=None,
):
    """The Python and the compiled run (with the ``no_fallback`` fixture, the compiled one may
    not hand itself back to the Python engine)."""

    def run(engine):
        return simulate(
            workload,
            cluster,
            make_policy(name, **flags),
            slo=SLO,
            record_timeseries=record_timeseries,
            tick_s=tick_s,
            engine=engine,
            client_timeout_s=timeout,
        )

    python = run("python")
    if no_fallback is None:
        return [python, run("compiled")]
    no_fallback["compiled"] = True
    try:
        return [python, run("compiled")]
    finally:
        no_fallback["compiled"] = False


def client_timeouts():
    """No client timeout half the time, else one short enough that clients give up on small
    workloads' requests in every state (queued, in prefill, in a KV transfer, waiting for
    admission, decoding): 1 ms to 0.5 s."""
    return st.one_of(st.none(), st.floats(0.001, 0.5))


def note_aborts(result):
    """Hypothesis events: the states clients gave up in (from the abort reasons)."""
    for reason in result.requests["reason"]:
        if reason.startswith("client timeout"):
            hypothesis_event("aborted " + reason.rsplit("(", 1)[1].rstrip(")"))


def assert_identical(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries, check_exact=True)
    pd.testing.assert_frame_equal(a.events, b.events, check_exact=True)
    pd.testing.assert_frame_equal(a.workers, b.workers, check_exact=True)
    assert a.makespan_s == b.makespan_s


def hypothesis_event(text):
    """A hypothesis statistics event (--hypothesis-show-statistics), inside a given test."""
    if currently_in_test_context():
        event(text)


def check_both_engines(run, no_fallback):
    """``run(engine)`` on both engines gives identical results (the compiled run without handing
    itself back to the Python engine: the ``no_fallback`` fixture), or both refuse the same way
    (a decision the engine refuses: the compiled run hands it back, which raises the same);
    returns the Python engine's result, None on a refusal."""
    try:
        python = run("python")
    except PdoptError as exc:
        hypothesis_event(f"refused: {type(exc).__name__}")
        with pytest.raises(type(exc), match=re.escape(str(exc)[:60])):
            run("compiled")
        return None
    no_fallback["compiled"] = True
    try:
        compiled = run("compiled")
    finally:
        no_fallback["compiled"] = False
    assert_identical(python, compiled)
    return python


@st.composite
def disaggregated_clusters(draw):
    """1–3 prefill and 1–3 decode workers (a dense or an MoE decode cost), the shared limits, one
    of three links, and sometimes a
    slower pair link, a decode worker with half the KV (uneven capacities) and a prefill worker
    with half the KV (prompts it cannot hold go to the others); preempted requests re-queued at
    the front or the back; sometimes a sliding-window model's KV; the workers' KV allocated on
    demand or reserved at admission (:func:`pdopt.testing.strategies.kv_allocations`)."""
    limits = draw(worker_limits())
    cost = draw(st.sampled_from([COST, MOE_COST]))
    n_p, n_d = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    link = draw(st.sampled_from([LinkSpec.nvlink(), LinkSpec.ethernet(10), LinkSpec.kv_pool()]))
    workers = [WorkerSpec(f"p{i}", Role.PREFILL, cost, **limits) for i in range(n_p)] + [
        WorkerSpec(f"d{i}", Role.DECODE, cost, **limits) for i in range(n_d)
    ]
    if n_d > 1 and draw(st.booleans()):
        small = max(1, limits["kv_capacity_blocks"] // 2)
        workers[-1] = WorkerSpec(
            "d_small", Role.DECODE, cost, **{**limits, "kv_capacity_blocks": small}
        )
    if n_p > 1 and draw(st.booleans()):
        small = max(1, limits["kv_capacity_blocks"] // 2)
        workers[n_p - 1] = WorkerSpec(
            "p_small", Role.PREFILL, cost, **{**limits, "kv_capacity_blocks": small}
        )
    pairs = (("p0", workers[-1].name, LinkSpec.ethernet(10)),) if draw(st.booleans()) else ()
    requeue = draw(st.sampled_from(["front", "back"]))
    return ClusterSpec(
        draw(kv_allocations(workers)),
        kv_bytes_per_token=2e5,
        link=link,
        pair_links=pairs,
        preempted_requeue=requeue,
        sliding_window=draw(st.sampled_from([None, None, WINDOW])),
    )


@settings(max_examples=120, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    disaggregated_clusters(),
    st.sampled_from(POLICIES),
    st.sampled_from([None, 0.001, 0.01, 0.05]),
    client_timeouts(),
)
def test_compiled_engine_matches_python_engine(
    no_fallback, workload, cluster, policy, tick_s, timeout
):
    """Without a time series, and with one every ``tick_s`` (ticks also check false OOMs);
    with and without client timeouts."""
    record = tick_s is not None
    tick_s = tick_s or 0.05
    try:
        python, compiled = both(workload, cluster, *policy, record, tick_s, timeout, no_fallback)
    except ConfigError as exc:  # both engines must refuse the same way
        with pytest.raises(ConfigError, match=str(exc)[:40]):
            both(workload, cluster, *policy, record, tick_s, timeout)
        return
    assert_identical(python, compiled)
    note_aborts(python)


@settings(max_examples=60, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    disaggregated_clusters(),
    st.sampled_from(POLICIES),
    st.integers(1, 6),
    st.sampled_from([0.0, 0.02]),
    st.sampled_from(["constant", "exponential"]),
    st.one_of(st.just(0.0), st.floats(0.0, 0.5, allow_nan=False, allow_infinity=False)),
    client_timeouts(),
)
def test_compiled_engine_matches_in_a_closed_loop(
    no_fallback, workload, cluster, policy, clients, think_s, think, spread_s, timeout
):
    """Clients send their next request a think time after the previous one ends (an aborted
    one's too, from its abort); their first requests are spread over ``spread_s`` seconds."""
    driver = ClosedLoop(
        clients, think_s, workload, 3 * len(workload), think=think, start_spread_s=spread_s
    )
    try:
        python, compiled = both(driver, cluster, *policy, True, 0.01, timeout, no_fallback)
    except ConfigError as exc:
        with pytest.raises(ConfigError, match=str(exc)[:40]):
            both(driver, cluster, *policy, True, 0.01, timeout)
        return
    assert_identical(python, compiled)
    note_aborts(python)


@pytest.mark.parametrize("cost", [COST, MOE_COST], ids=["dense", "moe"])
@pytest.mark.parametrize("requeue", ["front", "back"])
@pytest.mark.parametrize(("name", "flags"), POLICIES)
def test_compiled_engine_matches_under_overload_with_preemptions(name, flags, requeue, cost):
    """A bursty overload of a small cluster: preemptions, false OOMs and KV waits all occur;
    preempted requests re-queued at the front (vLLM) or the back; a dense and an MoE decode."""
    rng = np.random.default_rng(7)
    n = 2000
    workload = Workload(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(16, 600, n), rng.integers(2, 300, n)
    )
    cluster = ClusterSpec.build(
        cost, 2, 3, kv_capacity_blocks=120, max_running=24, preempted_requeue=requeue
    )
    python, compiled = both(workload, cluster, name, flags, record_timeseries=True)
    assert python.requests["preemptions"].sum() > 0
    assert python.timeseries["kv_stranded_blocks"].sum() > 0
    assert (python.events["kind"] == "false_oom").any()
    assert_identical(python, compiled)


def test_rejections_are_logged_with_the_same_reason():
    workload = Workload([0.0, 0.01, 0.02], [100, 5000, 50], [10, 10, 1])
    cluster = ClusterSpec.build(COST, 1, 1, kv_capacity_blocks=64)
    python, compiled = both(workload, cluster, "least_loaded", {})
    assert list(compiled.requests["status"]) == ["finished", "rejected", "finished"]
    assert_identical(python, compiled)


def test_a_request_no_decode_worker_holds_raises_the_python_engines_error():
    """A prompt that fits the (larger) prefill worker but peaks beyond every decode worker."""
    big = WorkerSpec("p0", Role.PREFILL, COST, kv_capacity_blocks=100)
    small = WorkerSpec("d0", Role.DECODE, COST, kv_capacity_blocks=10)
    cluster = ClusterSpec((big, small), kv_bytes_per_token=1e5)
    workload = Workload([0.0], [400], [50])
    with pytest.raises(ConfigError, match="no decode worker can hold request 0"):
        simulate(
            workload,
            cluster,
            make_policy("least_loaded"),
            slo=SLO,
            record_timeseries=False,
            engine="compiled",
        )


def test_compiled_refuses_runs_it_cannot_do_and_says_why():
    cluster = ClusterSpec.build(COST, 1, 1)
    workload = Workload([0.0, 0.1], [64, 64], [4, 4])
    with pytest.raises(ConfigError, match="mixed"):
        simulate(
            workload,
            ClusterSpec.build(COST, 1, 1, 1),
            make_policy("least_loaded"),
            slo=SLO,
            record_timeseries=False,
            engine="compiled",
        )
    with pytest.raises(ConfigError, match="no compiled twin for colocated=False"):
        simulate(
            workload,
            ClusterSpec.build(COST, 0, 0, 2),
            make_policy("arrow", colocated=False),
            slo=SLO,
            record_timeseries=False,
            engine="compiled",
        )
    with pytest.raises(ParameterError, match="engine"):
        simulate(workload, cluster, make_policy("least_loaded"), slo=SLO, engine="numba")


def test_a_subclass_that_reroutes_has_no_compiled_twin():
    class FirstPrefill(LeastLoaded):
        def route_prefill(self, request, view):
            return int(view.prefill_workers[0])

    class Renamed(LeastLoaded):
        name = "renamed"

    assert LeastLoaded().traits().compiled_routing == ("least_loaded", "least_loaded")
    assert Renamed().traits().compiled_routing == ("least_loaded", "least_loaded")
    assert FirstPrefill().traits().compiled_routing is None


def test_auto_uses_the_compiled_engine_only_where_it_runs():
    """auto gives the same result as python both when it compiles and when it does not."""
    from pdopt.sim import _simulate

    cluster = ClusterSpec.build(COST, 2, 2)
    rng = np.random.default_rng(1)
    n = 300
    workload = Workload(
        np.cumsum(rng.exponential(0.02, n)), rng.integers(16, 400, n), rng.integers(1, 60, n)
    )
    old = _simulate.COMPILED_MIN_REQUESTS
    try:
        _simulate.COMPILED_MIN_REQUESTS = 100
        auto = simulate(
            workload, cluster, make_policy("round_robin"), slo=SLO, record_timeseries=False
        )
        auto_mixed = simulate(
            workload, ClusterSpec.build(COST, 1, 1, 1), make_policy("round_robin"), slo=SLO
        )
    finally:
        _simulate.COMPILED_MIN_REQUESTS = old
    python = simulate(
        workload,
        cluster,
        make_policy("round_robin"),
        slo=SLO,
        record_timeseries=False,
        engine="python",
    )
    assert_identical(python, auto)
    mixed = simulate(
        workload, ClusterSpec.build(COST, 1, 1, 1), make_policy("round_robin"), slo=SLO
    )
    assert_identical(mixed, auto_mixed)  # a mixed worker: auto fell back to Python


def test_the_moe_expert_term_changes_decode_times_in_both_engines():
    """The MoE run is not the dense run in disguise: each decode iteration pays d3·cover(B), so
    with the same linear part and d3 > 0 every decode lasts longer, identically in both engines."""
    rng = np.random.default_rng(3)
    n = 300
    workload = Workload(
        np.cumsum(rng.exponential(0.01, n)), rng.integers(16, 400, n), rng.integers(2, 100, n)
    )
    linear = CostModel(COST.prefill, DecodeModel(0.006, 2e-5, 1e-6, 0.0, 128, 8))
    runs = {}
    for label, cost in (("linear", linear), ("moe", MOE_COST)):
        cluster = ClusterSpec.build(cost, 1, 2, kv_capacity_blocks=400, max_running=32)
        python, compiled = both(workload, cluster, "round_robin", {})
        assert_identical(python, compiled)
        runs[label] = python.requests
    decode_s = {k: (r["finish_s"] - r["decode_start_s"]).sum() for k, r in runs.items()}
    assert decode_s["moe"] > decode_s["linear"]
