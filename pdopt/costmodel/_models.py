"""Immutable latency models: prefill (DESIGN.md "Cost model"), TTFT predictor and decode iteration.

Units are SI throughout: seconds, FLOP, FLOP/s, tokens. A published parameter set in other units
(Phasor reports alpha and beta with P_peak in TFLOP/s) is converted where it is loaded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_non_negative, check_positive

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
    """Decode iteration time ``τ(B, C) = d0 + d1·B + d2·C`` seconds (DESIGN.md "Cost model").

    B is the number of running requests, C their total context tokens.
    """

    d0_s: float
    d1_s_per_request: float
    d2_s_per_token: float

    def __post_init__(self) -> None:
        check_non_negative(self.d0_s, "d0_s", "DecodeModel")
        check_non_negative(self.d1_s_per_request, "d1_s_per_request", "DecodeModel")
        check_non_negative(self.d2_s_per_token, "d2_s_per_token", "DecodeModel")

    def iteration_time_s(
        self, batch_size: ArrayLike, total_context_tokens: ArrayLike
    ) -> npt.NDArray[np.float64]:
        """τ(B, C) in seconds, vectorised over B and C."""
        b = np.asarray(batch_size, dtype=np.float64)
        c = np.asarray(total_context_tokens, dtype=np.float64)
        return self.d0_s + self.d1_s_per_request * b + self.d2_s_per_token * c

    def to_dict(self) -> dict[str, Any]:
        return {"type": "DecodeModel", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeModel:
        return cls(**{k: v for k, v in data.items() if k != "type"})


@dataclass(frozen=True, slots=True)
class CostModel:
    """The latency models of one worker type (one GPU × model × TP)."""

    prefill: PrefillModel
    decode: DecodeModel
    ttft: TtftModel | None = None

    def hybrid_iteration_time_s(
        self, prefill_chunk_tokens: ArrayLike, batch_size: float, total_context_tokens: float
    ) -> float:
        """A colocated (chunked) iteration: prefill chunk work and decode work add (DESIGN.md).

        With no decode requests (B = 0) only the prefill part counts, and vice versa.
        """
        chunks = np.asarray(prefill_chunk_tokens, dtype=np.float64)
        prefill_s = self.prefill.batch_time_s(chunks) if chunks.size else 0.0
        decode_s = (
            float(self.decode.iteration_time_s(batch_size, total_context_tokens))
            if batch_size > 0
            else 0.0
        )
        return prefill_s + decode_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "prefill": self.prefill.to_dict(),
            "decode": self.decode.to_dict(),
            "ttft": None if self.ttft is None else self.ttft.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        ttft = data.get("ttft")
        return cls(
            PrefillModel.from_dict(data["prefill"]),
            DecodeModel.from_dict(data["decode"]),
            None if ttft is None else TtftModel.from_dict(ttft),
        )
