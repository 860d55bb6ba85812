"""The fused (hybrid) iteration fitted directly from measured mixed batches (issue 18).

A profile's ``hybrid`` rows (:mod:`pdopt.profile._format`) time one forward pass that carries
``B`` running decodes (``C`` context tokens in all) plus a prefill chunk of ``c`` tokens whose
prompt has ``d`` tokens done. :class:`HybridModel` is the cost of such a pass; it is fitted by
:func:`pdopt.costmodel.fit_hybrid` and used by
:meth:`pdopt.costmodel.CostModel.hybrid_iteration_time_s` when present (otherwise that method
composes the pass from the prefill and decode fits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pdopt._validation import check_non_negative


@dataclass(frozen=True, slots=True)
class HybridModel:
    """One fused iteration ``T = h0 + h1·B + h2·C + Σ_i (h3·c_i + h4·((d_i + c_i)² − d_i²))`` s.

    The terms follow what one forward pass over a mixed batch does:

    * ``h0``: the fixed cost paid once per pass (weights streamed once, kernel launches,
      all-reduce latency), whatever the batch holds;
    * ``h1·B``: per running decode (its token through the linear layers, sampling, the
      per-sequence attention and scheduling work);
    * ``h2·C``: the decodes' attention reads of their ``C`` cached tokens (memory traffic);
    * ``h3·c``: the chunk's tokens through the linear layers (GEMM work linear in ``c``; a
      coefficient of its own, not ``h1``, because a decode token and a prefill token do not cost
      the same per token: decode rows are memory-bound, chunk tokens compute-bound);
    * ``h4·((d + c)² − d²) = h4·c·(2d + c)``: the chunk's causal attention against its prefix
      and itself, the term :meth:`PrefillModel.chunk_work_flop` writes as ``alpha`` (so the
      chunks of a prompt sum to ``h4·l²``).

    It is the composed pass (``max(d0, t0) + d1·B + d2·C + W / P_peak``,
    :meth:`CostModel.hybrid_iteration_time_s`) with every coefficient fitted on mixed batches
    rather than borrowed from the decode-only and prefill-only regimes: five coefficients, all
    ``>= 0`` (non-negative least squares), linear in the measured quantities. Several chunks in
    one iteration add their ``h3`` and ``h4`` terms (each chunk's tokens and attention are work
    of their own); the fixed cost is paid once.

    Parameters
    ----------
    h0_s : float
        Fixed cost per iteration, seconds.
    h1_s_per_decode : float
        Per running decode, seconds.
    h2_s_per_context_token : float
        Per context token of the running decodes, seconds.
    h3_s_per_chunk_token : float
        Per prefill chunk token, seconds.
    h4_s_per_token2 : float
        Per unit of ``(d + c)² − d²`` (chunk attention), seconds.
    """

    h0_s: float
    h1_s_per_decode: float
    h2_s_per_context_token: float
    h3_s_per_chunk_token: float
    h4_s_per_token2: float

    def __post_init__(self) -> None:
        for name in (
            "h0_s",
            "h1_s_per_decode",
            "h2_s_per_context_token",
            "h3_s_per_chunk_token",
            "h4_s_per_token2",
        ):
            check_non_negative(getattr(self, name), name, "HybridModel")

    @staticmethod
    def chunk_terms(chunk_tokens: Any, prefix_tokens: Any) -> tuple[Any, Any]:
        """``(c, (d + c)² − d²) = (c, c·(2d + c))``, the chunk's two terms (numbers or numpy
        arrays alike)."""
        c = chunk_tokens
        return c, c * (2 * prefix_tokens + c)

    @staticmethod
    def terms(
        batch_size: Any, total_context_tokens: Any, chunk_tokens: Any, prefix_tokens: Any
    ) -> tuple[Any, Any, Any, Any, Any]:
        """The five terms ``(1, B, C, c, c·(2d + c))`` of one single-chunk iteration, in
        coefficient order (the design matrix of :func:`~pdopt.costmodel.fit_hybrid`)."""
        chunk = HybridModel.chunk_terms(chunk_tokens, prefix_tokens)
        return 1.0, batch_size, total_context_tokens, *chunk

    def coefficients(self) -> tuple[float, float, float, float, float]:
        """``(h0, h1, h2, h3, h4)``, the order of :meth:`terms`."""
        return (
            self.h0_s,
            self.h1_s_per_decode,
            self.h2_s_per_context_token,
            self.h3_s_per_chunk_token,
            self.h4_s_per_token2,
        )

    def iteration_time_s(
        self,
        batch_size: int,
        total_context_tokens: float,
        chunk_tokens: Sequence[int],
        prefix_tokens: Sequence[int],
    ) -> float:
        """One fused iteration of ``B`` decodes and the given chunks, seconds (the class's
        equation; plain arithmetic: the engine calls it once per iteration).

        Examples
        --------
        >>> model = HybridModel(0.02, 1e-4, 1e-7, 5e-5, 1e-9)
        >>> round(model.iteration_time_s(4, 1000, [64], [128]), 9)  # 0.02+4e-4+1e-4+3.2e-3+2.048e-5
        0.02372048
        """
        h0, h1, h2, h3, h4 = self.coefficients()
        total = h0 + h1 * batch_size + h2 * total_context_tokens
        for d, c in zip(prefix_tokens, chunk_tokens, strict=True):
            linear, attention = self.chunk_terms(c, d)
            total += h3 * linear + h4 * attention
        return float(total)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "HybridModel", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HybridModel:
        return cls(**{k: v for k, v in data.items() if k != "type"})
