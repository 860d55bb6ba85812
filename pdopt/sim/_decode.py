"""The decode side of a worker: continuous batching advanced in closed form.

Semantics (exact at iteration granularity, DESIGN.md "Cost model"):

* The worker counts iterations with a counter ``m``. Iteration ``m`` runs the requests admitted at
  or before boundary ``m``; it takes ``τ(B, C) = d0 + d1·B + d2·C`` with ``B`` running requests and
  ``C`` their total context tokens, and emits one token per running request.
* A request admitted at boundary ``a`` with context ``c`` (prompt + tokens generated so far) has
  context ``c + (m - a)`` during iteration ``m``; it needs ``kv_blocks(context)`` KV blocks
  then (:func:`pdopt.sim._closed_form.kv_blocks`: ``ceil(context / block_tokens)``, or with a
  sliding window ``ceil(E / block_tokens)``, ``E = (F·L + S·min(L, W)) / N`` full-token
  equivalents), so it gains a block whenever that count steps up (every ``block_tokens`` tokens
  without a window).
  It leaves at boundary ``a + (output_tokens - generated)`` after emitting its last token.
* At a boundary, in order: finished requests leave (their blocks free); the survivors' growth is
  allocated, and while it does not fit the youngest running request is preempted (recompute: it
  loses its KV and goes back to be prefilled again over prompt + generated tokens); then waiting
  requests are admitted from the head of the FIFO admission queue while their KV fits and the
  running batch is below ``max_running`` (head-of-line blocking).
* A running request whose client gave up (``client_timeout_s``, :meth:`DecodeSide.abort`) leaves
  at the first boundary after its deadline, right after the finished ones and before growth is
  allocated, as vLLM frees an aborted request's blocks at its next scheduler step: the iteration
  in flight keeps its ``B`` and ``C`` (its time was already set), and the blocks it frees can
  spare a preemption and admit waiting requests at that same boundary.

KV allocation (:attr:`pdopt.sim.WorkerSpec.kv_allocation`): ``"on_demand"`` grows a request's
blocks with its context as above. ``"reserve_output"`` admits a request only when the blocks of
its whole expected footprint fit, ``kv_blocks(input + output − 1)`` (the context of
its last iteration; the expected output is the request's own ``output_tokens``, an oracle), and
holds them from admission to its end: its blocks never grow, so no growth is counted, nothing
is preempted for growth, and held blocks are those :meth:`DecodeSide.blocks_for` gives.

Between boundaries where something happens, ``B`` is fixed and ``C`` grows by ``B`` per iteration,
so boundary ``n_seg + k`` falls at ``t_seg + k·(d0 + d1·B + d2·C_seg) + d2·B·k(k-1)/2``. The engine
only visits boundaries where a request finishes, growth fails, or a new request is waiting; the
growth of all running requests is tracked by counting requests per phase ``(1 - offset) mod
block_tokens`` (a request gains a block at counters congruent to its phase); with a sliding
window it is summed over the running requests' offsets instead. These closed forms
are :mod:`pdopt.sim._closed_form`'s functions, which the compiled engine compiles as they are.

The worker's KV blocks are its :class:`pdopt.sim._kv.KvBlocks` (``kv``), their only writer: the
decode side commits the blocks its batch holds at each boundary it processes
(:meth:`~pdopt.sim._kv.KvBlocks.commit_used`; the growth since is the closed form above), moves a
departing request's blocks to the migration's hold and a joining request's hold into its use,
and admits and preempts against :attr:`~pdopt.sim._kv.KvBlocks.decode_limit`.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import repeat

from pdopt.cluster._spec import WorkerSpec
from pdopt.sim._closed_form import (
    NEVER,
    boundaries_before,
    boundary_time,
    first_boundary_after,
    first_growth_failure,
    growth,
    kv_blocks,
    segment_slopes,
    used_blocks,
    window_first_growth_failure,
    window_growth,
    window_used_blocks,
)
from pdopt.sim._kv import KvBlocks
from pdopt.sim._requests import RequestTable


class DecodeSide:
    """Running batch and admission queue of one worker's decode side; its KV blocks are ``kv``'s
    (shared with the worker's prefill side)."""

    __slots__ = (
        "a_seg",
        "aborting",
        "accepting",
        "b",
        "bt",
        "busy_s",
        "busy_since",
        "cnt",
        "d0",
        "d1",
        "d2",
        "d3",
        "departed",
        "departing",
        "dropped",
        "event_seq",
        "experts",
        "experts_per_token",
        "fin_heap",
        "half_d2b",
        "incoming",
        "joined",
        "kv",
        "max_running",
        "n_seg",
        "next_n",
        "queue",
        "reserve_output",
        "run_limit",
        "running",
        "s",
        "t_seg",
        "win",
        "windowed",
    )

    def __init__(
        self,
        spec: WorkerSpec,
        window: tuple[int, int, int] = (0, 0, 1),
        kv: KvBlocks | None = None,
    ) -> None:
        """``window``: ``(W, S, N)`` of :func:`pdopt.sim._closed_form.kv_blocks`
        (:attr:`pdopt.sim.ClusterSpec.kv_window`; ``S = 0`` without a sliding window); ``kv``:
        the worker's KV blocks (its own when None)."""
        model = spec.cost.decode
        self.d0 = model.d0_s
        self.d1 = model.d1_s_per_request
        self.d2 = model.d2_s_per_token
        self.d3 = model.d3_s_per_expert
        self.experts = float(model.experts)
        self.experts_per_token = float(model.experts_per_token)
        self.bt = spec.block_tokens
        self.kv = KvBlocks(spec.kv_capacity_blocks) if kv is None else kv
        self.max_running = spec.max_running
        self.reserve_output = spec.kv_allocation == "reserve_output"
        self.win = window
        self.windowed = window[1] > 0
        self.queue: deque[int] = deque()
        self.running: dict[int, int] = {}  # rid -> kv_offset, admission order (last: youngest)
        self.fin_heap: list[tuple[int, int, int]] = []  # (finish counter, admit seq, rid)
        self.cnt = [0] * self.bt  # running requests per growth phase (no sliding window)
        self.b = 0  # running requests
        self.s = 0  # Σ kv_offset of running requests: C(m) = s + b·m
        self.n_seg = 0
        self.t_seg = 0.0
        self.a_seg = 0.0
        self.half_d2b = 0.0
        self.next_n = -1  # counter of the scheduled boundary event, -1 when none
        self.event_seq = -1
        self.busy_s = 0.0
        self.busy_since = 0.0
        self.accepting = True
        # Migration (pdopt.sim._migration): ``run_limit`` is the running batch's size cap less the
        # slots promised to incoming migrations (their blocks are held in ``kv``).
        self.run_limit = self.max_running
        self.departing: dict[int, int] = {}  # rid -> boundary at which it leaves (stop-and-copy)
        self.departed: list[int] = []  # left at the last boundary processed
        self.incoming: list[tuple[int, int]] = []  # (rid, reserved blocks) joining next boundary
        self.joined: list[int] = []  # joined at the last boundary processed
        # Client timeouts: running requests to drop at the next boundary, and those dropped at
        # the last boundary processed (the engine ends them).
        self.aborting: set[int] = set()
        self.dropped: list[int] = []

    # -- closed forms (pdopt.sim._closed_form, shared with the compiled engine) ---------------
    def time_at(self, n: int) -> float:
        """Time of boundary ``n`` (end of iteration ``n - 1``) in the current segment."""
        return boundary_time(self.t_seg, self.a_seg, self.half_d2b, n - self.n_seg)

    def growth(self, m1: int, m2: int) -> int:
        """Blocks the running requests gain at boundaries ``m1..m2`` inclusive (none when
        their blocks are reserved)."""
        if self.reserve_output:
            return 0
        if self.windowed:
            offsets = list(self.running.values())
            return window_growth(offsets, self.b, self.bt, *self.win, m1, m2)
        return growth(self.cnt, self.b, self.bt, m1, m2)

    def _first_growth_failure(self, n: int, free: int) -> int:
        """Smallest boundary ``m > n`` where growth since ``n`` exceeds ``free`` blocks
        (reserved blocks never grow: the next boundary when already over, else ``NEVER``)."""
        if self.reserve_output:
            return n + 1 if free < 0 else NEVER
        if self.windowed:
            offsets = list(self.running.values())
            return window_first_growth_failure(offsets, self.b, self.bt, *self.win, n, free)
        return first_growth_failure(self.cnt, self.b, self.bt, n, free)

    def blocks_for(self, rid: int, context: int, table: RequestTable) -> int:
        """KV blocks request ``rid`` holds here with ``context`` tokens: ``kv_blocks(context)``
        on demand; its whole reservation ``kv_blocks(input + output − 1)`` under
        ``reserve_output`` (module docstring)."""
        if self.reserve_output:
            context = table.input_tokens[rid] + table.output_tokens[rid] - 1
        return kv_blocks(context, self.bt, *self.win)

    def blocks_for_each(
        self, ids: list[int], contexts: list[int], table: RequestTable
    ) -> list[int]:
        """:meth:`blocks_for` of requests ``ids`` with ``contexts`` tokens each.

        NOTE: one C-level ``map`` of ``kv_blocks`` instead of a method call per request: a
        policy view reads every running request's blocks at every tick (EcoServe's
        CheckConstraints), where the per-request call was ~10% of a ``--compare-modes`` run."""
        if self.reserve_output:
            inputs, outputs = table.input_tokens, table.output_tokens
            contexts = [inputs[r] + outputs[r] - 1 for r in ids]
        window, sliding, layers = self.win
        return list(map(kv_blocks, contexts, repeat(self.bt), repeat(window), repeat(sliding),
                        repeat(layers)))  # fmt: skip

    def admission_blocks(self, rid: int, table: RequestTable) -> int:
        """KV blocks request ``rid`` (prompt + tokens generated so far) needs to be admitted."""
        return self.blocks_for(rid, table.input_tokens[rid] + table.generated[rid], table)

    def _boundaries_before(self, t: float) -> int:
        """Largest ``k >= 0`` with ``time_at(n_seg + k) <= t`` (quadratic, then exact fix-up)."""
        return boundaries_before(self.t_seg, self.a_seg, self.half_d2b, t)

    def first_boundary_after(self, t: float) -> int:
        """The counter of the first boundary at or after ``t`` that is later than ``n_seg``."""
        return self.n_seg + first_boundary_after(self.t_seg, self.a_seg, self.half_d2b, t)

    def used_blocks(self, t: float) -> int:
        """KV blocks held by running requests at time ``t`` (inside the current segment)."""
        u_seg = self.kv.used
        if self.reserve_output:
            return u_seg
        if self.windowed:
            offsets = list(self.running.values())
            return window_used_blocks(
                offsets, self.b, self.bt, *self.win, self.n_seg, u_seg,
                self.t_seg, self.a_seg, self.half_d2b, t,
            )  # fmt: skip
        return used_blocks(
            self.cnt, self.b, self.bt, self.n_seg, u_seg,
            self.t_seg, self.a_seg, self.half_d2b, t,
        )  # fmt: skip

    def free_blocks(self, t: float) -> int:
        """Blocks the running batch may still take at time ``t`` (inside the current segment):
        :attr:`pdopt.sim._kv.KvBlocks.decode_limit` less what it holds then."""
        return self.kv.decode_limit - self.used_blocks(t)

    # -- read-only KV figures (the counts are ``kv``'s) -----------------------------------------
    @property
    def u_seg(self) -> int:
        """KV blocks held during iteration ``n_seg`` (the boundary snapshot in ``kv``)."""
        return self.kv.used

    @property
    def reserved(self) -> int:
        """KV blocks held for migrations, outside the running batch."""
        return self.kv.held

    @property
    def cap(self) -> int:
        """The decode side's KV capacity: the worker's, less a mixed worker's prompts."""
        return self.kv.decode_capacity()

    def context_tokens(self) -> int:
        """Total context tokens ``C`` of the running requests during iteration ``n_seg``."""
        return self.s + self.b * self.n_seg

    def counter_at(self, t: float) -> int:
        """The iteration counter running at time ``t``."""
        return self.n_seg + (self._boundaries_before(t) if self.b else 0)

    # -- boundary processing --------------------------------------------------------------------
    def boundary(
        self,
        n: int,
        t: float,
        table: RequestTable,
        finished: list[int],
        preempted: list[int],
        admitted: list[int],
    ) -> int:
        """Process boundary ``n`` at time ``t``; return the blocked head's id or -1."""
        used = self.kv.used + self.growth(self.n_seg + 1, n)
        was_busy = self.b > 0
        used = self._complete(n, used, table, finished)
        if self.aborting:
            used = self._drop(n, used, table)
        # NOTE: growth at n must fit before a departing request's blocks turn into a hold: a
        # departure at n keeps the block it grew at n, so preempting after it could overflow.
        used = self._preempt(n, used, table, preempted)
        if self.departing:
            used = self._depart(n, used, table)
        if self.incoming:
            used = self._join(n, used, table)
        blocked = -1
        if self.accepting:
            used, blocked = self._admit(n, used, table, admitted)
        self._start_segment(n, t, used)
        if was_busy and self.b == 0:
            self.busy_s += t - self.busy_since
        elif not was_busy and self.b > 0:
            self.busy_since = t
        return blocked

    def _remove(self, rid: int, o: int, n: int, table: RequestTable) -> int:
        """Take ``rid`` (offset ``o``) out of the running batch at boundary ``n``; return the
        blocks it held."""
        self.cnt[(1 - o) % self.bt] -= 1
        self.s -= o
        self.b -= 1
        del self.running[rid]
        return self.blocks_for(rid, o + n, table)

    def _complete(self, n: int, used: int, table: RequestTable, out: list[int]) -> int:
        heap = self.fin_heap
        admit_seq = table.admit_seq
        offset = table.kv_offset
        while heap and heap[0][0] <= n:
            _, seq, rid = heapq.heappop(heap)
            if admit_seq[rid] != seq:
                continue  # stale: preempted or migrated since
            admit_seq[rid] = -1
            used -= self._remove(rid, offset[rid], n, table)
            table.generated[rid] = table.output_tokens[rid]
            out.append(rid)
        return used

    def abort(self, rid: int) -> None:
        """``rid`` (running here) was aborted by its client: it leaves at the next boundary
        this side processes (the caller makes sure one is visited)."""
        self.aborting.add(rid)

    def _drop(self, n: int, used: int, table: RequestTable) -> int:
        """Aborted requests still running leave at ``n`` in admission order (their blocks
        free, ``dropped``); those that finished at ``n`` already left with the finished ones.

        NOTE: admission order, not the set's: the engine releases their cached blocks in
        ``dropped``'s order, and the compiled engine walks its running list in that order."""
        aborting = self.aborting
        running = self.running
        for rid in [r for r in running if r in aborting]:
            o = running[rid]
            used -= self._remove(rid, o, n, table)
            table.generated[rid] = o + n - table.input_tokens[rid]
            table.admit_seq[rid] = -1
            self.dropped.append(rid)
        self.aborting.clear()
        return used

    def withdraw(self, rid: int) -> bool:
        """Take ``rid`` out of the admission queue (its client gave up; a queued request holds
        no blocks here); return whether it headed the queue (the next one may fit now)."""
        head = self.queue[0] == rid
        self.queue.remove(rid)
        return head

    def _depart(self, n: int, used: int, table: RequestTable) -> int:
        """Requests due to leave at or before ``n`` stop decoding; their blocks stay held
        (reserved) until their stop-and-copy ends."""
        for rid, at in list(self.departing.items()):
            if at > n:
                continue
            del self.departing[rid]
            if rid not in self.running:
                continue  # it finished here: the engine cancels the migration
            o = table.kv_offset[rid]
            blocks = self._remove(rid, o, n, table)
            used -= blocks
            self.kv.reserve(blocks)  # the migration holds them until its stop-and-copy ends
            table.generated[rid] = o + n - table.input_tokens[rid]
            table.admit_seq[rid] = -1
            self.departed.append(rid)
        return used

    def _join(self, n: int, used: int, table: RequestTable) -> int:
        """Migrated requests join the running batch; their reserved blocks become used."""
        kv = self.kv
        for rid, held in self.incoming:
            kv.release(held)  # the hold becomes the batch's use (the same blocks)
            self.run_limit += 1
            context = table.input_tokens[rid] + table.generated[rid]
            used += self.blocks_for(rid, context, table)
            self._insert(rid, context, n, table)
            self.joined.append(rid)
        self.incoming.clear()
        return used

    def _insert(self, rid: int, context: int, n: int, table: RequestTable) -> None:
        """Add ``rid`` with ``context`` tokens to the running batch at boundary ``n``."""
        o = context - n
        table.kv_offset[rid] = o
        seq = table.next_admit_seq
        table.next_admit_seq = seq + 1
        table.admit_seq[rid] = seq
        left = table.output_tokens[rid] - table.generated[rid]
        heapq.heappush(self.fin_heap, (n + left, seq, rid))
        self.running[rid] = o
        self.cnt[(1 - o) % self.bt] += 1
        self.s += o
        self.b += 1

    def _preempt(self, n: int, used: int, table: RequestTable, out: list[int]) -> int:
        limit = self.kv.decode_limit
        running = self.running
        while used > limit and running:
            rid = next(reversed(running))
            o = table.kv_offset[rid]
            used -= self._remove(rid, o, n, table)
            table.generated[rid] = o + n - table.input_tokens[rid]
            table.admit_seq[rid] = -1
            out.append(rid)
        return used

    def _admit(self, n: int, used: int, table: RequestTable, out: list[int]) -> tuple[int, int]:
        queue = self.queue
        bt = self.bt
        limit = self.kv.decode_limit
        run_limit = self.run_limit
        while queue and self.b < run_limit:
            rid = queue[0]
            generated = table.generated[rid]
            context = table.input_tokens[rid] + generated
            need = self.blocks_for(rid, context, table)
            if used + need > limit:
                return used, rid
            queue.popleft()
            o = context - n
            table.kv_offset[rid] = o
            seq = table.next_admit_seq
            table.next_admit_seq = seq + 1
            table.admit_seq[rid] = seq
            heapq.heappush(self.fin_heap, (n + table.output_tokens[rid] - generated, seq, rid))
            self.running[rid] = o
            self.cnt[(1 - o) % bt] += 1
            self.s += o
            self.b += 1
            used += need
            out.append(rid)
        return used, -1

    def _start_segment(self, n: int, t: float, used: int) -> None:
        self.n_seg = n
        self.t_seg = t
        self.kv.commit_used(used)
        b = self.b
        self.a_seg, self.half_d2b = segment_slopes(
            self.d0, self.d1, self.d2, self.d3, self.experts, self.experts_per_token, b, self.s, n
        )

    def next_event_counter(self, table: RequestTable) -> int:
        """The next boundary that needs a visit (a finish or a growth failure), -1 if idle."""
        if self.b == 0:
            return -1
        heap = self.fin_heap
        admit_seq = table.admit_seq
        while admit_seq[heap[0][2]] != heap[0][1]:
            heapq.heappop(heap)
        fin = heap[0][0]
        if self.departing:  # a migrating request leaves at its stop-and-copy boundary
            fin = min(fin, *self.departing.values())
        kv = self.kv
        fail = self._first_growth_failure(self.n_seg, kv.decode_limit - kv.used)
        return fin if fin < fail else fail

    def first_growth_failure(self) -> int:
        """The first boundary of the current segment where growth exceeds the KV's
        ``decode_limit`` (-1 when idle or never); called after that shrank mid-segment (a
        migration reserved blocks)."""
        if self.b == 0:
            return -1
        kv = self.kv
        m = self._first_growth_failure(self.n_seg, kv.decode_limit - kv.used)
        return -1 if m == NEVER else m

    def remaining_tokens(self, table: RequestTable, counter: int) -> list[int]:
        """Tokens each running request (admission order) has still to emit when iteration
        ``counter`` runs: its finish counter minus ``counter``."""
        admit_seq = table.admit_seq
        finish = {rid: fc for fc, seq, rid in self.fin_heap if admit_seq[rid] == seq}
        return [finish[rid] - counter for rid in self.running]

    def reserve_slot(self) -> None:
        """Promise one running-batch slot to a migration copying in (its blocks are held in
        ``kv`` by the migration)."""
        self.run_limit -= 1

    def release_slot(self) -> None:
        """Give back a slot promised by :meth:`reserve_slot` (the migration was cancelled or
        went elsewhere; one that joins takes its slot at the boundary, :meth:`boundary`)."""
        self.run_limit += 1

    def busy_until(self, now: float) -> float:
        """Busy seconds up to ``now``."""
        return self.busy_s + (now - self.busy_since if self.b else 0.0)
