"""The request-level engine of one run: event handlers over the kernel, workers and links.

Request path (DESIGN.md "Requests"): arrival → ``route_prefill`` → FCFS prefill queue → batch →
prefill end (first token; a request with ``output_tokens == 1`` finishes here) → ``route_decode``
→ KV transfer on the FIFO link from the prefill worker to the decode worker (``prefill_tokens ×
kv_bytes_per_token`` bytes; none when both are the same worker) → the decode worker's admission
queue → continuous batching (:mod:`pdopt.sim._decode`) → finish.

While a request waits in a decode admission queue its KV sits in a staging buffer of the decode
node and is not counted in that worker's KV blocks. Prefill-side KV is bounded by the batch token
budget and not tracked. A preempted request (recompute) goes back through ``route_prefill`` and is
prefilled over prompt + generated tokens; that prefill emits its next token. Timestamps and
workers in the result describe the first pass; ``preemptions`` counts the repeats.

A request whose KV can never fit any worker (prompt alone, or ``input + output - 1`` tokens when
it decodes) is rejected at arrival with a reason.
"""

from __future__ import annotations

import math
from collections import deque

from pdopt.sim._control import Control
from pdopt.sim._decode import DecodeSide
from pdopt.sim._enums import Event
from pdopt.sim._kernel import Kernel
from pdopt.sim._mixed import BUSY, NONE, Colocated
from pdopt.sim._policy import PolicyDecisionError, PolicyProtocol, PolicyTraits, RequestInfo
from pdopt.sim._prefill import PrefillSide
from pdopt.sim._requests import FINISHED, REJECTED, RequestTable
from pdopt.sim._spec import ClusterSpec, Role

ARRIVAL, PREFILL_DONE, TRANSFER_DONE, DECODE, TICK, MIGRATION = Event
_PREFILL_ROLES = (Role.PREFILL, Role.MIXED)
_DECODE_ROLES = (Role.DECODE, Role.MIXED)


class Engine(Colocated, Control):
    """State and event handlers of one simulation run (never reused)."""

    def __init__(
        self,
        cluster: ClusterSpec,
        policy: PolicyProtocol,
        traits: PolicyTraits,
        table: RequestTable,
        n_total: int,
    ) -> None:
        self.kernel = Kernel()
        self.cluster = cluster
        self.policy = policy
        self.traits = traits
        self.policy_name = policy.name
        self.table = table
        self.n_total = n_total
        self.n_done = 0
        self.bt = cluster.block_tokens
        self.names = tuple(w.name for w in cluster.workers)
        self.roles = [w.role for w in cluster.workers]
        self.pools = [w.pool for w in cluster.workers]
        self.prefill = [PrefillSide(w) for w in cluster.workers]
        self.decode = [DecodeSide(w) for w in cluster.workers]
        for w, side in enumerate(self.decode):
            side.accepting = self.roles[w] in _DECODE_ROLES
        self.max_kv_tokens = max(w.kv_capacity_blocks * w.block_tokens for w in cluster.workers)
        self.kv_bytes_per_token = cluster.kv_bytes_per_token
        # links[src][dst] = [bandwidth, latency, time the wire is free]
        self.links = [
            [
                [spec.bw_bytes_per_s, spec.latency_s, 0.0]
                for spec in (cluster.link_between(a.name, b.name) for b in cluster.workers)
            ]
            for a in cluster.workers
        ]
        self.recent_peaks: deque[int] = deque(maxlen=256)
        self.n_admitted = 0
        self.false_oom_flagged: set[int] = set()
        self.on_end: list[int] = []  # closed-loop hook: ids of requests that just ended
        Control.__init__(self)
        Colocated.__init__(self)
        self.handlers = (
            self.on_arrival,
            self.on_prefill_done,
            self.on_transfer_done,
            self.on_decode,
            self.on_tick,
            self.on_migration,
        )

    # -- helpers ---------------------------------------------------------------------------------
    def request_info(self, rid: int) -> RequestInfo:
        t = self.table
        inp, out, gen = t.input_tokens[rid], t.output_tokens[rid], t.generated[rid]
        bt = self.bt
        return RequestInfo(
            rid,
            t.arrival_s[rid],
            inp,
            out,
            inp + gen,
            (inp + max(gen, 1) + bt - 1) // bt,
            (inp + out - 1 + bt - 1) // bt,
            t.preemptions[rid],
        )

    def _bad(self, hook: str, rid: int, choice: object, rule: str) -> PolicyDecisionError:
        return PolicyDecisionError(
            f"policy {self.policy_name!r}: {hook} chose worker {choice!r} for request {rid}, "
            f"but {rule}"
        )

    def _check_index(self, hook: str, rid: int, choice: object, roles: tuple[Role, ...]) -> int:
        if isinstance(choice, bool) or not hasattr(choice, "__index__"):
            raise self._bad(hook, rid, choice, "a worker index (int) is required")
        w = int(choice.__index__())
        if not 0 <= w < len(self.roles):
            raise self._bad(hook, rid, w, f"valid indices are 0..{len(self.roles) - 1}")
        if self.roles[w] not in roles:
            wanted = " or ".join(str(r) for r in roles)
            raise self._bad(hook, rid, w, f"its role is {self.roles[w]}, not {wanted}")
        return w

    # -- arrival and prefill ---------------------------------------------------------------------
    def on_arrival(self, now: float, seq: int, rid: int) -> None:
        t = self.table
        self.schedule_next_arrival(rid)
        inp, out = t.input_tokens[rid], t.output_tokens[rid]
        need = inp + out - 1 if out > 1 else inp
        if need > self.max_kv_tokens:
            self.reject(
                rid,
                now,
                f"KV of {need} tokens exceeds the largest worker's "
                f"{self.max_kv_tokens} tokens ({self.max_kv_tokens // self.bt} blocks)",
            )
            return
        self.route_prefill(rid, now)

    def route_prefill(self, rid: int, now: float) -> None:
        choice = self.policy.route_prefill(self.request_info(rid), self.view)
        w = self._check_index("route_prefill", rid, choice, _PREFILL_ROLES)
        t = self.table
        side = self.prefill[w]
        tokens = t.input_tokens[rid] + t.generated[rid]
        if tokens > side.cap * side.bt:
            raise self._bad(
                "route_prefill",
                rid,
                w,
                f"its KV capacity ({side.cap} blocks) cannot hold the {tokens} prompt tokens",
            )
        if t.prefill_worker[rid] < 0:
            t.prefill_worker[rid] = w
        t.prefill_tokens[rid] = tokens
        flop = side.work_flop(tokens)
        t.prefill_flop[rid] = flop
        side.enqueue(rid, flop)
        if self.roles[w] is Role.MIXED:
            self.mixed_poke(w, now)
        elif not side.batch and self.decode[w].b == 0:
            self.start_prefill(w, now)

    def start_prefill(self, w: int, now: float) -> None:
        t = self.table
        side = self.prefill[w]
        # NOTE: blocks reserved for a migration still copying in (the worker left the decode pool
        # during its stop-and-copy) are not free: the head waits for them (_migration releases).
        limit = side.cap - self.decode[w].reserved
        if -(-t.prefill_tokens[side.queue[0]] // side.bt) > limit:
            return
        end = side.start_batch(now, t.prefill_tokens, t.prefill_flop, limit)
        start = t.prefill_start_s
        for rid in side.batch:
            if math.isnan(start[rid]):
                start[rid] = now
        self.kernel.schedule(end, PREFILL_DONE, w)

    def on_prefill_done(self, now: float, seq: int, w: int) -> None:
        side = self.prefill[w]
        if self.mstate[w] != NONE:  # a mixed worker's step (or one that ended being mixed)
            mixed = self.roles[w] is Role.MIXED
            if mixed:
                self.mstate[w] = BUSY  # arrivals during the hand-over wait for mixed_next
            self.prefill_completed(w, self.end_mixed_prefill(w, now), now)
            if mixed:
                self.mixed_settle(w, now)
                return
            self.leave_mixed(w, now)
        else:
            self.prefill_completed(w, side.finish_batch(), now)
        if side.queue and not side.batch and self.decode[w].b == 0:
            self.start_prefill(w, now)
        elif self.roles[w] in _DECODE_ROLES and not side.batch:
            self.decode[w].accepting = True
            if self.decode[w].queue:
                self.wake_decode(w, now)

    # -- transfer and decode ---------------------------------------------------------------------
    def route_decode(self, rid: int, src: int, now: float) -> None:
        choice = self.policy.route_decode(self.request_info(rid), self.view)
        j = self._check_index("route_decode", rid, choice, _DECODE_ROLES)
        t = self.table
        peak = t.input_tokens[rid] + t.output_tokens[rid] - 1
        spec = self.cluster.workers[j]
        if peak > spec.kv_capacity_blocks * spec.block_tokens:
            raise self._bad(
                "route_decode",
                rid,
                j,
                f"its KV capacity ({spec.kv_capacity_blocks} blocks) "
                f"cannot hold the request's peak footprint of {peak} tokens",
            )
        self.transfer(rid, src, j, now)

    def transfer(self, rid: int, src: int, dst: int, now: float) -> None:
        t = self.table
        t.decode_target[rid] = dst
        if t.decode_worker[rid] < 0:
            t.decode_worker[rid] = dst
        if src == dst:
            start = end = now
        else:
            link = self.links[src][dst]
            start = now if now > link[2] else link[2]
            wire = t.prefill_tokens[rid] * self.kv_bytes_per_token / link[0]
            link[2] = start + wire
            end = start + link[1] + wire
        if math.isnan(t.transfer_start_s[rid]):
            t.transfer_start_s[rid] = start
            t.transfer_end_s[rid] = end
        if src == dst:
            self.on_transfer_done(now, -1, rid)
        else:
            self.kernel.schedule(end, TRANSFER_DONE, rid)

    def on_transfer_done(self, now: float, seq: int, rid: int) -> None:
        j = self.table.decode_target[rid]
        if self.roles[j] not in _DECODE_ROLES:
            # moved to the prefill pool while the KV was in flight: route it on from there
            self.route_decode(rid, j, now)
            return
        self.table.ready_s[rid] = now
        side = self.decode[j]
        side.queue.append(rid)
        if len(side.queue) == 1:
            self.wake_decode(j, now)

    def wake_decode(self, j: int, now: float) -> None:
        """A new request heads worker ``j``'s admission queue: admit at the next boundary."""
        if self.roles[j] is Role.MIXED:
            self.mixed_poke(j, now)
            return
        side = self.decode[j]
        if not side.accepting:
            return
        if side.b == 0:
            side.t_seg = now
            self.process_boundary(j, side.n_seg, now)
            return
        n = side.first_boundary_after(now)
        if n < side.next_n:
            side.next_n = n
            side.event_seq = self.kernel.schedule(side.time_at(n), DECODE, j)

    def schedule_decode(self, j: int) -> None:
        side = self.decode[j]
        n = side.next_event_counter(self.table)
        side.next_n = n
        side.event_seq = -1 if n < 0 else self.kernel.schedule(side.time_at(n), DECODE, j)

    def on_decode(self, now: float, seq: int, j: int) -> None:
        side = self.decode[j]
        if seq == side.event_seq:
            self.process_boundary(j, side.next_n, now)

    def process_boundary(self, j: int, n: int, now: float) -> None:
        t = self.table
        side = self.decode[j]
        mixed = self.roles[j] is Role.MIXED
        if mixed:
            self.mstate[j] = BUSY  # arrivals during the boundary wait for mixed_next
        if self.prefill[j].chunk:  # a hybrid iteration (decodes plus chunks) ends here
            self.credit_hybrid(j, now)
            if not mixed:
                self.leave_mixed(j, now)
        finished: list[int] = []
        preempted: list[int] = []
        admitted: list[int] = []
        blocked = side.boundary(n, now, t, finished, preempted, admitted)
        self.schedule_decode(j)
        if self.migrations:
            self.migration_boundary(j, now, finished, preempted)
        start = t.decode_start_s
        self.n_admitted += len(admitted)
        for rid in admitted:
            if math.isnan(start[rid]):
                start[rid] = now
            self.recent_peaks.append(
                (t.input_tokens[rid] + t.output_tokens[rid] - 1 + self.bt - 1) // self.bt
            )
        for rid in finished:
            self.finish(rid, now)
        for rid in preempted:
            t.preemptions[rid] += 1
            self.log(now, "preemption", j, rid, f"generated={t.generated[rid]}")
            self.route_prefill(rid, now)
        if blocked >= 0:
            self.check_false_oom(blocked, now)
        if mixed:
            self.mixed_next(j, now)
            return
        if side.b == 0 and self.roles[j] not in _DECODE_ROLES:
            side.accepting = False
            if self.prefill[j].queue and not self.prefill[j].batch:
                self.start_prefill(j, now)

    # -- endings ----------------------------------------------------------------------------------
    def finish(self, rid: int, now: float) -> None:
        self.table.status[rid] = FINISHED
        self.table.finish_s[rid] = now
        self.ended(rid, now)

    def reject(self, rid: int, now: float, reason: str) -> None:
        self.table.status[rid] = REJECTED
        self.table.reason[rid] = reason
        self.log(now, "rejection", -1, rid, reason)
        self.ended(rid, now)

    def ended(self, rid: int, now: float) -> None:
        self.n_done += 1
        self.request_ended(rid, now)
        if self.n_done == self.n_total:
            self.kernel.stopped = True
