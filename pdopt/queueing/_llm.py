"""LLM-specific queueing: prefill service moments, the decode batch model, a P/D prediction.

These are first-order analytic models meant for sizing and for checking against the simulator;
each function states its approximation. Units: seconds, tokens, requests per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pdopt._validation import (
    check_fraction,
    check_int_at_least,
    check_non_negative,
    check_positive,
    param_error,
)
from pdopt.queueing._multi import allen_cunneen
from pdopt.queueing._single import check_stable

if TYPE_CHECKING:  # only the types: queueing must not import the fitting machinery
    from pdopt.costmodel import DecodeModel, PrefillModel

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ServiceMoments:
    """First three raw moments of a service time, as mean, SCV and ``E[S³]``.

    Attributes
    ----------
    mean_s : float
        E[S], seconds.
    scv : float
        Squared coefficient of variation ``Var[S] / E[S]²`` (1 exponential, 0 constant).
    third_moment_s3 : float
        E[S³], seconds cubed (for Takács' second moment of the M/G/1 wait).
    """

    mean_s: float
    scv: float
    third_moment_s3: float

    @property
    def second_moment_s2(self) -> float:
        """E[S²] = (1 + scv) · E[S]², seconds squared."""
        return (1.0 + self.scv) * self.mean_s**2


def service_moments(samples_s: npt.ArrayLike) -> ServiceMoments:
    """Empirical :class:`ServiceMoments` of service-time samples (seconds, all > 0)."""
    s = np.asarray(samples_s, dtype=np.float64).ravel()
    if s.size == 0 or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise param_error("samples_s", "service_moments", "a non-empty array of times > 0", s)
    mean = float(s.mean())
    return ServiceMoments(mean, float(s.var() / mean**2), float(np.mean(s**3)))


def prefill_service_moments(model: PrefillModel, input_tokens: npt.ArrayLike) -> ServiceMoments:
    """Moments of the batch-1 prefill time ``S(l) = t0 + (alpha l² + beta P_m l) / P_peak``.

    ``input_tokens`` are samples of the prompt-length distribution (e.g. a workload's column);
    each sample is mapped through the cost model (DESIGN.md "Cost model") and the moments of the
    resulting times are returned. Batching is ignored: this is the service of a worker that
    prefills one request at a time.
    """
    lengths = np.asarray(input_tokens, dtype=np.float64)
    if lengths.size == 0 or np.any(lengths < 1):
        raise param_error(
            "input_tokens",
            "prefill_service_moments",
            "a non-empty array of lengths >= 1",
            input_tokens,
        )
    return service_moments(model.request_time_s(lengths))


def decode_throughput_tokens_per_s(
    model: DecodeModel, batch_size: npt.ArrayLike, mean_context_tokens: float
) -> FloatArray:
    """Decode tokens per second of one worker running ``B`` requests: ``B / τ(B, B·c̄)``.

    ``mean_context_tokens`` (c̄) is the mean context of a running request, so the batch's total
    context is ``C = B·c̄``. Vectorised over ``batch_size``.
    """
    b = np.asarray(batch_size, dtype=np.float64)
    c_bar = check_non_negative(
        mean_context_tokens, "mean_context_tokens", "decode_throughput_tokens_per_s"
    )
    return np.asarray(b / model.iteration_time_s(b, b * c_bar), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class DecodeBatchLimit:
    """The largest decode batch meeting a TPOT SLO and a KV capacity.

    ``limited_by`` is ``"tpot"`` or ``"kv"`` (the binding constraint); ``batch_size`` is 0 when
    even one request breaks the TPOT SLO or does not fit.
    """

    batch_size: int
    limited_by: str
    iteration_time_s: float
    throughput_tokens_per_s: float


def max_decode_batch(
    model: DecodeModel,
    *,
    tpot_slo_s: float,
    mean_context_tokens: float,
    kv_capacity_tokens: float,
    kv_tokens_per_request: float | None = None,
) -> DecodeBatchLimit:
    """Largest B with ``τ(B, B·c̄) <= tpot_slo_s`` and ``B · kv_tokens_per_request <= capacity``.

    ``τ(B, B·c̄)`` increases in B, so the TPOT bound is the floor of
    :meth:`~pdopt.costmodel.DecodeModel.max_batch_within`: ``floor((SLO − d0) / (d1 + d2·c̄))``
    for a dense model, the root of ``τ(B, B·c̄) = SLO`` with an MoE expert term.
    ``kv_tokens_per_request`` defaults to c̄; pass the peak footprint (input + output tokens) for
    a no-preemption bound.
    """
    owner = "max_decode_batch"
    slo = check_positive(tpot_slo_s, "tpot_slo_s", owner)
    c_bar = check_non_negative(mean_context_tokens, "mean_context_tokens", owner)
    capacity = check_non_negative(kv_capacity_tokens, "kv_capacity_tokens", owner)
    per_req = c_bar if kv_tokens_per_request is None else kv_tokens_per_request
    per_req = check_positive(per_req, "kv_tokens_per_request", owner)
    headroom = slo - model.d0_s
    b_real = model.max_batch_within(slo, c_bar)
    b_tpot = math.inf if math.isinf(b_real) else math.floor(b_real + 1e-9)
    b_tpot = max(b_tpot, 0) if headroom >= 0 else 0
    b_kv = math.floor(capacity / per_req + 1e-9)
    batch = int(min(b_tpot, b_kv))
    limited_by = "kv" if b_kv <= b_tpot else "tpot"
    tau = float(model.iteration_time_s(batch, batch * c_bar))
    rate = batch / tau if batch > 0 and tau > 0 else 0.0
    return DecodeBatchLimit(batch, limited_by, tau, rate)


@dataclass(frozen=True, slots=True)
class DecodeLoad:
    """Mean-field steady state of one continuous-batching decode worker.

    Attributes
    ----------
    mean_batch_size : float
        Mean number of running requests B̄ (Little's law: rate × mean decode time).
    iteration_time_s : float
        τ(B̄, B̄·c̄): the predicted TPOT, seconds.
    mean_decode_time_s : float
        (ō − 1) · τ: time in decode of a request with the mean output length.
    throughput_tokens_per_s : float
        B̄ / τ, generated tokens per second.
    """

    mean_batch_size: float
    iteration_time_s: float
    mean_decode_time_s: float
    throughput_tokens_per_s: float


def decode_load(
    model: DecodeModel,
    arrival_rate_per_s: float,
    mean_output_tokens: float,
    mean_context_tokens: float,
) -> DecodeLoad:
    """Decode concurrency by Little's law, solved as a fixed point.

    Each request spends ``(ō − 1)`` iterations in decode (its first token comes from prefill), so
    ``B = lambda (ō − 1) τ(B, B·c̄) = lambda (ō − 1)(d0 + (d1 + d2 c̄) B)``, hence
    ``B = lambda (ō − 1) d0 / (1 − lambda (ō − 1)(d1 + d2 c̄))`` for a dense model (with an MoE
    expert term the fixed point is solved numerically:
    :meth:`~pdopt.costmodel.DecodeModel.mean_field_batch`). Mean-field: the batch is taken at
    its mean, ignoring its fluctuation (τ is linear in B for a dense model, so the mean
    iteration time is exact given B̄; concave for MoE, so it is then an upper bound by
    Jensen's inequality; the TPOT spread is not modelled). Raises
    :class:`~pdopt.errors.ParameterError` when ``lambda (ō − 1)(d1 + d2 c̄) >= 1`` (the batch
    grows without bound).
    """
    owner = "decode_load"
    lam = check_non_negative(arrival_rate_per_s, "arrival_rate_per_s", owner)
    o_bar = check_positive(mean_output_tokens, "mean_output_tokens", owner)
    c_bar = check_non_negative(mean_context_tokens, "mean_context_tokens", owner)
    visits = lam * max(o_bar - 1.0, 0.0)  # decode iterations requested per second
    slope = model.per_request_slope_s(c_bar)
    check_stable(visits * slope, owner, "arrival_rate_per_s", lam)
    batch = float(model.mean_field_batch(visits, c_bar))
    tau = float(model.iteration_time_s(batch, batch * c_bar))
    return DecodeLoad(batch, tau, max(o_bar - 1.0, 0.0) * tau, batch / tau if tau > 0 else 0.0)


@dataclass(frozen=True, slots=True)
class PdPrediction:
    """Predicted latency of a P/D configuration at a rate (see :func:`predict_pd`).

    Unstable configurations (a prefill or decode utilisation >= 1) have ``stable=False``, infinite
    latencies and attainment 0 rather than raising, so sweeps over rates can use them directly.
    """

    rate_per_s: float
    n_prefill: int
    n_decode: int
    stable: bool
    prefill_utilization: float
    prefill_prob_wait: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    decode_batch_size: float
    tpot_s: float
    decode_kv_tokens: float
    kv_ok: bool
    ttft_attainment: float
    attainment: float


def predict_pd(
    prefill: PrefillModel,
    decode: DecodeModel,
    input_tokens: npt.ArrayLike,
    output_tokens: npt.ArrayLike,
    rate_per_s: float,
    n_prefill: int,
    n_decode: int,
    *,
    ttft_slo_s: float,
    tpot_slo_s: float,
    arrival_scv: float = 1.0,
    kv_capacity_tokens: float = math.inf,
    kv_tokens_per_request: float | None = None,
) -> PdPrediction:
    """TTFT mean/P50/P99, TPOT and SLO attainment of ``n_prefill`` P and ``n_decode`` D workers.

    Approximations (first order; check them against :func:`pdopt.sim.simulate`):

    * Prefill: ``n_prefill`` workers fed from one FCFS queue, batch size 1, service times from
      ``prefill`` over the sampled ``input_tokens``; the wait W is Allen–Cunneen's G/G/c mean with
      an atom ``1 − C`` at zero and an exponential tail. TTFT = W + S with S the request's own
      prefill time, independent of W (FCFS); KV transfer time is not included.
    * Decode: the rate splits evenly over ``n_decode`` workers; each is at the mean-field steady
      state of :func:`decode_load`, with c̄ the decode-time-weighted mean context
      ``Σ(o−1)(l + o/2) / Σ(o−1)``. TPOT is that worker's τ for every request (no spread), so
      the TPOT part of attainment is all or nothing; requests with one output token have no TPOT
      and always meet it. ``kv_ok`` says the mean KV in use ``B̄·k`` fits ``kv_capacity_tokens``,
      with ``k = kv_tokens_per_request`` (default c̄; with sliding-window layers less, e.g.
      :meth:`pdopt.plan.Demand.decode_kv_tokens`).
    * Attainment = P(TTFT <= ttft_slo_s) × (TPOT met), assuming the two independent.
    """
    owner = "predict_pd"
    lam = check_positive(rate_per_s, "rate_per_s", owner)
    n_p = check_int_at_least(n_prefill, 1, "n_prefill", owner)
    n_d = check_int_at_least(n_decode, 1, "n_decode", owner)
    ttft_slo = check_positive(ttft_slo_s, "ttft_slo_s", owner)
    tpot_slo = check_positive(tpot_slo_s, "tpot_slo_s", owner)
    lengths = np.asarray(input_tokens, dtype=np.float64)
    outputs = np.asarray(output_tokens, dtype=np.float64)
    if lengths.shape != outputs.shape or lengths.size == 0 or np.any(outputs < 1):
        raise param_error(
            "output_tokens",
            owner,
            "an array of counts >= 1 shaped like input_tokens",
            output_tokens,
        )
    service_s = prefill.request_time_s(lengths)
    moments = service_moments(service_s)
    rho_p = lam * moments.mean_s / n_p
    c_bar = _decode_mean_context_tokens(lengths, outputs)
    slope = decode.per_request_slope_s(c_bar)
    rho_d = lam / n_d * float(np.mean(outputs - 1.0)) * slope
    if rho_p >= 1.0 or rho_d >= 1.0:
        inf = math.inf
        return PdPrediction(
            lam, n_p, n_d, False, rho_p, 1.0, inf, inf, inf, inf, inf, inf, False, 0.0, 0.0
        )
    queue = allen_cunneen(
        lam, moments.mean_s, n_p, arrival_scv=arrival_scv, service_scv=moments.scv
    )
    load = decode_load(decode, lam / n_d, float(outputs.mean()), c_bar)
    ttft = _WaitPlusService(queue.prob_wait, queue.mean_wait_s, service_s)
    tpot_met = 1.0 if load.iteration_time_s <= tpot_slo else float(np.mean(outputs == 1))
    per_request = c_bar if kv_tokens_per_request is None else kv_tokens_per_request
    kv_tokens = load.mean_batch_size * check_non_negative(
        per_request, "kv_tokens_per_request", owner
    )
    ttft_att = ttft.cdf(ttft_slo)
    return PdPrediction(
        lam,
        n_p,
        n_d,
        True,
        rho_p,
        queue.prob_wait,
        queue.mean_response_s,
        ttft.quantile(0.5),
        ttft.quantile(0.99),
        load.mean_batch_size,
        load.iteration_time_s,
        kv_tokens,
        kv_tokens <= kv_capacity_tokens,
        ttft_att,
        ttft_att * tpot_met,
    )


def _decode_mean_context_tokens(lengths: FloatArray, outputs: FloatArray) -> float:
    """Time-weighted mean context of a running request: ``Σ(o−1)(l + o/2) / Σ(o−1)``."""
    iters = outputs - 1.0
    if not np.any(iters > 0):
        return 0.0
    return float(np.sum(iters * (lengths + outputs / 2.0)) / np.sum(iters))


@dataclass(frozen=True, slots=True)
class _WaitPlusService:
    """T = W + S: W with an atom ``1 − p`` at 0 and an exponential tail, S empirical samples."""

    prob_wait: float
    mean_wait_s: float
    service_s: FloatArray

    def cdf(self, t: float) -> float:
        x = t - self.service_s
        if self.prob_wait <= 0.0 or self.mean_wait_s <= 0.0:
            return float(np.mean(x >= 0))
        cond_mean = self.mean_wait_s / self.prob_wait
        f_w = 1.0 - self.prob_wait * np.exp(-np.maximum(x, 0.0) / cond_mean)
        return float(np.mean(np.where(x >= 0, f_w, 0.0)))

    def quantile(self, q: float) -> float:
        q = check_fraction(q, "q", "_WaitPlusService.quantile")
        from scipy.optimize import brentq

        lo = float(self.service_s.min())
        hi = float(self.service_s.max())
        if self.prob_wait > 0.0 and self.mean_wait_s > 0.0:
            cond_mean = self.mean_wait_s / self.prob_wait
            hi += cond_mean * max(math.log(self.prob_wait / max(1.0 - q, 1e-300)), 0.0) + 1e-12
        if self.cdf(lo) >= q:
            return lo
        return float(brentq(lambda t: self.cdf(t) - q, lo, hi, xtol=1e-12, rtol=1e-10))
