"""``plan_deployment``: the planning pipeline as one library call (issue 37, "library first").

What ``pdopt plan`` does between reading its options and printing, for a notebook: the offered
traffic under the model's context window (:func:`pdopt.plan._context.offered_traffic`), the
demand that reaches the GPUs, every GPU type × TP option, an optional limit on GPU types
(:mod:`pdopt.plan._types`), the verified sizing (:func:`solve_verified`, minimal neighbours
included), the per-token cost and energy, and optionally the headroom and the colocated modes.
``pdopt plan`` calls it and only parses, prints and writes, so the same inputs give the same
plan as the command (``tests/plan/test_plan_deployment.py``).

Example
-------
>>> from pdopt.plan import plan_deployment
>>> from pdopt.workload import archetype_workload
>>> wl = archetype_workload("sharegpt", 4.0, n_requests=200, seed=0)
>>> result = plan_deployment(wl, "Qwen2.5-7B", {"H100-SXM": 8}, ttft_slo_s=1.0,
...                          tpot_slo_s=0.1, arrival_cv=1.0)  # doctest: +SKIP
>>> result.meets, result.plan.n_gpus  # doctest: +SKIP
(True, 2)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdopt.errors import ConfigError
from pdopt.model_spec import ModelSpec, get_model, kv_bytes_per_token
from pdopt.parallel import DaskTarget
from pdopt.plan._context import OfferedTraffic, offered_traffic
from pdopt.plan._demand import Demand, demand_from_workload, plan_cache_tokens
from pdopt.plan._economics import token_economics
from pdopt.plan._headroom import STEPS, Headroom, plan_headroom
from pdopt.plan._knobs import knob_hint
from pdopt.plan._modes import ModeResult, mode_scenario
from pdopt.plan._pd import SizingInfeasibleError, capacities_for, solve_pd_sizing
from pdopt.plan._pipeline import (
    Steps,
    cheapest_homogeneous,
    check_traffic,
    choose_types,
    fit_hint,
    guard_demand,
    homogeneous_row,
    pick_mode,
    step_progress,
)
from pdopt.plan._pipeline import compare_modes as run_compare_modes
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._types import TypeChoice
from pdopt.plan._uncertainty import (
    ROOFLINE_PRIOR_ERROR,
    CostErrorCheck,
    CostErrors,
    cost_error_check,
)
from pdopt.plan._verified import DEFAULT_MAX_ITERATIONS, VerifiedPlan, solve_verified
from pdopt.plan._workers import DEFAULT_TPS, WorkerCapacity, WorkerOption, worker_options
from pdopt.scenario import Scenario
from pdopt.workload import Workload


@dataclass(frozen=True, slots=True)
class DeploymentPlan:
    """What :func:`plan_deployment` found (what ``pdopt plan`` prints and writes).

    ``verified`` is the size-simulate-correct outcome (its ``verdict()`` is the command's
    verdict line; None with ``verify=False``, when ``unverified`` is the queueing model's
    plan); ``plan`` the recommended plan when it meets, else the last one tried; ``tokens`` USD
    per million input/output/total tokens and joules per token at TDP
    (:func:`pdopt.plan._economics.token_economics`); ``role_gpus`` the GPU types per role a
    type limit chose (None without one; ``type_choice`` what each assignment cost);
    ``headroom`` the load factor crossing when asked; ``modes`` the colocated deployments
    sized by simulation on ``mode_option`` when asked (``modes_compared``; none when no single
    option holds the demand within the limits). ``capacities``,
    ``served`` (the draws as simulated) and ``kv_bytes_per_token`` are what the sizing and
    the checks used. ``cost_error`` is the binding draw simulated once more with every cost
    model slowed by its documented error (:mod:`pdopt.plan._uncertainty`; None when the plan
    misses, is unverified, or the error is 0).
    """

    model: ModelSpec
    traffic: OfferedTraffic
    demand: Demand
    options: tuple[WorkerOption, ...]
    verified: VerifiedPlan | None
    tokens: dict[str, float | None]
    role_gpus: dict[str, frozenset[str]] | None = None
    headroom: Headroom | None = None
    capacities: tuple[WorkerCapacity, ...] = ()
    served: tuple[Workload, ...] = ()
    kv_bytes_per_token: float = 0.0
    type_choice: TypeChoice | None = None
    unverified: PdSizingPlan | None = None
    modes: tuple[ModeResult, ...] = ()
    mode_option: WorkerOption | None = None
    modes_compared: bool = False
    cache_tokens: float | None = None
    seed: int = 0
    cost_error: CostErrorCheck | None = None

    @property
    def meets(self) -> bool:
        """The verified plan meets its SLOs on every draw (True for an unverified plan: the
        queueing model's own answer)."""
        return True if self.verified is None else self.verified.meets

    @property
    def plan(self) -> PdSizingPlan:
        if self.verified is None:
            assert self.unverified is not None
            return self.unverified
        return self.verified.final.plan

    @property
    def analytic(self) -> dict[str, Any] | None:
        """The cheapest single-option plan by the exact queueing model (no MILP, no
        simulation)."""
        return cheapest_homogeneous(self.capacities, self.demand)

    @property
    def goodput_rps(self) -> float | None:
        """The plan's goodput at the offered rate: its binding draw's SLO attainment (a rejected
        request a miss) times the rate that reaches the GPUs; None unverified."""
        if self.verified is None:
            return None
        return self.verified.final.check.sim_attainment * self.demand.rate_per_s

    @property
    def cost_per_1k_good_requests(self) -> float | None:
        """USD per 1,000 requests that meet both SLOs (:attr:`goodput_rps`); None without
        goodput."""
        good = self.goodput_rps
        if not good:
            return None
        return self.plan.cost_per_hour / (good * 3600.0) * 1000.0

    def option_rows(self) -> list[dict[str, Any]]:
        """Each candidate worker's capacities and its cheapest homogeneous plan."""
        return [homogeneous_row(c, self.demand) for c in self.capacities]

    @property
    def rejected_by_reason(self) -> dict[str, int]:
        """The requests turned away, by reason: the offered traffic's beyond the context window
        (when they count as misses) and the verification run's others."""
        split = self.traffic.split
        out = dict(split.rejected_by_reason) if self.traffic.treatment == "miss" else {}
        sim = {} if self.verified is None else self.verified.final.check.rejected_by_reason
        for reason, n in sim.items():
            if "context window" in reason:
                continue  # counted from the offered traffic above
            out[reason] = out.get(reason, 0) + n
        return out

    def confidence(self) -> tuple[bool, str]:
        """Whether the plan meets its SLOs with 95% confidence, and the sentence that says so:
        every draw's upper bounds (the sampling of requests, :meth:`VerifiedPlan.confidence`)
        and the binding draw's with every cost model slowed by its error (``cost_error``)."""
        if self.verified is None:
            return False, "not verified: no confidence"
        ok, text = self.verified.confidence()
        if self.cost_error is None:
            return ok, f"{text}; the cost model's error is not included"
        both = ok and self.cost_error.meets_confidently
        # the sampling sentence without its "sampling only" caveat, which this one lifts
        bounds = text.split(": ", 1)[1].split("; the sampling of requests only")[0]
        head = "meets" if both else "does not meet"
        return both, (
            f"{head} the SLOs with 95% confidence over the sampling of requests and the cost "
            f"model's error: {bounds}; {self.cost_error.describe()} "
            "(--slo-margin holds room for more)"
        )

    def economics(self, counts: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
        """Per-token cost and energy of a deployment's worker counts (``to_dict`` form)."""
        prices = {(o.gpu, o.tp): o.price_per_hour for o in self.options}
        return token_economics(counts, prices, self.demand)

    def recommended_mode(self) -> ModeResult | None:
        """The compared colocated mode recommended over full P/D (:func:`pick_mode`), if any."""
        if not self.modes:
            return None
        plan = self.plan
        rows = [(self.meets, plan.cost_per_hour, plan.n_gpus)]
        rows += [(m.meets, m.cost_per_hour, m.gpus) for m in self.modes]
        i = pick_mode(rows)
        return None if i is None else self.modes[i - 1]

    def scenario(self) -> tuple[Scenario | None, str]:
        """The simulation of the recommended deployment on its binding draw (what ``--out``
        writes: a compared mode's when one is recommended, else the P/D plan's) and what it
        holds; None without verification."""
        if self.verified is None:
            return None, "nothing: the plan was not verified"
        mode = self.recommended_mode()
        if mode is not None and self.mode_option is not None:
            i = mode.binding_draw
            chosen = mode_scenario(
                mode.policy,
                self.mode_option,
                mode.workers,
                self.demand,
                self.served[i],
                self.kv_bytes_per_token,
                self.seed + i,
            )
            return chosen, (
                f"the recommended {mode.mode}: {mode.workers} × {mode.option} mixed, "
                f"on draw seed {self.seed + i}"
            )
        out = self.verified
        seed = out.seeds[out.final.binding_draw]
        which = "recommended" if out.meets else "last (missing)"
        return out.scenario, f"the {which} P/D plan on draw seed {seed}"

    def describe(self) -> str:
        """Two lines: the recommendation (or that there is none) and the verdict."""
        head = "RECOMMENDED" if self.meets else "NO PLAN RECOMMENDED (last tried)"
        verdict = (
            "not verified (verify=False): the queueing model's plan, unsimulated"
            if self.verified is None
            else self.verified.verdict()
        )
        return f"{head} {self.plan.describe()}\nverdict: {verdict}"


def plan_deployment(
    workload: Workload,
    model: str | ModelSpec,
    gpus: Mapping[str, float],
    *,
    ttft_slo_s: float,
    tpot_slo_s: float,
    rate_per_s: float | None = None,
    arrival_cv: float | None = None,
    quantile: float = 0.99,
    draws: Sequence[Workload] = (),
    tps: Sequence[int] = DEFAULT_TPS,
    prices: Mapping[str, float] | None = None,
    costs: Mapping[tuple[str, int], Any] | None = None,
    expert_parallel: Sequence[bool] = (False, True),
    max_gpus: int | None = None,
    too_long: str = "miss",
    slo_margin: float = 0.0,
    max_gpu_types: int | None = None,
    one_type_per_role: bool = False,
    seed: int = 0,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    headroom: bool = False,
    progress: Callable[[], None] | None = None,
    prefix_caching: bool = True,
    peak_rate_per_s: float | None = None,
    max_samples: int | None = None,
    compute_efficiency: Mapping[str, float] | None = None,
    verify: bool = True,
    compare_modes: bool = False,
    steps: Steps | None = None,
    dask: DaskTarget = None,
    cost_model_error: CostErrors | float | None = None,
) -> DeploymentPlan:
    """Size, verify and price a P/D deployment of ``model`` for ``workload``, as ``pdopt plan``
    (which calls this and only prints and writes what it returns).

    Parameters
    ----------
    workload : Workload
        The offered traffic (over-long requests included: ``too_long`` says what happens to
        them, as ``--too-long``). ``draws`` are further independent draws of it (archetypes:
        seeds ``seed + 1``, …), treated the same way.
    model : str or ModelSpec
        A catalogue name, spec file or Hugging Face config (:func:`pdopt.model_spec.get_model`).
    gpus : mapping GPU type -> most GPUs
        The types considered and their inventory (``math.inf``: no limit), as ``--gpus``.
    ttft_slo_s, tpot_slo_s, quantile, slo_margin
        The SLOs at ``quantile`` over all requests; ``slo_margin`` tightens both (as
        ``--slo-margin``).
    rate_per_s, arrival_cv, peak_rate_per_s
        Override the workload's own rate and inter-arrival CV (archetypes: give the rate and
        CV 1, as the command does); a forecast peak adds a Mixed pool (``--peak-rate``).
    max_samples : int, optional
        Size from this many randomly drawn request lengths (``--sample``).
    tps, prices, costs, expert_parallel, max_gpus, compute_efficiency
        As :func:`worker_options` and :func:`solve_pd_sizing`.
    max_gpu_types, one_type_per_role
        Limits on the deployment's GPU types (:mod:`pdopt.plan._types`).
    verify : bool
        Simulate and correct (default); False returns the queueing model's plan unsimulated
        (``--no-sim``).
    headroom : bool
        Also find the largest load factor the plan still meets (:mod:`pdopt.plan._headroom`).
    compare_modes : bool
        Also size colocated and EcoServe deployments by simulation (``--compare-modes``).
    prefix_caching : bool
        With a workload that has prefix blocks, size prefill on the tokens that miss one
        prefill worker's LRU prefix cache and verify with caching on (as ``pdopt plan``; False:
        ``--no-prefix-cache``).
    cost_model_error : mapping (GPU type, TP) -> fraction, or fraction, optional
        The cost models' documented error ε: the plan's 95% confidence also needs the
        binding draw to meet with every cost model ``1 + ε`` times slower
        (:mod:`pdopt.plan._uncertainty`). A mapping gives the fit error of profiled options
        (others: the roofline prior's, :data:`ROOFLINE_PRIOR_ERROR`); None: the roofline
        prior's for every option; 0: the sampling of requests only (no extra simulation).
    progress, steps
        ``progress()`` is called after each simulation; ``steps(description, total, unit)``
        opens each long step instead (the command's progress bars,
        :data:`pdopt.plan._pipeline.Steps`).
    dask : None, "local" or a Dask scheduler address
        Run the verification draws and the compared modes on a Dask cluster
        (:func:`pdopt.parallel.map_runs`; ``pdopt plan --dask``): the serial results.

    Raises
    ------
    ConfigError
        When nothing reaches a GPU, when the requests beyond the window alone break the SLO
        quantile (the message names the knobs), when the model fits on no option, when the
        demand is beyond what the check can simulate, or when no type assignment has a plan.
    SizingInfeasibleError
        When no plan exists within the limits (as :func:`solve_pd_sizing`; the message names
        the knob that would help).
    """
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    step = step_progress(steps, progress)
    traffic = offered_traffic(workload, spec.max_context_tokens, too_long)
    check_traffic(traffic, spec, quantile)
    share = len(traffic.sized) / traffic.offered
    types = list(gpus)
    options = worker_options(types, spec, tps, prices=prices, costs=costs,
                             expert_parallel=tuple(expert_parallel),
                             compute_efficiency=compute_efficiency)  # fmt: skip
    if not options:
        raise ConfigError(
            f"{spec.name} fits on none of {types} at TP {list(tps)}; "
            + fit_hint(spec, spec.name, types, tps)
        )
    cache_tokens = plan_cache_tokens(traffic.sized, options, prefix_caching)
    # the GPUs see the requests that reach them: the offered rate less the rejected share
    demand = demand_from_workload(
        traffic.sized, ttft_slo_s=ttft_slo_s * (1.0 - slo_margin),
        tpot_slo_s=tpot_slo_s * (1.0 - slo_margin),
        rate_per_s=None if rate_per_s is None else rate_per_s * share, arrival_cv=arrival_cv,
        ttft_quantile=quantile,
        peak_rate_per_s=None if peak_rate_per_s is None else peak_rate_per_s * share,
        max_samples=max_samples, seed=seed, cache_tokens=cache_tokens,
    )  # fmt: skip
    limits = {g: int(n) for g, n in gpus.items() if math.isfinite(n)}
    guard_demand(demand, options, {g: float(n) for g, n in gpus.items()}, max_gpus, verify)
    kv_bytes = max(kv_bytes_per_token(spec, o.tp) for o in options)
    served = [traffic.served]
    served += [offered_traffic(d, spec.max_context_tokens, too_long).served for d in draws]
    try:
        return _size(
            spec, traffic, demand, tuple(options), limits, served, kv_bytes, cache_tokens,
            max_gpus=max_gpus, max_gpu_types=max_gpu_types,
            one_type_per_role=one_type_per_role, seed=seed, max_iterations=max_iterations,
            verify=verify, headroom=headroom, compare_modes=compare_modes, steps=step, dask=dask,
            cost_model_error=ROOFLINE_PRIOR_ERROR if cost_model_error is None else cost_model_error,
        )  # fmt: skip
    except SizingInfeasibleError as exc:
        hint = knob_hint(exc.binding, demand, spec, options)
        if hint is None:
            raise
        error = SizingInfeasibleError(f"{exc}; {hint}", exc.binding, exc.closest,
                                      exc.closest_slo_s)  # fmt: skip
        error.unconstrained = exc.unconstrained
        raise error from exc


def _size(
    spec: ModelSpec,
    traffic: OfferedTraffic,
    demand: Demand,
    options: tuple[WorkerOption, ...],
    limits: dict[str, int],
    served: list[Workload],
    kv_bytes: float,
    cache_tokens: float | None,
    *,
    max_gpus: int | None,
    max_gpu_types: int | None,
    one_type_per_role: bool,
    seed: int,
    max_iterations: int,
    verify: bool,
    headroom: bool,
    compare_modes: bool,
    steps: Steps,
    dask: DaskTarget = None,
    cost_model_error: CostErrors | float,
) -> DeploymentPlan:
    """Size (and unless ``verify`` is False verify on each draw of ``served``), then the
    optional headroom and mode comparison."""
    caps = tuple(capacities_for(options, demand, max_gpus, limits))
    choice = choose_types(demand, options, limits, max_gpu_types, one_type_per_role, max_gpus)
    role_gpus = None if choice is None else choice.role_gpus
    common: dict[str, Any] = dict(
        model=spec, traffic=traffic, demand=demand, options=options, role_gpus=role_gpus,
        capacities=caps, served=tuple(served), kv_bytes_per_token=kv_bytes,
        type_choice=choice, cache_tokens=cache_tokens, seed=seed,
    )  # fmt: skip
    prices = {(o.gpu, o.tp): o.price_per_hour for o in options}
    if not verify:
        plan = (
            solve_pd_sizing(demand, options, inventory=limits, max_gpus=max_gpus)
            if choice is None
            else choice.plan
        )
        tokens = token_economics(plan.to_dict()["counts"], prices, demand)
        return DeploymentPlan(verified=None, tokens=tokens, unverified=plan, **common)
    sims = max_iterations * len(served) * (2 if demand.has_peak else 1)
    with steps("plan: size, simulate, correct", sims, "simulation") as tick:
        verified = solve_verified(
            demand, options, served, kv_bytes, inventory=limits, max_gpus=max_gpus, seed=seed,
            max_iterations=max_iterations, progress=tick, role_gpus=role_gpus, dask=dask,
        )  # fmt: skip
    final = verified.final.plan
    tokens = token_economics(final.to_dict()["counts"], prices, demand)
    error = None
    if verified.meets and cost_model_error != 0:
        draw = verified.final.binding_draw
        with steps("plan: the cost model's error", 1, "simulation") as tick:
            error = cost_error_check(
                final,
                caps,
                demand,
                served[draw],
                kv_bytes,
                cost_model_error,
                draw=draw,
                seed=verified.seeds[draw],
            )
            tick()
    room = None
    if headroom and verified.meets:
        total = (len(STEPS) + 5) * len(served)
        with steps("plan --headroom: load factor crossing", total, "simulation") as tick:
            room = plan_headroom(final, caps, demand, served, kv_bytes, seed=seed,
                                 progress=tick)  # fmt: skip
    modes: tuple[ModeResult, ...] = ()
    option = None
    if compare_modes:
        modes, option = run_compare_modes(final.n_gpus, caps, demand, limits, max_gpus, served,
                                          kv_bytes, seed, steps, dask)  # fmt: skip
    return DeploymentPlan(verified=verified, tokens=tokens, headroom=room, modes=modes,
                          mode_option=option, modes_compared=compare_modes, cost_error=error,
                          **common)  # fmt: skip
