"""The prefill side of a worker: a FCFS queue and batches formed when the worker goes idle.

A batch takes requests from the head of the queue while the batch holds fewer than
``max_batch_size`` requests, their prefill tokens stay within ``max_batch_tokens`` and their KV
blocks (``ceil(tokens / block_tokens)`` each) within the worker's KV capacity; the head always
goes, so a prompt longer than the token budget runs alone (the engine only routes prompts whose
KV fits the worker). Batch time is the prefill model
``T = t0 + Σ_i (alpha·l_i² + beta·P_m·l_i) / P_peak`` (DESIGN.md "Cost model").
"""

from __future__ import annotations

from array import array
from collections import deque

from pdopt.sim._spec import WorkerSpec


class PrefillSide:
    """Queue, running batch and queued work (FLOP) of one worker's prefill side."""

    __slots__ = (
        "alpha",
        "batch",
        "batch_end_s",
        "batch_flop",
        "batch_start_s",
        "beta_pm",
        "bt",
        "busy_s",
        "cap",
        "intercept_s",
        "max_size",
        "max_tokens",
        "p_peak",
        "queue",
        "queued_flop",
    )

    def __init__(self, spec: WorkerSpec) -> None:
        model = spec.cost.prefill
        self.alpha = model.alpha_flop_per_token2
        self.beta_pm = model.beta_flop_per_token * model.p_m
        self.p_peak = model.p_peak_flops
        self.intercept_s = model.intercept_s
        self.max_tokens = spec.max_batch_tokens
        self.max_size = spec.max_batch_size
        self.bt = spec.block_tokens
        self.cap = spec.kv_capacity_blocks
        self.queue: deque[int] = deque()
        self.queued_flop = 0.0
        self.batch: list[int] = []
        self.batch_flop = 0.0
        self.batch_start_s = 0.0
        self.batch_end_s = 0.0
        self.busy_s = 0.0

    def work_flop(self, tokens: int) -> float:
        """FLOP-equivalent work ``alpha·l² + beta·P_m·l`` of one prefill of ``tokens``."""
        return self.alpha * tokens * tokens + self.beta_pm * tokens

    def enqueue(self, rid: int, flop: float) -> None:
        self.queue.append(rid)
        self.queued_flop += flop

    def start_batch(self, now: float, tokens: array[int], flop: array[float]) -> float:
        """Form a batch from the queue head at ``now``; return its end time.

        ``tokens[rid]`` is the prefill length, ``flop[rid]`` its work.
        """
        queue = self.queue
        batch = [queue.popleft()]
        used = tokens[batch[0]]
        bt = self.bt
        blocks = (used + bt - 1) // bt
        work = flop[batch[0]]
        while queue and len(batch) < self.max_size:
            rid = queue[0]
            length = tokens[rid]
            need = (length + bt - 1) // bt
            if used + length > self.max_tokens or blocks + need > self.cap:
                break
            queue.popleft()
            batch.append(rid)
            used += length
            blocks += need
            work += flop[rid]
        # NOTE: reset rather than subtract when the queue empties, so rounding cannot drift.
        self.queued_flop = self.queued_flop - work if queue else 0.0
        self.batch = batch
        self.batch_flop = work
        self.batch_start_s = now
        self.batch_end_s = now + self.intercept_s + work / self.p_peak
        return self.batch_end_s

    def finish_batch(self) -> list[int]:
        """Close the running batch and return its requests in batch order."""
        batch = self.batch
        self.busy_s += self.batch_end_s - self.batch_start_s
        self.batch = []
        self.batch_flop = 0.0
        return batch

    def outstanding_flop(self, now: float) -> float:
        """Queued work plus the part of the running batch not yet done (Φ_T numerator)."""
        if not self.batch:
            return self.queued_flop
        span = self.batch_end_s - self.batch_start_s
        left = (self.batch_end_s - now) / span if span > 0 else 0.0
        return self.queued_flop + self.batch_flop * min(1.0, max(0.0, left))

    def busy_until(self, now: float) -> float:
        """Busy seconds up to ``now`` (the running batch counted so far)."""
        if self.batch:
            return self.busy_s + (now - self.batch_start_s)
        return self.busy_s
