"""The cost model's own error in a plan's confidence (issue 37, deliver 2: "an interval from the
draws of the trace *and* the cost model's documented uncertainty").

A verified plan is simulated with the same cost models it was sized with, so its verdict and the
95% upper bounds of its quantiles (:func:`pdopt.plan._verify.quantile_upper_bound`) cover the
sampling of requests only. Here the plan's binding draw (the one closest to, or furthest past,
an SLO) is simulated once more with every worker's cost model slowed by its documented error:
``(1 + ε)`` times every prefill, decode and fused iteration time (:func:`slowed_cost`). The plan
"meets with 95% confidence" only when the quantiles' upper bounds of that run are within the
SLOs too.

ε per option: a profile's own fit error where the plan was given one (``pdopt plan``: the larger
cross-validated MAPE of its prefill and decode fits), else :data:`ROOFLINE_PRIOR_ERROR`, the
roofline prior's documented error (README "The roofline prior's presets": dense models mostly
within 10%). The assumption: the cost model errs uniformly slow by ε on every iteration, a
pessimistic shift, not a random one; errors larger than ε (MoE and MLA priors, README) are not
covered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pdopt._validation import check_non_negative
from pdopt.cluster import Slo
from pdopt.costmodel import CostModel
from pdopt.plan._demand import Demand
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._verify import PlanCheck, check_plan
from pdopt.plan._workers import WorkerCapacity
from pdopt.workload import Workload

ROOFLINE_PRIOR_ERROR = 0.10
"""The roofline prior's documented error, a fraction: README "The roofline prior's presets"
(dense models mostly within 10% of measured engines at the median)."""

CostErrors = Mapping[tuple[str, int], float]
"""A cost model's error (a fraction) per (GPU type, TP) option that was fitted from a profile."""


def slowed_cost(cost: CostModel, factor: float) -> CostModel:
    """``cost`` with every time ``factor`` times longer: prefill ``t0`` and work over a peak
    ``factor`` times lower, decode ``d0…d3``, the TTFT predictor and the fused iteration's
    coefficients (each model is homogeneous of degree one in them). The serving stack's
    overhead (:class:`pdopt.costmodel.ServerOverhead`) is not the GPU's and stays."""
    check_non_negative(factor, "factor", "slowed_cost")
    prefill = dataclasses.replace(
        cost.prefill,
        p_peak_flops=cost.prefill.p_peak_flops / factor,
        intercept_s=cost.prefill.intercept_s * factor,
    )
    d = cost.decode
    decode = dataclasses.replace(
        d,
        d0_s=d.d0_s * factor,
        d1_s_per_request=d.d1_s_per_request * factor,
        d2_s_per_token=d.d2_s_per_token * factor,
        d3_s_per_expert=d.d3_s_per_expert * factor,
    )
    ttft = cost.ttft
    if ttft is not None:
        ttft = type(ttft)(*(getattr(ttft, f.name) * factor for f in dataclasses.fields(ttft)))
    hybrid = cost.hybrid
    if hybrid is not None:
        hybrid = type(hybrid)(
            *(getattr(hybrid, f.name) * factor for f in dataclasses.fields(hybrid))
        )
    return dataclasses.replace(cost, prefill=prefill, decode=decode, ttft=ttft, hybrid=hybrid)


def option_error(capacity: WorkerCapacity, errors: CostErrors | float) -> float:
    """ε of one option: its profile's fit error when ``errors`` names it, else the roofline
    prior's (a number ``errors`` applies to every option)."""
    if not isinstance(errors, Mapping):
        return float(errors)
    option = capacity.option
    key = (option.gpu, option.tp)
    return (
        float(errors[key]) if key in errors and not option.expert_parallel else ROOFLINE_PRIOR_ERROR
    )


@dataclass(frozen=True, slots=True)
class CostErrorCheck:
    """The binding draw simulated with every cost model slowed by its error (``errors``: ε per
    option of the plan, by name) and the verdict of that run's 95% upper bounds."""

    check: PlanCheck
    errors: dict[str, float]
    draw: int
    slo: Slo

    @property
    def meets_confidently(self) -> bool:
        return self.check.meets_confidently(self.slo)

    def describe(self) -> str:
        """``"with every cost model slower by its documented error (H100-SXM/tp1 10.0%; …) on
        the binding draw: TTFT <= 0.81 s, TPOT <= 0.049 s"``."""
        parts = [f"TTFT <= {_s(self.check.sim_ttft_q_upper_s)}"]
        if self.check.sim_tpot_q_upper_s == self.check.sim_tpot_q_upper_s:  # not NaN
            parts.append(f"TPOT <= {_s(self.check.sim_tpot_q_upper_s)}")
        which = ", ".join(f"{name} {e:.1%}" for name, e in sorted(self.errors.items()))
        return (
            f"with every cost model slower by its documented error ({which}; assumed uniformly "
            f"slow) on the binding draw: {', '.join(parts)}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "errors": self.errors, "draw": self.draw, "meets_confidently": self.meets_confidently,
            "ttft_q_upper_s": self.check.sim_ttft_q_upper_s,
            "tpot_q_upper_s": self.check.sim_tpot_q_upper_s, "text": self.describe(),
        }  # fmt: skip


def _s(seconds: float) -> str:
    return f"{seconds:.3g} s"


def cost_error_check(
    plan: PdSizingPlan,
    capacities: Sequence[WorkerCapacity],
    demand: Demand,
    workload: Workload,
    kv_bytes_per_token: float,
    errors: CostErrors | float,
    *,
    draw: int,
    seed: int,
) -> CostErrorCheck:
    """Simulate ``plan`` on ``workload`` (draw ``draw``, run with ``seed``) with each option's
    cost model slowed by ``1 + ε`` (:func:`option_error`)."""
    used = {c.key for c in plan.counts}
    slowed, named = [], {}
    for cap in capacities:
        eps = option_error(cap, errors)
        if cap.option.key in used:
            named[cap.option.name] = eps
        option = dataclasses.replace(cap.option, cost=slowed_cost(cap.option.cost, 1.0 + eps))
        slowed.append(dataclasses.replace(cap, option=option))
    check = check_plan(plan, slowed, demand, workload, kv_bytes_per_token, seed=seed)
    return CostErrorCheck(check, named, draw, Slo(demand.ttft_slo_s, demand.tpot_slo_s))
