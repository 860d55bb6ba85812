"""``plan_deployment``: the planning pipeline as one library call (issue 37, "library first").

What ``pdopt plan`` does between reading its options and printing, for a notebook: the offered
traffic under the model's context window (:func:`pdopt.plan._context.offered_traffic`), the
demand that reaches the GPUs, every GPU type × TP option, an optional limit on GPU types
(:mod:`pdopt.plan._types`), the verified sizing (:func:`solve_verified`, minimal neighbours
included), the per-token cost and energy, and optionally the headroom. The same inputs give
the same plan as the command (``tests/plan/test_plan_deployment.py``).

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
from pdopt.plan._context import OfferedTraffic, offered_traffic, rejections_allowed
from pdopt.plan._demand import Demand, demand_from_workload, plan_cache_tokens
from pdopt.plan._economics import token_economics
from pdopt.plan._headroom import Headroom, plan_headroom
from pdopt.plan._pd import capacities_for
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._types import cheapest_types, type_choices
from pdopt.plan._verified import DEFAULT_MAX_ITERATIONS, VerifiedPlan, solve_verified
from pdopt.plan._workers import DEFAULT_TPS, WorkerOption, worker_options
from pdopt.workload import Workload


@dataclass(frozen=True, slots=True)
class DeploymentPlan:
    """What :func:`plan_deployment` found.

    ``verified`` is the size-simulate-correct outcome (its ``verdict()`` is the command's
    verdict line); ``plan`` the recommended plan when it meets, else the last one tried;
    ``tokens`` USD per million input/output/total tokens and joules per token at TDP
    (:func:`pdopt.plan._economics.token_economics`); ``role_gpus`` the GPU types per role a
    type limit chose (None without one); ``headroom`` the load factor crossing when asked.
    """

    model: ModelSpec
    traffic: OfferedTraffic
    demand: Demand
    options: tuple[WorkerOption, ...]
    verified: VerifiedPlan
    tokens: dict[str, float | None]
    role_gpus: dict[str, frozenset[str]] | None = None
    headroom: Headroom | None = None

    @property
    def meets(self) -> bool:
        return self.verified.meets

    @property
    def plan(self) -> PdSizingPlan:
        return self.verified.final.plan

    def describe(self) -> str:
        """Two lines: the recommendation (or that there is none) and the verdict."""
        head = "RECOMMENDED" if self.meets else "NO PLAN RECOMMENDED (last tried)"
        return f"{head} {self.plan.describe()}\nverdict: {self.verified.verdict()}"


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
) -> DeploymentPlan:
    """Size, verify and price a P/D deployment of ``model`` for ``workload``, as ``pdopt plan``.

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
    rate_per_s, arrival_cv
        Override the workload's own rate and inter-arrival CV (archetypes: give the rate and
        CV 1, as the command does).
    tps, prices, costs, expert_parallel, max_gpus
        As :func:`worker_options` and :func:`solve_pd_sizing`.
    max_gpu_types, one_type_per_role
        Limits on the deployment's GPU types (:mod:`pdopt.plan._types`).
    headroom : bool
        Also find the largest load factor the plan still meets (:mod:`pdopt.plan._headroom`).
    prefix_caching : bool
        With a workload that has prefix blocks, size prefill on the tokens that miss one
        prefill worker's LRU prefix cache and verify with caching on (as ``pdopt plan``; False:
        ``--no-prefix-cache``).

    Raises
    ------
    ConfigError
        When nothing reaches a GPU, when the requests beyond the window alone break the SLO
        quantile (the message names the knobs), or when no type assignment has a plan.
    SizingInfeasibleError
        When no plan exists within the limits (as :func:`solve_pd_sizing`).
    """
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    traffic = offered_traffic(workload, spec.max_context_tokens, too_long)
    if not len(traffic.sized):
        raise ConfigError(f"every request exceeds {spec.name}'s context window")
    if not rejections_allowed(traffic, quantile):
        raise ConfigError(
            f"{traffic.over_window:,} of {traffic.offered:,} requests exceed {spec.name}'s "
            f"context window: counted as misses they alone break the P{quantile * 100:g} SLOs; "
            "give too_long='drop' or 'truncate', or a model with a longer window"
        )
    share = len(traffic.sized) / traffic.offered
    options = worker_options(list(gpus), spec, tps, prices=prices, costs=costs,
                             expert_parallel=tuple(expert_parallel))  # fmt: skip
    if not options:
        raise ConfigError(f"{spec.name} fits on none of {list(gpus)} at TP {list(tps)}")
    demand = demand_from_workload(
        traffic.sized, ttft_slo_s=ttft_slo_s * (1.0 - slo_margin),
        tpot_slo_s=tpot_slo_s * (1.0 - slo_margin),
        rate_per_s=None if rate_per_s is None else rate_per_s * share, arrival_cv=arrival_cv,
        ttft_quantile=quantile, seed=seed,
        cache_tokens=plan_cache_tokens(traffic.sized, options, prefix_caching),
    )  # fmt: skip
    limits = {g: int(n) for g, n in gpus.items() if math.isfinite(n)}
    role_gpus = None
    if max_gpu_types is not None or one_type_per_role:
        choices = type_choices([o.gpu for o in options], max_gpu_types, one_type_per_role)
        choice = cheapest_types(demand, options, choices, inventory=limits, max_gpus=max_gpus)
        if choice is None:
            raise ConfigError("no plan meets the demand with the GPU types the limits allow")
        role_gpus = choice.role_gpus
    served = [traffic.served]
    served += [offered_traffic(d, spec.max_context_tokens, too_long).served for d in draws]
    kv_bytes = max(kv_bytes_per_token(spec, o.tp) for o in options)
    verified = solve_verified(
        demand, options, served, kv_bytes, inventory=limits, max_gpus=max_gpus, seed=seed,
        max_iterations=max_iterations, progress=progress, role_gpus=role_gpus,
    )  # fmt: skip
    prices_by_key = {(o.gpu, o.tp): o.price_per_hour for o in options}
    final = verified.final.plan
    tokens = token_economics(final.to_dict()["counts"], prices_by_key, demand)
    room = None
    if headroom and verified.meets:
        caps = capacities_for(options, demand, max_gpus, limits)
        room = plan_headroom(final, caps, demand, served, kv_bytes, seed=seed, progress=progress)
    return DeploymentPlan(spec, traffic, demand, tuple(options), verified, tokens, role_gpus,
                          room)  # fmt: skip
