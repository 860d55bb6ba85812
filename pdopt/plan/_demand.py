"""What a plan must serve: rate, burstiness, request lengths and the SLOs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_fraction, check_non_negative, check_positive, param_error
from pdopt.costmodel import PrefillModel
from pdopt.model_spec import ModelSpec
from pdopt.workload import Workload, stack_distances

if TYPE_CHECKING:  # NOTE: type-only: pdopt.plan._workers imports this module
    from pdopt.plan._workers import WorkerOption

FloatArray = npt.NDArray[np.float64]

DKW_CONFIDENCE = 0.95
"""Confidence of the sampling error bound :func:`sampled_quantile_error`."""


@dataclass(frozen=True, slots=True)
class Demand:
    """The traffic and SLOs a plan is sized for.

    Parameters
    ----------
    rate_per_s : float
        Mean arrival rate to serve, requests per second.
    input_tokens, output_tokens : array of float, shape (n,)
        Samples of the prompt and output length distributions (a workload's columns).
    ttft_slo_s, tpot_slo_s : float
        Time to first token and time per output token objectives, seconds.
    arrival_scv : float
        Squared CV of inter-arrival times (1 Poisson; a gamma process with CV 3 has 9). Enters
        the prefill waits through Allen–Cunneen / Kingman.
    ttft_quantile : float
        The TTFT SLO holds at this quantile (0.99: P99 TTFT <= ttft_slo_s).
    peak_rate_per_s : float
        Forecast peak rate that Mixed-pool workers, promoted to P or D, must absorb (not at the
        same time: one peak of prefill demand, another of decode demand). Defaults to the mean
        rate: no Mixed pool is needed.
    cached_tokens : array of float, shape (n,), or None
        Prompt tokens of each sample a prefix cache serves (issue 35: prefill is sized on the
        tokens that miss, :meth:`prefill_service_s`); None: no prefix caching.
    """

    rate_per_s: float
    input_tokens: FloatArray
    output_tokens: FloatArray
    ttft_slo_s: float
    tpot_slo_s: float
    arrival_scv: float = 1.0
    ttft_quantile: float = 0.99
    peak_rate_per_s: float = field(default=math.nan)
    cached_tokens: FloatArray | None = None

    def __post_init__(self) -> None:
        owner = "Demand"
        check_positive(self.rate_per_s, "rate_per_s", owner)
        check_positive(self.ttft_slo_s, "ttft_slo_s", owner)
        check_positive(self.tpot_slo_s, "tpot_slo_s", owner)
        check_non_negative(self.arrival_scv, "arrival_scv", owner)
        check_fraction(self.ttft_quantile, "ttft_quantile", owner)
        if self.ttft_quantile >= 1.0:
            raise param_error("ttft_quantile", owner, "in (0, 1)", self.ttft_quantile)
        inputs = np.asarray(self.input_tokens, dtype=np.float64).ravel()
        outputs = np.asarray(self.output_tokens, dtype=np.float64).ravel()
        if inputs.size == 0 or inputs.shape != outputs.shape or np.any(inputs < 1):
            raise param_error(
                "input_tokens", owner, "a non-empty array of lengths >= 1", self.input_tokens
            )
        if np.any(outputs < 1):
            raise param_error("output_tokens", owner, "lengths >= 1", self.output_tokens)
        object.__setattr__(self, "input_tokens", inputs)
        object.__setattr__(self, "output_tokens", outputs)
        peak = self.rate_per_s if math.isnan(self.peak_rate_per_s) else self.peak_rate_per_s
        if not peak >= self.rate_per_s:
            raise param_error("peak_rate_per_s", owner, ">= rate_per_s", self.peak_rate_per_s)
        object.__setattr__(self, "peak_rate_per_s", float(peak))
        if self.cached_tokens is not None:
            cached = np.asarray(self.cached_tokens, dtype=np.float64).ravel()
            if cached.shape != inputs.shape or np.any(cached < 0) or np.any(cached >= inputs):
                raise param_error(
                    "cached_tokens", owner,
                    "one count per sample, >= 0 and below its prompt length", self.cached_tokens,
                )  # fmt: skip
            object.__setattr__(self, "cached_tokens", cached)

    @property
    def hit_fraction(self) -> float:
        """Share of prompt tokens a prefix cache serves (0 without caching)."""
        if self.cached_tokens is None:
            return 0.0
        return float(self.cached_tokens.sum() / self.input_tokens.sum())

    def prefill_service_s(self, model: PrefillModel) -> FloatArray:
        """Each sample's prefill alone on a worker of ``model``, seconds: the tokens that miss
        the prefix cache, ``t0 + (work(l) − work(h)) / P_peak`` (``h`` its cached tokens; a hit
        skips compute, its attention still reads the prefix), or ``t0 + work(l) / P_peak``
        without caching. The one owner of a plan's prefill service time."""
        service = model.request_time_s(self.input_tokens)
        if self.cached_tokens is None:
            return service
        return np.asarray(service - model.work_flop(self.cached_tokens) / model.p_peak_flops)

    @property
    def has_peak(self) -> bool:
        """A peak above the mean rate was given (so a Mixed pool may pay off)."""
        return self.peak_rate_per_s > self.rate_per_s

    @property
    def mean_decode_iterations(self) -> float:
        """E[o − 1]: decode iterations per request (its first token comes from prefill)."""
        return float(np.mean(self.output_tokens - 1.0))

    @property
    def decode_context_tokens(self) -> float:
        """Time-weighted mean context of a running decode request ``Σ(o−1)(l + o/2)/Σ(o−1)``."""
        iters = self.output_tokens - 1.0
        if not np.any(iters > 0):
            return 0.0
        return float(np.sum(iters * (self.input_tokens + self.output_tokens / 2.0)) / iters.sum())

    def decode_kv_tokens(self, model: ModelSpec | None = None) -> float:
        """KV-capacity tokens a running decode request holds on average: as
        :attr:`decode_context_tokens`, each request's midpoint context ``l + o/2`` taken through
        :meth:`pdopt.model_spec.ModelSpec.kv_context_tokens` (sliding-window layers hold at most
        the window). Equal to :attr:`decode_context_tokens` when ``model`` is None or has no
        sliding window."""
        if model is None or not model.has_sliding_window:
            return self.decode_context_tokens
        iters = self.output_tokens - 1.0
        if not np.any(iters > 0):
            return 0.0
        held = model.kv_context_tokens(self.input_tokens + self.output_tokens / 2.0)
        return float(np.sum(iters * held) / iters.sum())

    def peak_kv_tokens(self, model: ModelSpec | None = None) -> float:
        """KV-capacity tokens of the longest request at its end, ``max(l + o − 1)`` (through
        :meth:`pdopt.model_spec.ModelSpec.kv_context_tokens` when ``model`` is given)."""
        peak = float(np.max(self.input_tokens + self.output_tokens - 1.0))
        return peak if model is None else float(model.kv_context_tokens(peak))

    def with_slo(
        self, *, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None
    ) -> Demand:
        """The same demand under other SLOs."""
        return Demand(
            self.rate_per_s, self.input_tokens, self.output_tokens,
            self.ttft_slo_s if ttft_slo_s is None else ttft_slo_s,
            self.tpot_slo_s if tpot_slo_s is None else tpot_slo_s,
            self.arrival_scv, self.ttft_quantile, self.peak_rate_per_s, self.cached_tokens,
        )  # fmt: skip

    def with_rate(self, rate_per_s: float) -> Demand:
        """The same demand at another mean rate (the peak scales with it)."""
        scale = rate_per_s / self.rate_per_s
        return Demand(
            rate_per_s, self.input_tokens, self.output_tokens, self.ttft_slo_s, self.tpot_slo_s,
            self.arrival_scv, self.ttft_quantile, self.peak_rate_per_s * scale, self.cached_tokens,
        )  # fmt: skip


def demand_from_workload(
    workload: Workload,
    *,
    ttft_slo_s: float,
    tpot_slo_s: float,
    rate_per_s: float | None = None,
    arrival_cv: float | None = None,
    ttft_quantile: float = 0.99,
    peak_rate_per_s: float | None = None,
    max_samples: int | None = None,
    seed: int = 0,
    cache_tokens: float | None = None,
) -> Demand:
    """A :class:`Demand` from a workload: its rate, inter-arrival CV and lengths.

    ``rate_per_s`` and ``arrival_cv`` override what the workload's arrivals say; with fewer than
    three requests they must be given. Every row is kept by default, so tails come from the
    whole workload; ``max_samples`` keeps at most that many rows (drawn without replacement
    with ``seed``) for speed, and :func:`sampled_quantile_error` bounds what that costs.
    ``cache_tokens`` (with a workload that has prefix blocks): each request's cached prompt
    tokens under one LRU prefix cache of that many tokens (:func:`prefix_hits`); None: no
    caching.
    """
    owner = "demand_from_workload"
    stats = workload.stats()
    rate = float(stats["rate_per_s"]) if rate_per_s is None else rate_per_s
    cv = float(stats["interarrival_cv"]) if arrival_cv is None else arrival_cv
    if not math.isfinite(rate) or rate <= 0:
        raise param_error("rate_per_s", owner, "given when the workload has < 2 arrivals", rate)
    if not math.isfinite(cv):
        cv = 1.0  # too few gaps to estimate: assume Poisson
    inputs = workload.input_tokens.astype(np.float64)
    outputs = workload.output_tokens.astype(np.float64)
    cached = None
    if cache_tokens is not None and workload.prefix_blocks is not None:
        cached = prefix_hits(workload, cache_tokens).astype(np.float64)
    if max_samples is not None and len(inputs) > max_samples:
        pick = np.random.default_rng(seed).choice(len(inputs), max_samples, replace=False)
        pick.sort()
        inputs, outputs = inputs[pick], outputs[pick]
        cached = None if cached is None else cached[pick]
    return Demand(
        rate, inputs, outputs, ttft_slo_s, tpot_slo_s, cv * cv, ttft_quantile,
        math.nan if peak_rate_per_s is None else peak_rate_per_s, cached,
    )  # fmt: skip


def plan_cache_tokens(
    workload: Workload, options: Sequence[WorkerOption], enabled: bool = True
) -> float | None:
    """The prefix cache a plan assumes per prefill worker, in tokens: the smallest option's KV
    (a prefill worker's KV is free once its prompts are sent to decode); None when caching is
    off or the workload has no prefix blocks (the ``cache_tokens`` of
    :func:`demand_from_workload`)."""
    if not enabled or workload.prefix_blocks is None or not options:
        return None
    return min(o.kv_capacity_tokens for o in options)


def prefix_hits(workload: Workload, cache_tokens: float) -> npt.NDArray[np.int64]:
    """Prompt tokens of each request an LRU prefix cache of ``cache_tokens`` tokens serves, in
    arrival order (one pass of LRU stack distances, :func:`pdopt.workload.stack_distances`): a
    request's leading blocks seen before and at most ``cache_tokens / block_tokens`` distinct
    blocks ago, at most all but one token (vLLM recomputes the last). 0 without prefix blocks.

    A plan's estimate: one cache for the whole stream is what routing by cache affinity
    approaches when each worker holds the prefixes routed to it; it assumes the cache keeps
    only prompt blocks and that their space is free, as on a prefill worker whose KV is
    released once sent to decode.
    """
    blocks = workload.prefix_blocks
    n = len(workload)
    if blocks is None:
        return np.zeros(n, dtype=np.int64)
    capacity = int(cache_tokens // blocks.block_tokens)
    distance = stack_distances(blocks)
    hit = (distance > 0) & (distance <= capacity)
    counts = np.diff(blocks.offsets)
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        row = hit[blocks.offsets[i] : blocks.offsets[i + 1]]
        lead = int(np.argmin(row)) if not row.all() else int(counts[i])
        out[i] = min(lead * blocks.block_tokens, int(workload.input_tokens[i]) - 1)
    return out


def sampled_quantile_error(n_samples: int, confidence: float = DKW_CONFIDENCE) -> float:
    """Largest error of any quantile level of a length distribution estimated from
    ``n_samples`` rows drawn at random, with probability ``confidence``: the
    Dvoretzky–Kiefer–Wolfowitz bound ``sqrt(ln(2 / (1 − confidence)) / (2 n))`` (Massart 1990).

    A P99 from a 2,048-row sample is the true P(99 ± 3.0) at 95% confidence.

    Examples
    --------
    >>> round(sampled_quantile_error(2048), 4)
    0.03
    """
    if n_samples < 1:
        raise param_error("n_samples", "sampled_quantile_error", ">= 1", n_samples)
    check_fraction(confidence, "confidence", "sampled_quantile_error")
    return math.sqrt(math.log(2.0 / (1.0 - confidence)) / (2.0 * n_samples))
