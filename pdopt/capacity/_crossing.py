"""Where SLO attainment crosses its target, with a confidence interval over seeds, and whether
it crosses at all (issue 17, item 8).

A capacity search on one seed answers with a number even when the attainment curve is flat
around the target (e.g. 0.9897–0.9901 from 0.5× to 1× load): noise then decides the answer.
:func:`is_flat` detects that case from the search's own points; :func:`max_rate_crossing` runs
the search once per replicate scenario (a seed each) and reports the mean crossing with a
Student-t interval, or "flat" when any replicate's curve does not cross.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy import stats

from pdopt._validation import check_fraction, param_error
from pdopt.scenario import Scenario

FLAT_SIGMAS = 3.0
"""A curve is flat when all its probed attainments lie within this many binomial standard
errors ``sqrt(t (1 − t) / n)`` of each other (``t`` the target, ``n`` requests per run)."""


def is_flat(attainments: Sequence[float], target: float, n_requests: int) -> bool:
    """True when the probed attainments (spanning at least a factor 2 of rate, as the search's
    doubling or halving guarantees) vary less than sampling noise: the curve does not cross
    the target at any rate the search can tell apart."""
    values = [a for a in attainments if math.isfinite(a)]
    if len(values) < 2 or n_requests < 1:
        return False
    band = FLAT_SIGMAS * math.sqrt(max(target * (1.0 - target), 1e-12) / n_requests)
    return max(values) - min(values) < band


@dataclass(frozen=True, slots=True)
class CrossingEstimate:
    """The rate at which attainment crosses the target, over replicate seeds.

    Attributes
    ----------
    status : str
        ``"ok"`` (every replicate crossed), ``"flat"`` (some replicate's curve does not cross:
        undetermined, no number), or the first replicate's other search status
        (``"below_min"``, ``"above_max"``, ``"max_evaluations"``).
    max_rate_per_s : float
        Mean over replicates of the largest rate meeting the target, requests/s (NaN unless
        ``status`` is ``"ok"``).
    ci_low_per_s, ci_high_per_s : float
        Student-t ``confidence`` interval of that mean (NaN with one replicate).
    confidence : float
    seeds : tuple of int
        The replicates' seeds.
    per_seed_rate_per_s : tuple of float
        Each replicate's answer, requests/s.
    """

    status: str
    max_rate_per_s: float
    ci_low_per_s: float
    ci_high_per_s: float
    confidence: float
    seeds: tuple[int, ...]
    per_seed_rate_per_s: tuple[float, ...]


def crossing_interval(
    rates: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the Student-t interval of the mean of ``rates`` (NaN bounds for
    fewer than two values, equal bounds for identical values)."""
    check_fraction(confidence, "confidence", "crossing_interval")
    n = len(rates)
    if n == 0:
        raise param_error("rates", "crossing_interval", "at least one rate", rates)
    mean = sum(rates) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def max_rate_crossing(
    replicates: Sequence[Scenario],
    search: Callable[[Scenario], tuple[str, float]],
    *,
    confidence: float = 0.95,
) -> CrossingEstimate:
    """Run ``search`` (scenario → ``(status, max_rate_per_s)``, e.g. a wrapper of
    :func:`~pdopt.capacity.max_rate_under_slo`) on each replicate and combine the answers."""
    if not replicates:
        raise param_error("replicates", "max_rate_crossing", "at least one scenario", replicates)
    results = [search(sc) for sc in replicates]
    seeds = tuple(sc.seed for sc in replicates)
    rates = tuple(rate for _, rate in results)
    statuses = [status for status, _ in results]
    status = "flat" if "flat" in statuses else next((s for s in statuses if s != "ok"), "ok")
    if status != "ok":
        return CrossingEstimate(status, math.nan, math.nan, math.nan, confidence, seeds, rates)
    mean, low, high = crossing_interval(rates, confidence)
    return CrossingEstimate(status, mean, low, high, confidence, seeds, rates)
