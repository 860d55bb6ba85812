"""EcoServe macro-instance sizing: N_l, N_u and macro instances per period of a rate forecast.

First-order model of temporal disaggregation (EcoServe §4, rolling activation), our derivation:

* One instance alternates prefill and decode phases in a cycle of ``C`` seconds; each switch
  costs ``switch_s`` (a prefill batch intercept plus a decode iteration's fixed cost), and ``C``
  is chosen so switching takes ``overhead_share`` of the time: ``C = 2·switch_s/overhead_share``.
* At rate ``lambda`` an instance spends ``f = lambda·E[S]`` of its time prefilling (``S`` the
  batch-free prefill work of a request). Decode runs in the remaining ``1 − f − h`` of the time,
  so a decode iteration of ``B`` requests is stretched to ``τ(B)/(1 − f − h)`` (the "saved
  TPOT"). With Little's law ``B = lambda (ō − 1) TPOT``, TPOT <= SLO holds iff
  ``lambda·(E[S] + (d1 + d2 c̄)(ō − 1)) <= 1 − h − d0/SLO``; KV bounds ``B`` too, at ``B <=
  K / c̄_kv`` with ``c̄_kv`` :meth:`pdopt.plan.Demand.decode_kv_tokens` (``c̄``, or less for a
  model with sliding-window layers, which hold only the window). The largest such
  ``lambda`` is the instance rate ``mu``. With an MoE expert term ``τ(B)`` is concave in B, and
  the largest ``lambda`` with ``τ(B)/(1 − f − h) <= SLO`` is found by root finding below the
  linear form's (the expert term only adds time).
* Instances of a macro instance stagger their prefill phases, so a request waits at most
  ``C/N`` for the next prefill window and then at most the phase ``f·C``: TTFT <= SLO needs
  ``N >= N_l = ceil(C / (SLO − f·C))`` at full load.
* Mitosis splits a macro instance at ``N_u`` into two halves that must each keep ``N_l``, so
  ``N_u = 2·N_l`` (or a smaller cap, which then disables splitting).

MILP over the forecast periods ``t``: instances ``n_t >= lambda_t/mu`` and macro instances
``M_t`` with ``N_l·M_t <= n_t <= N_u·M_t``; minimise instance-periods, then scaling churn
``Σ|M_t − M_{t−1}|``, then fewer macro instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import cvxpy as cp
import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq

from pdopt._validation import check_fraction, check_int_at_least, check_positive, param_error
from pdopt.costmodel import CostModel, DecodeModel
from pdopt.errors import InfeasiblePlanError
from pdopt.model_spec import ModelSpec
from pdopt.plan._demand import Demand
from pdopt.plan._solve import DEFAULT_TIME_LIMIT_S, solve_highs

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class InstanceModel:
    """What one temporally disaggregated instance sustains (module docstring)."""

    rate_per_s: float
    limited_by: str
    cycle_s: float
    prefill_share: float
    n_lower: int
    n_upper: int


@dataclass(frozen=True, slots=True)
class MacroPlan:
    """Macro-instance sizing over a forecast: per period, instances and macro instances."""

    status: str
    gap: float
    runtime_s: float
    instance: InstanceModel
    n_lower: int
    n_upper: int
    instances: tuple[int, ...]
    macro_instances: tuple[int, ...]
    gpus: tuple[int, ...]

    @property
    def is_ok(self) -> bool:
        return self.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)


def instance_model(
    cost: CostModel,
    demand: Demand,
    *,
    kv_capacity_tokens: float,
    overhead_share: float = 0.05,
    switch_s: float | None = None,
    max_instances_per_macro: int | None = None,
    model: ModelSpec | None = None,
) -> InstanceModel:
    """The instance rate ``mu``, the cycle and ``N_l``/``N_u`` of one instance type.

    ``kv_capacity_tokens`` counts tokens held in every layer (:func:`pdopt.model_spec.kv_capacity`);
    a running request takes :meth:`Demand.decode_kv_tokens` ``(model)`` of them, its mean context
    ``c̄`` when ``model`` is None or has no sliding window, less with one.

    Raises
    ------
    InfeasiblePlanError
        When the TPOT SLO leaves no time to prefill, or the TTFT SLO is shorter than a
        full-load prefill phase (no macro-instance size helps).
    """
    owner = "instance_model"
    h = check_fraction(overhead_share, "overhead_share", owner)
    kv = check_positive(kv_capacity_tokens, "kv_capacity_tokens", owner)
    pre, dec = cost.prefill, cost.decode
    switch = pre.intercept_s + dec.d0_s if switch_s is None else switch_s
    check_positive(switch, "switch_s", owner)
    work_s = float(np.mean(demand.prefill_service_s(pre))) - pre.intercept_s
    iters = demand.mean_decode_iterations
    slope = dec.d1_s_per_request + dec.d2_s_per_token * demand.decode_context_tokens
    room = 1.0 - h - dec.d0_s / demand.tpot_slo_s
    if room <= 0:
        raise InfeasiblePlanError(
            f"no macro instance meets TPOT <= {demand.tpot_slo_s * 1e3:g} ms: binding: TPOT SLO: "
            f"the decode fixed cost d0 = {dec.d0_s * 1e3:.3g} ms plus {h:.0%} switching leaves "
            f"no time to prefill; the closest is TPOT >= {dec.d0_s / (1 - h) * 1e3:.3g} ms"
        )
    mu_tpot = room / (work_s + slope * iters)
    if dec.has_expert_term:
        mu_tpot = _moe_tpot_rate(dec, demand, work_s, h, mu_tpot)
    b_kv = kv / max(demand.decode_kv_tokens(model), 1.0)
    mu_kv = b_kv / (iters * demand.tpot_slo_s) if iters > 0 else math.inf
    mu, limited = (mu_tpot, "tpot") if mu_tpot <= mu_kv else (mu_kv, "kv")
    cycle = 2.0 * switch / h
    share = mu * work_s
    phase = share * cycle
    if demand.ttft_slo_s <= phase:
        raise InfeasiblePlanError(
            f"no macro instance meets TTFT <= {demand.ttft_slo_s:g} s: binding: TTFT SLO: a "
            f"full-load prefill phase lasts {phase:.3g} s of a {cycle:.3g} s cycle; the closest "
            f"is TTFT > {phase:.3g} s, or a larger overhead_share (shorter cycles)"
        )
    n_lower = max(1, math.ceil(cycle / (demand.ttft_slo_s - phase) - 1e-9))
    n_upper = 2 * n_lower
    if max_instances_per_macro is not None:
        cap = check_int_at_least(max_instances_per_macro, 1, "max_instances_per_macro", owner)
        if cap < n_lower:
            raise InfeasiblePlanError(
                f"a macro instance needs at least N_l = {n_lower} instances to meet TTFT <= "
                f"{demand.ttft_slo_s:g} s but max_instances_per_macro = {cap}: binding: the cap; "
                f"the closest is max_instances_per_macro = {n_lower}"
            )
        n_upper = min(n_upper, cap)
    return InstanceModel(mu, limited, cycle, share, n_lower, n_upper)


def _moe_tpot_rate(
    dec: DecodeModel, demand: Demand, work_s: float, h: float, linear_rate: float
) -> float:
    """Largest ``lambda`` with ``τ(B, B·c̄) <= (1 − lambda·E[S] − h)·SLO`` at Little's
    ``B = lambda (ō − 1) SLO``, for a decode model with an expert term: the left side increases
    in ``lambda``, the right decreases, and ``linear_rate`` (the root without the expert term)
    bounds it above (module docstring)."""
    slo, c_bar = demand.tpot_slo_s, demand.decode_context_tokens
    iters = demand.mean_decode_iterations

    def excess(rate: float) -> float:
        tau = float(dec.mean_context_time_s(rate * iters * slo, c_bar))
        return tau - (1.0 - rate * work_s - h) * slo

    if excess(linear_rate) <= 0:
        return linear_rate
    return float(brentq(excess, 0.0, linear_rate, xtol=1e-12 * linear_rate, rtol=1e-12))


def build_macro_sizing(n_periods: int, instance: InstanceModel) -> cp.Problem:
    """The unsolved macro-instance MILP; parameter ``rate_per_s`` (per period), variables
    ``instances`` and ``macro_instances``."""
    t_n = check_int_at_least(n_periods, 1, "n_periods", "build_macro_sizing")
    rates = cp.Parameter(t_n, nonneg=True, name="rate_per_s", value=np.zeros(t_n))
    n = cp.Variable(t_n, integer=True, name="instances")
    m = cp.Variable(t_n, integer=True, name="macro_instances")
    churn = cp.Variable(max(t_n - 1, 1), nonneg=True, name="churn")
    cons: list[Any] = [
        m >= 0,
        n >= rates / instance.rate_per_s,
        n >= instance.n_lower * m,
        n <= instance.n_upper * m,
    ]
    if t_n > 1:
        cons += [churn >= m[1:] - m[:-1], churn >= m[:-1] - m[1:]]
    # Instance-periods dominate; churn and macro count only break ties.
    ones_n = np.ones(t_n)
    objective = ones_n @ n + 1e-3 * (np.ones(max(t_n - 1, 1)) @ churn) + 1e-6 * (ones_n @ m)
    return cp.Problem(cp.Minimize(objective), cons)


def solve_macro_sizing(
    cost: CostModel,
    demand: Demand,
    rate_forecast_per_s: npt.ArrayLike,
    *,
    kv_capacity_tokens: float,
    tp: int = 1,
    overhead_share: float = 0.05,
    switch_s: float | None = None,
    max_instances_per_macro: int | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    model: ModelSpec | None = None,
) -> MacroPlan:
    """N_l, N_u and the instances and macro instances of each forecast period.

    ``demand`` gives the lengths and SLOs (its rate is not used: ``rate_forecast_per_s`` is,
    one mean rate per period). GPUs per period are instances × ``tp``. ``model`` (None: every
    layer full attention) counts a sliding window in the KV bound (:func:`instance_model`).

    Examples
    --------
    >>> import numpy as np
    >>> from pdopt.costmodel import CostModel, DecodeModel, DecodeModel, PrefillModel
    >>> cost = CostModel(PrefillModel(0.0, 2e9, 1e14, 1.0, 2e-3), DecodeModel(0.01, 1e-4, 1e-7))
    >>> d = Demand(1.0, np.full(8, 512.0), np.full(8, 128.0), 1.0, 0.1)
    >>> plan = solve_macro_sizing(cost, d, [5.0, 40.0, 10.0], kv_capacity_tokens=2e5)
    >>> (plan.n_lower, plan.n_upper, plan.macro_instances)
    (1, 2, (1, 1, 1))
    """
    rates = np.asarray(rate_forecast_per_s, dtype=np.float64).ravel()
    if rates.size == 0 or not np.all(np.isfinite(rates)) or np.any(rates < 0):
        raise param_error("rate_forecast_per_s", "solve_macro_sizing", "rates >= 0", rates)
    tp = check_int_at_least(tp, 1, "tp", "solve_macro_sizing")
    inst = instance_model(
        cost, demand, kv_capacity_tokens=kv_capacity_tokens, overhead_share=overhead_share,
        switch_s=switch_s, max_instances_per_macro=max_instances_per_macro, model=model,
    )  # fmt: skip
    problem = build_macro_sizing(len(rates), inst)
    problem.param_dict["rate_per_s"].value = rates
    info = solve_highs(problem, time_limit_s=time_limit_s)
    if not info.is_ok:
        return MacroPlan(info.status, info.gap, info.runtime_s, inst, inst.n_lower,
                         inst.n_upper, (), (), ())  # fmt: skip
    n = np.rint(np.asarray(problem.var_dict["instances"].value)).astype(int)
    m = np.rint(np.asarray(problem.var_dict["macro_instances"].value)).astype(int)
    return MacroPlan(
        info.status, info.gap, info.runtime_s, inst, inst.n_lower, inst.n_upper,
        tuple(int(v) for v in n), tuple(int(v) for v in m), tuple(int(v) * tp for v in n),
    )  # fmt: skip
