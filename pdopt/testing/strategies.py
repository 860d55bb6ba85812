"""Hypothesis strategies for property tests of the simulator and of policies.

The inputs are small on purpose: 1–40 requests on a few workers whose KV holds 32–960 tokens, so
that batching limits, admission waits for KV and preemptions all occur within a handful of
requests. Importing this module needs ``hypothesis`` (a dev extra); ``pdopt.testing`` does not
import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

from pdopt.cluster import KV_ALLOCATIONS, WorkerSpec
from pdopt.workload import Workload


@st.composite
def small_workloads(draw: st.DrawFn, max_output_tokens: int = 80) -> Workload:
    """1–40 Poisson arrivals (mean gap 1–50 ms), prompts of 1–399 tokens, outputs of
    1 to ``max_output_tokens - 1`` tokens."""
    n = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    mean_gap_s = draw(st.floats(0.001, 0.05))
    return Workload(
        np.cumsum(rng.exponential(mean_gap_s, n)),
        rng.integers(1, 400, n),
        rng.integers(1, max_output_tokens, n),
    )


@st.composite
def worker_limits(draw: st.DrawFn, min_kv_blocks: int = 2) -> dict[str, Any]:
    """Keyword arguments of :meth:`pdopt.sim.ClusterSpec.build`: blocks of 1, 8 or 16 tokens,
    KV capacity of ``min_kv_blocks``–60 blocks of 16 tokens, and the batching limits."""
    block_tokens = draw(st.sampled_from([1, 8, 16]))
    return {
        "kv_capacity_blocks": draw(st.integers(min_kv_blocks, 60)) * (16 // block_tokens),
        "block_tokens": block_tokens,
        "max_batch_tokens": draw(st.integers(50, 800)),
        "max_batch_size": draw(st.integers(1, 6)),
        "max_running": draw(st.integers(1, 10)),
    }


@st.composite
def kv_allocations(draw: st.DrawFn, workers: Sequence[WorkerSpec]) -> tuple[WorkerSpec, ...]:
    """``workers`` with their ``kv_allocation`` drawn: all on demand (half the time), all
    reserving their expected output at admission (``"reserve_output"``), or each worker its own
    (a cluster mixing the two)."""
    mode = draw(st.sampled_from(["on_demand", "on_demand", "reserve_output", "each"]))
    allocations = (
        [draw(st.sampled_from(KV_ALLOCATIONS)) for _ in workers]
        if mode == "each"
        else [mode] * len(workers)
    )
    return tuple(
        dataclasses.replace(w, kv_allocation=a) for w, a in zip(workers, allocations, strict=True)
    )
