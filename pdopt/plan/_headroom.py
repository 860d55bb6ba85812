"""Headroom of a verified plan: the largest load factor at which it still meets its SLOs in
simulation, found by a crossing (issue 37, "headroom").

Every draw's arrivals are compressed by a factor ``f`` (``f`` × the offered rate, the same
requests); the plan meets at ``f`` when every draw meets at the mean rate (a Mixed reserve is
not promoted: headroom is the base pools'). The search steps up from 1 (1.25, 1.5, 2, 3, 4) to
the first factor that misses, then bisects between the last that met and it, to ``tolerance``
(relative). Meeting is taken as monotone in the load, as the capacity search does; a simulated
tail is noisy, so the factor is a crossing on these draws, not a guarantee.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdopt.cluster import Slo
from pdopt.plan._demand import Demand
from pdopt.plan._predict import predict_plan
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._verify import DEFAULT_POLICY, check_scenario, scenario_for_plan
from pdopt.plan._workers import WorkerCapacity
from pdopt.workload import Workload

STEPS = (1.25, 1.5, 2.0, 3.0, 4.0)
"""Load factors tried upward before the bisection."""


@dataclass(frozen=True, slots=True)
class Headroom:
    """``met``: the largest factor found that meets on every draw (1.0 when only the offered
    load was known to meet); ``missed``: the smallest that misses (None when even the last step
    meets: the headroom is at least ``met``); ``simulations`` run."""

    met: float
    missed: float | None
    simulations: int

    def describe(self, rate_per_s: float) -> str:
        if self.missed is None:
            return (
                f"meets at {self.met:g}× the offered rate ({self.met * rate_per_s:.4g} req/s) "
                "and beyond: the last factor tried"
            )
        return (
            f"meets up to {self.met:.3g}× the offered rate ({self.met * rate_per_s:.4g} req/s) "
            f"on every draw; misses at {self.missed:.3g}×"
        )


def plan_headroom(
    plan: PdSizingPlan,
    capacities: Sequence[WorkerCapacity],
    demand: Demand,
    draws: Sequence[Workload],
    kv_bytes_per_token: float,
    *,
    seed: int = 0,
    policy: str = DEFAULT_POLICY,
    tolerance: float = 0.05,
    progress: Callable[[], None] | None = None,
) -> Headroom:
    """The load factor at which ``plan`` stops meeting its SLOs (module docstring); draw ``i``
    runs with seed ``seed + i`` as in :func:`pdopt.plan.solve_verified`."""
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)
    predicted = predict_plan(plan, capacities, demand)
    runs = 0

    def meets(factor: float) -> bool:
        nonlocal runs
        for i, draw in enumerate(draws):
            faster = draw.scale_rate(factor)
            scenario = scenario_for_plan(plan, capacities, demand, faster, kv_bytes_per_token,
                                         policy=policy, seed=seed + i)  # fmt: skip
            check = check_scenario(scenario, predicted, demand.ttft_quantile,
                                   demand.rate_per_s * factor)  # fmt: skip
            runs += 1
            if progress is not None:
                progress()
            if not check.meets(slo):
                return False
        return True

    lo, hi = 1.0, None
    for step in STEPS:
        if not meets(step):
            hi = step
            break
        lo = step
    if hi is None:
        return Headroom(lo, None, runs)
    while hi / lo - 1.0 > tolerance:
        mid = (lo * hi) ** 0.5
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return Headroom(lo, hi, runs)
