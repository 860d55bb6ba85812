"""What the fluid model reads of a workload: an arrival rate per tick and a length sample."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_non_negative, check_positive
from pdopt.errors import ConfigError
from pdopt.workload import LengthDistribution, RateSchedule, Workload

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class FluidWorkload:
    """What the fluid model reads: an arrival rate per tick and a sample of request lengths.

    Parameters
    ----------
    rate_per_s : array of float, shape (n_ticks,)
        Mean arrival rate on tick ``k`` = ``[start_s + k·tick_s, start_s + (k+1)·tick_s)``.
    tick_s : float
        Δt, seconds.
    input_tokens, output_tokens : array of int, shape (m,)
        A sample of (input, output) length pairs: the length moments the pools use.
    start_s : float
        Time of the first tick's start, seconds.
    """

    rate_per_s: FloatArray
    tick_s: float
    input_tokens: FloatArray
    output_tokens: FloatArray
    start_s: float = 0.0

    def __post_init__(self) -> None:
        owner = "FluidWorkload"
        check_positive(self.tick_s, "tick_s", owner)
        check_non_negative(self.start_s, "start_s", owner)
        rate = np.asarray(self.rate_per_s, dtype=np.float64)
        if rate.ndim != 1 or not np.all(np.isfinite(rate)) or np.any(rate < 0):
            raise ConfigError("FluidWorkload: rate_per_s must be a 1-D array of finite rates >= 0")
        inputs = np.asarray(self.input_tokens, dtype=np.float64)
        outputs = np.asarray(self.output_tokens, dtype=np.float64)
        if inputs.shape != outputs.shape or inputs.ndim != 1 or inputs.size == 0:
            raise ConfigError("FluidWorkload: input_tokens and output_tokens must be equal, 1-D")
        if np.any(inputs < 1) or np.any(outputs < 1):
            raise ConfigError("FluidWorkload: token counts must be >= 1")
        object.__setattr__(self, "rate_per_s", rate)
        object.__setattr__(self, "input_tokens", inputs)
        object.__setattr__(self, "output_tokens", outputs)

    @classmethod
    def from_workload(
        cls, workload: Workload, tick_s: float = 0.05, *, rate_window_s: float = 2.0
    ) -> FluidWorkload:
        """Arrivals binned per tick and smoothed by a centred moving average of
        ``rate_window_s`` (mass kept at the edges); lengths are the workload's own."""
        check_positive(tick_s, "tick_s", "FluidWorkload.from_workload")
        check_non_negative(rate_window_s, "rate_window_s", "FluidWorkload.from_workload")
        if len(workload) == 0:
            raise ConfigError("FluidWorkload.from_workload: the workload has no requests")
        n_ticks = math.floor(float(workload.arrival_s[-1]) / tick_s) + 1
        bins = np.minimum((workload.arrival_s / tick_s).astype(np.int64), n_ticks - 1)
        counts = np.bincount(bins, minlength=n_ticks).astype(np.float64)
        width = max(1, round(rate_window_s / tick_s))
        smooth = _moving_average(counts, width)
        return cls(
            smooth / tick_s,
            tick_s,
            workload.input_tokens.astype(np.float64),
            workload.output_tokens.astype(np.float64),
        )

    @classmethod
    def from_schedule(
        cls,
        schedule: RateSchedule,
        input_lengths: LengthDistribution,
        output_lengths: LengthDistribution,
        tick_s: float = 0.05,
        *,
        n_length_samples: int = 4096,
        seed: int = 0,
    ) -> FluidWorkload:
        """The schedule's rate at each tick's midpoint; lengths sampled (``seed``) from the two
        distributions, ``n_length_samples`` pairs."""
        check_positive(tick_s, "tick_s", "FluidWorkload.from_schedule")
        n_ticks = math.ceil(schedule.end_s / tick_s)
        mids = (np.arange(n_ticks) + 0.5) * tick_s
        starts = np.asarray(schedule.start_s)
        idx = np.searchsorted(starts, mids, side="right") - 1
        rates = np.asarray(schedule.rate_per_s)[np.maximum(idx, 0)]
        rates = np.where((idx < 0) | (mids >= schedule.end_s), 0.0, rates)
        rng = np.random.default_rng(seed)
        inputs = input_lengths.sample(n_length_samples, rng)
        outputs = output_lengths.sample(n_length_samples, rng)
        return cls(rates, tick_s, inputs.astype(np.float64), outputs.astype(np.float64))


def _moving_average(counts: FloatArray, width: int) -> FloatArray:
    """Centred moving mean over ``width`` ticks, the window clipped at the edges, then rescaled so
    the total count is kept (NOTE: cumulative sums, O(n) whatever the width)."""
    n = len(counts)
    if width <= 1 or n <= 1:
        return counts
    half = min(width // 2, n)
    csum = np.concatenate(([0.0], np.cumsum(counts)))
    idx = np.arange(n)
    lo = np.maximum(idx - half, 0)
    hi = np.minimum(idx + half + 1, n)
    out: FloatArray = (csum[hi] - csum[lo]) / (hi - lo)
    total = float(out.sum())
    return out * (float(counts.sum()) / total) if total > 0 else out
