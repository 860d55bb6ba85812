"""Should I disaggregate at all? The deployment modes side by side, each verified by simulation
(issue 17, item 7).

For the same workload and SLOs: colocated serving with prefill-first batches (vLLM-style) and
with chunked hybrid batches (Sarathi-style), and EcoServe-style partial disaggregation (each
instance alternates prefill and decode phases, macro instances stagger them), all on ``n``
identical Mixed workers of one option, beside the full P/D plan. For each colocated mode the
smallest ``n`` whose simulation meets the SLOs (the same verdict as the P/D plan's:
:meth:`pdopt.plan.PlanCheck.meets`) is found by doubling or halving from a start, then
bisection, assuming more workers never hurt; every count tried is simulated on the whole
workload. Given several draws of the workload (as :func:`pdopt.plan.solve_verified`), a count
meets only if every draw meets: draws run in order (draw ``i`` with seed ``seed + i``) and a
count stops at its first draw that misses.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pdopt.cluster import ClusterSpec, LinkSpec, Role, Slo, build_cluster, worker_spec
from pdopt.parallel import DaskTarget, open_runs
from pdopt.plan._demand import Demand
from pdopt.plan._predict import PlanPrediction
from pdopt.plan._verify import PlanCheck, option_gpu, summarise_run
from pdopt.plan._workers import WorkerOption
from pdopt.scenario import Scenario
from pdopt.workload import Workload

COLOCATED_MODES: tuple[tuple[str, str], ...] = (
    ("colocated, prefill-first (vLLM)", "vllm"),
    ("colocated, chunked prefill (Sarathi)", "sarathi"),
    ("partial disaggregation (EcoServe)", "ecoserve"),
)
"""(mode, registered policy) of the colocated deployments compared with full P/D."""

_UNPREDICTED = PlanPrediction(False, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan,
                              math.nan)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One deployment mode sized by simulation: ``workers`` of ``option`` (``gpus`` GPUs),
    USD per hour and per 1,000 requests at the offered rate, and the check of the smallest
    count that meets the SLOs (or of the largest tried, when none does: ``meets`` False).

    ``check`` is that count's binding draw (``binding_draw``: the one furthest past, or
    closest to, an SLO) among the ``draws_run`` it ran, of which ``draws_met`` met; ``draws``
    is how many were given (a count that meets ran them all)."""

    mode: str
    policy: str
    option: str
    workers: int
    gpus: int
    cost_per_hour: float
    cost_per_1k_requests: float
    meets: bool
    check: PlanCheck
    simulations: int
    wall_s: float
    draws: int = 1
    draws_run: int = 1
    draws_met: int = 1
    binding_draw: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["check"] = self.check.to_dict()
        return out


def colocated_cluster(option: WorkerOption, workers: int, kv_bytes_per_token: float) -> ClusterSpec:
    """``workers`` Mixed workers of ``option`` (KV in blocks of
    :data:`pdopt.cluster.DEFAULT_BLOCK_TOKENS`, its ``max_running``, its GPUs' power), built
    as the P/D check's (:func:`pdopt.cluster.build_cluster`)."""
    gpu = option_gpu(option.gpu)
    specs = [
        worker_spec(
            f"m-{option.name.replace('/', '-')}-{i}",
            Role.MIXED,
            option.cost,
            kv_tokens=option.kv_capacity_tokens,
            gpu=gpu,
            tp=option.tp,
            max_running=option.max_running,
        )
        for i in range(workers)
    ]
    window = None if option.model is None else option.model.max_context_tokens
    return build_cluster(specs, kv_bytes_per_token, link=LinkSpec.nvlink(),
                         max_context_tokens=window)  # fmt: skip


def smallest_meeting(meets: Callable[[int], bool], start: int, most: int) -> int | None:
    """Smallest ``n`` in ``[1, most]`` with ``meets(n)``, assuming ``meets`` is monotone
    (doubling or halving from ``start``, then bisection); None when ``meets(most)`` fails."""
    n = min(max(1, start), most)
    if meets(n):
        hi = n
        lo = 0
        while hi > 1:
            probe = hi // 2
            if not meets(probe):
                lo = probe
                break
            hi = probe
    else:
        lo = n
        while True:
            if lo >= most:
                return None
            hi = min(2 * lo, most)
            if meets(hi):
                break
            lo = hi
    while hi - lo > 1:  # invariant: lo fails (or is 0), hi meets
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


def mode_scenario(
    policy: str,
    option: WorkerOption,
    workers: int,
    demand: Demand,
    workload: Workload,
    kv_bytes_per_token: float,
    seed: int,
) -> Scenario:
    """The simulation of ``workers`` Mixed ``option`` workers under ``policy`` (what a mode's
    check runs, and what ``pdopt plan --out`` writes when a mode is recommended)."""
    cluster = colocated_cluster(option, workers, kv_bytes_per_token)
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)
    return Scenario(workload, cluster, policy, slo, seed=seed, record_timeseries=False)


def _mode_check(job: tuple[Scenario, float, float]) -> PlanCheck:
    """One draw of a mode's count: ``(scenario, quantile, rate)`` run and summarised, with no
    analytic prediction (module level, so a Dask worker can run it)."""
    scenario, quantile, rate = job
    t0 = time.perf_counter()
    result = scenario.run()
    wall = time.perf_counter() - t0
    return summarise_run(result, _UNPREDICTED, quantile, rate, wall, scenario.policy_name)


def size_colocated(
    mode: str,
    policy: str,
    option: WorkerOption,
    demand: Demand,
    workload: Workload | Sequence[Workload],
    kv_bytes_per_token: float,
    *,
    start: int,
    most: int,
    seed: int = 0,
    dask: DaskTarget = None,
) -> ModeResult:
    """The smallest count of ``option`` Mixed workers under ``policy`` meeting the SLOs on
    every draw of ``workload`` (one workload is one draw; draw ``i`` runs with seed
    ``seed + i``).

    ``dask`` (None, ``"local"``, a scheduler address or an open :class:`pdopt.parallel.Runs`)
    runs a count's draws at once on a Dask cluster; the checks after a count's first miss are
    dropped, so the result is the serial one (``simulations`` counts the kept checks)."""
    draws = (workload,) if isinstance(workload, Workload) else tuple(workload)
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)
    checks: dict[int, list[PlanCheck]] = {}
    began = time.perf_counter()
    q, rate = demand.ttft_quantile, demand.rate_per_s
    with open_runs(dask) as runs:

        def meets(n: int) -> bool:
            if n not in checks:
                checks[n] = []
                jobs = [
                    (mode_scenario(policy, option, n, demand, draw, kv_bytes_per_token,
                                   seed + i), q, rate)
                    for i, draw in enumerate(draws)
                ]  # fmt: skip
                done: Iterator[PlanCheck] = (
                    iter(runs.map(_mode_check, jobs))
                    if runs.client is not None
                    else (_mode_check(job) for job in jobs)  # lazy: a miss stops the runs
                )
                for check in done:
                    checks[n].append(check)
                    if not check.meets(slo):
                        break  # one draw that misses settles the count
            return all(c.meets(slo) for c in checks[n]) and len(checks[n]) == len(draws)

        best = smallest_meeting(meets, start, most)
    n = best if best is not None else max(checks)
    ran = checks[n]
    binding = max(range(len(ran)), key=lambda i: ran[i].slo_excess(slo))
    price = option.price_per_hour * n
    per_1k = price / (demand.rate_per_s * 3600.0) * 1000.0
    return ModeResult(
        mode, policy, option.name, n, n * option.tp, price, per_1k, best is not None,
        ran[binding], sum(len(c) for c in checks.values()), time.perf_counter() - began,
        len(draws), len(ran), sum(c.meets(slo) for c in ran), binding,
    )  # fmt: skip
