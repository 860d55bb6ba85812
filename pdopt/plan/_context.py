"""What a plan cannot serve or cannot trust: requests beyond the model's context window, and
cost models used far beyond the lengths their profile measured (issue 17, "context windows")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pdopt.workload import Workload

EXTRAPOLATION_FACTOR = 2.0
"""A profile counts as extrapolated when the workload's P99 prompt exceeds its longest measured
prompt by this factor."""


@dataclass(frozen=True, slots=True)
class ContextSplit:
    """A workload split at a context window: ``kept`` requests fit, the others are rejected;
    ``rejected_by_reason`` counts them by reason (the text a rejection carries)."""

    kept: Workload
    rejected_by_reason: dict[str, int]

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_reason.values())


def split_by_context(workload: Workload, max_context_tokens: int | None) -> ContextSplit:
    """Requests whose prompt plus output tokens fit ``max_context_tokens`` (None: no limit).

    As vLLM's ``max_model_len``: a prompt longer than the window is rejected, and so is a
    prompt whose output would run past it (the generation limit a server would impose would
    change the request; the planner does not serve a different request than the trace has).
    """
    if not max_context_tokens or not len(workload):
        return ContextSplit(workload, {})
    inputs, outputs = workload.input_tokens, workload.output_tokens
    prompt_over = inputs > max_context_tokens
    total_over = ~prompt_over & (inputs + outputs > max_context_tokens)
    reasons = {
        f"prompt exceeds the {max_context_tokens}-token context window": int(prompt_over.sum()),
        f"prompt + output exceed the {max_context_tokens}-token context window": int(
            total_over.sum()
        ),
    }
    keep = ~(prompt_over | total_over)
    kept = Workload(
        workload.arrival_s[keep], inputs[keep], outputs[keep], name=workload.name
    )  # fmt: skip
    return ContextSplit(kept, {k: v for k, v in reasons.items() if v})


def measured_prompt_tokens(rows: pd.DataFrame) -> float:
    """Longest prompt a profile's prefill rows measured, tokens (NaN without prefill rows)."""
    prefill = rows[rows["kind"] == "prefill"]
    return float(prefill["input_tokens"].max()) if len(prefill) else float("nan")


def extrapolation_warning(
    label: str, measured_tokens: float, workload: Workload, factor: float = EXTRAPOLATION_FACTOR
) -> str | None:
    """A warning when the workload's P99 prompt is more than ``factor`` × the longest prompt
    ``label``'s profile measured, else None."""
    if not len(workload) or not np.isfinite(measured_tokens) or measured_tokens <= 0:
        return None
    p99 = float(np.percentile(workload.input_tokens, 99))
    longest = int(workload.input_tokens.max())
    if p99 <= factor * measured_tokens:
        return None
    return (
        f"{label}: the profile measured prompts up to {measured_tokens:.0f} tokens, but the "
        f"workload's P99 prompt is {p99:.0f} tokens (longest {longest}): its cost model is "
        f"extrapolated {p99 / measured_tokens:.1f}x beyond the data; profile longer prompts "
        "(pdopt profile) before trusting this plan"
    )
