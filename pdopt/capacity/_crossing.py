"""Where SLO attainment crosses its target, with a confidence interval over seeds, and whether
it crosses at all (issue 17, item 8).

A capacity search on one seed answers with a number even when the attainment curve is flat
around the target (e.g. 0.9897–0.9901 from 0.5× to 1× load): noise then decides the answer.
:func:`is_flat` detects that case from the search's own points; :func:`max_rate_crossing` runs
the search once per replicate scenario (a seed each) and reports the mean crossing with a
Student-t interval, or "flat" when any replicate's curve does not cross.

Goodput (issue 36) is the same quantity on a rate grid: :func:`grid_crossing` finds one seed's
crossing on a grid of rates (the largest rate meeting the target, interpolated to the next
one), and :func:`combine_crossings` combines seeds for both the grid (the experiments) and the
bisection (``pdopt capacity``): one rule, so no goodput is 0 because one seed missed the first
grid point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy import stats

from pdopt._validation import check_fraction, param_error
from pdopt.parallel import DaskTarget, map_runs
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
    per_seed_status : tuple of str
        Each replicate's own status (:func:`combine_crossings`).
    """

    status: str
    max_rate_per_s: float
    ci_low_per_s: float
    ci_high_per_s: float
    confidence: float
    seeds: tuple[int, ...]
    per_seed_rate_per_s: tuple[float, ...]
    per_seed_status: tuple[str, ...] = ()

    def describe(self, unit: str = "req/s") -> str:
        """The estimate in words: ``"12.3 [11.0, 13.6] req/s"``, ``"below the grid"``, a
        lower bound ``">= 40 req/s (above the grid)"``, or the status."""
        if self.status == "below_grid":
            return "below the grid"
        if self.status in ("flat", "max_evaluations", "below_min") or not math.isfinite(
            self.max_rate_per_s
        ):
            return self.status
        text = f"{self.max_rate_per_s:.3g}"
        if math.isfinite(self.ci_low_per_s):
            text += f" [{self.ci_low_per_s:.3g}, {self.ci_high_per_s:.3g}]"
        text += f" {unit}"
        if self.status == "above_grid":
            return f">= {text} (above the grid)"
        if self.status == "partly_below_grid":
            below = sum(s == "below_grid" for s in self.per_seed_status)
            text += f" ({below} of {len(self.per_seed_status)} seeds below the grid)"
        return text


def grid_crossing(
    rates: Sequence[float], attainment: Sequence[float], target: float
) -> tuple[str, float]:
    """One seed's crossing on a rate grid: ``(status, rate)``.

    The largest grid rate whose attainment meets ``target``, linearly interpolated towards the
    next (failing) rate: ``rate_i + (a_i − target) / (a_i − a_{i+1}) · (rate_{i+1} − rate_i)``.
    A point that misses below a later one that meets (noise) does not end the search.
    ``"ok"``; ``"above_grid"`` when the top rate meets (its rate is a lower bound);
    ``"below_grid"`` (rate NaN) when no rate meets. NaN attainments are skipped.
    """
    pts = sorted(
        (float(r), float(a))
        for r, a in zip(rates, attainment, strict=True)
        if math.isfinite(float(a))
    )
    if not pts:
        raise param_error("attainment", "grid_crossing", "at least one finite value", attainment)
    meeting = [i for i, (_, a) in enumerate(pts) if a >= target]
    if not meeting:
        return "below_grid", math.nan
    i = meeting[-1]
    if i == len(pts) - 1:
        return "above_grid", pts[i][0]
    (r0, a0), (r1, a1) = pts[i], pts[i + 1]
    frac = (a0 - target) / (a0 - a1) if a0 > a1 else 0.0
    return "ok", r0 + frac * (r1 - r0)


def combine_crossings(
    statuses: Sequence[str],
    rates: Sequence[float],
    seeds: Sequence[int],
    *,
    confidence: float = 0.95,
) -> CrossingEstimate:
    """Several seeds' crossings as one estimate: the mean and Student-t interval over seeds
    (:func:`crossing_interval`; its lower end clipped at 0).

    Status: ``"below_grid"`` only when every seed is below the grid (or ``"below_min"`` below
    a bisection's smallest rate); ``"flat"`` (or another search status) when any seed's search
    ended so; ``"partly_below_grid"`` when some seeds are below the grid (they count as 0: the
    mean is a lower bound); ``"above_grid"`` when some seed's top rate still met (counted at
    that rate: a lower bound); else ``"ok"``.
    """
    if not statuses:
        raise param_error("statuses", "combine_crossings", "at least one seed", statuses)
    st = tuple(statuses)
    rs = tuple(float(r) for r in rates)
    below = {"below_grid", "below_min"}
    bad = [s for s in st if s not in below | {"ok", "above_grid"}]
    if all(s in below for s in st) or bad:
        status = "flat" if "flat" in bad else (bad[0] if bad else st[0])
        return CrossingEstimate(
            status, math.nan, math.nan, math.nan, confidence, tuple(seeds), rs, st
        )
    # a seed below the grid crossed somewhere in [0, lowest rate): counted at 0, so the
    # estimate is a lower bound and stays monotone in the target across seeds
    crossed = [0.0 if s in below else r for s, r in zip(st, rs, strict=True)]
    mean, low, high = crossing_interval(crossed, confidence)
    low = max(low, 0.0) if math.isfinite(low) else low  # a rate is never negative
    if any(s in below for s in st):
        status = "partly_below_grid"
    elif "above_grid" in st:
        status = "above_grid"
    else:
        status = "ok"
    return CrossingEstimate(status, mean, low, high, confidence, tuple(seeds), rs, st)


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
    dask: DaskTarget = None,
    progress: Callable[[], None] | None = None,
) -> CrossingEstimate:
    """Run ``search`` (scenario → ``(status, max_rate_per_s)``, e.g. a wrapper of
    :func:`~pdopt.capacity.max_rate_under_slo`) on each replicate and combine the answers.

    The replicates' searches are independent: ``dask`` runs them on a Dask cluster
    (:func:`pdopt.parallel.map_runs`: ``"local"`` or a scheduler address; ``search`` must then
    be picklable, e.g. :class:`~pdopt.capacity.RateSearch`), with the serial answer;
    ``progress()`` is called as each search ends.
    """
    if not replicates:
        raise param_error("replicates", "max_rate_crossing", "at least one scenario", replicates)
    results = map_runs(search, replicates, dask=dask, progress=progress)
    seeds = tuple(sc.seed for sc in replicates)
    return crossing_of(results, seeds, confidence=confidence)


def crossing_of(
    answers: Sequence[tuple[str, float]], seeds: Sequence[int], *, confidence: float = 0.95
) -> CrossingEstimate:
    """Replicate bisections' ``(status, max_rate_per_s)`` as one estimate: a search's
    ``"above_max"`` counts as above the grid (a lower bound), then :func:`combine_crossings`."""
    statuses = ["above_grid" if s == "above_max" else s for s, _ in answers]
    return combine_crossings(statuses, [rate for _, rate in answers], seeds, confidence=confidence)
