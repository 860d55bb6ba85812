"""Seeded synthetic workloads: arrival processes and request-length distributions.

A workload is composed from two independent parts::

    arrival_s = poisson_arrivals(5.0, n_requests=1000, seed=1)          # when requests come
    workload = generate_workload(arrival_s, LognormalLengths.from_mean_median(343.8, 148),
                                 ConstantLengths(128), seed=1)          # how long they are

Every function takes ``seed`` (an int >= 0, or None for fresh OS entropy). Arrivals and the two
length columns draw from separate child streams of ``numpy.random.SeedSequence(seed)``, so the
same seed given to both calls above yields independent, reproducible draws.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from scipy import optimize, stats

from pdopt._validation import (
    check_int_at_least,
    check_non_negative,
    check_positive,
    param_error,
)
from pdopt.workload._workload import FloatArray, IntArray, Workload

# Child-stream indices of SeedSequence(seed): one per independent random column.
_ARRIVAL_STREAM, _INPUT_STREAM, _OUTPUT_STREAM = 0, 1, 2


def _rng(seed: int | None, stream: int, owner: str) -> np.random.Generator:
    if seed is not None:
        seed = check_int_at_least(seed, 0, "seed", owner)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


class LengthDistribution(Protocol):
    """Anything that draws request lengths: ``sample(n, rng)`` -> ints >= 1, shape (n,)."""

    def sample(self, n: int, rng: np.random.Generator) -> IntArray: ...


@dataclass(frozen=True, slots=True)
class ConstantLengths:
    """Every request has ``tokens`` tokens (the fixed-length archetypes of the seed papers)."""

    tokens: int

    def __post_init__(self) -> None:
        check_int_at_least(self.tokens, 1, "tokens", "ConstantLengths")

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        """``n`` copies of ``tokens`` (``rng`` is unused; it is taken for a common interface)."""
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class EmpiricalLengths:
    """Lengths resampled uniformly with replacement from observed ``values`` (e.g. a trace)."""

    values: tuple[int, ...]

    def __init__(self, values: npt.ArrayLike) -> None:
        raw = np.asarray(values)
        if raw.ndim != 1 or raw.size == 0 or raw.dtype.kind not in "iuf":
            raise param_error("values", "EmpiricalLengths", "a non-empty 1-D array of ints", values)
        if not np.all(np.isfinite(raw)) or np.any(raw != np.round(raw)) or np.any(raw < 1):
            raise param_error("values", "EmpiricalLengths", "whole numbers >= 1", values)
        object.__setattr__(self, "values", tuple(int(v) for v in raw))

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        """``n`` draws with replacement from ``values``."""
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, replace=True)


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    """Lengths ``round(min(X, max_tokens))`` clipped to >= 1, with ``ln X ~ Normal(mu, sigma)``.

    Build it from a published mean and median with :meth:`from_mean_median`.

    Parameters
    ----------
    mu, sigma : float
        Location and scale of ``ln X`` (the median of ``X`` is ``exp(mu)``); ``sigma`` >= 0.
    max_tokens : int or None
        Upper clip (a context-window cap), or None for no cap.
    """

    mu: float
    sigma: float
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.mu):
            raise param_error("mu", "LognormalLengths", "a finite number", self.mu)
        check_non_negative(self.sigma, "sigma", "LognormalLengths")
        if self.max_tokens is not None:
            check_int_at_least(self.max_tokens, 1, "max_tokens", "LognormalLengths")

    @classmethod
    def from_mean_sigma(
        cls, mean: float, sigma: float, max_tokens: int | None = None
    ) -> LognormalLengths:
        """Fit ``mu`` so the (clipped) mean equals ``mean`` at a given spread ``sigma``.

        Without a cap ``mu = ln(mean) - sigma**2 / 2``; with ``max_tokens``, ``mu`` solves
        ``E[min(X, M)] = mean`` (see :meth:`from_mean_median`). Used for archetypes published
        as means only, with a spread measured elsewhere.

        Examples
        --------
        >>> d = LognormalLengths.from_mean_sigma(1024.0, 0.5)
        >>> round(math.exp(d.mu + d.sigma**2 / 2), 6)
        1024.0
        """
        owner = "LognormalLengths.from_mean_sigma"
        mean = check_positive(mean, "mean", owner)
        sigma = check_non_negative(sigma, "sigma", owner)
        if max_tokens is not None:
            max_tokens = check_int_at_least(max_tokens, 1, "max_tokens", owner)
        return cls(_mu_for_clipped_mean(mean, sigma, max_tokens, owner), sigma, max_tokens)

    @classmethod
    def from_mean_median(
        cls, mean: float, median: float, max_tokens: int | None = None
    ) -> LognormalLengths:
        """Fit ``mu = ln(median)`` and ``sigma`` so the (clipped) mean equals ``mean``.

        Without a cap, ``mean = exp(mu + sigma**2 / 2)`` gives ``sigma = sqrt(2 ln(mean/median))``,
        which needs ``mean >= median``. With ``max_tokens`` above the median, the median is
        unchanged by the cap and ``sigma`` solves ``E[min(X, M)] = mean``, where
        ``E[min(X, M)] = exp(mu + sigma**2/2) Phi((ln M - mu - sigma**2)/sigma)
        + M (1 - Phi((ln M - mu)/sigma))``; this also fits a mean below the median (a
        length distribution piled up against a context cap, e.g. LongBench inputs).

        Examples
        --------
        >>> d = LognormalLengths.from_mean_median(343.8, 148)
        >>> round(d.sigma, 3)
        1.298
        """
        owner = "LognormalLengths.from_mean_median"
        mean = check_positive(mean, "mean", owner)
        median = check_positive(median, "median", owner)
        mu = math.log(median)
        if max_tokens is None:
            if mean < median:
                raise param_error(
                    "mean",
                    owner,
                    f">= the median {median} for an uncapped lognormal "
                    "(give max_tokens to fit a lognormal clipped at a cap)",
                    mean,
                )
            return cls(mu, math.sqrt(2.0 * math.log(mean / median)))
        max_tokens = check_int_at_least(max_tokens, 1, "max_tokens", owner)
        if max_tokens <= median:
            raise param_error("max_tokens", owner, f"> the median {median}", max_tokens)
        return cls(mu, _sigma_for_clipped_mean(mean, mu, max_tokens, owner), max_tokens)

    def clipped_mean(self) -> float:
        """The mean of ``min(X, max_tokens)`` before rounding (closed form above)."""
        if self.max_tokens is None:
            return math.exp(self.mu + self.sigma**2 / 2)
        return _clipped_lognormal_mean(self.sigma, self.mu, self.max_tokens)

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        """``n`` lengths: lognormal draws, clipped at ``max_tokens``, rounded, at least 1."""
        draws = rng.lognormal(self.mu, self.sigma, size=n)
        if self.max_tokens is not None:
            draws = np.minimum(draws, self.max_tokens)
        return np.maximum(np.rint(draws), 1).astype(np.int64)


def _clipped_lognormal_mean(sigma: float, mu: float, cap: float) -> float:
    if sigma <= 0:
        return min(math.exp(mu), cap)
    z = (math.log(cap) - mu) / sigma
    # NOTE: in log space, because exp(sigma**2 / 2) overflows long before the product does.
    below = math.exp(mu + sigma**2 / 2 + float(stats.norm.logcdf(z - sigma)))
    return below + cap * float(stats.norm.sf(z))


def _mu_for_clipped_mean(mean: float, sigma: float, cap: int | None, owner: str) -> float:
    """Solve ``E[min(X, cap)] = mean`` for mu at fixed sigma (without a cap:
    ``mu = ln(mean) - sigma**2 / 2``); the clipped mean rises monotonically with mu."""
    if cap is None:
        return math.log(mean) - 0.5 * sigma * sigma
    if mean >= cap:
        raise param_error("mean", owner, f"< the cap max_tokens={cap}", mean)

    def f(mu: float) -> float:
        return _clipped_lognormal_mean(sigma, mu, cap) - mean

    low = math.log(mean) - 0.5 * sigma * sigma - 1.0
    high = math.log(cap) + 10.0 * max(sigma, 1.0)
    return float(optimize.brentq(f, low, high, xtol=1e-12))


def _sigma_for_clipped_mean(mean: float, mu: float, cap: int, owner: str) -> float:
    """Solve ``E[min(X, cap)] = mean`` for sigma: the rising branch if mean >= median, else the
    falling one (the clipped mean rises from the median, peaks, then falls towards cap / 2)."""
    median = math.exp(mu)

    def f(sigma: float) -> float:
        return _clipped_lognormal_mean(sigma, mu, cap) - mean

    peak = optimize.minimize_scalar(lambda s: -f(s), bounds=(1e-9, 10.0), method="bounded")
    sigma_peak = float(peak.x)
    low, high = (1e-12, sigma_peak) if mean >= median else (sigma_peak, 50.0)
    if f(low) * f(high) > 0:
        reachable = f"in ({cap / 2:.6g}, {f(sigma_peak) + mean:.6g}]"
        raise param_error("mean", owner, f"{reachable} for median {median} and cap {cap}", mean)
    return float(optimize.brentq(f, low, high, xtol=1e-12))


def _check_size(
    n_requests: int | None, duration_s: float | None, owner: str
) -> tuple[int | None, float | None]:
    if (n_requests is None) == (duration_s is None):
        rule = "given, or 'duration_s', but not both"
        raise param_error("n_requests", owner, rule, n_requests)
    if n_requests is not None:
        return check_int_at_least(n_requests, 0, "n_requests", owner), None
    assert duration_s is not None  # for mypy: exactly one is None
    return None, check_positive(duration_s, "duration_s", owner)


def _renewal(
    draw_gaps: Callable[[int], FloatArray],
    mean_gap_s: float,
    n_requests: int | None,
    duration_s: float | None,
) -> FloatArray:
    """Arrival times as cumulative sums of i.i.d. gaps, the first arrival one gap after t = 0:
    ``n_requests`` of them, or all of them in ``[0, duration_s)``."""
    if n_requests is not None:
        return np.cumsum(draw_gaps(n_requests))
    assert duration_s is not None
    chunks: list[FloatArray] = []
    elapsed_s = 0.0
    while elapsed_s < duration_s:
        # NOTE: draw in blocks sized by the expected remaining count, so this loops a few times.
        block = int(1.1 * (duration_s - elapsed_s) / mean_gap_s) + 64
        times = elapsed_s + np.cumsum(draw_gaps(block))
        chunks.append(times)
        elapsed_s = float(times[-1])
    arrival = np.concatenate(chunks)
    return arrival[arrival < duration_s]


def poisson_arrivals(
    rate_per_s: float,
    *,
    n_requests: int | None = None,
    duration_s: float | None = None,
    seed: int | None = None,
) -> FloatArray:
    """Poisson arrivals: exponential gaps with mean ``1 / rate_per_s`` (inter-arrival CV = 1).

    Give ``n_requests`` (that many arrivals) or ``duration_s`` (all arrivals in the window).

    Examples
    --------
    >>> poisson_arrivals(2.0, n_requests=3, seed=0).shape
    (3,)
    """
    owner = "poisson_arrivals"
    rate_per_s = check_positive(rate_per_s, "rate_per_s", owner)
    n_requests, duration_s = _check_size(n_requests, duration_s, owner)
    rng = _rng(seed, _ARRIVAL_STREAM, owner)
    return _renewal(
        lambda k: rng.exponential(1.0 / rate_per_s, size=k),
        1.0 / rate_per_s,
        n_requests,
        duration_s,
    )


def gamma_arrivals(
    rate_per_s: float,
    cv: float,
    *,
    n_requests: int | None = None,
    duration_s: float | None = None,
    seed: int | None = None,
) -> FloatArray:
    """Bursty renewal arrivals: gamma gaps with mean ``1 / rate_per_s`` and CV ``cv``.

    Shape ``k = 1 / cv**2`` and scale ``cv**2 / rate_per_s``. ``cv = 1`` is Poisson; ``cv = 3``
    (k = 1/9) gives micro-clustered bursts: most gaps are tiny and a few are long.
    """
    owner = "gamma_arrivals"
    rate_per_s = check_positive(rate_per_s, "rate_per_s", owner)
    cv = check_positive(cv, "cv", owner)
    n_requests, duration_s = _check_size(n_requests, duration_s, owner)
    rng = _rng(seed, _ARRIVAL_STREAM, owner)
    shape, scale = 1.0 / cv**2, cv**2 / rate_per_s
    return _renewal(
        lambda k: rng.gamma(shape, scale, size=k), 1.0 / rate_per_s, n_requests, duration_s
    )


@dataclass(frozen=True, slots=True)
class RateSchedule:
    """A piecewise-constant arrival rate: ``rate_per_s[i]`` on ``[start_s[i], start_s[i+1])``,
    the last segment ending at ``end_s``.

    Examples
    --------
    >>> RateSchedule((0.0, 90.0, 120.0), (5.0, 25.0, 5.0), 210.0).rate_at(100.0)
    25.0
    """

    start_s: tuple[float, ...]
    rate_per_s: tuple[float, ...]
    end_s: float

    def __post_init__(self) -> None:
        owner = "RateSchedule"
        starts = tuple(check_non_negative(t, "start_s", owner) for t in self.start_s)
        rates = tuple(check_non_negative(r, "rate_per_s", owner) for r in self.rate_per_s)
        if not starts or len(starts) != len(rates):
            rule = f"non-empty and as long as rate_per_s ({len(rates)})"
            raise param_error("start_s", owner, rule, self.start_s)
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise param_error("start_s", owner, "strictly increasing", self.start_s)
        end_s = check_positive(self.end_s, "end_s", owner)
        if end_s <= starts[-1]:
            raise param_error("end_s", owner, f"> the last start {starts[-1]}", self.end_s)
        object.__setattr__(self, "start_s", starts)
        object.__setattr__(self, "rate_per_s", rates)
        object.__setattr__(self, "end_s", end_s)

    def rate_at(self, t_s: float) -> float:
        """The rate in force at time ``t_s`` (0 outside ``[start_s[0], end_s)``)."""
        if t_s < self.start_s[0] or t_s >= self.end_s:
            return 0.0
        return self.rate_per_s[int(np.searchsorted(self.start_s, t_s, side="right")) - 1]

    def expected_requests(self) -> float:
        """The mean number of arrivals, the integral of the rate."""
        bounds = (*self.start_s, self.end_s)
        return float(
            sum(r * (b - a) for r, a, b in zip(self.rate_per_s, bounds, bounds[1:], strict=False))
        )


def shock_recovery_schedule(
    base_rate_per_s: float = 5.0,
    peak_rate_per_s: float = 25.0,
    shock_start_s: float = 90.0,
    shock_end_s: float = 120.0,
    total_s: float = 210.0,
) -> RateSchedule:
    """Steady ``base`` rate, a ``peak`` burst on ``[shock_start_s, shock_end_s)``, then back to
    ``base`` until ``total_s`` (the shock-recovery experiment: 5 -> 25 req/s during 90-120 s)."""
    return RateSchedule(
        (0.0, shock_start_s, shock_end_s),
        (base_rate_per_s, peak_rate_per_s, base_rate_per_s),
        total_s,
    )


def piecewise_rate_arrivals(schedule: RateSchedule, *, seed: int | None = None) -> FloatArray:
    """Non-homogeneous Poisson arrivals following a piecewise-constant ``schedule``.

    Exact: segment ``i`` receives ``Poisson(rate_i * length_i)`` arrivals placed uniformly in it.
    """
    rng = _rng(seed, _ARRIVAL_STREAM, "piecewise_rate_arrivals")
    starts = np.asarray(schedule.start_s)
    lengths = np.diff(np.append(starts, schedule.end_s))
    counts = rng.poisson(np.asarray(schedule.rate_per_s) * lengths)
    offsets = rng.uniform(0.0, 1.0, size=int(counts.sum())) * np.repeat(lengths, counts)
    return np.sort(np.repeat(starts, counts) + offsets)


def generate_workload(
    arrival_s: Sequence[float] | FloatArray,
    input_lengths: LengthDistribution,
    output_lengths: LengthDistribution,
    *,
    seed: int | None = None,
    name: str = "generated",
) -> Workload:
    """A :class:`Workload` with the given (sorted) arrival times and lengths drawn per request.

    Input and output lengths are drawn independently of each other and of the arrivals.

    Examples
    --------
    >>> w = generate_workload(poisson_arrivals(5.0, n_requests=4, seed=1),
    ...                       ConstantLengths(128), ConstantLengths(16), seed=1)
    >>> w.input_tokens.tolist()
    [128, 128, 128, 128]
    """
    arrival = np.asarray(arrival_s, dtype=np.float64)
    n = len(arrival)
    inputs = input_lengths.sample(n, _rng(seed, _INPUT_STREAM, "generate_workload"))
    outputs = output_lengths.sample(n, _rng(seed, _OUTPUT_STREAM, "generate_workload"))
    return Workload(arrival, inputs, outputs, name=name)
