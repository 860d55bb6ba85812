"""Arrow on the compiled engine against the Python engine: identical results.

The compiled twin runs Arrow's Alg. 1 prefill routing (least predicted TTFT in P, then D→P, then
an instance taken from decode when decode load is low), Alg. 2 decode routing (stay where
prefilled, else D then P→D under Max Running Tokens, KV and the observed token interval, else an
instance taken from prefill), Alg. 3/4 instance moves and the §5.5 monitor (token intervals from
snapshots of the running requests, overload and idle patience, transitions finished), with the
instances made mixed at the first tick (the paper's stateless instances, ``colocated=True``) or
single-role workers whose role flips (``colocated=False``), on clusters that start as prefill and
decode workers or (``colocated=True``) as mixed ones, bit for bit: requests, event log
(``pool_move`` rows), time series and the workers frame.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, Role, WorkerSpec
from pdopt.errors import ConfigError
from pdopt.policies import make_policy
from pdopt.policies._slo_predict import ttft_predictor
from pdopt.policies.arrow import Arrow
from pdopt.sim import ClosedLoop, simulate
from pdopt.sim._simulate import _compiled_codes
from pdopt.testing.strategies import small_workloads
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import (
    COST,
    MOE_COST,
    SLO,
    check_both_engines,
    disaggregated_clusters,
    hypothesis_event,
)
from tests.sim.test_sim_compiled_colocated import mixed_clusters
from tests.sim.test_sim_compiled_splitwise import HEALTH


@st.composite
def arrow_flags(draw):
    """Every setting and ablation: SLOs, patiences, flip damping, the low-load fraction, SLO
    awareness, elasticity, stateless (mixed) instances or single-role ones, the chunk budget."""
    return {
        "ttft_slo_s": draw(st.sampled_from([None, 0.02, 0.2])),
        "tpot_slo_s": draw(st.sampled_from([None, 0.012, 0.03])),
        "overload_patience_s": draw(st.sampled_from([0.0, 0.02, 0.2])),
        "idle_patience_s": draw(st.sampled_from([0.0, 0.05, 0.5])),
        "min_flip_interval_s": draw(st.sampled_from([0.0, 0.0, 0.05])),
        "decode_low_frac": draw(st.sampled_from([0.1, 0.3, 0.9])),
        "slo_aware": draw(st.booleans()) or draw(st.booleans()),
        "elastic": draw(st.booleans()) or draw(st.booleans()),
        "colocated": draw(st.booleans()),
        "chunk_tokens": draw(st.sampled_from([64, 512])),
        "chunk_budget": draw(st.sampled_from(["iteration", "prefill"])),
    }


def run(driver, cluster, flags, record_timeseries, tick_s, engine):
    return simulate(
        driver,
        cluster,
        make_policy("arrow", **flags),
        slo=SLO,
        record_timeseries=record_timeseries,
        tick_s=tick_s,
        engine=engine,
    )


def check(driver, cluster, flags, record, tick_s, no_fallback):
    """Both engines identical, or refusing alike; the Python engine's result (None on a
    refusal)."""
    python = check_both_engines(
        lambda engine: run(driver, cluster, flags, record, tick_s, engine), no_fallback
    )
    if python is not None:
        moves = python.events[python.events["kind"] == "pool_move"]
        flips = len(moves) - len(cluster.workers) if flags.get("colocated", True) else len(moves)
        hypothesis_event(f"flips: {'none' if flips <= 0 else '1-5' if flips <= 5 else 'over 5'}")
    return python


@settings(max_examples=120, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    disaggregated_clusters(),
    arrow_flags(),
    st.sampled_from([None, 0.005, 0.01, 0.05]),
)
def test_compiled_arrow_matches_python_engine(no_fallback, workload, cluster, flags, tick_s):
    """Without a time series (the policy's ticks still run), and with one every ``tick_s``."""
    check(workload, cluster, flags, tick_s is not None, tick_s or 0.01, no_fallback)


@settings(max_examples=40, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    disaggregated_clusters(),
    arrow_flags(),
    st.integers(1, 6),
    st.sampled_from([0.0, 0.02]),
)
def test_compiled_arrow_matches_in_a_closed_loop(
    no_fallback, workload, cluster, flags, clients, think_s
):
    driver = ClosedLoop(clients, think_s, workload, 3 * len(workload), start_spread_s=0.1)
    check(driver, cluster, flags, True, 0.01, no_fallback)


def _overload_cluster(requeue):
    lim = {"kv_capacity_blocks": 120, "max_running": 24}
    workers = [WorkerSpec(f"p{i}", Role.PREFILL, COST, **lim) for i in range(3)]
    workers += [WorkerSpec(f"d{i}", Role.DECODE, COST, **lim) for i in range(3)]
    return ClusterSpec(tuple(workers), kv_bytes_per_token=2e5, preempted_requeue=requeue)


def _two_phase():
    """A decode-heavy burst (short prompts, long outputs), then a prefill-heavy one (long
    prompts, a few tokens out): decode overloads, then prefill misses its TTFT SLO."""
    rng = np.random.default_rng(7)
    n = 1000
    first = np.cumsum(rng.exponential(0.004, n))
    second = first[-1] + np.cumsum(rng.exponential(0.003, n))
    return Workload(
        np.concatenate([first, second]),
        np.concatenate([rng.integers(16, 200, n), rng.integers(800, 1600, n)]),
        np.concatenate([rng.integers(100, 300, n), rng.integers(2, 8, n)]),
    )


EAGER = {"ttft_slo_s": 0.05, "decode_low_frac": 0.9}  # flips both ways on the two phases


@pytest.mark.parametrize(
    "flags",
    [
        EAGER,
        {**EAGER, "colocated": False},
        {**EAGER, "min_flip_interval_s": 0.05, "overload_patience_s": 0.0, "tpot_slo_s": 0.02},
        {"slo_aware": False, "idle_patience_s": 0.0},
        {},
    ],
    ids=["eager", "single_role", "damped", "not_slo_aware", "paper_defaults"],
)
@pytest.mark.parametrize("record", [False, True], ids=["no_ts", "ts"])
def test_compiled_arrow_matches_under_overload(flags, record, no_fallback):
    """Bursts that overload decode, then prefill: instances flip both ways (hundreds of times
    with the eager settings), with preemptions and false OOMs."""
    python = check(_two_phase(), _overload_cluster("front"), flags, record, 0.01, no_fallback)
    assert python is not None
    moves = python.events[python.events["kind"] == "pool_move"]["detail"]
    assert python.requests["preemptions"].sum() > 0
    if flags.get("colocated", True):  # every instance made mixed at the first tick
        assert moves.str.startswith("prefill->mixed").sum() == 3
        assert moves.str.startswith("decode->mixed").sum() == 3
    else:
        assert moves.str.startswith("decode->prefill").any()
        assert moves.str.startswith("prefill->decode").any()
    if flags.get("ttft_slo_s"):
        assert moves.str.endswith("pool=D->P").sum() > 50
        assert moves.str.endswith("pool=P->D").sum() > 40


def test_arrow_runs_compiled_with_its_settings():
    """Arrow has a twin in both instance modes; before start only its settings are known (NaN
    stands in for the run's SLOs), after it the run's SLOs and each worker's TTFT predictor."""
    cluster = _overload_cluster("front")
    for colocated in (True, False):
        policy = Arrow(colocated=colocated)
        codes = _compiled_codes("compiled", policy, policy.traits(), cluster, 10)
        assert codes is not None and codes[:3] == (10, 9, 3)
        assert len(codes[3]) == 9
        assert codes[3][-1] == float(colocated)
    policy = Arrow(tpot_slo_s=0.03)
    workload = Workload(np.array([0.0, 0.01]), np.array([20, 30]), np.array([4, 5]))
    simulate(workload, cluster, policy, slo=SLO, engine="compiled")
    name, params = policy.compiled_tick()
    assert name == "arrow" and params[:2] == (SLO.ttft_s, 0.03)  # the run's TTFT SLO, its TPOT
    predictors = [ttft_predictor(w.cost) for w in cluster.workers]
    assert params[9:] == tuple(
        x for p in predictors for x in (p.a_s_per_token2, p.b_s_per_token, p.c_s)
    )


def test_an_arrow_subclass_with_its_own_rule_has_no_compiled_twin():
    class Eager(Arrow):
        def _may_flip(self, w, now):
            return True

    assert Eager().traits().compiled_routing is None
    assert Eager().compiled_tick() is None
    assert Arrow().traits().compiled_routing == ("arrow", "arrow")


@pytest.mark.parametrize("colocated", [True, False], ids=["mixed", "single_role"])
def test_an_moe_decode_runs_compiled_identically(colocated, no_fallback):
    """Max Running Tokens and the token interval's τ(B, C) with the expert term (a float power,
    the C library's pow in both engines), under the two-phase overload."""
    lim = {"kv_capacity_blocks": 120, "max_running": 24}
    workers = [WorkerSpec(f"p{i}", Role.PREFILL, MOE_COST, **lim) for i in range(3)]
    workers += [WorkerSpec(f"d{i}", Role.DECODE, MOE_COST, **lim) for i in range(3)]
    cluster = ClusterSpec(tuple(workers), kv_bytes_per_token=2e5)
    flags = {**EAGER, "colocated": colocated}
    python = check(_two_phase(), cluster, flags, False, 0.01, no_fallback)
    assert python is not None
    assert python.events["detail"].str.endswith("pool=P->D").any()


@settings(max_examples=60, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    mixed_clusters(),
    arrow_flags(),
    st.sampled_from([None, 0.005, 0.05]),
)
def test_compiled_arrow_matches_on_instances_mixed_from_the_start(
    no_fallback, workload, cluster, flags, tick_s
):
    """The paper's stateless instances given as mixed workers: the first tick relabels them
    into Arrow's pools and every flip after it is a relabel within the mixed role."""
    flags = {**flags, "colocated": True}
    check(workload, cluster, flags, tick_s is not None, tick_s or 0.01, no_fallback)


@pytest.mark.parametrize("flags", [EAGER, {}, {**EAGER, "slo_aware": False}], ids=str)
def test_compiled_arrow_matches_under_overload_on_mixed_instances(flags, no_fallback):
    lim = {"kv_capacity_blocks": 120, "max_running": 24}
    workers = tuple(WorkerSpec(f"m{i}", Role.MIXED, COST, **lim) for i in range(6))
    cluster = ClusterSpec(workers, kv_bytes_per_token=2e5)
    python = check(_two_phase(), cluster, flags, False, 0.01, no_fallback)
    assert python is not None
    details = python.events.loc[python.events["kind"] == "pool_move", "detail"]
    assert details.str.startswith("mixed->mixed").all()
    assert (~details.str.endswith("pool=P")).any()  # flips, after the first tick put all in P


def test_a_flip_before_the_first_tick_keeps_a_mixed_instance_mixed(no_fallback):
    """A decode routed before the first tick finds no D instance and flips one to P->D; the
    first tick finishes that transition before it makes the instances Arrow's (review
    finding): the instance stays mixed (a relabel, then the conversion's), in both engines, and
    the run stays compiled."""
    workers = (WorkerSpec("m0", Role.MIXED, COST, 400), WorkerSpec("m1", Role.MIXED, COST, 400))
    cluster = ClusterSpec(workers, kv_bytes_per_token=2e5)
    python = check(_two_phase(), cluster, {}, False, 0.05, no_fallback)
    assert python is not None
    events = python.events
    first = events[(events["kind"] == "pool_move") & (events["t_s"] <= 0.05)]
    assert first["detail"].str.startswith("mixed->mixed").all()
    assert first["worker"].duplicated().any()  # the transition finished, then the conversion


def test_arrow_single_role_on_instances_mixed_from_the_start_stays_on_the_python_engine():
    """With ``colocated=False`` a flip moves an instance out of the mixed role, which the
    compiled engine does not run: refused, saying why; ``auto`` runs it on the Python engine."""
    mixed = ClusterSpec(
        (WorkerSpec("m0", Role.MIXED, COST, 100), WorkerSpec("m1", Role.MIXED, COST, 100)),
        kv_bytes_per_token=2e5,
    )
    workload = Workload(np.array([0.0, 0.01]), np.array([20, 30]), np.array([4, 5]))
    flags = {"colocated": False}
    with pytest.raises(ConfigError, match="colocated=False on instances mixed from the start"):
        run(workload, mixed, flags, False, 0.01, "compiled")
    python = run(workload, mixed, flags, False, 0.01, "python")
    auto = run(workload, mixed, flags, False, 0.01, "auto")
    assert python.requests.equals(auto.requests)
