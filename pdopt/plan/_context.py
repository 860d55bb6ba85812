"""What a plan cannot serve or cannot trust: requests beyond the model's context window, and
cost models used far beyond the lengths their profile measured (issue 17, "context windows")."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pdopt.sim import context_rejections
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
    """Requests that fit ``max_context_tokens`` (None: no limit) and the others counted by
    reason, by the simulator's rule (:func:`pdopt.sim.context_rejections`)."""
    if not max_context_tokens or not len(workload):
        return ContextSplit(workload, {})
    reasons = context_rejections(workload.input_tokens, workload.output_tokens, max_context_tokens)
    keep = reasons == ""
    kept = Workload(
        workload.arrival_s[keep], workload.input_tokens[keep], workload.output_tokens[keep],
        name=workload.name,
    )  # fmt: skip
    counts = Counter(str(r) for r in reasons[~keep])
    return ContextSplit(kept, dict(counts.most_common()))


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
