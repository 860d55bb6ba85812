"""The steps of :func:`pdopt.plan.plan_deployment` that are not sizing or verification proper:
refusals that name the knob, the guard on absurd demand, the GPU-type limits, the cheapest
homogeneous plan by the queueing model, the colocated modes compared with full P/D, and step
progress (issue 37, "library first": ``pdopt plan`` only parses, prints and writes).

Messages name both the library parameter and the command's option, so one text serves the
notebook and the command.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from pdopt.errors import ConfigError, ParameterError
from pdopt.model_spec import ModelSpec
from pdopt.parallel import DaskTarget, map_runs, with_compiled_engine
from pdopt.plan._context import OfferedTraffic, rejections_allowed
from pdopt.plan._demand import Demand
from pdopt.plan._modes import COLOCATED_MODES, ModeResult, size_colocated
from pdopt.plan._types import TypeChoice, cheapest_types, type_choices
from pdopt.plan._workers import WorkerCapacity, WorkerOption, prefill_workers_needed
from pdopt.workload import Workload

MAX_SIMULATED_GPUS = 10_000
"""Most GPUs a verified plan may need (by :func:`pdopt.plan._pd.gpus_lower_bound`): the check
simulates every worker request by request; 20,000 workers took minutes (issue 37)."""

Tick = Callable[[], None]
"""Called once per finished unit of a step (a simulation, a mode)."""

Steps = Callable[[str, int, str], AbstractContextManager[Tick]]
"""``steps(description, total, unit)`` opens one long step (the CLI: a progress bar) and yields
the tick its units call."""

T = TypeVar("T")
R = TypeVar("R")


def step_progress(steps: Steps | None, tick: Tick | None) -> Steps:
    """``steps`` when given; else every step ticks ``tick`` (or nothing)."""
    if steps is not None:
        return steps

    @contextlib.contextmanager
    def each(description: str, total: int, unit: str) -> Iterator[Tick]:
        del description, total, unit
        yield tick if tick is not None else (lambda: None)

    return each


def check_traffic(traffic: OfferedTraffic, spec: ModelSpec, quantile: float) -> None:
    """Refuse traffic of which nothing reaches a GPU, or whose requests counted as misses
    (``too_long="miss"``) alone break the SLO quantile, naming the knobs that would help."""
    window = spec.max_context_tokens
    knobs = (
        "plan a model with a longer context window (--model), give the deployment's window if "
        "it serves a longer one (--max-context TOKENS), or say what happens to them: "
        "--too-long truncate (cut to fit) or --too-long drop (plan the others only)"
    )
    if not len(traffic.sized):
        raise ConfigError(
            f"--workload: every request exceeds {spec.name}'s {window:,}-token context window; "
            + knobs.replace(" or --too-long drop (plan the others only)", "")
        )
    if not rejections_allowed(traffic, quantile):
        n, r = traffic.offered, traffic.over_window
        allowed = n - math.ceil(quantile * n - 1e-9)
        raise ConfigError(
            f"--workload: {r:,} of {n:,} requests ({r / n:.1%}) exceed {spec.name}'s "
            f"{window:,}-token context window; each is rejected and counted as a miss "
            f"(--too-long miss), so they alone break the P{quantile * 100:g} SLOs (at most "
            f"{allowed:,} requests may miss): {knobs}"
        )


def fit_hint(spec: ModelSpec, named: str, gpus: Sequence[str], tps: Sequence[int]) -> str:
    """What would make ``spec`` (given as ``named``) fit where no GPU type × TP degree holds it:
    the reason at the largest TP tried, the smallest larger TP at which one GPU type does, and
    FP8 weights where the weights are wider and that is enough."""
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import DTYPE_BYTES, kv_capacity_tokens, with_precision

    def holds(model: ModelSpec, tp: int) -> bool:
        for name in gpus:
            try:
                kv_capacity_tokens(get_gpu(name), model, tp)
            except (ConfigError, ParameterError):
                continue
            return True
        return False

    reason = ""
    try:
        kv_capacity_tokens(get_gpu(gpus[0]), spec, max(tps))
    except (ConfigError, ParameterError) as exc:
        reason = str(exc).split(";")[0].split(". ")[0] + "; "
    ways = []
    node = max(get_gpu(name).gpus_per_node for name in gpus)
    larger = next(
        (t for t in (2, 4, 8, 16, 32, 64) if max(tps) < t <= node and holds(spec, t)), None
    )
    if larger is not None:
        ways.append(f"--tp {larger}")
    if DTYPE_BYTES[spec.dtype] > 1 and any(holds(with_precision(spec, "fp8"), t) for t in tps):
        ways.append(f"FP8 weights (--model {named.partition('@')[0]}@fp8)")
    ways = ways or [
        f"a GPU type with more memory (--gpus): no TP group within one {node}-GPU node holds it "
        "(pdopt models neither multi-node tensor parallelism nor pipeline parallelism)"
    ]
    return f"{reason}try {' or '.join(ways)}"


def _num_text(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.4g}"


def guard_demand(
    demand: Demand,
    options: Sequence[WorkerOption],
    inventory: Mapping[str, float],
    max_gpus: int | None,
    verify: bool,
) -> None:
    """Refuse at once a demand whose plan is beyond what the check can simulate
    (:data:`MAX_SIMULATED_GPUS`); the sizing alone (``verify=False``, ``--no-sim``) takes
    seconds at any rate."""
    from pdopt.plan._pd import gpus_lower_bound

    allowed = sum(inventory.values()) if inventory else math.inf
    if max_gpus is not None:
        allowed = min(allowed, max_gpus)
    if not verify or allowed <= MAX_SIMULATED_GPUS:
        return  # within these limits the sizing answers (or refuses) in seconds
    need = gpus_lower_bound(options, demand)
    if need <= MAX_SIMULATED_GPUS:
        return
    rate = demand.peak_rate_per_s
    share = max(2, math.ceil(need / MAX_SIMULATED_GPUS))
    raise ConfigError(
        f"{_num_text(rate)} req/s needs at least {_num_text(need)} GPUs (each request's prefill "
        "and decode at full utilisation on the most efficient option), beyond the "
        f"{MAX_SIMULATED_GPUS:,} GPUs a plan's simulation covers: plan one of {share:,} "
        f"deployments that share the traffic (--rate {_num_text(demand.rate_per_s / share)}), "
        "or size without the check (--no-sim / verify=False, seconds at any rate)"
    )


def choose_types(
    demand: Demand,
    options: Sequence[WorkerOption],
    limits: Mapping[str, int],
    max_gpu_types: int | None,
    one_type_per_role: bool,
    max_gpus: int | None,
) -> TypeChoice | None:
    """The GPU types per role ``max_gpu_types`` / ``one_type_per_role`` allow, the cheapest
    by the sizing model (None without either limit)."""
    if max_gpu_types is None and not one_type_per_role:
        return None
    types = [o.gpu for o in options]
    choices = type_choices(types, max_gpu_types, one_type_per_role)
    choice = cheapest_types(demand, options, choices, inventory=limits, max_gpus=max_gpus)
    if choice is None:
        named = "--max-gpu-types" if not one_type_per_role else "--one-type-per-role"
        raise ConfigError(
            f"no plan meets the demand with the GPU types {named} allows "
            f"({len(choices)} assignments of {', '.join(dict.fromkeys(types))} tried): "
            f"drop {named} or raise the limits (--gpus, --max-gpus)"
        )
    return choice


def homogeneous_row(cap: WorkerCapacity, demand: Demand) -> dict[str, Any]:
    """One candidate worker's capacities and its cheapest homogeneous plan (analytic)."""
    n_p = prefill_workers_needed(cap, demand.rate_per_s, demand)
    rate_d = cap.decode_rate_per_worker
    n_d = math.ceil(demand.rate_per_s / rate_d * (1 - 1e-9)) if 0 < rate_d < math.inf else 0
    ok = cap.fits and n_p > 0 and (rate_d > 0)
    workers = n_p + n_d
    return {
        "option": cap.option.name, "gpu": cap.option.gpu, "tp": cap.option.tp,
        "expert_parallel": cap.option.expert_parallel,
        "price_per_hour": cap.option.price_per_hour,
        "prefill_rps_per_worker_alone": cap.prefill_rate_per_worker[0],
        "decode_rps_per_worker": rate_d, "decode_batch": cap.decode_batch,
        "decode_limited_by": cap.decode_limited_by, "idle_ttft_s": cap.idle_ttft_s,
        "homogeneous_prefill": n_p if ok else None, "homogeneous_decode": n_d if ok else None,
        "homogeneous_cost_per_hour": workers * cap.option.price_per_hour if ok else None,
    }  # fmt: skip


def cheapest_homogeneous(caps: Sequence[WorkerCapacity], demand: Demand) -> dict[str, Any] | None:
    """The cheapest single-option plan by the exact queueing model (no MILP, no simulation)."""
    rows = [(homogeneous_row(c, demand), c) for c in caps]
    ok = [(r, c) for r, c in rows if r["homogeneous_cost_per_hour"] is not None]
    if not ok:
        return None
    row, cap = min(ok, key=lambda rc: (rc[0]["homogeneous_cost_per_hour"], rc[1].option.tp))
    gpus = (row["homogeneous_prefill"] + row["homogeneous_decode"]) * cap.option.tp
    return {
        "option": row["option"], "prefill": row["homogeneous_prefill"],
        "decode": row["homogeneous_decode"], "gpus": gpus,
        "cost_per_hour": row["homogeneous_cost_per_hour"],
    }  # fmt: skip


def pick_mode(rows: Sequence[tuple[bool, float, int]]) -> int | None:
    """The index of the recommended deployment among ``rows`` (meets, USD/h, GPUs), row 0
    being full P/D: the cheapest that meets on every draw when it is not row 0 and full P/D
    does not meet at that price or less (None: full P/D, or nothing meets)."""
    meeting = [i for i, r in enumerate(rows) if r[0]]
    if not meeting:
        return None
    best = min(meeting, key=lambda i: (rows[i][1], rows[i][2]))
    if best == 0 or (rows[0][0] and rows[best][1] >= rows[0][1]):
        return None
    return best


def run_in_processes(function: Callable[[T], R], jobs: Sequence[T], done: Tick) -> list[R]:
    """``function`` over ``jobs`` in worker processes (in order), or in this one on one core;
    ``done()`` is called as each job finishes. Each process loads the compiled engine first
    (:func:`pdopt.parallel.with_compiled_engine`: a mode's sizing runs are below the size at
    which ``engine="auto"`` would)."""
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        out = []
        for job in jobs:
            out.append(with_compiled_engine(function, job))
            done()
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(with_compiled_engine, function, job) for job in jobs]
        for future in as_completed(futures):
            future.result()
            done()
        return [f.result() for f in futures]


def _size_mode(job: tuple[Any, ...]) -> ModeResult:
    """One mode's sizing (a picklable top-level function for the process pool)."""
    mode, policy, option, demand, workloads, kv_bytes, start, most, seed = job
    return size_colocated(mode, policy, option, demand, workloads, kv_bytes, start=start,
                          most=most, seed=seed)  # fmt: skip


def compare_modes(
    pd_gpus: int,
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    limits: Mapping[str, int],
    max_gpus: int | None,
    served: Sequence[Workload],
    kv_bytes: float,
    seed: int,
    steps: Steps,
    dask: DaskTarget = None,
) -> tuple[tuple[ModeResult, ...], WorkerOption | None]:
    """Each colocated mode (:data:`COLOCATED_MODES`) on the cheapest single option (the
    analytic plan), sized by simulation from the P/D plan's size (``pd_gpus``) on the same
    draws; the results and that option (none when there is no such option). ``dask``
    (:func:`pdopt.parallel.map_runs`) runs the modes on a Dask cluster instead of local
    processes."""
    single = cheapest_homogeneous(caps, demand)
    if single is None:
        return (), None
    option = next(c for c in caps if c.option.name == single["option"]).option
    most = limits.get(option.gpu, 10**6) // option.tp
    if max_gpus is not None:
        most = min(most, max_gpus // option.tp)
    if most < 1:
        return (), None
    # NOTE: every mode starts from the P/D plan's size, so the three searches are independent
    # and run in parallel processes: the wall time is the slowest mode's (EcoServe's, whose
    # policy's tick work dominates its runs), not the sum.
    start = max(1, pd_gpus // option.tp)
    most = max(1, min(most, 4 * start + 8))
    jobs = [(mode, policy, option, demand, list(served), kv_bytes, start, most, seed)
            for mode, policy in COLOCATED_MODES]  # fmt: skip
    with steps("plan --compare-modes: size colocated modes", len(jobs), "mode") as tick:
        if dask is None:
            results = run_in_processes(_size_mode, jobs, tick)
        else:
            results = map_runs(_size_mode, jobs, dask=dask, progress=tick)
    return tuple(results), option
