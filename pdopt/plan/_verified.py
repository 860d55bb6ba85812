"""Verified sizing: size by MILP, simulate, correct the capacities from the simulation, re-solve.

The queueing capacities (:mod:`pdopt.plan._workers`) are first-order models; bursty, heavy-tailed
traffic can make a plan that the model accepts miss its SLOs in simulation (issue 17). Each
iteration simulates the plan on the whole workload (and, with a forecast peak, at the peak rate
with the Mixed pool promoted); when a stage misses, every option's per-worker capacity of that
stage is multiplied by ``clip(slo / simulated quantile, 0.5, 0.9)`` (the model's error is taken
to be common to all options) and the MILP is solved again, until the simulation meets the SLOs,
the GPU limits leave no plan, or ``max_iterations`` simulations have run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdopt.plan._demand import Demand
from pdopt.plan._pd import _solve, capacities_for, explain_infeasible
from pdopt.plan._predict import predict_plan
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._solve import DEFAULT_TIME_LIMIT_S
from pdopt.plan._verify import DEFAULT_POLICY, PlanCheck, check_scenario, scenario_for_plan
from pdopt.plan._workers import WorkerCapacity, WorkerOption
from pdopt.scenario import Scenario
from pdopt.sim import Slo
from pdopt.workload import Workload

DEFAULT_MAX_ITERATIONS = 6
"""Simulations at most before a plan that still misses is reported as a miss."""

_STEP_BOUNDS = (0.5, 0.9)  # each correction removes 10% to 50% of a stage's modelled capacity
_MAX_RESOLVES = 12  # derating steps tried for one correction before the plan must change


@dataclass(frozen=True, slots=True)
class Iteration:
    """One sized-and-simulated plan: the capacity factors it was sized with (1 = the model's
    capacities), its check at the mean rate and, with a peak, at the peak rate."""

    plan: PdSizingPlan
    prefill_factor: float
    decode_factor: float
    check: PlanCheck
    peak_check: PlanCheck | None
    meets: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(), "prefill_factor": self.prefill_factor,
            "decode_factor": self.decode_factor, "meets": self.meets,
            "check": self.check.to_dict(),
            "peak_check": None if self.peak_check is None else self.peak_check.to_dict(),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class VerifiedPlan:
    """The outcome of :func:`solve_verified`.

    ``meets`` is the verdict of the last iteration; ``stop`` says why the loop ended
    (``"meets"``, ``"inventory"``: no plan within the GPU limits at the corrected capacities,
    ``"max_iterations"``); ``scenario`` is the last iteration's mean-rate simulation (what
    ``pdopt plan --out`` writes).
    """

    iterations: tuple[Iteration, ...]
    stop: str
    scenario: Scenario
    slo: Slo

    @property
    def final(self) -> Iteration:
        return self.iterations[-1]

    @property
    def meets(self) -> bool:
        return self.final.meets

    def verdict(self) -> str:
        """``"meets: …"`` or ``"MISSES: … (by …)"``, each simulated quantile beside its SLO."""
        checks = [("mean rate", self.final.check), ("peak", self.final.peak_check)]
        met, missed = [], []
        for label, check in checks:
            if check is None:
                continue
            q = f"P{check.quantile * 100:g}"
            for metric, value, slo in (
                ("TTFT", check.sim_ttft_q_s, self.slo.ttft_s),
                ("TPOT", check.sim_tpot_q_s, self.slo.tpot_s),
            ):
                if math.isnan(value):
                    continue
                text = f"{label} {q} {metric} {_s(value)}"
                if value > slo:
                    missed.append(f"{text} > {_s(slo)} (by {_s(value - slo)})")
                else:
                    met.append(f"{text} <= {_s(slo)}")
        if not missed:
            return "meets the SLOs in simulation: " + ", ".join(met)
        why = {"inventory": "the GPU limits allow no larger plan",
               "max_iterations": "iteration limit reached"}[self.stop]  # fmt: skip
        return f"MISSES the SLOs in simulation: {'; '.join(missed)} ({why})"


def _s(seconds: float) -> str:
    return "inf s" if math.isinf(seconds) else f"{seconds:.3g} s"


def derate(
    caps: Sequence[WorkerCapacity], prefill: float, decode: float
) -> tuple[WorkerCapacity, ...]:
    """Capacities with every prefill rate × ``prefill`` and every decode rate × ``decode``."""
    return tuple(
        dataclasses.replace(
            c,
            prefill_rate_per_worker=tuple(r * prefill for r in c.prefill_rate_per_worker),
            decode_rate_per_worker=c.decode_rate_per_worker * decode,
        )
        for c in caps
    )


def solve_verified(
    demand: Demand,
    options: Sequence[WorkerOption],
    workload: Workload,
    kv_bytes_per_token: float,
    *,
    inventory: Mapping[str, int] | None = None,
    max_gpus: int | None = None,
    seed: int = 0,
    policy: str = DEFAULT_POLICY,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> VerifiedPlan:
    """The cheapest plan whose own simulation meets the SLOs (module docstring).

    Raises
    ------
    SizingInfeasibleError
        When even the model's capacities admit no plan (as :func:`~pdopt.plan.solve_pd_sizing`).
    """
    caps = capacities_for(options, demand, max_gpus, inventory)
    plan = _solve(caps, demand, inventory, max_gpus, "min_cost", None, time_limit_s)
    if not plan.is_ok:
        raise explain_infeasible(caps, demand, inventory, max_gpus, time_limit_s)
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)
    factors = (1.0, 1.0)
    iterations: list[Iteration] = []
    while True:
        it, scenario = _iterate(plan, caps, demand, workload, kv_bytes_per_token, seed, policy,
                                factors, slo)  # fmt: skip
        iterations.append(it)
        if it.meets:
            return VerifiedPlan(tuple(iterations), "meets", scenario, slo)
        if len(iterations) >= max_iterations:
            return VerifiedPlan(tuple(iterations), "max_iterations", scenario, slo)
        nxt = _resolve(it, caps, demand, inventory, max_gpus, time_limit_s)
        if nxt is None:
            return VerifiedPlan(tuple(iterations), "inventory", scenario, slo)
        plan, factors = nxt


def _iterate(
    plan: PdSizingPlan,
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    workload: Workload,
    kv_bytes: float,
    seed: int,
    policy: str,
    factors: tuple[float, float],
    slo: Slo,
) -> tuple[Iteration, Scenario]:
    predicted = predict_plan(plan, caps, demand)
    scenario = scenario_for_plan(plan, caps, demand, workload, kv_bytes, policy=policy, seed=seed)
    check = check_scenario(scenario, predicted, demand.ttft_quantile, demand.rate_per_s)
    peak = None
    if demand.has_peak:
        peak_sc = scenario_for_plan(
            plan, caps, demand, workload, kv_bytes, policy=policy, seed=seed, peak=True
        )
        peak = check_scenario(peak_sc, predicted, demand.ttft_quantile, demand.peak_rate_per_s)
    meets = check.meets(slo) and (peak is None or peak.meets(slo))
    return Iteration(plan, factors[0], factors[1], check, peak, meets), scenario


def _step(value: float, slo: float) -> float:
    """The capacity factor of a stage whose simulated quantile is ``value`` against ``slo``."""
    if math.isnan(value) or value <= slo:
        return 1.0
    return min(max(slo / value, _STEP_BOUNDS[0]), _STEP_BOUNDS[1])


def _resolve(
    it: Iteration,
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    inventory: Mapping[str, int] | None,
    max_gpus: int | None,
    time_limit_s: float,
) -> tuple[PdSizingPlan, tuple[float, float]] | None:
    """The next plan (it must differ from ``it.plan``) and its factors, or None if none fits."""
    checks = [c for c in (it.check, it.peak_check) if c is not None]
    step_p = min(_step(c.sim_ttft_q_s, demand.ttft_slo_s) for c in checks)
    step_d = min(_step(c.sim_tpot_q_s, demand.tpot_slo_s) for c in checks)
    fp, fd = it.prefill_factor, it.decode_factor
    for _ in range(_MAX_RESOLVES):
        fp, fd = fp * step_p, fd * step_d
        plan = _solve(derate(caps, fp, fd), demand, inventory, max_gpus, "min_cost", None,
                      time_limit_s)  # fmt: skip
        if not plan.is_ok:
            return None
        if plan.counts != it.plan.counts:
            return plan, (fp, fd)
    return None
