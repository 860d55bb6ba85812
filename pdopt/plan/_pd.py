"""``solve_pd_sizing``: capacities, MILP, and an explanation when no plan exists."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import cvxpy as cp

from pdopt._validation import check_int_at_least, check_one_of, check_positive
from pdopt.errors import InfeasiblePlanError
from pdopt.plan._demand import Demand
from pdopt.plan._sizing import OBJECTIVES, PdSizingPlan, build_pd_sizing, set_limits, solve_built
from pdopt.plan._solve import DEFAULT_TIME_LIMIT_S
from pdopt.plan._workers import WorkerCapacity, WorkerOption, worker_capacity

UNCONSTRAINED_MAX_GPUS = 1_000_000
"""Beyond this lower bound on GPUs (:func:`gpus_lower_bound`) an infeasibility states the
bound instead of solving the unconstrained plan (a rate of 1e300 req/s would hand HiGHS
coefficients it cannot solve)."""


class SizingInfeasibleError(InfeasiblePlanError):
    """No sizing meets the demand; ``binding`` names the constraint, ``closest`` the nearest plan
    (``None`` when no plan serves any traffic) and ``closest_slo_s`` a relaxed SLO if that is
    what it takes (``None`` otherwise)."""

    def __init__(
        self,
        message: str,
        binding: str,
        closest: PdSizingPlan | None,
        closest_slo_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.binding = binding
        self.closest = closest
        self.closest_slo_s = closest_slo_s
        self.unconstrained: PdSizingPlan | None = None
        """The cheapest plan without GPU limits, when the inventory binds (else None)."""


def capacities_for(
    options: Sequence[WorkerOption],
    demand: Demand,
    max_gpus: int | None = None,
    inventory: Mapping[str, float] | None = None,
) -> tuple[WorkerCapacity, ...]:
    """:func:`~pdopt.plan.worker_capacity` of every option, each prefill grid capped by the
    workers ``max_gpus`` and the option's GPU ``inventory`` allow (no plan has more).

    NOTE: the cap keeps the grid, and so the bisection over pool sizes, within the limits: at
    an extreme rate (10^6 req/s and beyond) the uncapped grid would reach the pool the rate
    needs, however large.
    """
    limits = {k.lower(): v for k, v in (inventory or {}).items()}
    out = []
    for o in options:
        gpus = min(math.inf if max_gpus is None else max_gpus, limits.get(o.gpu.lower(), math.inf))
        out.append(
            worker_capacity(o, demand, None if math.isinf(gpus) else max(1, int(gpus) // o.tp))
        )
    return tuple(out)


def solve_pd_sizing(
    demand: Demand,
    options: Sequence[WorkerOption],
    *,
    inventory: Mapping[str, int] | None = None,
    max_gpus: int | None = None,
    objective: str = "min_cost",
    budget_per_hour: float | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> PdSizingPlan:
    """The cheapest P/D(/Mixed) sizing meeting ``demand`` (or the most goodput under a budget).

    Parameters
    ----------
    demand : Demand
        Rate, burstiness (arrival SCV), lengths, TTFT/TPOT SLOs and an optional peak (which
        adds a Mixed pool to the decisions).
    options : sequence of WorkerOption
        Candidate GPU type × TP workers (:func:`~pdopt.plan.worker_options`).
    inventory : mapping GPU name -> int, optional
        Most GPUs of each type; absent types are unlimited.
    max_gpus : int, optional
        Most GPUs in all.
    objective : ``"min_cost"`` or ``"max_goodput"``
        ``max_goodput`` maximises the served rate (<= ``demand.rate_per_s``) under
        ``budget_per_hour`` (USD/h) and the GPU limits, cheapest among equals.

    Returns
    -------
    PdSizingPlan

    Raises
    ------
    SizingInfeasibleError
        (``min_cost``) naming the binding constraint and the closest plan: the most goodput
        within the limits, or the smallest SLO any worker meets.

    Examples
    --------
    >>> import numpy as np
    >>> from pdopt.plan import Demand, solve_pd_sizing, worker_options
    >>> d = Demand(20.0, np.full(64, 1024.0), np.full(64, 256.0), 0.5, 0.05)
    >>> plan = solve_pd_sizing(d, worker_options(["A100-80GB"], "Llama-3-8B", tps=[1]))
    >>> (plan.status, plan.workers("prefill") > 0, plan.workers("decode") > 0)
    ('optimal', True, True)
    """
    check_one_of(objective, OBJECTIVES, "objective", "solve_pd_sizing")
    if not options:
        raise InfeasiblePlanError("no worker options: give at least one GPU type and TP degree")
    if max_gpus is not None:
        check_int_at_least(max_gpus, 1, "max_gpus", "solve_pd_sizing")
    if budget_per_hour is not None:
        check_positive(budget_per_hour, "budget_per_hour", "solve_pd_sizing")
    caps = capacities_for(options, demand, max_gpus, inventory)
    plan = _solve(caps, demand, inventory, max_gpus, objective, budget_per_hour, time_limit_s)
    if plan.is_ok or objective == "max_goodput":
        return plan
    raise explain_infeasible(caps, demand, inventory, max_gpus, time_limit_s)


def _solve(
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    inventory: Mapping[str, int] | None,
    max_gpus: int | None,
    objective: str,
    budget_per_hour: float | None,
    time_limit_s: float,
) -> PdSizingPlan:
    problem = build_pd_sizing(
        caps, peak_rate_per_s=demand.peak_rate_per_s, objective=objective, mixed=demand.has_peak,
        max_gpus_bound=math.inf if max_gpus is None else max_gpus, inventory_bound=inventory,
    )  # fmt: skip
    set_limits(
        problem, caps, rate_per_s=demand.rate_per_s, peak_rate_per_s=demand.peak_rate_per_s,
        inventory=inventory, max_gpus=max_gpus, budget_per_hour=budget_per_hour,
    )  # fmt: skip
    return solve_built(problem, caps, objective, time_limit_s)


def _slo_text(demand: Demand) -> str:
    q = f"P{demand.ttft_quantile * 100:g}"
    return f"{q} TTFT <= {demand.ttft_slo_s:g} s and TPOT <= {demand.tpot_slo_s * 1e3:g} ms"


def _limits_text(inventory: Mapping[str, int] | None, max_gpus: int | None) -> str:
    parts = [f"{k}={v}" for k, v in (inventory or {}).items()]
    if max_gpus is not None:
        parts.append(f"<= {max_gpus} GPUs in all")
    return ", ".join(parts) if parts else "no GPU limit"


def explain_infeasible(
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    inventory: Mapping[str, int] | None,
    max_gpus: int | None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> SizingInfeasibleError:
    """Why no sizing exists, checked in order: KV, the TTFT SLO, the TPOT SLO, the GPU limits."""
    head = f"no plan serves {demand.rate_per_s:g} req/s with {_slo_text(demand)}"
    fit = [c for c in caps if c.fits]
    if not fit:
        best = max(caps, key=lambda c: c.option.kv_capacity_tokens)
        peak = math.ceil(demand.peak_kv_tokens(best.option.model))
        return SizingInfeasibleError(
            f"{head}: binding: KV capacity: the longest request needs {peak} KV tokens but the "
            f"largest option, {best.option.name}, holds {best.option.kv_capacity_tokens:.0f}; "
            "add a larger TP degree or GPU type",
            "kv_capacity", None,
        )  # fmt: skip
    if all(c.prefill_rate_per_worker[0] <= 0 for c in fit):
        best = min(fit, key=lambda c: c.idle_ttft_s)
        relaxed_slo = best.idle_ttft_s * 1.25
        closest = _plan_at(fit, demand.with_slo(ttft_slo_s=relaxed_slo), inventory, max_gpus,
                           time_limit_s)  # fmt: skip
        tail = ""
        if closest is not None:
            tail = (
                f"; the closest: TTFT <= {relaxed_slo:.3g} s serves "
                f"{closest.served_rate_per_s:.4g} req/s with {closest.describe()}"
            )
        return SizingInfeasibleError(
            f"{head}: binding: TTFT SLO: even an idle worker misses it; the fastest option, "
            f"{best.option.name}, has P{demand.ttft_quantile * 100:g} prefill time "
            f"{best.idle_ttft_s:.3g} s alone, so the SLO must exceed that (plus queueing)" + tail,
            "ttft_slo", closest, relaxed_slo,
        )  # fmt: skip
    if all(c.decode_rate_per_worker <= 0 for c in fit):
        tau1 = min(_tau_one(c, demand) for c in fit)
        return SizingInfeasibleError(
            f"{head}: binding: TPOT SLO: a decode iteration of one request already takes "
            f"{tau1 * 1e3:.3g} ms at the mean context on the fastest option; the closest is "
            f"TPOT <= {tau1 * 1.25 * 1e3:.3g} ms",
            "tpot_slo", None, tau1,
        )  # fmt: skip
    return _limits_bind(fit, demand, inventory, max_gpus, time_limit_s, head)


def _tau_one(cap: WorkerCapacity, demand: Demand) -> float:
    model = cap.option.cost.decode
    return float(model.iteration_time_s(1, demand.decode_context_tokens))


def _plan_at(
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    inventory: Mapping[str, int] | None,
    max_gpus: int | None,
    time_limit_s: float,
) -> PdSizingPlan | None:
    options = [c.option for c in caps]
    relaxed = capacities_for(options, demand, max_gpus, inventory)
    plan = _solve(relaxed, demand, inventory, max_gpus, "max_goodput", None, time_limit_s)
    return plan if plan.is_ok and plan.served_rate_per_s > 0 else None


def _limits_bind(
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    inventory: Mapping[str, int] | None,
    max_gpus: int | None,
    time_limit_s: float,
    head: str,
) -> SizingInfeasibleError:
    bound = _servable_bound(caps, inventory, max_gpus)
    within = demand if demand.peak_rate_per_s <= bound else demand.with_rate(
        demand.rate_per_s * bound / demand.peak_rate_per_s
    )  # fmt: skip
    closest = _solve(caps, within, inventory, max_gpus, "max_goodput", None, time_limit_s)
    # NOTE: the unconstrained optimum is solved on capacities computed without any limit:
    # ``caps`` have their prefill grids capped by the inventory, and a plan on a capped grid
    # prices large pools at a small pool's per-worker rate (so the "needs" grew as the
    # inventory shrank: 188 / 52 / 44 GPUs for one demand, issue 37).
    options = [c.option for c in caps]
    least = gpus_lower_bound(options, demand)
    free = None if least > UNCONSTRAINED_MAX_GPUS else unconstrained_plan(options, demand,
                                                                         time_limit_s)  # fmt: skip
    need = f" (without limits a plan needs at least {least:.3g} GPUs)" if free is None else ""
    if free is not None:
        by_type: dict[str, int] = {}
        for c in free.counts:
            by_type[c.gpu] = by_type.get(c.gpu, 0) + c.gpus
        need = (
            " (without limits the cheapest plan needs "
            + ", ".join(f"{g}: {n} GPUs" for g, n in by_type.items())
            + f"; {free.n_gpus} in all)"
        )
    limits = _limits_text(inventory, max_gpus)
    if closest.is_ok and closest.served_rate_per_s > 0:
        share = closest.served_rate_per_s / demand.rate_per_s
        tail = (
            f"; the closest within the limits serves {closest.served_rate_per_s:.4g} req/s "
            f"({share:.0%}): {closest.describe()}"
        )
        best: PdSizingPlan | None = closest
    else:
        tail = "; no plan within the limits serves any traffic"
        best = None
    error = SizingInfeasibleError(
        f"{head} within the GPU limits ({limits}): binding: GPU inventory{need}{tail}",
        "inventory", best,
    )  # fmt: skip
    error.unconstrained = free
    return error


def gpus_lower_bound(options: Sequence[WorkerOption], demand: Demand) -> float:
    """Fewest GPUs any plan for ``demand`` over ``options`` could have: the peak rate times the
    fewest GPU-seconds a request takes, its prefill at full utilisation (``tp · E[S]``, no
    queueing) plus its decode at the option's decode rate per worker. Cheap (no pool grid, no
    MILP): a guard against demand no plan of a sensible size serves.
    """
    prefill, decode = math.inf, math.inf
    for cap in capacities_for(options, demand, max_gpus=1):
        if not cap.fits:
            continue
        service = demand.prefill_service_s(cap.option.cost.prefill)
        prefill = min(prefill, cap.option.tp * float(service.mean()))
        if cap.decode_rate_per_worker > 0:
            decode = min(decode, cap.option.tp / cap.decode_rate_per_worker)
    return demand.peak_rate_per_s * (prefill + decode)


def unconstrained_plan(
    options: Sequence[WorkerOption], demand: Demand, time_limit_s: float = DEFAULT_TIME_LIMIT_S
) -> PdSizingPlan | None:
    """The cheapest plan for ``demand`` over ``options`` with no GPU limit at all (None when
    there is none): one answer for one demand, whatever inventory a caller was held to."""
    caps = capacities_for(options, demand)
    plan = _solve(caps, demand, None, None, "min_cost", None, time_limit_s)
    return plan if plan.is_ok else None


def _servable_bound(
    caps: Sequence[WorkerCapacity], inventory: Mapping[str, int] | None, max_gpus: int | None
) -> float:
    """Twice the most req/s any plan within the limits could serve (inf when a GPU type is
    unlimited and so is the total): each GPU at its option's best per-GPU rate."""
    limits = {k.lower(): float(v) for k, v in (inventory or {}).items()}
    per_gpu: dict[str, float] = {}
    for c in caps:
        rate = max(max(c.prefill_rate_per_worker), c.decode_rate_per_worker) / c.option.tp
        per_gpu[c.option.gpu.lower()] = max(per_gpu.get(c.option.gpu.lower(), 0.0), rate)
    by_types = sum(limits.get(g, math.inf) * r for g, r in per_gpu.items() if r > 0)
    in_all = math.inf if max_gpus is None else max_gpus * max(per_gpu.values(), default=0.0)
    # NOTE: the "closest" solve runs at a rate clipped to this bound, which no plan within the
    # limits reaches, so the answer is unchanged while HiGHS never sees a rate like 1e300.
    return 2.0 * float(min(by_types, in_all))


def closest_ttft_slo_s(
    demand: Demand,
    options: Sequence[WorkerOption],
    *,
    inventory: Mapping[str, int] | None = None,
    max_gpus: int | None = None,
    steps: int = 10,
) -> float:
    """Smallest TTFT SLO (to ~``2^-steps`` relative) a plan within the limits meets at the
    demand's rate; ``inf`` if none does even at 64× the given SLO."""
    lo, hi = 0.0, demand.ttft_slo_s
    for _ in range(7):
        if _feasible(demand.with_slo(ttft_slo_s=hi), options, inventory, max_gpus):
            break
        lo, hi = hi, hi * 2.0
    else:
        return math.inf
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if _feasible(demand.with_slo(ttft_slo_s=mid), options, inventory, max_gpus):
            hi = mid
        else:
            lo = mid
    return hi


def _feasible(
    demand: Demand,
    options: Sequence[WorkerOption],
    inventory: Mapping[str, int] | None,
    max_gpus: int | None,
) -> bool:
    caps = capacities_for(options, demand, max_gpus, inventory)
    plan = _solve(caps, demand, inventory, max_gpus, "min_cost", None, DEFAULT_TIME_LIMIT_S)
    return plan.status == cp.OPTIMAL
