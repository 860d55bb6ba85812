"""SLO-constrained capacity (issue 3): the largest open-loop rate whose SLO attainment meets a
target, and the largest closed-loop concurrency whose P99 TTFT and TPOT meet the SLOs, each found
by bracketing and bisection over fixed-seed simulations."""

from __future__ import annotations

from pdopt.capacity._crossing import (
    CrossingEstimate,
    combine_crossings,
    crossing_interval,
    crossing_of,
    grid_crossing,
    is_flat,
    max_rate_crossing,
)
from pdopt.capacity._search import (
    CapacityResult,
    ConcurrencyResult,
    Probe,
    RateSearch,
    SearchOutcome,
    largest_meeting,
    max_concurrency_under_slo,
    max_rate_under_slo,
)

__all__ = [
    "CapacityResult",
    "ConcurrencyResult",
    "CrossingEstimate",
    "Probe",
    "RateSearch",
    "SearchOutcome",
    "combine_crossings",
    "crossing_interval",
    "crossing_of",
    "grid_crossing",
    "is_flat",
    "largest_meeting",
    "max_concurrency_under_slo",
    "max_rate_crossing",
    "max_rate_under_slo",
]
