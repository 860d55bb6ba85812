"""What a serving client sees beyond the engine's iterations (issue 34, item 3)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_non_negative


@dataclass(frozen=True, slots=True)
class ServerOverhead:
    """Per-request latency a client sees on top of the engine's TTFT and E2E, seconds:

    ``extra = fixed_s + per_input_token_s · l + stream_iterations · τ``

    ``fixed_s``: HTTP, request parsing and scheduling hand-off; ``per_input_token_s``:
    tokenising the prompt; ``stream_iterations · τ``: the output pipeline (vLLM V1 runs the
    engine core in its own process and detokenises and streams each step's tokens while the next
    step runs, so a token reaches the client about one iteration after the step that made it;
    ``τ`` is the request's own time per output token, the iteration time it saw). The same delay
    holds for the last token, so E2E moves by ``extra`` and TPOT not at all.
    """

    fixed_s: float = 0.0
    per_input_token_s: float = 0.0
    stream_iterations: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_input_token_s", "stream_iterations"):
            check_non_negative(getattr(self, name), name, "ServerOverhead")

    def client_extra_s(
        self, input_tokens: npt.ArrayLike, iteration_s: npt.ArrayLike
    ) -> npt.NDArray[np.float64]:
        """``extra`` per request (vectorised); an undefined iteration time (one output token)
        counts as 0."""
        tokens = np.asarray(input_tokens, dtype=np.float64)
        step = np.nan_to_num(np.asarray(iteration_s, dtype=np.float64), nan=0.0)
        return np.asarray(
            self.fixed_s + self.per_input_token_s * tokens + self.stream_iterations * step,
            dtype=np.float64,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"type": "ServerOverhead", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerOverhead:
        return cls(**{k: v for k, v in data.items() if k != "type"})


VLLM_V1_OVERHEAD = ServerOverhead(fixed_s=0.0042, per_input_token_s=0.0, stream_iterations=1.35)
"""vLLM V1 (0.15) behind its OpenAI server, streaming: fitted once on all calm stages of the H100
calibration runs (Llama-2-7B TP1, CodeLlama-34B TP2, Mixtral-8x7B TP2;
:func:`pdopt.validate.fit_server_overhead`, ``pdopt validate realgpu --fit-overhead``): 4.2 ms
and 1.35 iterations. The prompts there were 570-790 tokens, too narrow a range to separate a
per-token term, which is left 0. Other servers (SGLang, TRT-LLM) and other versions need their
own fit."""
