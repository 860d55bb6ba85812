"""The prefill side of a worker: a FCFS queue and batches formed when the worker goes idle.

A batch takes requests from the head of the queue while the batch holds fewer than
``max_batch_size`` requests, their prefill tokens stay within ``max_batch_tokens`` and their KV
blocks (:func:`pdopt.sim._closed_form.kv_blocks` of its tokens each, the sliding window counted)
within the KV limit (the worker's capacity, or what a mixed worker has free); the head always
goes, so a prompt longer than the token budget runs alone
(the engine only routes prompts whose KV fits the worker, and a mixed worker starts a batch only
when the head fits). Batch time is the prefill model
``T = t0 + Σ_i (alpha·l_i² + beta·P_m·l_i) / P_peak`` (DESIGN.md "Cost model").

Chunked prefill (mixed workers, hybrid schedule, :mod:`pdopt.sim._mixed`): prompts that have
started are held in ``batch`` with the tokens done so far in ``done``; an iteration gives them, in
FCFS order, chunks of at most ``budget`` tokens in all, then starts new prompts from the queue
while their whole prompt's KV fits. A chunk of ``c`` tokens of a prompt with ``d`` done costs
``alpha·((d + c)² − d²) + beta·P_m·c`` FLOP (:meth:`pdopt.costmodel.PrefillModel.chunk_work_flop`),
so the chunks of a prompt sum to its whole prefill; the iteration's time is the scheduler's
(:meth:`pdopt.costmodel.CostModel.hybrid_iteration_time_s`).

A request preempted by recompute is queued with ``front=True`` under the cluster's default
``preempted_requeue="front"`` (:meth:`enqueue`): ahead of the requests waiting, as vLLM does.

A request whose client gave up (``client_timeout_s``) leaves the queue at once
(:meth:`PrefillSide.withdraw`); a prompt in the step in flight stays in it to its end (the step's
time was set when it started, as vLLM frees an aborted request at its next scheduler step): a
whole batch's prompt is dropped by the engine when the batch ends, a chunked prompt by
:meth:`PrefillSide.finish_chunks` (``aborted``); a chunked prompt started but not in the step in
flight is dropped at once (:meth:`PrefillSide.drop`). Their KV blocks are released then.

The prompts' KV blocks are reserved in the worker's :class:`pdopt.sim._kv.KvBlocks` (``kv``, shared
with its decode side) when they start (a batch, or a chunked prompt's first chunk) and released
when their prefill ends (or they go back to the queue).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable

from pdopt.cluster._spec import WorkerSpec
from pdopt.sim._closed_form import kv_blocks
from pdopt.sim._kv import KvBlocks


class PrefillSide:
    """Queue, running batch and queued work (FLOP) of one worker's prefill side.

    ``inflight`` is True while a batch (or a chunk iteration) runs, between ``batch_start_s`` and
    ``batch_end_s``. Busy time: an in-flight step counts when ``counted`` (a hybrid iteration that
    carries decodes is counted by the decode side instead); while ``stall_since >= 0`` the decode
    side of a mixed worker is stalled with requests running, so the time it counts as busy is
    subtracted here (the worker's busy time is prefill plus decode busy time).
    """

    __slots__ = (
        "aborted",
        "alpha",
        "batch",
        "batch_blocks",
        "batch_end_s",
        "batch_flop",
        "batch_start_s",
        "beta_pm",
        "bt",
        "busy_s",
        "chunk",
        "counted",
        "done",
        "dropped",
        "inflight",
        "intercept_s",
        "kv",
        "max_size",
        "max_tokens",
        "model",
        "p_peak",
        "prefix_hit",
        "queue",
        "queued_flop",
        "stall_since",
        "win",
    )

    def __init__(
        self,
        spec: WorkerSpec,
        window: tuple[int, int, int] = (0, 0, 1),
        kv: KvBlocks | None = None,
    ) -> None:
        """``window``: ``(W, S, N)`` of :func:`pdopt.sim._closed_form.kv_blocks`; ``kv``: the
        worker's KV blocks (its own when None)."""
        model = spec.cost.prefill
        self.model = model
        self.alpha = model.alpha_flop_per_token2
        self.beta_pm = model.beta_flop_per_token * model.p_m
        self.p_peak = model.p_peak_flops
        self.intercept_s = model.intercept_s
        self.max_tokens = spec.max_batch_tokens
        self.max_size = spec.max_batch_size
        self.bt = spec.block_tokens
        self.win = window
        self.kv = KvBlocks(spec.kv_capacity_blocks) if kv is None else kv
        self.queue: deque[int] = deque()
        self.queued_flop = 0.0
        self.batch: list[int] = []
        self.batch_blocks = 0  # KV blocks of the running (unchunked) batch's prompts
        self.batch_flop = 0.0
        self.batch_start_s = 0.0
        self.batch_end_s = 0.0
        self.busy_s = 0.0
        self.inflight = False
        self.counted = True
        self.stall_since = -1.0
        self.done: dict[int, int] = {}  # chunked prompts started: tokens prefilled so far
        self.chunk: list[tuple[int, int]] = []  # (request, tokens) of the chunk iteration in flight
        # prefix_hit(rid, free_blocks, pin) -> prompt tokens of rid cached on this worker (the
        # engine's, pdopt.sim._prefix_cache; pin: rid takes them); None: no prefix cache
        self.prefix_hit: Callable[[int, int, bool], int] | None = None
        self.aborted: set[int] = set()  # chunked prompts in flight whose client gave up
        # those of them the last finish_chunks dropped, in chunk order (the engine releases
        # their cached prefix blocks)
        self.dropped: list[int] = []

    # -- client timeouts --------------------------------------------------------------------------
    def withdraw(self, rid: int, flop: float) -> bool:
        """Take ``rid`` (queued work ``flop``) out of the queue if it is there; return whether
        it was."""
        try:
            self.queue.remove(rid)
        except ValueError:
            return False
        # NOTE: reset rather than subtract when the queue empties, so rounding cannot drift.
        self.queued_flop = max(self.queued_flop - flop, 0.0) if self.queue else 0.0
        return True

    def in_flight(self, rid: int) -> bool:
        """Whether ``rid``'s prompt is in the step in flight (a batch, or a chunk of it)."""
        if not self.inflight:
            return False
        if self.chunk:
            return any(r == rid for r, _ in self.chunk)
        return rid in self.batch

    def drop(self, rid: int, tokens: array[int]) -> None:
        """Drop chunked prompt ``rid`` (started, not in the step in flight; its client gave
        up): its KV blocks free, its remaining work leaves the queued work."""
        self._forget(rid, tokens[rid])
        self.batch.remove(rid)
        self.kv.release_prompts(kv_blocks(tokens[rid], self.bt, *self.win))

    def _forget(self, rid: int, length: int) -> None:
        """Remove chunked prompt ``rid`` of ``length`` tokens from ``done`` and its remaining
        work from the queued work."""
        d = self.done.pop(rid)
        self.queued_flop = max(self.queued_flop - self.chunk_flop(d, length - d), 0.0)

    def work_flop(self, tokens: int) -> float:
        """FLOP-equivalent work ``alpha·l² + beta·P_m·l`` of one prefill of ``tokens``."""
        return self.alpha * tokens * tokens + self.beta_pm * tokens

    def chunk_flop(self, done: int, tokens: int) -> float:
        """Work of prefilling ``tokens`` more tokens of a prompt with ``done`` already prefilled
        (:meth:`pdopt.costmodel.PrefillModel.chunk_work_flop`: attention over the whole prefix)."""
        return self.model.chunk_work_flop(done, tokens)

    def enqueue(self, rid: int, flop: float, *, front: bool = False) -> None:
        """Queue ``rid`` (work ``flop``) at the back, or ahead of every waiting request."""
        if front:
            self.queue.appendleft(rid)
        else:
            self.queue.append(rid)
        self.queued_flop += flop

    def chunk_shape(self) -> tuple[list[int], list[int]]:
        """(tokens, tokens already prefilled) of each chunk of the iteration in flight."""
        done = self.done
        return [c for _, c in self.chunk], [done[rid] for rid, _ in self.chunk]

    def reserved_blocks(self, tokens: array[int]) -> int:
        """KV blocks of the prompts in ``batch`` (a running batch or chunked prompts started):
        ``Σ kv_blocks(tokens[r])``, as reserved in ``kv``."""
        return self.kv.prompts

    def start_batch(
        self,
        now: float,
        tokens: array[int],
        flop: array[float],
        kv_limit_blocks: int = -1,
        seats: int = -1,
    ) -> float:
        """Form a batch from the queue head at ``now``; return its end time.

        ``tokens[rid]`` is the prefill length, ``flop[rid]`` its work; the batch's KV stays within
        ``kv_limit_blocks`` (default: the worker's capacity) except for the head, and its size
        within ``seats`` when given (a mixed worker's free ``max_num_seqs`` slots; the head
        always goes, the caller starts a batch only with a seat free).
        """
        queue = self.queue
        head = queue.popleft()
        batch = [head]
        bt, win = self.bt, self.win
        limit = self.kv.capacity if kv_limit_blocks < 0 else kv_limit_blocks
        blocks = kv_blocks(tokens[head], bt, *win)
        hit = self._hit(head, limit - blocks, pin=True)
        used = tokens[head] - hit  # tokens computed (a prefix hit skips its compute)
        queued = flop[head]  # its work as queued (less what the cache held then)
        work = self.work_flop(tokens[head]) - self.work_flop(hit)
        size = self.max_size if seats < 0 else min(self.max_size, seats)
        while queue and len(batch) < size:
            rid = queue[0]
            length = tokens[rid]
            need = kv_blocks(length, bt, *win)
            if blocks + need > limit:
                break
            hit = self._hit(rid, limit - blocks - need, pin=False)
            if used + length - hit > self.max_tokens:
                break
            queue.popleft()
            # every started prompt holds its blocks (a miss too: its prefill caches them)
            self._hit(rid, limit - blocks - need, pin=True)
            batch.append(rid)
            used += length - hit
            blocks += need
            queued += flop[rid]
            work += self.work_flop(length) - self.work_flop(hit)
        # NOTE: reset rather than subtract when the queue empties, so rounding cannot drift.
        self.queued_flop = self.queued_flop - queued if queue else 0.0
        self.batch = batch
        self.batch_blocks = blocks
        self.kv.reserve_prompts(blocks)
        self.batch_flop = work
        self.batch_start_s = now
        self.batch_end_s = now + self.intercept_s + work / self.p_peak
        self.inflight = True
        self.counted = True
        return self.batch_end_s

    def finish_batch(self) -> list[int]:
        """Close the running batch and return its requests in batch order."""
        batch = self.batch
        if self.counted:
            self.busy_s += self.batch_end_s - self.batch_start_s
        self.aborted.clear()  # the engine drops them (their status says so)
        self.batch = []
        self.kv.release_prompts(self.batch_blocks)
        self.batch_blocks = 0
        self.batch_flop = 0.0
        self.inflight = False
        return batch

    def _hit(self, rid: int, free_blocks: int, *, pin: bool) -> int:
        """Prompt tokens of ``rid`` this worker's prefix cache serves (0 without a cache)."""
        lookup = self.prefix_hit
        return 0 if lookup is None else lookup(rid, free_blocks, pin)

    # -- chunked prefill (hybrid schedule) ------------------------------------------------------
    def start_chunks(
        self,
        now: float,
        tokens: array[int],
        flop: array[float],
        budget: int,
        kv_free: int,
        seats: int = -1,
    ) -> list[int]:
        """Choose this iteration's chunks (``chunk``, :meth:`chunk_shape`) within ``budget``
        prefill tokens; return the prompts started now. ``kv_free`` bounds the KV of newly
        started prompts (whole prompts are reserved at their first chunk) and ``seats``, when
        given, their number (vLLM's ``max_num_seqs`` gates the start of a prefill). The caller
        times the iteration and sets ``batch_end_s`` and ``counted``."""
        chunk: list[tuple[int, int]] = []
        work = 0.0
        skipped = 0.0  # queued work the chunks will not compute (a prefix hit)
        left = budget
        done = self.done
        for rid in self.batch:
            if left <= 0:
                break
            d = done[rid]
            c = min(tokens[rid] - d, left)
            work += self.chunk_flop(d, c)
            chunk.append((rid, c))
            left -= c
        started: list[int] = []
        queue = self.queue
        bt, win = self.bt, self.win
        reserved = 0
        while left > 0 and queue and len(self.batch) < self.max_size and seats != 0:
            rid = queue[0]
            length = tokens[rid]
            need = kv_blocks(length, bt, *win)
            if need > kv_free:
                break
            queue.popleft()
            kv_free -= need
            reserved += need
            seats -= 1
            hit = self._hit(rid, kv_free, pin=True)
            self.batch.append(rid)
            done[rid] = hit
            started.append(rid)
            c = min(length - hit, left)
            # the chunks will subtract the work they compute; the rest of what was queued goes now
            skipped += flop[rid] - (self.work_flop(length) - self.work_flop(hit))
            work += self.chunk_flop(hit, c)
            chunk.append((rid, c))
            left -= c
        if reserved:
            self.kv.reserve_prompts(reserved)
        remaining = any(tokens[r] - done[r] > c for r, c in chunk) or len(chunk) < len(self.batch)
        self.queued_flop = self.queued_flop - work - skipped if queue or remaining else 0.0
        self.chunk = chunk
        self.batch_flop = work
        self.batch_start_s = now
        self.inflight = True
        return started

    def finish_chunks(self, tokens: array[int]) -> list[int]:
        """Credit the chunk iteration in flight; return the prompts it completed, in order (an
        aborted prompt it completed too: the engine drops it; one it did not complete is
        dropped here, its blocks freed, and listed in ``dropped``)."""
        done = self.done
        completed = []
        self.dropped = []
        freed = 0
        bt, win = self.bt, self.win
        aborted = self.aborted
        for rid, c in self.chunk:
            d = done[rid] + c
            if d >= tokens[rid]:
                del done[rid]
                completed.append(rid)
                freed += kv_blocks(tokens[rid], bt, *win)
            else:
                done[rid] = d
                if aborted and rid in aborted:
                    self._forget(rid, tokens[rid])
                    freed += kv_blocks(tokens[rid], bt, *win)
                    self.dropped.append(rid)
        if freed:
            self.batch = [r for r in self.batch if r in done]
            self.kv.release_prompts(freed)
        aborted.clear()
        if self.counted:
            self.busy_s += self.batch_end_s - self.batch_start_s
        self.chunk = []
        self.batch_flop = 0.0
        self.inflight = False
        return completed

    def release_started(self, tokens: array[int]) -> list[int]:
        """Put chunked prompts started but not finished back at the queue head (they restart
        from scratch: their partial KV is dropped; ``tokens[rid]`` is each one's prompt).
        Returns them in order."""
        back = self.batch
        bt, win = self.bt, self.win
        freed = 0
        for rid in reversed(back):
            self.queue.appendleft(rid)
            self.queued_flop += self.work_flop(self.done.pop(rid))
            freed += kv_blocks(tokens[rid], bt, *win)
        self.batch = []
        self.kv.release_prompts(freed)
        return back

    # -- telemetry --------------------------------------------------------------------------------
    def outstanding_flop(self, now: float) -> float:
        """Queued work plus the part of the running step not yet done (Φ_T numerator)."""
        if not self.inflight:
            return self.queued_flop
        span = self.batch_end_s - self.batch_start_s
        left = (self.batch_end_s - now) / span if span > 0 else 0.0
        return self.queued_flop + self.batch_flop * min(1.0, max(0.0, left))

    def busy_until(self, now: float) -> float:
        """Busy seconds up to ``now`` (the running step counted so far)."""
        busy = self.busy_s
        if self.inflight and self.counted:
            busy += now - self.batch_start_s
        if self.stall_since >= 0.0:
            busy -= now - self.stall_since
        return busy
