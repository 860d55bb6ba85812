"""KV allocation policies (``WorkerSpec.kv_allocation``): growing on demand against reserving a
request's expected output at admission, on a hand-checkable case; the compiled engine runs
reserving workers (all of a cluster's or some) as the Python engine does, bit for bit."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo, WorkerSpec
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ParameterError
from pdopt.model_spec import SlidingWindow
from pdopt.policies import make_policy
from pdopt.policies.phasor import Phasor
from pdopt.sim import PolicyDecisionError, SimResult, simulate
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import assert_identical
from tests.sim.test_sim_compiled_prefix import _shared_burst

COST = CostModel(PrefillModel(0.0, 1e9, 1e13, 1.0, 1e-3), DecodeModel(0.01, 1e-3, 1e-6))
SLO = Slo(1.0, 0.1)
# Three requests of 32 prompt and 97 output tokens at t = 0 on one decode worker of 10 blocks
# of 16 tokens. Each peaks at 32 + 96 = 128 context tokens: 8 blocks.
WORKLOAD = Workload([0.0, 0.0, 0.0], [32, 32, 32], [97, 97, 97])
WINDOW = SlidingWindow(128, 18, 36)  # gpt-oss-120b: 18 of 36 layers keep a 128-token window


def run(kv_allocation: str, engine: str = "python") -> SimResult:
    cluster = ClusterSpec.build(
        COST, 1, 1, kv_capacity_blocks=10, kv_bytes_per_token=1e5,
        link=LinkSpec("test", 1e9, 1e-3), kv_allocation=kv_allocation,
    )  # fmt: skip
    return simulate(
        WORKLOAD, cluster, make_policy("round_robin"), slo=SLO, tick_s=0.01, engine=engine
    )


def test_reserve_output_admits_one_at_a_time_where_on_demand_admits_all() -> None:
    """On demand: each request is admitted at 33 tokens (3 blocks), all three fit (9 <= 10),
    and their growth (4 blocks each at 49 tokens) preempts. Reserved: each needs its 8 blocks at
    admission, so one runs at a time; the next is admitted at the boundary where the previous
    one finishes; nothing is preempted and the 2 free blocks are stranded while one waits."""
    grow, reserve = run("on_demand"), run("reserve_output")
    g, r = grow.requests, reserve.requests
    assert (r["status"] == "finished").all() and (g["status"] == "finished").all()
    # on demand: all three admitted before the first finishes, then growth preempts
    assert (g["decode_start_s"] < g["finish_s"].min()).all()
    assert g["preemptions"].sum() > 0
    # reserved: strictly one after another, no preemption
    order = r.sort_values("decode_start_s")
    starts, ends = order["decode_start_s"].to_numpy(), order["finish_s"].to_numpy()
    assert starts[1] == ends[0] and starts[2] == ends[1]
    assert r["preemptions"].sum() == 0
    d0 = reserve.timeseries[reserve.timeseries["worker"] == "d0"]
    assert set(d0["kv_used_blocks"]) <= {0, 8} and 8 in set(d0["kv_used_blocks"])
    assert d0["running"].max() == 1
    waiting = d0[d0["kv_used_blocks"] == 8]
    assert (waiting["kv_free_blocks"] == 2).all()
    m_grow, m_reserve = grow.metrics(), reserve.metrics()
    assert m_reserve["fragmentation_peak_pct"] == 100.0  # 2 free, 2 stranded (need 8)
    assert m_reserve["fragmentation_mean_pct"] > m_grow["fragmentation_mean_pct"]
    # serial decoding takes longer end to end
    assert reserve.makespan_s > grow.makespan_s


def test_reserve_output_runs_compiled_identically(no_fallback) -> None:
    """The hand-checked case on the compiled engine (without handing itself back to the Python
    engine): every result column, the event log, the time series and the workers frame are
    the Python engine's, bit for bit; ``auto`` gives the same."""
    python = run("reserve_output")
    no_fallback["compiled"] = True
    compiled = run("reserve_output", engine="compiled")
    no_fallback["compiled"] = False
    assert_identical(python, compiled)
    assert_identical(python, run("reserve_output", engine="auto"))
    assert (python.requests["status"] == "finished").all() and len(python.timeseries)


def _overload(n: int = 600, seed: int = 3) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(16, 400, n), rng.integers(2, 200, n)
    )


def _workers(roles: str, allocations: str, kv_blocks: int = 80) -> tuple[WorkerSpec, ...]:
    """One worker per letter of ``roles`` (p: prefill, d: decode, m: mixed), allocating its KV
    on demand (o) or reserving its output (r) by the same position of ``allocations``."""
    role = {"p": "prefill", "d": "decode", "m": "mixed"}
    kind = {"o": "on_demand", "r": "reserve_output"}
    return tuple(
        WorkerSpec(f"{r}{i}", role[r], COST, kv_blocks, max_running=16, kv_allocation=kind[a])
        for i, (r, a) in enumerate(zip(roles, allocations, strict=True))
    )


@pytest.mark.parametrize(
    ("roles", "allocations", "policy", "window", "prefix"),
    [
        ("ppddd", "rrrrr", "distserve", False, False),
        ("ppddd", "ooror", "least_loaded", False, False),
        ("ppddd", "rrrrr", "round_robin", True, False),
        ("ppddd", "oorro", "cache_aware", False, True),
        ("mmm", "rrr", "vllm", False, False),
        ("mmm", "ror", "sarathi", True, True),
    ],
    ids=["reserved", "mixed_allocations", "sliding_window", "prefix_cache", "vllm", "sarathi"],
)
def test_reserve_output_clusters_run_compiled_identically(
    roles, allocations, policy, window, prefix, no_fallback
) -> None:
    """Overloaded clusters whose workers reserve (all or some of them): admissions wait for
    whole reservations, next to on-demand workers that grow and preempt; with a sliding
    window's KV, prefix caching, and on mixed workers under the colocated policies. Both
    engines give the same result, bit for bit."""
    workload = _shared_burst(300, 7) if prefix else _overload()
    cluster = ClusterSpec(
        _workers(roles, allocations, 120 if prefix else 80),
        kv_bytes_per_token=1e5,
        link=LinkSpec("test", 1e9, 1e-3),
        sliding_window=WINDOW if window else None,
        prefix_caching=prefix,
    )
    results = []
    for engine in ("python", "compiled"):
        no_fallback["compiled"] = engine == "compiled"
        results.append(
            simulate(workload, cluster, make_policy(policy), slo=SLO, tick_s=0.01, engine=engine)
        )
    no_fallback["compiled"] = False
    python, compiled = results
    assert_identical(python, compiled)
    assert (python.events["kind"] == "false_oom").any()


def test_kv_allocation_is_validated_and_reaches_every_worker() -> None:
    with pytest.raises(ParameterError, match="kv_allocation"):
        WorkerSpec("d0", "decode", COST, 10, kv_allocation="greedy")
    cluster = ClusterSpec.build(COST, 1, 2, 1, kv_allocation="reserve_output")
    assert {w.kv_allocation for w in cluster.workers} == {"reserve_output"}
    assert {w.kv_allocation for w in ClusterSpec.build(COST, 1, 1).workers} == {"on_demand"}


# Phasor on 2 prefill, 2 decode and 2 Mixed-pool workers of 60 blocks (short prefills, fast
# decodes): its defragmentation and pool moves migrate often
PHASOR_COST = CostModel(PrefillModel(50.0, 1e9, 1e13, 1.0, 5e-4), DecodeModel(5e-3, 1e-4, 1e-7))


def _phasor_workload() -> Workload:
    rng = np.random.default_rng(0)
    n = 400
    return Workload(
        np.cumsum(rng.exponential(0.01, n)), rng.integers(16, 300, n), rng.integers(2, 200, n)
    )


def _phasor_cluster(allocations: str) -> ClusterSpec:
    """The 2P 2D 2M cluster, each worker allocating on demand (o) or reserving (r) by the
    same position of ``allocations``."""
    built = ClusterSpec.build(
        PHASOR_COST, 2, 2, 2, kv_capacity_blocks=60, kv_bytes_per_token=1e4,
        link=LinkSpec("l", 1e9, 1e-4), mixed_pool_role="decode", max_running=12,
    )  # fmt: skip
    kind = {"o": "on_demand", "r": "reserve_output"}
    workers = tuple(
        dataclasses.replace(w, kv_allocation=kind[a])
        for w, a in zip(built.workers, allocations, strict=True)
    )
    return dataclasses.replace(built, workers=workers)


def _on_both_engines(run, no_fallback) -> SimResult:  # type: ignore[no-untyped-def]
    """``run(engine)`` on both engines (the compiled one may not hand the run back): the
    Python engine's result, checked identical to the compiled one's."""
    results = []
    for engine in ("python", "compiled"):
        no_fallback["compiled"] = engine == "compiled"
        try:
            results.append(run(engine))
        finally:
            no_fallback["compiled"] = False
    python, compiled = results
    assert_identical(python, compiled)
    return python


def _migrated_onto_reserving(result: SimResult, cluster: ClusterSpec) -> bool:
    """Whether some migration ended on a worker that reserves."""
    ends = result.events[result.events["kind"] == "migration_end"]
    reserving = {w.name for w in cluster.workers if w.kv_allocation == "reserve_output"}
    return bool(ends["worker"].isin(reserving).any())


def test_migrations_carry_the_whole_reservation() -> None:
    """Phasor's defragmentation and pool moves migrate reserved requests: the destination
    reserves (and the source frees) the whole reservation, so KV stays within capacity, nothing
    is preempted and every request finishes."""
    cluster = _phasor_cluster("rrrrrr")
    res = simulate(_phasor_workload(), cluster, make_policy("phasor"), slo=SLO, tick_s=0.01)
    assert (res.events["kind"] == "migration_end").sum() > 0
    assert res.requests["preemptions"].sum() == 0
    assert (res.requests["status"] == "finished").all()
    assert res.timeseries["kv_used_blocks"].between(0, 60).all()


def test_migrations_of_reservations_run_compiled_identically(no_fallback) -> None:
    """Phasor's defragmentation on reserving workers: the compiled engine's
    migrations (the destination holds the whole reservation, the source frees it) are the
    Python engine's, bit for bit."""
    wl, cluster = _phasor_workload(), _phasor_cluster("rrrrrr")

    def run(engine):  # type: ignore[no-untyped-def]
        return simulate(wl, cluster, make_policy("phasor"), slo=SLO, tick_s=0.01, engine=engine)

    python = _on_both_engines(run, no_fallback)
    assert (python.events["kind"] == "migration_end").sum() > 0


@pytest.mark.parametrize("allocations", ["oorror", "ooorro", "oororr", "oooorr"])
def test_phasor_migrates_between_workers_that_allocate_differently(allocations, no_fallback):
    """Decode workers (and Mixed-pool members) of both allocations: a request migrated to a
    worker that reserves needs its whole peak free there, not the blocks it holds on an
    on-demand source plus growth. Phasor's plans and evacuations count that need per
    destination (before, every one of these runs stopped with a Migrate the engine refused),
    and both engines agree bit for bit."""
    wl, cluster = _phasor_workload(), _phasor_cluster(allocations)

    def run(engine):  # type: ignore[no-untyped-def]
        return simulate(wl, cluster, make_policy("phasor"), slo=SLO, tick_s=0.01, engine=engine)

    python = _on_both_engines(run, no_fallback)
    assert (python.requests["status"] == "finished").all()
    assert _migrated_onto_reserving(python, cluster)


def _decode_then_long_prompts(seed: int) -> Workload:
    """Short prompts with long outputs (the Mixed-pool members decode), then long prompts with
    short outputs (a member is promoted to prefill and its decodes evacuated)."""
    rng = np.random.default_rng(seed)
    n = 200
    first = np.cumsum(rng.exponential(0.01, n))
    arrivals = np.concatenate([first, first[-1] + np.cumsum(rng.exponential(0.005, n))])
    inputs = np.concatenate([rng.integers(16, 100, n), rng.integers(400, 900, n)])
    outputs = np.concatenate([rng.integers(100, 300, n), rng.integers(2, 10, n)])
    return Workload(arrivals, inputs, outputs)


@pytest.mark.parametrize("seed", [0, 1])
def test_phasor_evacuates_onto_reserving_workers_by_the_whole_peak(seed, no_fallback):
    """A promoted member's decodes (defragmentation off: these are evacuations) go to reserving
    workers (one decode worker and one member here) only where their whole peak is free: every
    request finishes, both engines alike; a Phasor blind to reservations (each asks its
    reserve everywhere) sends one where the engine refuses it."""
    workload, cluster = _decode_then_long_prompts(seed), _phasor_cluster("ooorro")

    def run(engine):  # type: ignore[no-untyped-def]
        policy = make_policy("phasor", defrag=False)
        return simulate(workload, cluster, policy, slo=SLO, tick_s=0.01, engine=engine)

    python = _on_both_engines(run, no_fallback)
    assert (python.requests["status"] == "finished").all()
    assert _migrated_onto_reserving(python, cluster)
    reset = Phasor._reset

    def blind(self, cluster):  # type: ignore[no-untyped-def]
        reset(self, cluster)
        self._reserving = np.zeros_like(self._reserving)

    with mock.patch.object(Phasor, "_reset", blind), pytest.raises(PolicyDecisionError):
        run("python")
