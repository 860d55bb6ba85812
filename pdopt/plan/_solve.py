"""Solving a built cvxpy problem with HiGHS and reading back status, gap and runtime."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import cvxpy as cp

from pdopt._validation import check_non_negative, check_positive

DEFAULT_TIME_LIMIT_S = 30.0
"""Wall-clock limit handed to HiGHS, seconds; a plan hitting it has status ``"time_limit"``."""

DEFAULT_MIP_REL_GAP = 1e-4
"""Relative MIP gap at which HiGHS stops (its own default): a plan costs at most 0.01% more
than the optimum, and says how much in its ``gap``. Pass ``mip_rel_gap=0`` to prove optimality
(a 10,000-GPU sizing takes about twice as long to close the last 1e-4)."""


@dataclass(frozen=True, slots=True)
class SolveInfo:
    """What a solve reports, whatever the problem.

    Attributes
    ----------
    status : str
        cvxpy's status: ``"optimal"``, ``"optimal_inaccurate"`` (includes a time-limited
        incumbent), ``"infeasible"``, ``"unbounded"``, ``"solver_error"``.
    gap : float
        Relative MIP gap HiGHS reports (0 when proven optimal, NaN for an LP or no solution).
    runtime_s : float
        Wall-clock seconds of ``problem.solve`` (cvxpy compilation included).
    objective : float
        The objective value (NaN without a solution).
    """

    status: str
    gap: float
    runtime_s: float
    objective: float

    @property
    def is_ok(self) -> bool:
        """A solution is present (optimal, or the best found within the limits)."""
        return self.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)


def solve_highs(
    problem: cp.Problem,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    mip_rel_gap: float = DEFAULT_MIP_REL_GAP,
) -> SolveInfo:
    """Solve ``problem`` in place with HiGHS; never raises for infeasibility (see the status)."""
    limit = check_positive(time_limit_s, "time_limit_s", "solve_highs")
    gap_target = check_non_negative(mip_rel_gap, "mip_rel_gap", "solve_highs")
    start = time.perf_counter()
    try:
        with stdout_to_stderr():
            problem.solve(solver=cp.HIGHS, time_limit=limit, mip_rel_gap=gap_target)  # type: ignore[no-untyped-call]
    except (cp.SolverError, ValueError):
        # ValueError: cvxpy cannot unpack HiGHS's "unknown" status (seen with coefficients
        # near 1e300, e.g. a rate of 1e300 req/s): no solution, said as a solver error.
        return SolveInfo("solver_error", math.nan, time.perf_counter() - start, math.nan)
    runtime = time.perf_counter() - start
    status = str(problem.status)
    value = problem.value
    objective = float(value) if status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) else math.nan
    return SolveInfo(status, _mip_gap(problem), runtime, objective)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at standard error for the duration (and restore it).

    HiGHS prints its banner from C++ straight to descriptor 1, past ``sys.stdout`` and whatever
    capture Python has installed, so ``pdopt ... --json`` would not be JSON alone on stdout
    (issue 17). Python's own buffered output is flushed first so nothing is reordered.
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (e.g. a detached process): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _mip_gap(problem: cp.Problem) -> float:
    stats = problem.solver_stats
    info = None if stats is None else stats.extra_stats
    gap = getattr(info, "mip_gap", math.nan)
    try:
        gap = float(gap)
    except (TypeError, ValueError):
        return math.nan
    # HiGHS reports +inf for an LP or before an incumbent exists.
    return gap if math.isfinite(gap) else math.nan
