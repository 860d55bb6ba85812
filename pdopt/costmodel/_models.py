"""Immutable latency models: prefill (DESIGN.md "Cost model"), TTFT predictor and decode iteration.

Units are SI throughout: seconds, FLOP, FLOP/s, tokens. A published parameter set in other units
(Phasor reports alpha and beta with P_peak in TFLOP/s) is converted where it is loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_non_negative, check_positive
from pdopt.costmodel._hybrid import HybridModel, fused_iteration_s
from pdopt.costmodel._overhead import ServerOverhead
from pdopt.errors import ParameterError
from pdopt.model_spec import expert_coverage

ArrayLike = npt.ArrayLike


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """Prefill cost ``T = t0 + Σ_i (alpha·l_i² + beta·P_m·l_i) / P_peak`` (DESIGN.md, Phasor Eq. 1).

    Parameters
    ----------
    alpha_flop_per_token2 : float
        Quadratic (attention) work per squared input token, FLOP-equivalent.
    beta_flop_per_token : float
        Linear (GEMM) work per input token of the reference model, FLOP-equivalent.
    p_peak_flops : float
        Effective sustained peak of the worker, FLOP/s.
    p_m : float
        Parameter-count ratio params(model) / params(reference model); 1 for the fitted model.
    intercept_s : float
        Fixed per-batch overhead t0, seconds.
    """

    alpha_flop_per_token2: float
    beta_flop_per_token: float
    p_peak_flops: float
    p_m: float = 1.0
    intercept_s: float = 0.0

    def __post_init__(self) -> None:
        check_non_negative(self.alpha_flop_per_token2, "alpha_flop_per_token2", "PrefillModel")
        check_non_negative(self.beta_flop_per_token, "beta_flop_per_token", "PrefillModel")
        check_positive(self.p_peak_flops, "p_peak_flops", "PrefillModel")
        check_positive(self.p_m, "p_m", "PrefillModel")
        check_non_negative(self.intercept_s, "intercept_s", "PrefillModel")

    def work_flop(self, input_tokens: ArrayLike) -> npt.NDArray[np.float64]:
        """FLOP-equivalent work ``alpha·l² + beta·P_m·l`` of each request (the Φ_T numerator)."""
        length = np.asarray(input_tokens, dtype=np.float64)
        linear = self.beta_flop_per_token * self.p_m * length
        return self.alpha_flop_per_token2 * length * length + linear

    def request_time_s(self, input_tokens: ArrayLike) -> npt.NDArray[np.float64]:
        """Time of each request prefilled alone (batch of one), seconds, intercept included."""
        return self.intercept_s + self.work_flop(input_tokens) / self.p_peak_flops

    def batch_time_s(self, input_tokens: ArrayLike) -> float:
        """Time of one batch holding all of ``input_tokens``: t0 + Σ work / P_peak, seconds."""
        return self.intercept_s + float(np.sum(self.work_flop(input_tokens))) / self.p_peak_flops

    def chunk_work_flop(self, prefix_tokens: int, chunk_tokens: int) -> float:
        """Work of prefilling ``chunk_tokens`` more tokens of a prompt whose first
        ``prefix_tokens`` are done: ``alpha·((d + c)² − d²) + beta·P_m·c`` FLOP-equivalent.

        The chunk's attention runs against its whole prefix, so the chunks of a prompt sum to
        its whole prefill work ``alpha·l² + beta·P_m·l`` (``d = 0, c = l`` is that work).
        Plain arithmetic on Python numbers (the engine calls it once per chunk).
        """
        c, d = chunk_tokens, prefix_tokens
        return (
            self.alpha_flop_per_token2 * c * (2 * d + c) + self.beta_flop_per_token * self.p_m * c
        )

    def with_p_m(self, p_m: float) -> PrefillModel:
        """The same model transferred to another model size through P_m (no refit)."""
        return PrefillModel(
            self.alpha_flop_per_token2,
            self.beta_flop_per_token,
            self.p_peak_flops,
            p_m,
            self.intercept_s,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"type": "PrefillModel", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrefillModel:
        return cls(**{k: v for k, v in data.items() if k != "type"})


@dataclass(frozen=True, slots=True)
class TtftModel:
    """Quadratic TTFT predictor ``TTFT(l) = a·l² + b·l + c`` seconds (Arrow §4, prefill routing)."""

    a_s_per_token2: float
    b_s_per_token: float
    c_s: float

    def predict(self, input_tokens: ArrayLike) -> npt.NDArray[np.float64]:
        length = np.asarray(input_tokens, dtype=np.float64)
        return self.a_s_per_token2 * length * length + self.b_s_per_token * length + self.c_s

    def to_dict(self) -> dict[str, Any]:
        return {"type": "TtftModel", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TtftModel:
        return cls(**{k: v for k, v in data.items() if k != "type"})


@dataclass(frozen=True, slots=True)
class DecodeModel:
    """Decode iteration time ``τ(B, C) = d0 + d1·B + d2·C + d3·cover(B)`` seconds (DESIGN.md
    "Cost model"; the one owner of that formula and of what follows from it).

    B is the number of running requests, C their total context tokens. The expert term is for
    mixture-of-experts (MoE) models: a decode step reads the weights of the *distinct* experts its
    B tokens are routed to, ``cover(B) = E·(1 − (1 − k/E)^B)`` per MoE layer
    (:func:`pdopt.model_spec.expert_coverage`, uniform routing), which grows like ``k·B`` at small
    B and saturates at ``E``; a linear ``d1·B`` cannot follow that curve (issue 20). A dense model
    has no expert term (``d3 = 0``, ``experts = 0``), and every method then evaluates exactly the
    linear form's expressions, in the same floating-point order.

    Parameters
    ----------
    d0_s, d1_s_per_request, d2_s_per_token : float
        Fixed cost (s), cost per running request (s), cost per context token (s).
    d3_s_per_expert : float
        Cost per expected distinct expert touched per MoE layer (s; all MoE layers of a step
        together). Fitted on data whose routing is skewed, it absorbs the skew: the measured
        curve saturates earlier than ``cover(B)``, so the fit trades a smaller ``d3`` against a
        larger ``d1``.
    experts, experts_per_token : int
        ``E`` and ``k`` of ``cover(B)``; 0 for a dense model.
    """

    d0_s: float
    d1_s_per_request: float
    d2_s_per_token: float
    d3_s_per_expert: float = 0.0
    experts: int = 0
    experts_per_token: int = 0

    def __post_init__(self) -> None:
        check_non_negative(self.d0_s, "d0_s", "DecodeModel")
        check_non_negative(self.d1_s_per_request, "d1_s_per_request", "DecodeModel")
        check_non_negative(self.d2_s_per_token, "d2_s_per_token", "DecodeModel")
        check_non_negative(self.d3_s_per_expert, "d3_s_per_expert", "DecodeModel")
        e, k = self.experts, self.experts_per_token
        if e == 0 and (k != 0 or self.d3_s_per_expert > 0):
            raise ParameterError(
                "The 'experts' parameter of DecodeModel must be > 0 when experts_per_token or "
                f"d3_s_per_expert is set (an MoE expert term). Got experts={e}, "
                f"experts_per_token={k}, d3_s_per_expert={self.d3_s_per_expert!r}."
            )
        if e != 0 and not 1 <= k <= e:
            raise ParameterError(
                f"The 'experts_per_token' parameter of DecodeModel must be in 1..experts={e} "
                f"for an MoE expert term. Got {k!r}."
            )

    @property
    def has_expert_term(self) -> bool:
        """Whether ``d3·cover(B)`` contributes (an MoE model with a positive ``d3``)."""
        return self.d3_s_per_expert > 0.0

    def expert_time_s(self, batch_size: ArrayLike) -> npt.NDArray[np.float64]:
        """``d3·cover(B)`` seconds, vectorised over B (0 for a dense model).

        One B is evaluated in Python floats: the power is then the C library's ``pow``, as in
        the simulation engines (:mod:`pdopt.sim._closed_form`, compiled or not); numpy's
        power on an array may use another implementation (SIMD) that differs in the last bit
        on some machines, and the policies' predictions must match the compiled engine's
        twins exactly."""
        b = np.asarray(batch_size, dtype=np.float64)
        if not self.has_expert_term:
            return np.zeros_like(b)
        if b.ndim == 0:
            one = expert_coverage(float(b), self.experts, self.experts_per_token)
            return np.asarray(self.d3_s_per_expert * one, dtype=np.float64)
        cover = expert_coverage(b, self.experts, self.experts_per_token)
        return np.asarray(self.d3_s_per_expert * cover, dtype=np.float64)

    def iteration_time_s(
        self, batch_size: ArrayLike, total_context_tokens: ArrayLike
    ) -> npt.NDArray[np.float64]:
        """τ(B, C) in seconds, vectorised over B and C."""
        b = np.asarray(batch_size, dtype=np.float64)
        c = np.asarray(total_context_tokens, dtype=np.float64)
        linear = self.d0_s + self.d1_s_per_request * b + self.d2_s_per_token * c
        return linear + self.expert_time_s(b) if self.has_expert_term else linear

    def per_request_slope_s(self, mean_context_tokens: float) -> float:
        """``d1 + d2·c̄``: seconds per running request along ``C = B·c̄``, the expert term left
        out: it saturates, so this is τ's slope at large B (what stability conditions need)."""
        return self.d1_s_per_request + self.d2_s_per_token * mean_context_tokens

    def mean_context_time_s(
        self, batch_size: ArrayLike, mean_context_tokens: float
    ) -> npt.NDArray[np.float64]:
        """``τ(B, B·c̄) = d0 + (d1 + d2·c̄)·B + d3·cover(B)`` seconds, vectorised over B."""
        b = np.asarray(batch_size, dtype=np.float64)
        linear = self.d0_s + self.per_request_slope_s(mean_context_tokens) * b
        return linear + self.expert_time_s(b) if self.has_expert_term else linear

    def max_batch_within(self, tpot_s: float, mean_context_tokens: float) -> float:
        """The (real) batch size ``B`` at which ``τ(B, B·c̄)`` reaches ``tpot_s``: the largest
        batch meeting a TPOT target. ``inf`` when τ never reaches it; ``<= 0`` when even
        ``τ(0) = d0`` exceeds it. τ increases in B, so the MoE case is found by bisection between
        0 and the linear bound ``(tpot − d0)/(d1 + d2·c̄)``; dense: that bound itself."""
        slope = self.per_request_slope_s(mean_context_tokens)
        headroom = tpot_s - self.d0_s
        linear = math.inf if slope == 0 else headroom / slope
        if not self.has_expert_term or headroom <= 0:
            return linear
        high = linear
        if math.isinf(high):  # slope 0: τ = d0 + d3·cover(B) saturates at d0 + d3·E
            y = headroom / self.d3_s_per_expert / self.experts
            if y >= 1.0:
                return math.inf
            high = math.log1p(-y) / math.log1p(-self.experts_per_token / self.experts)
        root = _bisect_up(
            lambda b: self.mean_context_time_s(b, mean_context_tokens) <= tpot_s,
            np.array(high, dtype=np.float64),
        )
        return float(root)

    def mean_field_batch(
        self, iterations_per_s: ArrayLike, mean_context_tokens: float
    ) -> npt.NDArray[np.float64]:
        """Mean running batch ``B`` of a worker asked for ``v`` decode iterations per second
        (requests per second × iterations each), by Little's law: ``B = v·τ(B, B·c̄)``.

        Dense: ``B = v·d0 / (1 − v·(d1 + d2·c̄))``. MoE: the right side is concave in B, so the
        fixed point is unique and found by bisection on ``[0, v·(d0 + d3·E)/(1 − v·(d1 +
        d2·c̄))]``. ``inf`` where ``v·(d1 + d2·c̄) >= 1`` (the batch grows without bound).
        Vectorised over ``v``.
        """
        v = np.asarray(iterations_per_s, dtype=np.float64)
        slope = self.per_request_slope_s(mean_context_tokens)
        denom = 1.0 - v * slope
        with np.errstate(divide="ignore", invalid="ignore"):
            if not self.has_expert_term:
                return np.asarray(np.where(denom > 0, v * self.d0_s / denom, np.inf))
            saturated = self.d0_s + self.d3_s_per_expert * self.experts
            high = np.where(denom > 0, v * saturated / denom, np.inf)
        stable = denom > 0
        root = _bisect_up(
            lambda b: v[stable] * self.mean_context_time_s(b, mean_context_tokens) >= b,
            high[stable],
        )
        out = np.full_like(v, np.inf)
        out[stable] = root
        return out

    def context_budget_tokens(self, batch_size: float, tpot_s: float) -> float:
        """Largest total context ``C`` with ``τ(B, C) <= tpot_s`` at ``B`` requests (``inf``
        when ``d2 = 0`` and τ(B, 0) meets it, 0 when even ``C = 0`` misses it)."""
        slack = tpot_s - self.d0_s - self.d1_s_per_request * batch_size
        if self.has_expert_term:
            slack -= float(self.expert_time_s(batch_size))
        if self.d2_s_per_token <= 0:
            return math.inf if slack >= 0 else 0.0
        return max(slack, 0.0) / self.d2_s_per_token

    def to_dict(self) -> dict[str, Any]:
        """Plain values; the MoE fields only for an MoE model (a dense dict reads as before)."""
        data = {"type": "DecodeModel", **asdict(self)}
        if self.experts == 0:
            for name in _MOE_FIELDS:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeModel:
        """The model of :meth:`to_dict`; a dict without the MoE fields is a dense model."""
        return cls(**{k: v for k, v in data.items() if k != "type"})


_MOE_FIELDS = ("d3_s_per_expert", "experts", "experts_per_token")

_BISECTIONS = 200
"""Halvings of :func:`_bisect_up`: enough to reach adjacent floats from any finite bracket."""


def _bisect_up(
    holds: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.bool_]],
    high: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Largest ``b`` in ``[0, high]`` (elementwise) where the monotone ``holds(b)`` is true
    (true at 0, false beyond the root), by bisection to float resolution."""
    lo = np.zeros_like(high)
    hi = np.array(high, dtype=np.float64)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if np.array_equal(mid, lo) or np.array_equal(mid, hi):
            break
        ok = np.asarray(holds(mid), dtype=bool)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return lo


@dataclass(frozen=True, slots=True)
class CostModel:
    """The latency models of one worker type (one GPU × model × TP).

    ``hybrid``, the fused mixed iteration fitted from a profile's ``hybrid`` rows
    (:func:`~pdopt.costmodel.fit_hybrid`), is None when the profile measured no mixed batches:
    :meth:`hybrid_iteration_time_s` then composes the pass from ``prefill`` and ``decode``.
    ``overhead``, the serving stack's per-request latency beyond the engine's iterations
    (:class:`~pdopt.costmodel.ServerOverhead`, e.g. :data:`~pdopt.costmodel.VLLM_V1_OVERHEAD`),
    is what a client adds to the simulated TTFT and E2E; None: the engine's times only.
    """

    prefill: PrefillModel
    decode: DecodeModel
    ttft: TtftModel | None = None
    hybrid: HybridModel | None = None
    overhead: ServerOverhead | None = None

    def hybrid_iteration_time_s(
        self,
        prefill_chunk_tokens: Sequence[int],
        batch_size: int,
        total_context_tokens: float,
        prefix_tokens: Sequence[int] | None = None,
    ) -> float:
        """One fused forward pass of ``B`` decodes plus prefill chunks, seconds (DESIGN.md
        "Cost model", hybrid iteration; the one owner of this formula: the engine's hybrid
        schedule, :mod:`pdopt.sim._mixed`, calls it for every iteration it runs).

        The pass is priced as the GPU runs it (:func:`pdopt.costmodel._hybrid.fused_iteration_s`,
        issue 34): the weights (and experts) stream once and the linear layers see every token
        of the iteration, so the linear work is the larger of the decode pass and the chunks'
        pass, not their sum; attention adds up per sequence::

            T = min(max(τ(B, C) − d2·C, t0 + k·(B + Σ c_i)) + d2·C + Σ a_i,  τ(B, C) + t0 + W/P)
            k = beta·P_m / P_peak,  a_i = alpha·((d_i + c_i)² − d_i²) / P_peak,  W = Σ chunk work

        with ``c_i`` the chunk tokens of prompt ``i`` and ``d_i`` its tokens already prefilled
        (``W``: :meth:`PrefillModel.chunk_work_flop`). ``τ(B, C) − d2·C`` is the decode pass
        without its KV reads (the fixed cost ``d0`` with the weights streamed, ``d1·B``, the
        experts touched ``d3·cover(B)``); ``t0 + k·m`` the compute-bound pass at ``m`` tokens.
        The fixed costs ``d0`` and ``t0`` are never both paid, and an MoE model's experts are
        streamed once. The special cases are the fits themselves, exactly: no chunk gives
        ``τ(B, C)``, no decode (``B = 0``) the prefill batch time ``t0 + W / P_peak``; a mixed
        pass costs at least the larger of the two and at most their sum (the second argument of
        the ``min``: the two passes run one after the other).

        When the profile measured mixed batches (``hybrid`` rows, so ``self.hybrid`` is
        fitted), an iteration with decodes *and* chunks is :meth:`HybridModel.iteration_time_s`,
        the same form with its coefficients fitted on those rows; the two endpoints, which the
        hybrid rows do not measure, stay the decode and prefill fits.

        Parameters
        ----------
        prefill_chunk_tokens : sequence of int
            Tokens of each prefill chunk in the iteration (empty: a decode-only iteration).
        batch_size : int
            Running decodes ``B`` (0: a chunk-only iteration).
        total_context_tokens : float
            Their total context tokens ``C``.
        prefix_tokens : sequence of int, optional
            Tokens each chunk's prompt has already prefilled (default: all 0, whole prompts).

        Examples
        --------
        >>> cost = CostModel(PrefillModel(1.0, 100.0, 1e6, intercept_s=0.01),
        ...                  DecodeModel(0.02, 0.001, 1e-6))
        >>> # decode pass 0.024 vs chunk pass 0.01 + 100·68/1e6 = 0.0168: the chunk costs its
        >>> # attention 64·320/1e6 = 0.02048 on top of τ = 0.025
        >>> round(cost.hybrid_iteration_time_s([64], 4, 1000, [128]), 6)
        0.04548
        """
        prefix = [0] * len(prefill_chunk_tokens) if prefix_tokens is None else prefix_tokens
        if len(prefix) != len(prefill_chunk_tokens):
            raise ParameterError(
                f"The 'prefix_tokens' parameter of hybrid_iteration_time_s must have one entry "
                f"per chunk ({len(prefill_chunk_tokens)}). Got {len(prefix)}."
            )
        prefill = self.prefill
        work = 0.0
        for d, c in zip(prefix, prefill_chunk_tokens, strict=True):
            work += prefill.chunk_work_flop(int(d), int(c))
        has_chunks = len(prefill_chunk_tokens) > 0
        if batch_size <= 0:
            return prefill.intercept_s + work / prefill.p_peak_flops if has_chunks else 0.0
        if not has_chunks:
            return float(self.decode.iteration_time_s(batch_size, total_context_tokens))
        if self.hybrid is not None:
            return self.hybrid.iteration_time_s(
                batch_size, total_context_tokens, prefill_chunk_tokens, prefix
            )
        decode = self.decode
        decode_s = float(decode.iteration_time_s(batch_size, total_context_tokens))
        decode_attention_s = decode.d2_s_per_token * total_context_tokens
        linear_flop_per_token = prefill.beta_flop_per_token * prefill.p_m
        chunk_tokens = sum(int(c) for c in prefill_chunk_tokens)
        iteration_tokens = chunk_tokens + batch_size
        return fused_iteration_s(
            decode_pass_s=decode_s - decode_attention_s,
            chunk_pass_s=prefill.intercept_s
            + linear_flop_per_token * iteration_tokens / prefill.p_peak_flops,
            decode_attention_s=decode_attention_s,
            chunk_attention_s=(work - linear_flop_per_token * chunk_tokens) / prefill.p_peak_flops,
            separate_s=decode_s + prefill.intercept_s + work / prefill.p_peak_flops,
        )

    def to_dict(self) -> dict[str, Any]:
        """The models as plain dicts; ``"hybrid"`` only when fitted, so a cost model without
        one gives the same dict (and scenario file) as before that part existed."""
        hybrid = {} if self.hybrid is None else {"hybrid": self.hybrid.to_dict()}
        overhead = {} if self.overhead is None else {"overhead": self.overhead.to_dict()}
        return {
            "prefill": self.prefill.to_dict(),
            "decode": self.decode.to_dict(),
            "ttft": None if self.ttft is None else self.ttft.to_dict(),
            **hybrid,
            **overhead,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        ttft = data.get("ttft")
        hybrid = data.get("hybrid")
        overhead = data.get("overhead")
        return cls(
            PrefillModel.from_dict(data["prefill"]),
            DecodeModel.from_dict(data["decode"]),
            None if ttft is None else TtftModel.from_dict(ttft),
            None if hybrid is None else HybridModel.from_dict(hybrid),
            None if overhead is None else ServerOverhead.from_dict(overhead),
        )
