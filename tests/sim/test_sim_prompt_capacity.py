"""Workers of unequal KV capacity. Prefill routing: while ``route_prefill`` routes a prompt that
some prefill workers cannot hold, ``ClusterView.prefill_workers`` lists only those that can, so
every policy's choice holds it (before, each chose among all of them and the engine refused a
worker too small for the prompt). Phasor's migrations (defragmentation and evacuation): only
where the request can grow to its end. The compiled engine does the same, with identical
results."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest

from pdopt.cluster import ClusterSpec, Role, Slo, WorkerSpec
from pdopt.errors import ConfigError
from pdopt.policies import available_policies, make_policy
from pdopt.policies._baselines import RoundRobin
from pdopt.policies.phasor import Phasor
from pdopt.sim import PolicyDecisionError, simulate
from pdopt.sim._simulate import _compiled_codes
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import COST, check_both_engines

SMALL, BIG = 100, 1000
"""KV blocks of the small and the big workers (16-token blocks: prompts of 1,600 or more
tokens fit only the big ones)."""
SINGLE_ROLE_POLICIES = ("phasor", "splitwise")
"""The policies that run prefill and decode workers only (their pool moves)."""


def _workload(n: int = 60, seed: int = 0) -> Workload:
    """Prompts of 100-2,999 tokens (about half over the small workers' 1,600), short outputs."""
    rng = np.random.default_rng(seed)
    return Workload(
        np.cumsum(rng.exponential(0.05, n)), rng.integers(100, 3000, n), rng.integers(5, 50, n)
    )


def _cluster(layout: str) -> ClusterSpec:
    """``"disaggregated"``: a small and a big prefill worker, two big decode workers; ``"mixed"``:
    one small and two big colocated workers."""
    if layout == "disaggregated":
        workers = (
            WorkerSpec("p_small", Role.PREFILL, COST, kv_capacity_blocks=SMALL),
            WorkerSpec("p_big", Role.PREFILL, COST, kv_capacity_blocks=BIG),
            WorkerSpec("d0", Role.DECODE, COST, kv_capacity_blocks=BIG),
            WorkerSpec("d1", Role.DECODE, COST, kv_capacity_blocks=BIG),
        )
    else:
        workers = (
            WorkerSpec("m_small", Role.MIXED, COST, kv_capacity_blocks=SMALL),
            WorkerSpec("m_big", Role.MIXED, COST, kv_capacity_blocks=BIG),
            WorkerSpec("m_big2", Role.MIXED, COST, kv_capacity_blocks=BIG),
        )
    return ClusterSpec(workers, kv_bytes_per_token=1e5)


CASES = [
    (policy, layout)
    for policy in available_policies()
    for layout in ("disaggregated", "mixed")
    if not (layout == "mixed" and policy in SINGLE_ROLE_POLICIES)
]


@pytest.mark.parametrize(("policy", "layout"), CASES)
def test_every_policy_routes_each_prompt_to_a_worker_that_holds_it(policy, layout, no_fallback):
    workload, cluster = _workload(), _cluster(layout)

    def run(engine):
        return simulate(
            workload, cluster, make_policy(policy), slo=Slo(1.0, 0.1), engine=engine,
            record_timeseries=False,
        )  # fmt: skip

    made = make_policy(policy)
    if _compiled_codes("auto", made, made.traits(), cluster, 10**6) is None:
        result = run("python")  # a disaggregated twin on colocated workers: Python only
    else:
        result = check_both_engines(run, no_fallback)
    assert result is not None
    r = result.requests
    assert r["status"].eq("finished").all()
    capacity = {w.name: w.kv_capacity_blocks for w in cluster.workers}
    blocks = np.array([cluster.kv_blocks(int(t)) for t in r["input_tokens"]])
    held = np.array([capacity[w] for w in r["prefill_worker"]])
    assert (held >= blocks).all()
    assert (blocks > SMALL).sum() > 10  # the narrowing decided those
    if policy != "memory_centric":  # the most free KV: always a big worker here
        assert (held == SMALL).any()  # the small worker still took prompts it holds


@pytest.mark.parametrize("policy", SINGLE_ROLE_POLICIES)
def test_a_single_role_policy_needs_a_worker_left_to_decode(policy):
    """Their pool moves put the Mixed pool's members (mixed workers' default pool) in the
    prefill or decode role: on such workers alone, or beside prefill workers only, the run
    ended with a ValueError from inside the routing (no decode worker left). Beside a decode
    worker, or with the mixed workers in another pool, they run as before."""
    mixed = [WorkerSpec(f"m{i}", Role.MIXED, COST, kv_capacity_blocks=BIG) for i in range(2)]
    prefill = WorkerSpec("p0", Role.PREFILL, COST, kv_capacity_blocks=BIG)
    decode = WorkerSpec("d0", Role.DECODE, COST, kv_capacity_blocks=BIG)
    workload = _workload(40, seed=3)
    for workers in ([*mixed], [prefill, *mixed]):
        with pytest.raises(ConfigError, match=f"policy '{policy}' moves its Mixed pool"):
            simulate(workload, ClusterSpec(tuple(workers), kv_bytes_per_token=1e5),
                     make_policy(policy), slo=Slo(1.0, 0.1))  # fmt: skip
    elsewhere = [dataclasses.replace(w, pool="x") for w in mixed]
    for workers in ([decode, *mixed], [prefill, *elsewhere], [*elsewhere]):
        result = simulate(workload, ClusterSpec(tuple(workers), kv_bytes_per_token=1e5),
                          make_policy(policy), slo=Slo(1.0, 0.1))  # fmt: skip
        assert result.requests["status"].eq("finished").all()


class _Recording(RoundRobin):
    """Round robin that records the prefill workers it is offered, per request."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: dict[int, list[int]] = {}

    def route_prefill(self, request, view):
        self.offered[request.request_id] = view.prefill_workers.tolist()
        return super().route_prefill(request, view)

    def route_decode(self, request, view):
        self.offered[-1 - request.request_id] = view.prefill_workers.tolist()
        return super().route_decode(request, view)


def test_the_view_offers_the_workers_that_hold_the_prompt_during_the_call():
    """Only while ``route_prefill`` routes a prompt some cannot hold: the others see them all;
    a prompt none can hold (over every prefill worker's capacity, within a decode worker's) is
    offered them all and the engine refuses the choice, naming the worker."""
    cluster = _cluster("disaggregated")
    policy = _Recording()
    workload = Workload(np.array([0.0, 0.1]), np.array([200, 2000]), np.array([4, 4]))
    simulate(workload, cluster, policy, slo=Slo(1.0, 0.1), engine="python")
    assert policy.offered == {0: [0, 1], 1: [1], -1: [0, 1], -2: [0, 1]}  # decode: all
    too_big = Workload(np.array([0.0]), np.array([BIG * 16 - 100]), np.array([4]))
    small_prefill = ClusterSpec(
        (
            WorkerSpec("p0", Role.PREFILL, COST, kv_capacity_blocks=SMALL),
            WorkerSpec("p1", Role.PREFILL, COST, kv_capacity_blocks=SMALL),
            WorkerSpec("d0", Role.DECODE, COST, kv_capacity_blocks=BIG),
        ),
        kv_bytes_per_token=1e5,
    )
    policy = _Recording()
    with pytest.raises(PolicyDecisionError, match="cannot hold the"):
        simulate(too_big, small_prefill, policy, slo=Slo(1.0, 0.1), engine="python")
    assert policy.offered == {0: [0, 1]}


def _uneven_decode(seed: int) -> tuple[Workload, ClusterSpec]:
    """Two decode workers with twice the KV of a third, prompts up to 1.3x the small one's
    capacity in tokens and long outputs: Phasor's defragmentation migrates often."""
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(60, 200))
    workers = (
        WorkerSpec("p0", Role.PREFILL, COST, kv_capacity_blocks=2 * cap),
        WorkerSpec("d0", Role.DECODE, COST, kv_capacity_blocks=2 * cap, max_running=8),
        WorkerSpec("d1", Role.DECODE, COST, kv_capacity_blocks=2 * cap, max_running=8),
        WorkerSpec("d_small", Role.DECODE, COST, kv_capacity_blocks=cap, max_running=8),
    )
    n = int(rng.integers(20, 80))
    workload = Workload(
        np.cumsum(rng.exponential(0.02, n)),
        rng.integers(16, int(cap * 16 * 1.3), n),
        rng.integers(5, 400, n),
    )
    return workload, ClusterSpec(workers, kv_bytes_per_token=1e5)


@pytest.mark.parametrize("seed", [8, 9])
def test_phasor_migrates_a_request_only_where_it_can_grow_to_its_end(seed, no_fallback):
    """Its defragmentation took any decode worker with room as a destination, even one whose
    capacity is below the request's peak (the engine refused the Migrate: 135 of 200 such runs
    ended with a PolicyDecisionError); now a plan's best fit picks among the destinations that
    hold each request's peak, the same on both engines, and requests too big for the small
    worker still move between the big ones; without the peaks these runs still stop."""
    workload, cluster = _uneven_decode(seed)

    def run(engine):
        return simulate(
            workload, cluster, make_policy("phasor", delta_t_s=0.01), slo=Slo(1.0, 0.1),
            engine=engine, tick_s=0.01,
        )  # fmt: skip

    result = check_both_engines(run, no_fallback)
    assert result is not None and result.requests["status"].eq("finished").all()
    assert (result.requests["migrations"] > 0).sum() >= 10
    small = cluster.workers[3].kv_capacity_blocks
    assert (_peaks_of_migrated(result) > small).any()  # the one destination rule would not
    with _without_peaks(), pytest.raises(PolicyDecisionError, match="request peak"):
        run("python")


def _peaks_of_migrated(result) -> np.ndarray:
    """Peak KV blocks (16-token blocks of ``input + output − 1``) of the migrated requests."""
    req = result.requests[result.requests["migrations"] > 0]
    return np.ceil((req["input_tokens"] + req["output_tokens"] - 1) / 16).to_numpy()


def _without_peaks():
    """Phasor blind to peaks: every destination seems to hold every request."""
    return mock.patch.object(
        Phasor, "_peak_blocks", lambda self, run: np.zeros(len(run["request_id"]), np.int64)
    )


def _decode_then_prompt_burst(seed: int) -> tuple[Workload, ClusterSpec]:
    """A Mixed-pool member at home on decode beside a big and a half-KV decode worker: first
    short prompts with long outputs (the member decodes), then a burst of longer prompts that
    starves prefill (the member is promoted and its decodes evacuated)."""
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(60, 200))
    workers = (
        WorkerSpec("p0", Role.PREFILL, COST, kv_capacity_blocks=2 * cap),
        WorkerSpec("d0", Role.DECODE, COST, kv_capacity_blocks=2 * cap, max_running=8),
        WorkerSpec("d_small", Role.DECODE, COST, kv_capacity_blocks=cap, max_running=8),
        WorkerSpec(
            "m0", Role.DECODE, COST, kv_capacity_blocks=2 * cap, max_running=8, pool="mixed"
        ),
    )
    n1, n2 = int(rng.integers(20, 50)), int(rng.integers(30, 80))
    arrivals = np.concatenate(
        [np.sort(rng.uniform(0, 1.0, n1)), 3.0 + np.sort(rng.uniform(0, 0.3, n2))]
    )
    inputs = np.concatenate([rng.integers(100, 500, n1), rng.integers(500, 1500, n2)])
    outputs = np.concatenate([rng.integers(cap * 4, cap * 20, n1), rng.integers(5, 100, n2)])
    return Workload(arrivals, inputs, outputs), ClusterSpec(workers, kv_bytes_per_token=1e5)


@pytest.mark.parametrize("seed", [1, 2])
def test_phasor_evacuates_a_request_only_where_it_can_grow_to_its_end(seed, no_fallback):
    """A member promoted to prefill evacuates its decodes (defragmentation off, so these are
    the evacuation's moves) only to destinations that hold each one's peak: the half-KV worker
    takes none of those too big for it, the same on both engines; blind to peaks, the
    evacuation sends one there and the engine refuses it."""
    workload, cluster = _decode_then_prompt_burst(seed)

    def run(engine):
        return simulate(
            workload, cluster, make_policy("phasor", delta_t_s=0.01, defrag=False),
            slo=Slo(1.0, 0.1), engine=engine, tick_s=0.01,
        )  # fmt: skip

    result = check_both_engines(run, no_fallback)
    assert result is not None and result.requests["status"].eq("finished").all()
    moved = result.events[result.events["kind"] == "migration_start"]
    assert len(moved) and moved["worker"].eq("m0").all()  # evacuations only
    assert (_peaks_of_migrated(result) > cluster.workers[2].kv_capacity_blocks).any()
    with _without_peaks(), pytest.raises(PolicyDecisionError, match="request peak"):
        run("python")
