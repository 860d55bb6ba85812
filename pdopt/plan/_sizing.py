"""P/D sizing as a MILP: integer prefill, decode and Mixed workers per GPU type × TP degree.

Minimise the GPU cost per hour (or maximise the served rate under a budget) so that

* prefill capacity >= rate: ``Σ_s mu_s · w_s`` over grid segments ``s`` of each option, where
  ``w_s`` workers may use the per-worker rate ``mu(b_s)`` only if ``w_s >= b_s`` (one segment per
  option, a disjunction with binaries ``z_s``; see :mod:`pdopt.plan._workers`);
* decode capacity >= rate: ``Σ_k r_k · x_d[k]`` (mean-field batch under the TPOT SLO and KV);
* with a forecast peak, Mixed-pool workers cover it: in a prefill-peak scenario
  ``m_p[k] <= x_m[k]`` of them join prefill (at the pool-of-one rate ``mu(1)``) and in a
  decode-peak scenario ``m_d[k] <= x_m[k]`` join decode, while the other stage serves the mean;
* GPUs per type <= inventory, total GPUs <= max_gpus.

Units: requests/s, USD/h, GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import cvxpy as cp
import numpy as np
import numpy.typing as npt
from scipy import sparse

from pdopt._validation import check_one_of, check_positive
from pdopt.plan._solve import DEFAULT_TIME_LIMIT_S, SolveInfo, solve_highs
from pdopt.plan._workers import WorkerCapacity, option_name

FloatArray = npt.NDArray[np.float64]
OBJECTIVES = ("min_cost", "max_goodput")
GRID_RATE_TOL = 0.01
"""A prefill grid point enters the MILP only if its per-worker rate beats the last one kept by
this fraction (so the MILP gives away at most 0.5% of prefill capacity to the grid)."""
_TIE_BREAK = 1e-6  # per GPU, relative to the price scale: equal cost -> fewer GPUs


@dataclass(frozen=True, slots=True)
class WorkerCount:
    """``workers`` instances of ``gpu`` at ``tp`` in role ``prefill``, ``decode`` or ``mixed``
    (``expert_parallel``: the option's MoE layout, :class:`pdopt.plan.WorkerOption`)."""

    gpu: str
    tp: int
    role: str
    workers: int
    expert_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.workers * self.tp

    @property
    def key(self) -> tuple[str, int, bool]:
        """The :attr:`pdopt.plan.WorkerOption.key` of the option counted."""
        return (self.gpu, self.tp, self.expert_parallel)

    @property
    def option_name(self) -> str:
        return option_name(self.gpu, self.tp, self.expert_parallel)


@dataclass(frozen=True, slots=True)
class PdSizingPlan:
    """A solved P/D sizing (see :func:`solve_pd_sizing`).

    ``counts`` lists the non-zero worker counts; ``binding`` names the constraints that are
    tight at the optimum (``"prefill"``, ``"decode"``, ``"inventory:<gpu>"``, ``"max_gpus"``,
    ``"budget"``, ``"prefill_peak"``, ``"decode_peak"``). ``served_rate_per_s`` is the demand
    rate for ``min_cost`` and the optimum for ``max_goodput``.
    """

    status: str
    gap: float
    runtime_s: float
    objective: str
    rate_per_s: float
    served_rate_per_s: float
    peak_rate_per_s: float
    counts: tuple[WorkerCount, ...]
    n_gpus: int
    cost_per_hour: float
    prefill_capacity_rps: float
    decode_capacity_rps: float
    binding: tuple[str, ...] = field(default=())

    @property
    def is_ok(self) -> bool:
        return self.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)

    @property
    def cost_per_1k_requests(self) -> float:
        """USD per 1000 requests at the served rate."""
        if self.served_rate_per_s <= 0:
            return math.inf
        return self.cost_per_hour / (self.served_rate_per_s * 3600.0) * 1000.0

    def workers(self, role: str) -> int:
        """Workers in ``role`` over all GPU types."""
        return sum(c.workers for c in self.counts if c.role == role)

    def describe(self) -> str:
        """One line: ``4 × A100-80GB/tp1 prefill + 3 × H100-SXM/tp1 decode, 7 GPUs, $37.00/h``."""
        parts = [f"{c.workers} × {c.option_name} {c.role}" for c in self.counts]
        body = " + ".join(parts) if parts else "no workers"
        return f"{body}, {self.n_gpus} GPUs, ${self.cost_per_hour:.2f}/h"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["counts"] = [asdict(c) for c in self.counts]
        out["binding"] = list(self.binding)
        out["cost_per_1k_requests"] = self.cost_per_1k_requests
        return out


@dataclass(frozen=True, slots=True)
class _Data:
    """Arrays of the sizing problem (one entry per option, per grid segment, per GPU type)."""

    price: FloatArray  # USD/h per worker
    tp: FloatArray
    decode_rate: FloatArray  # 0 where the option cannot decode
    mixed_ok: npt.NDArray[np.bool_]
    mu1: FloatArray
    seg_option: npt.NDArray[np.int64]
    seg_size: FloatArray
    seg_rate: FloatArray
    upper: FloatArray  # most workers of an option in one role
    types: tuple[str, ...]
    type_matrix: FloatArray  # GPUs of type t per worker of option k
    needs_decode: bool


def _data(
    capacities: Sequence[WorkerCapacity],
    peak_rate_per_s: float,
    max_gpus: float = math.inf,
    inventory: Mapping[str, float] | None = None,
) -> _Data:
    opts = [c.option for c in capacities]
    limits = {k.lower(): float(v) for k, v in (inventory or {}).items()}
    types = tuple(dict.fromkeys(o.gpu for o in opts))
    needs_decode = any(math.isfinite(c.decode_rate_per_worker) for c in capacities)
    dec = np.array(
        [c.decode_rate_per_worker if c.fits and math.isfinite(c.decode_rate_per_worker) else 0.0
         for c in capacities]
    )  # fmt: skip
    mu1 = np.array([c.prefill_rate_per_worker[0] if c.fits else 0.0 for c in capacities])
    seg_option, seg_size, seg_rate = [], [], []
    upper = np.zeros(len(capacities))
    for k, c in enumerate(capacities):
        need_p = math.ceil(peak_rate_per_s / mu1[k] * (1 + 1e-9)) if mu1[k] > 0 else 0
        need_d = math.ceil(peak_rate_per_s / dec[k] * (1 + 1e-9)) if dec[k] > 0 else 0
        # NOTE: the big-M of each option: the most workers ever useful, and no more than the
        # static GPU limits allow (tighter big-M, tighter LP relaxation, much faster B&B).
        gpus_cap = min(max_gpus, limits.get(c.option.gpu.lower(), math.inf))
        most = gpus_cap / c.option.tp
        useful = max(need_p, need_d)
        upper[k] = max(min(useful, math.floor(most)) if math.isfinite(most) else useful, 1)
        need_p = min(need_p, int(upper[k]))
        if mu1[k] <= 0:
            continue
        kept = 0.0
        for b, mu in zip(c.pool_sizes, c.prefill_rate_per_worker, strict=True):
            # NOTE: keep a grid point only when it raises the rate by > GRID_RATE_TOL over the
            # last one kept: using the lower rate until then is still a valid lower bound, and
            # the saturated tail of large pools collapses to a few segments (far fewer binaries).
            if b <= need_p and mu > kept * (1.0 + GRID_RATE_TOL):
                seg_option.append(k)
                seg_size.append(float(b))
                seg_rate.append(mu)
                kept = mu
    matrix = np.array([[o.tp if o.gpu == t else 0.0 for o in opts] for t in types])
    return _Data(
        np.array([o.price_per_hour for o in opts]), np.array([float(o.tp) for o in opts]), dec,
        (mu1 > 0) & (dec > 0), mu1, np.array(seg_option, dtype=np.int64),
        np.array(seg_size), np.array(seg_rate), upper, types, matrix, needs_decode,
    )  # fmt: skip


def build_pd_sizing(
    capacities: Sequence[WorkerCapacity],
    *,
    peak_rate_per_s: float,
    objective: str = "min_cost",
    mixed: bool = False,
    max_gpus_bound: float = math.inf,
    inventory_bound: Mapping[str, float] | None = None,
) -> cp.Problem:
    """The unsolved sizing MILP over ``capacities`` (one per GPU type × TP option).

    ``max_gpus_bound`` and ``inventory_bound`` are static limits that only tighten the big-M
    bounds (the ``max_gpus`` and ``inventory_gpus`` parameters must then stay within them).

    Parameters (``problem.param_dict``): ``rate_per_s`` (mean rate to serve), ``peak_rate_per_s``
    (with ``mixed``), ``inventory_gpus`` (per GPU type, in ``problem`` order of first appearance
    in ``capacities``; set a large number for no limit), ``max_gpus``, and ``budget_per_hour``
    (``max_goodput`` only). Variables (``problem.var_dict``): ``prefill_workers``,
    ``decode_workers``, ``mixed_workers`` (per option), ``served_rate_per_s``.

    ``peak_rate_per_s`` here only bounds the grid and the big-M of each option (the most
    workers ever useful); sweeps of the rate parameter must stay at or below it.
    """
    check_one_of(objective, OBJECTIVES, "objective", "build_pd_sizing")
    check_positive(peak_rate_per_s, "peak_rate_per_s", "build_pd_sizing")
    d = _data(capacities, peak_rate_per_s, max_gpus_bound, inventory_bound)
    k_opts, n_seg, n_types = len(d.price), len(d.seg_size), len(d.types)
    rate = cp.Parameter(nonneg=True, name="rate_per_s", value=peak_rate_per_s)
    big = np.full(n_types, 1e9)
    inventory = cp.Parameter(n_types, nonneg=True, name="inventory_gpus", value=big)
    max_gpus = cp.Parameter(nonneg=True, name="max_gpus", value=1e9)
    w = cp.Variable(max(n_seg, 1), integer=True, name="segment_workers")
    z = cp.Variable(max(n_seg, 1), boolean=True, name="segment_on")
    x_d = cp.Variable(k_opts, integer=True, name="decode_workers")
    served = cp.Variable(nonneg=True, name="served_rate_per_s")
    onehot = np.zeros((k_opts, max(n_seg, 1)))
    if n_seg:
        onehot[d.seg_option, np.arange(n_seg)] = 1.0
    x_p = cp.Variable(k_opts, integer=True, name="prefill_workers")
    seg_upper = d.upper[d.seg_option] if n_seg else np.zeros(1)
    seg_size = d.seg_size if n_seg else np.ones(1)
    seg_rate = d.seg_rate if n_seg else np.zeros(1)
    # NOTE: cvxpy is untyped where numpy sits on the left of an operator; constraints are Any.
    cons: list[Any] = [
        w >= 0, x_d >= 0, x_p == onehot @ w, onehot @ z <= 1,
        w <= sparse.diags(seg_upper) @ z, w >= sparse.diags(seg_size) @ z,
        x_d <= d.upper * (d.decode_rate > 0),
    ]  # fmt: skip
    p_cap = seg_rate @ w
    d_cap = d.decode_rate @ x_d
    total = x_p + x_d
    cons += [p_cap >= served]
    if d.needs_decode:
        cons += [d_cap >= served]
    if mixed:
        peak = cp.Parameter(nonneg=True, name="peak_rate_per_s", value=peak_rate_per_s)
        x_m = cp.Variable(k_opts, integer=True, name="mixed_workers")
        m_p = cp.Variable(k_opts, integer=True, name="mixed_to_prefill")
        m_d = cp.Variable(k_opts, integer=True, name="mixed_to_decode")
        allowed = d.upper * d.mixed_ok
        cons += [x_m >= 0, m_p >= 0, m_d >= 0, m_p <= x_m, m_d <= x_m, x_m <= allowed]
        cons += [p_cap + d.mu1 @ m_p >= peak, d_cap + d.decode_rate @ m_d >= peak]
        total = total + x_m
    gpus = d.tp @ total
    cons += [d.type_matrix @ total <= inventory, gpus <= max_gpus]
    cost = d.price @ total
    tie = _TIE_BREAK * float(np.min(d.price)) * gpus
    if objective == "min_cost":
        cons += [served == rate]
        return cp.Problem(cp.Minimize(cost + tie), cons)
    budget = cp.Parameter(nonneg=True, name="budget_per_hour", value=1e9)
    cons += [served <= rate, cost <= budget]
    # Among plans serving the same rate, prefer the cheaper: a cost term worth at most
    # 1e-6 of the peak rate, so it never trades served rate for cost.
    worst_cost = float(d.price @ d.upper) * (3.0 if mixed else 2.0)
    return cp.Problem(cp.Maximize(served - _TIE_BREAK * peak_rate_per_s * cost / worst_cost), cons)


def gpu_types(capacities: Sequence[WorkerCapacity]) -> tuple[str, ...]:
    """GPU types in the order :func:`build_pd_sizing` uses for ``inventory_gpus``."""
    return tuple(dict.fromkeys(c.option.gpu for c in capacities))


def set_limits(
    problem: cp.Problem,
    capacities: Sequence[WorkerCapacity],
    *,
    rate_per_s: float,
    peak_rate_per_s: float | None = None,
    inventory: Mapping[str, int] | None = None,
    max_gpus: int | None = None,
    budget_per_hour: float | None = None,
) -> None:
    """Set the parameters of a built sizing problem (``None``: no limit)."""
    params = problem.param_dict
    params["rate_per_s"].value = float(rate_per_s)
    if "peak_rate_per_s" in params:
        peak = rate_per_s if peak_rate_per_s is None else peak_rate_per_s
        params["peak_rate_per_s"].value = float(peak)
    limits = {k.lower(): v for k, v in (inventory or {}).items()}
    types = gpu_types(capacities)
    params["inventory_gpus"].value = np.array([float(limits.get(t.lower(), 1e9)) for t in types])
    params["max_gpus"].value = 1e9 if max_gpus is None else float(max_gpus)
    if "budget_per_hour" in params:
        params["budget_per_hour"].value = 1e9 if budget_per_hour is None else budget_per_hour


def read_plan(
    problem: cp.Problem,
    capacities: Sequence[WorkerCapacity],
    info: SolveInfo,
    objective: str,
) -> PdSizingPlan:
    """The :class:`PdSizingPlan` of a solved (or failed) sizing problem."""
    params = problem.param_dict
    rate = value_of(params["rate_per_s"])
    peak = value_of(params["peak_rate_per_s"]) if "peak_rate_per_s" in params else rate
    if not info.is_ok:
        return PdSizingPlan(info.status, info.gap, info.runtime_s, objective, rate, 0.0, peak,
                            (), 0, math.nan, 0.0, 0.0)  # fmt: skip
    var = problem.var_dict
    roles = {"prefill": _ints(var["prefill_workers"]), "decode": _ints(var["decode_workers"])}
    if "mixed_workers" in var:
        roles["mixed"] = _ints(var["mixed_workers"])
    counts = tuple(
        WorkerCount(c.option.gpu, c.option.tp, role, int(n[k]), c.option.expert_parallel)
        for role, n in roles.items()
        for k, c in enumerate(capacities)
        if n[k] > 0
    )
    n_gpus = sum(c.gpus for c in counts)
    price = {c.option.key: c.option.price_per_hour for c in capacities}
    cost = sum(price[c.key] * c.workers for c in counts)
    p_cap = sum(c.prefill_capacity_rps(int(roles["prefill"][k])) for k, c in enumerate(capacities))
    d_cap = sum(
        c.decode_rate_per_worker * roles["decode"][k]
        for k, c in enumerate(capacities)
        if roles["decode"][k] > 0
    )
    served = value_of(var["served_rate_per_s"])
    plan = PdSizingPlan(info.status, info.gap, info.runtime_s, objective, rate, served, peak,
                        counts, n_gpus, float(cost), float(p_cap), float(d_cap))  # fmt: skip
    return _with_binding(plan, capacities, params)


def value_of(item: cp.Parameter | cp.Variable) -> float:
    """The scalar value of a cvxpy parameter or variable (NaN when unset)."""
    value = item.value
    return math.nan if value is None else float(np.asarray(value, dtype=np.float64).ravel()[0])


def _ints(variable: cp.Variable) -> npt.NDArray[np.int64]:
    value = np.asarray(variable.value, dtype=np.float64).ravel()
    return np.rint(np.maximum(value, 0.0)).astype(np.int64)


def _with_binding(
    plan: PdSizingPlan, capacities: Sequence[WorkerCapacity], params: Mapping[str, cp.Parameter]
) -> PdSizingPlan:
    tight: list[str] = []
    served = plan.served_rate_per_s
    if plan.workers("mixed") == 0:
        if plan.prefill_capacity_rps <= served * 1.10:
            tight.append("prefill")
        if plan.decode_capacity_rps <= served * 1.10:
            tight.append("decode")
    else:
        tight.append("peak")
    inv = np.asarray(params["inventory_gpus"].value, dtype=np.float64)
    for t, limit in zip(gpu_types(capacities), inv, strict=True):
        used = sum(c.gpus for c in plan.counts if c.gpu == t)
        if limit < 1e9 and used >= limit:
            tight.append(f"inventory:{t}")
    if value_of(params["max_gpus"]) < 1e9 and plan.n_gpus >= value_of(params["max_gpus"]):
        tight.append("max_gpus")
    budget = params.get("budget_per_hour")
    limit = math.inf if budget is None else value_of(budget)
    if limit < 1e9 and plan.cost_per_hour >= limit * (1 - 1e-6):
        tight.append("budget")
    return PdSizingPlan(
        plan.status, plan.gap, plan.runtime_s, plan.objective, plan.rate_per_s,
        plan.served_rate_per_s, plan.peak_rate_per_s, plan.counts, plan.n_gpus,
        plan.cost_per_hour, plan.prefill_capacity_rps, plan.decode_capacity_rps, tuple(tight),
    )  # fmt: skip


def solve_built(
    problem: cp.Problem,
    capacities: Sequence[WorkerCapacity],
    objective: str,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> PdSizingPlan:
    """Solve a built and parameterised sizing problem and read its plan."""
    info = solve_highs(problem, time_limit_s=time_limit_s)
    return read_plan(problem, capacities, info, objective)
