"""The fused (hybrid) iteration: one forward pass carrying decodes and prefill chunks (issue 34).

A serving engine runs one forward pass per iteration, whatever it carries: ``B`` running decodes
(``C`` context tokens in all) and prefill chunks of ``c_i`` tokens whose prompts have ``d_i``
tokens done. What the GPU overlaps decides its cost (DESIGN.md "Cost model", hybrid iteration):

* the weights (and the experts touched) are streamed **once** per pass, and the linear layers run
  one GEMM over every token of the pass, ``m = B + Σ c_i``: at small ``m`` they are bound by the
  weight streaming (the decode pass), at large ``m`` by compute (the chunks' pass), never by the
  sum of the two;
* attention is per sequence and adds up: the decodes' KV reads (``∝ C``) and each chunk's causal
  attention against its prefix and itself (``∝ c·(2d + c)``);
* the fixed per-pass cost is paid once.

So ``T = max(decode pass, chunk pass) + decode attention + chunk attention``, and never more than
the two passes run one after the other (:func:`fused_iteration_s`, the one owner of that rule).
:meth:`pdopt.costmodel.CostModel.hybrid_iteration_time_s` composes the terms from the prefill
and decode fits; :class:`HybridModel` is the same form with its coefficients fitted on measured
mixed batches (:func:`pdopt.costmodel.fit_hybrid`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pdopt._validation import check_non_negative
from pdopt.errors import InputError


def fused_iteration_s(
    decode_pass_s: float,
    chunk_pass_s: float,
    decode_attention_s: float,
    chunk_attention_s: float,
    separate_s: float,
) -> float:
    """One fused forward pass, seconds: ``min(max(Dp, Pp) + Da + Pa, separate)``.

    ``Dp``: the decodes' pass without their KV reads (weights streamed, experts touched,
    per-sequence work); ``Pp``: the chunks' pass without their attention (the fixed cost and the
    linear layers over every token of the iteration); ``Da``, ``Pa``: the two attentions, which
    add up. ``separate_s``: the decode-only and prefill-only iterations run one after the other,
    which a scheduler could always do, so the fused pass never costs more. With ``Pp <= Dp`` a
    chunk costs only its attention (a small chunk riding on a memory-bound decode pass); the
    pass costs at least the larger of its two parts and at most their sum.
    """
    fused = max(decode_pass_s, chunk_pass_s) + decode_attention_s + chunk_attention_s
    return min(fused, separate_s)


@dataclass(frozen=True, slots=True)
class HybridModel:
    """One fused iteration fitted on measured mixed batches, seconds:

    ``T = max(h0 + h1·B, h5 + h3·(B + Σ c_i)) + h2·C + h4·Σ c_i·(2d_i + c_i)``

    (:func:`fused_iteration_s` with ``Dp = h0 + h1·B``, ``Pp = h5 + h3·m``, ``Da = h2·C``,
    ``Pa = h4·Σ c(2d + c)``; the separate bound is their sum, which the max never exceeds).

    * ``h0``, ``h1``: the decode pass: fixed cost with the weights streamed, per running decode;
    * ``h5``, ``h3``: the compute-bound pass: fixed cost, per token through the linear layers
      (every token of the iteration, decodes included);
    * ``h2``: per context token of the running decodes (KV reads);
    * ``h4``: per unit of ``(d + c)² − d²`` (a chunk's causal attention, the term
      :meth:`PrefillModel.chunk_work_flop` writes as ``alpha``, so a prompt's chunks sum to
      ``h4·l²``).

    All ``>= 0``. Several chunks in one iteration add their tokens to ``m`` and their attention
    terms; the fixed cost is paid once.
    """

    h0_s: float
    h1_s_per_decode: float
    h2_s_per_context_token: float
    h3_s_per_chunk_token: float
    h4_s_per_token2: float
    h5_s: float

    def __post_init__(self) -> None:
        for name in _FIELDS:
            check_non_negative(getattr(self, name), name, "HybridModel")

    @staticmethod
    def attention_term(chunk_tokens: Any, prefix_tokens: Any) -> Any:
        """``(d + c)² − d² = c·(2d + c)`` (numbers or numpy arrays alike)."""
        return chunk_tokens * (2 * prefix_tokens + chunk_tokens)

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
        >>> model = HybridModel(0.02, 1e-4, 1e-7, 5e-5, 1e-9, 0.005)
        >>> # max(0.02 + 4e-4, 0.005 + 5e-5·68) + 1e-4 + 1e-9·64·320
        >>> round(model.iteration_time_s(4, 1000, [64], [128]), 9)
        0.02052048
        """
        attention = 0.0
        tokens = batch_size
        for d, c in zip(prefix_tokens, chunk_tokens, strict=True):
            attention += self.h4_s_per_token2 * self.attention_term(c, d)
            tokens += c
        decode_pass = self.h0_s + self.h1_s_per_decode * batch_size
        chunk_pass = self.h5_s + self.h3_s_per_chunk_token * tokens
        decode_attention = self.h2_s_per_context_token * total_context_tokens
        separate = decode_pass + chunk_pass + decode_attention + attention
        return fused_iteration_s(decode_pass, chunk_pass, decode_attention, attention, separate)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "HybridModel", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HybridModel:
        """The model of :meth:`to_dict`. A dict of the additive form fitted before the fused
        one (no ``h5_s``) is refused: its coefficients mean something else; refit it."""
        if "h5_s" not in data:
            raise InputError(
                "this HybridModel holds the additive form fitted before the fused one (no 'h5_s'); "
                "its coefficients do not carry over to the fused form: fit the profile's hybrid "
                "rows again (pdopt calibrate, or fit_cost_model)"
            )
        return cls(**{k: v for k, v in data.items() if k != "type"})


_FIELDS = (
    "h0_s",
    "h1_s_per_decode",
    "h2_s_per_context_token",
    "h3_s_per_chunk_token",
    "h4_s_per_token2",
    "h5_s",
)
