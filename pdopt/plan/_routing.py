"""Batch Φ routing: place a burst of ``k`` requests on prefill workers maximising the minimum Φ_T.

With ``work[i, w] = alpha_w·l_i² + beta_w·P_m,w·l_i`` (FLOP-equivalent, DESIGN.md "Cost model")
and ``queued[w]`` the work already on worker ``w``, Phasor's temporal freeness after the burst is
``Φ_T(w) = 1 − (queued[w] + Σ_i work[i, w]·x[i, w]) / (P_peak,w · T_TTFT_SLO)``. Maximising
``min_w Φ_T(w)`` is min-max makespan (``R||C_max``, NP-hard): binaries ``x[i, w]``, one worker
per request, and ``t >= load[w] / (P_peak,w·T)`` for every worker; ``Φ_min = 1 − t``.

The greedy it is compared with is Phasor's micro rule: requests in arrival order, each to the
current argmax Φ_T (ties to the lowest index), updating Φ after each placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cvxpy as cp
import numpy as np
import numpy.typing as npt
from scipy import sparse

from pdopt._validation import check_positive, param_error
from pdopt.costmodel import PrefillModel
from pdopt.plan._solve import DEFAULT_TIME_LIMIT_S, solve_highs

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class BatchRoutingPlan:
    """The optimal placement of a burst and how far the greedy argmax-Φ rule is from it.

    Attributes
    ----------
    assignment : tuple of int
        Worker index of each request (optimal).
    phi_min : float
        min_w Φ_T after the optimal placement.
    phi : tuple of float
        Φ_T of every worker after it.
    greedy_assignment : tuple of int
        The greedy argmax-Φ placement.
    greedy_phi_min : float
        min_w Φ_T after the greedy placement.
    greedy_gap : float
        ``phi_min − greedy_phi_min`` (>= 0 up to the MIP gap): Φ units the greedy loses.
    greedy_makespan_ratio : float
        Greedy's bottleneck time over the optimum's, ``(1 − greedy_phi_min)/(1 − phi_min)``.
    """

    status: str
    gap: float
    runtime_s: float
    assignment: tuple[int, ...]
    phi_min: float
    phi: tuple[float, ...]
    greedy_assignment: tuple[int, ...]
    greedy_phi_min: float
    greedy_gap: float
    greedy_makespan_ratio: float

    @property
    def is_ok(self) -> bool:
        return self.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)


def routing_work_flop(
    input_tokens: npt.ArrayLike, models: PrefillModel | list[PrefillModel]
) -> FloatArray:
    """``work[i, w]``: request ``i``'s prefill work on worker ``w`` (FLOP-equivalent)."""
    lengths = np.asarray(input_tokens, dtype=np.float64).ravel()
    per = models if isinstance(models, list) else [models]
    return np.column_stack([m.work_flop(lengths) for m in per])


def _check_inputs(work: FloatArray, capacity: FloatArray, owner: str) -> None:
    if work.ndim != 2 or work.shape[0] == 0 or work.shape[1] == 0 or np.any(work < 0):
        raise param_error("work_flop", owner, "a non-empty (k, W) array of work >= 0", work.shape)
    if capacity.shape != (work.shape[1],) or np.any(capacity <= 0):
        raise param_error("budget_flop", owner, "W values > 0 (P_peak · T_SLO)", capacity)


def build_batch_routing(work_flop: npt.ArrayLike, budget_flop: npt.ArrayLike) -> cp.Problem:
    """The unsolved min-max routing MILP.

    ``work_flop`` (k, W) is each request's work on each worker; ``budget_flop`` (W,) is
    ``P_peak,w · T_TTFT_SLO``. Parameter ``queued_flop`` (W,) is the work already queued
    (default 0); variables ``assign`` (k, W, boolean) and ``load_share`` (the bottleneck
    ``1 − Φ_min``).
    """
    work = np.asarray(work_flop, dtype=np.float64)
    budget = np.asarray(budget_flop, dtype=np.float64).ravel()
    _check_inputs(work, budget, "build_batch_routing")
    k, n_workers = work.shape
    queued = cp.Parameter(n_workers, nonneg=True, name="queued_flop", value=np.zeros(n_workers))
    x = cp.Variable((k, n_workers), boolean=True, name="assign")
    t = cp.Variable(name="load_share")
    # Per-worker load divided by its budget: scaled so the coefficients are O(1) for HiGHS.
    scaled = work / budget[None, :]
    weighted = cp.multiply(scaled, x)  # type: ignore[attr-defined]
    load: Any = np.ones(k) @ weighted + sparse.diags(1.0 / budget) @ queued
    cons: list[Any] = [x @ np.ones(n_workers) == 1, load <= t]
    return cp.Problem(cp.Minimize(t), cons)


def greedy_phi_routing(
    work_flop: FloatArray, budget_flop: FloatArray, queued_flop: FloatArray
) -> IntArray:
    """Phasor's rule: each request, in order, to the argmax Φ_T worker (ties: lowest index)."""
    load = queued_flop / budget_flop
    out = np.empty(work_flop.shape[0], dtype=np.int64)
    for i in range(work_flop.shape[0]):
        w = int(np.argmin(load))  # argmax Φ = argmin load share
        out[i] = w
        load[w] += work_flop[i, w] / budget_flop[w]
    return out


def phi_after(
    assignment: npt.ArrayLike, work_flop: FloatArray, budget_flop: FloatArray, queued: FloatArray
) -> FloatArray:
    """Φ_T of every worker after placing each request ``i`` on ``assignment[i]``."""
    a = np.asarray(assignment, dtype=np.int64)
    load = queued.astype(np.float64).copy()
    np.add.at(load, a, work_flop[np.arange(len(a)), a])
    out: FloatArray = 1.0 - load / budget_flop
    return out


def solve_batch_routing(
    work_flop: npt.ArrayLike,
    budget_flop: npt.ArrayLike,
    queued_flop: npt.ArrayLike | None = None,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> BatchRoutingPlan:
    """Optimal and greedy placement of a burst (see the module docstring).

    Examples
    --------
    Two idle workers with budget 10, a burst of work 1, 1, 2: the greedy puts the two small
    requests on different workers and the large one on top of one of them (load 3); the
    optimum pairs the small ones (loads 2 and 2).

    >>> plan = solve_batch_routing([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]], [10.0, 10.0])
    >>> (round(plan.phi_min, 9), round(plan.greedy_phi_min, 9))
    (0.8, 0.7)
    """
    work = np.asarray(work_flop, dtype=np.float64)
    budget = np.asarray(budget_flop, dtype=np.float64).ravel()
    _check_inputs(work, budget, "solve_batch_routing")
    queued = np.zeros(work.shape[1]) if queued_flop is None else np.asarray(queued_flop, float)
    if queued.shape != budget.shape or np.any(queued < 0):
        raise param_error("queued_flop", "solve_batch_routing", "W values >= 0", queued_flop)
    check_positive(time_limit_s, "time_limit_s", "solve_batch_routing")
    problem = build_batch_routing(work, budget)
    problem.param_dict["queued_flop"].value = queued
    info = solve_highs(problem, time_limit_s=time_limit_s)
    greedy = greedy_phi_routing(work, budget, queued)
    greedy_min = float(phi_after(greedy, work, budget, queued).min())
    if not info.is_ok:
        nan = float("nan")
        return BatchRoutingPlan(info.status, info.gap, info.runtime_s, (), nan, (),
                                tuple(int(g) for g in greedy), greedy_min, nan, nan)  # fmt: skip
    x = np.asarray(problem.var_dict["assign"].value)
    assign = np.argmax(x, axis=1)
    phi = phi_after(assign, work, budget, queued)
    phi_min = float(phi.min())
    ratio = (1.0 - greedy_min) / (1.0 - phi_min) if phi_min < 1.0 else 1.0
    return BatchRoutingPlan(
        info.status, info.gap, info.runtime_s, tuple(int(a) for a in assign), phi_min,
        tuple(float(p) for p in phi), tuple(int(g) for g in greedy), greedy_min,
        phi_min - greedy_min, ratio,
    )  # fmt: skip
