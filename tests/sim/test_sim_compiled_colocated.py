"""The compiled engine against the Python engine on colocated (mixed) workers: identical results.

vLLM (``prefill_first``) and Sarathi (``hybrid``, both chunk budgets) on random all-mixed
clusters and workloads, KV pressure with recompute preemptions, vLLM V1's ``max_num_seqs`` gate,
decodes sent to another mixed worker when their own cannot hold them, time series on and off;
and the runs the compiled engine refuses, with the reason.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, LinkSpec, Role, Slo, WorkerSpec
from pdopt.costmodel import CostModel, DecodeModel, HybridModel, PrefillModel
from pdopt.errors import ConfigError, PdoptError
from pdopt.policies import make_policy
from pdopt.policies.colocated import Sarathi
from pdopt.sim import ClosedLoop, Policy, PolicyTraits, simulate
from pdopt.testing.strategies import kv_allocations, small_workloads, worker_limits
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import WINDOW, assert_identical, client_timeouts, note_aborts

SLO = Slo(1.0, 0.05)
COST = CostModel(PrefillModel(2e3, 2e9, 1e13, intercept_s=0.002), DecodeModel(0.01, 1e-4, 1e-6))
# An MoE decode (the expert-coverage term in the fused pass) and a fitted fused-pass model.
MOE_COST = CostModel(COST.prefill, DecodeModel(0.006, 2e-5, 1e-6, 6e-5, 128, 8))
FITTED_COST = CostModel(
    COST.prefill, COST.decode, hybrid=HybridModel(0.009, 1.2e-4, 1e-6, 2e-5, 3e-10, 0.003)
)
POLICIES = [
    ("vllm", {}),
    ("vllm", {"prefill_routing": "round_robin"}),
    ("sarathi", {}),
    ("sarathi", {"chunk_budget": "prefill"}),
    ("sarathi", {"chunk_tokens": 48, "prefill_routing": "round_robin"}),
    ("sarathi", {"chunk_tokens": 8, "chunk_budget": "iteration"}),
]


def both(
    driver, cluster, name, flags, no_fallback, record_timeseries=False, tick_s=0.05, timeout=None
):
    """The Python and the compiled run; when the Python engine raises, the compiled one must
    raise the same error (it hands an erroneous run to the Python engine to word it)."""

    def run(engine):
        return simulate(
            driver,
            cluster,
            make_policy(name, **flags),
            slo=SLO,
            record_timeseries=record_timeseries,
            tick_s=tick_s,
            engine=engine,
            client_timeout_s=timeout,
        )

    try:
        python = run("python")
    except PdoptError as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            run("compiled")
        return None
    no_fallback["compiled"] = True
    try:
        return python, run("compiled")
    finally:
        no_fallback["compiled"] = False


@st.composite
def mixed_clusters(draw):
    """1–3 mixed workers (a dense, an MoE or a fitted fused-pass cost), the shared limits (small
    KV and ``max_running``: preemptions and the ``max_num_seqs`` gate), each worker's own chunk
    size and schedule (a policy's forced ones win), sometimes one worker with half the KV (its
    long requests decode elsewhere, over a link), a slower pair link and a sliding-window
    model's KV (gpt-oss-120b's layers); the workers' KV allocated on demand or reserved at
    admission (:func:`pdopt.testing.strategies.kv_allocations`)."""
    limits = draw(worker_limits())
    cost = draw(st.sampled_from([COST, MOE_COST, FITTED_COST]))
    n = draw(st.integers(1, 3))
    chunk = draw(st.sampled_from([16, 64, 512]))
    schedule = draw(st.sampled_from(["prefill_first", "hybrid"]))
    workers = [
        WorkerSpec(
            f"m{i}", Role.MIXED, cost, colocated_schedule=schedule, chunk_tokens=chunk, **limits
        )
        for i in range(n)
    ]
    if n > 1 and draw(st.booleans()):
        small = max(1, limits["kv_capacity_blocks"] // 2)
        workers[-1] = WorkerSpec(
            "m_small",
            Role.MIXED,
            cost,
            colocated_schedule=schedule,
            chunk_tokens=chunk,
            **{**limits, "kv_capacity_blocks": small},
        )
    link = draw(st.sampled_from([LinkSpec.nvlink(), LinkSpec.ethernet(10)]))
    pairs = (
        (("m0", workers[-1].name, LinkSpec.ethernet(1)),) if n > 1 and draw(st.booleans()) else ()
    )
    return ClusterSpec(
        draw(kv_allocations(workers)),
        kv_bytes_per_token=2e5,
        link=link,
        pair_links=pairs,
        preempted_requeue=draw(st.sampled_from(["front", "back"])),
        sliding_window=draw(st.sampled_from([None, WINDOW])),
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    small_workloads(),
    mixed_clusters(),
    st.sampled_from(POLICIES),
    st.sampled_from([None, 0.001, 0.02]),
    client_timeouts(),
)
def test_compiled_engine_matches_python_on_mixed_workers(
    no_fallback, workload, cluster, policy, tick_s, timeout
):
    """Without a time series, and with one every ``tick_s`` (ticks also check false OOMs);
    with and without client timeouts (chunked prompts aborted in and between iterations,
    stalled decodes aborted)."""
    record = tick_s is not None
    tick_s = tick_s or 0.05
    runs = both(workload, cluster, *policy, no_fallback, record, tick_s, timeout)
    if runs is not None:  # else both engines raised the same error
        assert_identical(*runs)
        note_aborts(runs[0])


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    small_workloads(),
    mixed_clusters(),
    st.sampled_from(POLICIES),
    st.integers(1, 6),
    st.sampled_from([0.0, 0.02]),
    client_timeouts(),
)
def test_compiled_engine_matches_on_mixed_workers_in_a_closed_loop(
    no_fallback, workload, cluster, policy, clients, think_s, timeout
):
    driver = ClosedLoop(clients, think_s, workload, 3 * len(workload), think="exponential")
    runs = both(driver, cluster, *policy, no_fallback, True, 0.01, timeout)
    if runs is not None:
        assert_identical(*runs)


def _sized(flags: dict, n: int) -> int:
    """``n`` requests, a quarter under 8-token chunks (the Python engine runs ~10x as many
    iterations then)."""
    return n // 4 if flags.get("chunk_tokens") == 8 else n


def _burst(seed: int, n: int = 1500) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(16, 600, n), rng.integers(2, 300, n)
    )


@pytest.mark.parametrize("cost", [COST, MOE_COST, FITTED_COST], ids=["dense", "moe", "fitted"])
@pytest.mark.parametrize("timeseries", [False, True], ids=["no_ts", "ts"])
@pytest.mark.parametrize(("name", "flags"), POLICIES)
def test_compiled_engine_matches_under_overload_with_preemptions(
    name, flags, timeseries, cost, no_fallback
):
    """A bursty overload of three small mixed workers: recompute preemptions, KV waits and
    (with a time series) false OOMs."""
    cluster = ClusterSpec.build(cost, 0, 0, 3, kv_capacity_blocks=120, max_running=12)
    python, compiled = both(
        _burst(7, _sized(flags, 1500)), cluster, name, flags, no_fallback, timeseries
    )
    assert_identical(python, compiled)
    assert python.requests["preemptions"].sum() > 0
    assert (python.requests["status"] == "finished").all()
    if timeseries:
        assert (python.events["kind"] == "false_oom").any()


@pytest.mark.parametrize(("name", "flags"), POLICIES)
def test_compiled_engine_matches_with_a_sliding_window(name, flags, no_fallback):
    """A sliding-window model's KV (blocks grow slower past the window) under overload."""
    cluster = dataclasses.replace(
        ClusterSpec.build(COST, 0, 0, 3, kv_capacity_blocks=60, max_running=12),
        sliding_window=WINDOW,
    )
    workload = _burst(11, _sized(flags, 800))
    python, compiled = both(workload, cluster, name, flags, no_fallback, True, 0.01)
    assert_identical(python, compiled)
    assert python.requests["preemptions"].sum() > 0


@pytest.mark.parametrize(("name", "flags"), POLICIES)
def test_compiled_engine_matches_where_max_num_seqs_binds(name, flags, no_fallback):
    """Ample KV, four sequences per worker: vLLM V1's ``max_num_seqs`` gates new prompts
    (running decodes, prompts in prefill and those waiting for their decode slot count)."""
    cluster = ClusterSpec.build(COST, 0, 0, 2, kv_capacity_blocks=4000, max_running=4)
    python, compiled = both(_burst(5, 400), cluster, name, flags, no_fallback, True, 0.01)
    assert_identical(python, compiled)
    assert python.timeseries["running"].max() == 4
    assert python.requests["preemptions"].sum() == 0


@pytest.mark.parametrize(("name", "flags"), POLICIES[:3])
def test_colocated_policies_on_a_disaggregated_cluster_match(name, flags, no_fallback):
    """On prefill and decode workers the colocated policies route as their fallback does (the
    decode to the most free KV): the same twin runs them."""
    cluster = ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=120, max_running=16)
    python, compiled = both(_burst(3, 600), cluster, name, flags, no_fallback, True)
    assert python.requests["preemptions"].sum() > 0
    assert_identical(python, compiled)


def test_the_workers_table_names_the_policys_schedule(no_fallback):
    """Sarathi forces the hybrid schedule on workers whose own is prefill_first: both engines'
    workers tables say so."""
    cluster = ClusterSpec.build(COST, 0, 0, 2, colocated_schedule="prefill_first")
    python, compiled = both(_burst(1, 200), cluster, "sarathi", {}, no_fallback)
    assert list(compiled.workers["colocated_schedule"]) == ["hybrid", "hybrid"]
    assert_identical(python, compiled)


class _TickingSarathi(Policy):
    """Sarathi's routing declared with ticks: the compiled engine must refuse it."""

    name = "ticking"

    def traits(self) -> PolicyTraits:
        return PolicyTraits(
            wants_ticks=True,
            colocated_schedule="hybrid",
            compiled_routing=("least_outstanding", "origin"),
        )


@pytest.mark.parametrize(
    ("cluster", "policy", "reason"),
    [
        (ClusterSpec.build(COST, 1, 1, 1), Sarathi(), "mixed workers beside prefill"),
        (ClusterSpec.build(COST, 0, 0, 2), make_policy("least_loaded"), "colocated policies"),
        (ClusterSpec.build(COST, 0, 0, 2), _TickingSarathi(), "acts on control ticks"),
    ],
    ids=["mixed_pools", "disagg_twin", "ticks"],
)
def test_compiled_refuses_colocated_runs_it_cannot_do_and_says_why(cluster, policy, reason):
    workload = Workload([0.0, 0.1], [64, 64], [4, 4])
    with pytest.raises(ConfigError, match=reason):
        simulate(workload, cluster, policy, slo=SLO, record_timeseries=False, engine="compiled")
    # client timeouts run compiled (but under Arrow and EcoServe)
    with pytest.raises(ConfigError, match="client timeouts under Arrow's and EcoServe's"):
        simulate(
            workload,
            ClusterSpec.build(COST, 0, 0, 2),
            make_policy("ecoserve"),
            slo=SLO,
            engine="compiled",
            client_timeout_s=1.0,
        )


def test_colocated_policies_declare_their_twin():
    assert Sarathi().traits().compiled_routing == ("least_outstanding", "origin")
    assert make_policy("vllm", prefill_routing="round_robin").traits().compiled_routing == (
        "round_robin",
        "origin",
    )
    assert Sarathi(prefill_routing="prefix_affinity").traits().compiled_routing == (
        "prefix_affinity",
        "origin",
    )

    class Rerouted(Sarathi):
        def route_prefill(self, request, view):
            return int(view.prefill_workers[0])

    assert Rerouted().traits().compiled_routing is None
