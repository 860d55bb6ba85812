"""What a plan cannot serve or cannot trust: requests beyond the model's context window, and
cost models used far beyond the lengths their profile measured (issue 17, "context windows")."""

from __future__ import annotations

import math
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
    kept = workload.take(keep)  # with its prefix blocks
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


TOO_LONG = ("miss", "drop", "truncate")
"""What a plan does with requests beyond the context window (``pdopt plan --too-long``): count
them as misses (the default: the verdict covers all offered traffic), drop them (plan and verify
the others only, said in every output) or truncate them to fit (prompt cut to the window less
the output, as vLLM's ``truncate_prompt_tokens`` keeps the prompt's end)."""


@dataclass(frozen=True, slots=True)
class OfferedTraffic:
    """A workload as a plan serves it under a context window.

    ``served`` is what the plan's simulation runs (``miss``: every offered request, the engine
    rejecting the ones beyond the window, each a miss; ``drop``: the ones within it;
    ``truncate``: every request, cut to fit); ``sized`` is what the queueing model sizes for
    (the requests that reach a GPU); ``split`` counts the over-long ones by reason.
    """

    served: Workload
    sized: Workload
    split: ContextSplit
    treatment: str
    window_tokens: int | None

    @property
    def offered(self) -> int:
        return len(self.split.kept) + self.split.rejected

    @property
    def over_window(self) -> int:
        return self.split.rejected

    def to_dict(self) -> dict[str, object]:
        n = self.offered
        return {
            "offered": n, "over_context_window": self.over_window,
            "fraction": self.over_window / n if n else 0.0,
            "context_window_tokens": self.window_tokens, "treatment": self.treatment,
            "by_reason": dict(self.split.rejected_by_reason), "text": self.describe(),
        }  # fmt: skip

    def describe(self) -> str:
        """One clause for the demand line ("" when every request fits)."""
        if not self.over_window:
            return ""
        share = f"{self.over_window:,} ({self.over_window / self.offered:.1%})"
        what = f"beyond the {self.window_tokens:,}-token context window"
        return {
            "miss": f"{share} {what}, rejected and counted as misses",
            "drop": f"{share} {what} dropped (--too-long drop): the verdict covers the other "
            f"{len(self.split.kept):,}",
            "truncate": f"{share} {what} truncated to fit (--too-long truncate)",
        }[self.treatment]


def offered_traffic(
    workload: Workload, window_tokens: int | None, treatment: str = "miss"
) -> OfferedTraffic:
    """``workload`` under a context window of ``window_tokens`` (None: no limit), its over-long
    requests treated as ``treatment`` (one of :data:`TOO_LONG`)."""
    if treatment not in TOO_LONG:
        raise ValueError(f"treatment must be one of {TOO_LONG}; got {treatment!r}")
    split = split_by_context(workload, window_tokens)
    if not split.rejected or window_tokens is None:
        return OfferedTraffic(workload, workload, split, treatment, window_tokens)
    if treatment == "drop":
        return OfferedTraffic(split.kept, split.kept, split, treatment, window_tokens)
    if treatment == "truncate":
        outputs = np.minimum(workload.output_tokens, window_tokens - 1)
        inputs = np.clip(workload.input_tokens, 1, window_tokens - outputs)
        cut = workload.with_lengths(inputs, outputs)  # prefix blocks cut with the prompts
        return OfferedTraffic(cut, cut, split, treatment, window_tokens)
    return OfferedTraffic(workload, split.kept, split, treatment, window_tokens)


def rejections_allowed(traffic: OfferedTraffic, quantile: float) -> bool:
    """Whether the requests a ``miss`` treatment rejects leave the ``quantile`` SLOs reachable
    (at most ``(1 − quantile) · offered`` requests may miss, the rejected ones included)."""
    if traffic.treatment != "miss":
        return True
    # the verdict's quantile is "inverted_cdf": finite while ceil(q·n) requests are not rejected
    n = traffic.offered
    return traffic.over_window <= n - math.ceil(quantile * n - 1e-9)
