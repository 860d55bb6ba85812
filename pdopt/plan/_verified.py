"""Verified sizing: size by MILP, simulate, correct the capacities from the simulation, re-solve.

The queueing capacities (:mod:`pdopt.plan._workers`) are first-order models; bursty, heavy-tailed
traffic can make a plan that the model accepts miss its SLOs in simulation (issue 17). Each
iteration simulates the plan on the whole workload (and, with a forecast peak, at the peak rate
with the Mixed pool promoted); when a stage misses, every option's per-worker capacity of that
stage is multiplied by ``clip(slo / simulated quantile, 0.5, 0.9)`` (the model's error is taken
to be common to all options) and the MILP is solved again, until the simulation meets the SLOs,
the GPU limits leave no plan, or ``max_iterations`` simulations have run.

One draw of a generated workload is one sample of its tails: a plan sized close to its SLO can
meet them on one draw and miss on the next (measured: a Llama-3.1-70B plan at P99 TTFT 0.83 s on
seed 0 reached 1.38 s and 2.00 s on seeds 2 and 3). So the check may run several independent
draws (draw ``i`` simulated with seed ``seed + i``): a stage's simulated quantile is the worst
over the draws, a plan meets only if every draw meets, and the correction uses the worst. A
trace is one draw.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdopt.cluster import Slo
from pdopt.errors import ConfigError
from pdopt.parallel import SERIAL, DaskTarget, Runs, open_runs
from pdopt.plan._demand import Demand
from pdopt.plan._minimal import NeighbourTrial, trim
from pdopt.plan._pd import _solve, capacities_for, explain_infeasible
from pdopt.plan._predict import PlanPrediction, predict_plan
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._solve import DEFAULT_TIME_LIMIT_S
from pdopt.plan._types import restrict_roles
from pdopt.plan._verify import DEFAULT_POLICY, PlanCheck, check_scenario, scenario_for_plan
from pdopt.plan._workers import WorkerCapacity, WorkerOption
from pdopt.scenario import Scenario
from pdopt.workload import Workload

DEFAULT_MAX_ITERATIONS = 6
"""Simulations at most before a plan that still misses is reported as a miss."""

_STEP_BOUNDS = (0.5, 0.9)  # each correction removes 10% to 50% of a stage's modelled capacity
_MAX_RESOLVES = 12  # derating steps tried for one correction before the plan must change


@dataclass(frozen=True, slots=True)
class Iteration:
    """One sized-and-simulated plan: the capacity factors it was sized with (1 = the model's
    capacities) and its checks on each draw, at the mean rate and, with a peak, at the peak
    rate.

    ``draw_checks[i]`` (and ``draw_peak_checks[i]``, empty without a peak) is draw ``i``'s;
    ``draw_meets[i]`` whether draw ``i`` meets the SLOs (at the mean rate and the peak);
    ``binding_draw`` is the draw furthest past (or closest to) an SLO, whose checks are
    ``check`` and ``peak_check``; ``meets`` holds when every draw meets.
    """

    plan: PdSizingPlan
    prefill_factor: float
    decode_factor: float
    draw_checks: tuple[PlanCheck, ...]
    draw_peak_checks: tuple[PlanCheck, ...]
    draw_meets: tuple[bool, ...]
    binding_draw: int
    step: str = "milp"

    @property
    def meets(self) -> bool:
        """Every draw meets the SLOs."""
        return all(self.draw_meets)

    @property
    def check(self) -> PlanCheck:
        """The binding draw's check at the mean rate."""
        return self.draw_checks[self.binding_draw]

    @property
    def peak_check(self) -> PlanCheck | None:
        """The binding draw's check at the peak (None without a peak)."""
        return self.draw_peak_checks[self.binding_draw] if self.draw_peak_checks else None

    @property
    def draws_met(self) -> int:
        """How many draws meet the SLOs (at the mean rate and the peak)."""
        return sum(self.draw_meets)

    def worst(self, metric: str, peak: bool = False) -> float:
        """The worst simulated quantile of ``metric`` (``"ttft"`` or ``"tpot"``) over the draws
        (NaN where no request decodes)."""
        checks = self.draw_peak_checks if peak else self.draw_checks
        values = [getattr(c, f"sim_{metric}_q_s") for c in checks]
        values = [v for v in values if not math.isnan(v)]
        return max(values) if values else math.nan

    def to_dict(self) -> dict[str, Any]:
        peak = bool(self.draw_peak_checks)
        return {
            "plan": self.plan.to_dict(), "prefill_factor": self.prefill_factor,
            "decode_factor": self.decode_factor, "meets": self.meets,
            "draws": len(self.draw_checks), "draws_met": self.draws_met,
            "binding_draw": self.binding_draw, "step": self.step,
            "sim_ttft_q_s": _max(self.worst("ttft"), self.worst("ttft", True) if peak else None),
            "sim_tpot_q_s": _max(self.worst("tpot"), self.worst("tpot", True) if peak else None),
            "check": self.check.to_dict(),
            "peak_check": None if self.peak_check is None else self.peak_check.to_dict(),
            "draw_checks": [c.to_dict() for c in self.draw_checks],
            "draw_peak_checks": [c.to_dict() for c in self.draw_peak_checks],
        }  # fmt: skip


def _max(value: float, other: float | None) -> float:
    """The larger of two quantiles, a NaN (nothing decodes) or None (no peak) ignored."""
    values = [v for v in (value, other) if v is not None and not math.isnan(v)]
    return max(values) if values else math.nan


@dataclass(frozen=True, slots=True)
class VerifiedPlan:
    """The outcome of :func:`solve_verified`.

    ``meets`` is the verdict of the last iteration (every draw meets); ``stop`` says why the
    loop ended (``"meets"``, ``"inventory"``: no plan within the GPU limits at the corrected
    capacities, ``"max_iterations"``); ``scenario`` is the last iteration's mean-rate
    simulation of its binding draw (what ``pdopt plan --out`` writes); ``seeds`` the simulation
    seed of each draw; ``draw_requests`` the requests of each draw; ``neighbours`` the smaller
    plans tried after the loop met (:mod:`pdopt.plan._minimal`): an iteration with
    ``step == "trim"`` is one that met and replaced the plan.
    """

    iterations: tuple[Iteration, ...]
    stop: str
    scenario: Scenario
    slo: Slo
    seeds: tuple[int, ...] = (0,)
    draw_requests: tuple[int, ...] = ()
    neighbours: tuple[NeighbourTrial, ...] = ()

    @property
    def final(self) -> Iteration:
        return self.iterations[-1]

    @property
    def meets(self) -> bool:
        return self.final.meets

    def coverage(self) -> str:
        """What the verdict covers: ``"3 of 3 draws of 4,000 requests (seeds 0-2)"``."""
        n, seeds = len(self.seeds), self.seeds
        sizes = sorted(set(self.draw_requests))
        size = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
        named = f"seed {seeds[0]}" if n == 1 else f"seeds {seeds[0]}-{seeds[-1]}"
        draws = "draw" if n == 1 else "draws"
        return f"{self.final.draws_met} of {n} {draws} of {size} requests ({named})"

    def confidence(self) -> tuple[bool, str]:
        """Whether the plan meets with 95% confidence on every draw (each quantile's upper
        confidence bound, :func:`pdopt.plan._verify.quantile_upper_bound`, within its SLO) and
        the sentence that says so; the bound covers the sampling of requests in each run, not
        the cost model's own error."""
        final = self.final
        checks = [*final.draw_checks, *final.draw_peak_checks]
        ok = all(c.meets_confidently(self.slo) for c in checks)
        q = f"P{final.check.quantile * 100:g}"
        parts = []
        for metric, limit in (("ttft", self.slo.ttft_s), ("tpot", self.slo.tpot_s)):
            values = [getattr(c, f"sim_{metric}_q_upper_s") for c in checks]
            values = [v for v in values if not math.isnan(v)]
            if values:
                parts.append(f"{metric.upper()} <= {_s(max(values))} (SLO {_s(limit)})")
        head = "meets" if ok else "does not meet"
        return ok, (
            f"{head} the SLOs with 95% confidence: upper bounds of the {q}s, worst draw: "
            f"{', '.join(parts)}; the sampling of requests only (room for the cost model's own "
            "error: --slo-margin)"
        )

    def verdict(self) -> str:
        """``"meets …"`` or ``"MISSES …"``, each simulated quantile (the worst over the draws)
        beside its SLO, and what the verdict covers (:meth:`coverage`)."""
        final = self.final
        worst = "" if len(self.seeds) == 1 else "; worst draw"
        met, missed = [], []
        for label, peak in (("mean rate", False), ("peak", True)):
            if peak and not final.draw_peak_checks:
                continue
            q = f"P{final.check.quantile * 100:g}"
            for metric, slo in (("TTFT", self.slo.ttft_s), ("TPOT", self.slo.tpot_s)):
                value = final.worst(metric.lower(), peak)
                if math.isnan(value):
                    continue
                text = f"{label} {q} {metric} {_s(value)}"
                if value > slo:
                    missed.append(f"{text} > {_s(slo)} (by {_s(value - slo)})")
                else:
                    met.append(f"{text} <= {_s(slo)}")
        if final.meets:
            return f"meets the SLOs in simulation on {self.coverage()}{worst}: " + ", ".join(met)
        why = {"inventory": "the GPU limits allow no larger plan",
               "max_iterations": "iteration limit reached"}[self.stop]  # fmt: skip
        return f"MISSES the SLOs in simulation (meets on {self.coverage()}){worst}: " + (
            f"{'; '.join(missed)} ({why})"
        )


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
    workload: Workload | Sequence[Workload],
    kv_bytes_per_token: float,
    *,
    inventory: Mapping[str, int] | None = None,
    max_gpus: int | None = None,
    seed: int = 0,
    policy: str = DEFAULT_POLICY,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    progress: Callable[[], None] | None = None,
    minimal: bool = True,
    role_gpus: Mapping[str, Collection[str]] | None = None,
    dask: DaskTarget = None,
) -> VerifiedPlan:
    """The cheapest plan whose own simulation meets the SLOs on every draw (module docstring).

    Parameters
    ----------
    workload : Workload or sequence of Workload
        The workload the plan is checked on, or independent draws of it (e.g. an archetype
        generated with seeds ``seed, seed + 1, …``): draw ``i`` is simulated with seed
        ``seed + i``; a plan meets when every draw meets, and a stage's quantile is the worst
        over the draws. One workload (a trace) is one draw.
    progress : callable, optional
        Called with no argument after each simulation (a progress bar's ``update``); at most
        ``max_iterations × draws`` (twice that with a peak) calls, and one per draw of each
        smaller neighbour tried.
    minimal : bool
        After a plan meets, try its smaller neighbours (one worker fewer in one count) and keep
        the cheapest that meets, until none does (:mod:`pdopt.plan._minimal`).
    role_gpus : mapping role -> GPU types, optional
        Only these GPU types in prefill and in decode (:func:`pdopt.plan._types.restrict_roles`).
    dask : None, "local", a scheduler address, or an open :class:`pdopt.parallel.Runs`
        Run each iteration's draws (and peak checks) on a Dask cluster
        (:func:`pdopt.parallel.map_runs`): the same plan and checks as serially (each draw has
        its own seed); a smaller neighbour's draws then all run, where serially they stop at
        the first miss (the verdict is the same).

    Raises
    ------
    SizingInfeasibleError
        When even the model's capacities admit no plan (as :func:`~pdopt.plan.solve_pd_sizing`).
    """
    draws = (workload,) if isinstance(workload, Workload) else tuple(workload)
    if not draws:
        raise ConfigError("solve_verified needs at least one workload draw")
    seeds = tuple(seed + i for i in range(len(draws)))
    caps = restrict_roles(capacities_for(options, demand, max_gpus, inventory), role_gpus)
    plan = _solve(caps, demand, inventory, max_gpus, "min_cost", None, time_limit_s)
    if not plan.is_ok:
        raise explain_infeasible(caps, demand, inventory, max_gpus, time_limit_s)
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)
    with open_runs(dask) as runs:
        return _loop(plan, caps, demand, draws, kv_bytes_per_token, seeds, policy, slo,
                     inventory, max_gpus, max_iterations, time_limit_s, progress, minimal,
                     runs)  # fmt: skip


def _loop(
    plan: PdSizingPlan,
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    draws: Sequence[Workload],
    kv_bytes_per_token: float,
    seeds: tuple[int, ...],
    policy: str,
    slo: Slo,
    inventory: Mapping[str, int] | None,
    max_gpus: int | None,
    max_iterations: int,
    time_limit_s: float,
    progress: Callable[[], None] | None,
    minimal: bool,
    runs: Runs,
) -> VerifiedPlan:
    """:func:`solve_verified`'s size-simulate-correct loop, its simulations run by ``runs``."""
    factors = (1.0, 1.0)
    iterations: list[Iteration] = []
    sizes = tuple(len(d) for d in draws)
    while True:
        it, scenario = _iterate(plan, caps, demand, draws, kv_bytes_per_token, seeds, policy,
                                factors, slo, progress, runs=runs)  # fmt: skip
        iterations.append(it)
        stop = "meets" if it.meets else "max_iterations"
        if it.meets and minimal:
            args = (caps, demand, draws, kv_bytes_per_token, seeds, policy, factors, slo)
            smaller, tried = _minimal(it, args, progress, runs)
            if smaller is not None:
                iterations.append(dataclasses.replace(smaller[0], step="trim"))
                scenario = smaller[1]
            return VerifiedPlan(tuple(iterations), stop, scenario, slo, seeds, sizes,
                                tuple(tried))  # fmt: skip
        if it.meets or len(iterations) >= max_iterations:
            return VerifiedPlan(tuple(iterations), stop, scenario, slo, seeds, sizes)
        nxt = _resolve(it, caps, demand, inventory, max_gpus, time_limit_s)
        if nxt is None:
            return VerifiedPlan(tuple(iterations), "inventory", scenario, slo, seeds, sizes)
        plan, factors = nxt


def _minimal(
    it: Iteration,
    args: tuple[Any, ...],
    progress: Callable[[], None] | None,
    runs: Runs = SERIAL,
) -> tuple[tuple[Iteration, Scenario] | None, list[NeighbourTrial]]:
    """The smallest neighbour of a plan that meets which still meets (its iteration and
    scenario; None when no neighbour does) and every neighbour tried (:func:`trim`); ``args``
    are :func:`_iterate`'s after the plan."""

    def check(plan: PdSizingPlan) -> tuple[bool, int, Any]:
        caps, demand, draws, kv_bytes, seeds, policy, factors, slo = args
        found = _iterate(plan, caps, demand, draws, kv_bytes, seeds, policy, factors, slo,
                         progress, stop_at_miss=True, runs=runs)  # fmt: skip
        return found[0].meets, len(found[0].draw_checks), found

    _, smaller, tried = trim(it.plan, args[0], check)
    return smaller, tried


def _iterate(
    plan: PdSizingPlan,
    caps: Sequence[WorkerCapacity],
    demand: Demand,
    draws: Sequence[Workload],
    kv_bytes: float,
    seeds: Sequence[int],
    policy: str,
    factors: tuple[float, float],
    slo: Slo,
    progress: Callable[[], None] | None = None,
    *,
    stop_at_miss: bool = False,
    runs: Runs = SERIAL,
) -> tuple[Iteration, Scenario]:
    """The plan checked on every draw (``stop_at_miss``: up to the first draw that misses);
    the binding draw's mean-rate scenario. Serially the runs stop at that miss; on a cluster
    (``runs``) every run goes at once and the checks after the miss are dropped, so the
    iteration is the same."""
    predicted = predict_plan(plan, caps, demand)
    scenarios: list[Scenario] = []
    jobs: list[tuple[Scenario, PlanPrediction, float, float]] = []
    q = demand.ttft_quantile
    for workload, seed in zip(draws, seeds, strict=True):
        scenario = scenario_for_plan(plan, caps, demand, workload, kv_bytes, policy=policy,
                                     seed=seed)  # fmt: skip
        scenarios.append(scenario)
        jobs.append((scenario, predicted, q, demand.rate_per_s))
        if demand.has_peak:
            peak_sc = scenario_for_plan(
                plan, caps, demand, workload, kv_bytes, policy=policy, seed=seed, peak=True
            )
            jobs.append((peak_sc, predicted, q, demand.peak_rate_per_s))
    on_cluster = runs.client is not None
    done: Iterator[PlanCheck] = (
        iter(runs.map(_check_job, jobs, progress))
        if on_cluster
        else (_check_job(job) for job in jobs)  # lazy: a miss stops the serial runs
    )
    checks: list[PlanCheck] = []
    peaks: list[PlanCheck] = []
    for check in done:
        is_peak = demand.has_peak and len(peaks) < len(checks)
        (peaks if is_peak else checks).append(check)
        if progress is not None and not on_cluster:
            progress()
        if stop_at_miss and not check.meets(slo):
            break
    meets = tuple(
        checks[i].meets(slo) and (not demand.has_peak or (i < len(peaks) and peaks[i].meets(slo)))
        for i in range(len(checks))
    )
    binding = max(
        range(len(checks)),
        key=lambda i: max(c.slo_excess(slo) for c in (checks[i], *peaks[i : i + 1])),
    )  # ties: the earlier draw
    it = Iteration(plan, factors[0], factors[1], tuple(checks), tuple(peaks), meets, binding)
    return it, scenarios[binding]


def _check_job(job: tuple[Scenario, PlanPrediction, float, float]) -> PlanCheck:
    """One check of :func:`_iterate`: ``(scenario, prediction, quantile, rate)`` run
    (:func:`~pdopt.plan._verify.check_scenario`; module level, so a Dask worker can run it)."""
    scenario, predicted, quantile, rate = job
    return check_scenario(scenario, predicted, quantile, rate)


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
    """The next plan (it must differ from ``it.plan``) and its factors, or None if none fits;
    each stage steps by its worst quantile over the draws (and the peak)."""
    checks = [*it.draw_checks, *it.draw_peak_checks]
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
