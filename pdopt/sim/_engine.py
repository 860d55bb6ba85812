"""The core of the request-level engine of one run: the request path over the kernel.

The core (:class:`Engine`) owns the kernel (event loop and clock, :mod:`pdopt.sim._kernel`), the
request table, the workers' roles and pools, the request path below, the endings and the event
log. Its components own their state and call it back through :class:`pdopt.sim._core.Core`:
arrivals (:mod:`pdopt.sim._arrivals`), the KV links (:mod:`pdopt.sim._links`),
migrations (:mod:`pdopt.sim._migration`), the colocated scheduler (:mod:`pdopt.sim._mixed`) and
the control tick (:mod:`pdopt.sim._control`); each worker's prefill and decode sides
(:mod:`pdopt.sim._prefill`, :mod:`pdopt.sim._decode`) hold its queues and batches, and its
:class:`pdopt.sim._kv.KvBlocks` (``kv``) its KV blocks and prefix cache, for both sides.

Request path (DESIGN.md "Requests"): arrival → ``route_prefill`` → FCFS prefill queue → batch →
prefill end (first token; a request with ``output_tokens == 1`` finishes here) → ``route_decode``
→ KV transfer on the FIFO link from the prefill worker to the decode worker (``prefill_tokens ×
kv_bytes_per_token`` bytes, ``held_tokens(prefill_tokens)`` with sliding-window layers; none
when both are the same worker) → the decode worker's admission
queue → continuous batching (:mod:`pdopt.sim._decode`) → finish.

While a request waits in a decode admission queue its KV sits in a staging buffer of the decode
node and is not counted in that worker's KV blocks. Prefill-side KV is bounded by the batch token
budget and not tracked. A preempted request (recompute) goes back through ``route_prefill`` and is
prefilled over prompt + generated tokens; that prefill emits its next token. It joins the chosen
worker's prefill queue at the front under ``ClusterSpec.preempted_requeue="front"`` (vLLM,
Sarathi-Serve; requests preempted at one boundary are queued youngest first, each ahead of the
last, so they keep their admission order), at the back under ``"back"``. Timestamps and
workers in the result describe the first pass; ``preemptions`` counts the repeats.

Client timeouts (``client_timeout_s``, issue 34): a client gives up on its request
``client_timeout_s`` after its arrival, whatever the request's state, as inference-perf's and
vLLM's benchmark clients do; the request then ends ``aborted`` at that deadline (a failure: its
latencies stay out of the metrics and it misses the SLO) and releases what it holds the earliest
the engine can do so exactly (:meth:`Engine.on_abort`): queued for prefill or for decode
admission, at once; in a prefill step, at the step's end (the step's time is already set, and vLLM
frees an aborted request at its next scheduler step; a chunked prompt not in the step in flight,
at once); decoding, at its worker's next iteration boundary (:mod:`pdopt.sim._decode`); in a KV
transfer, when the transfer ends (the link time is spent either way; KV in flight is counted
nowhere); migrating, as :mod:`pdopt.sim._migration` says. Without ``client_timeout_s`` nothing
here runs and results are those of the engine without timeouts.

A request whose KV can never fit any worker (prompt alone, or ``input + output - 1`` tokens when
it decodes) is rejected at arrival with a reason. Tokens become KV blocks through
:meth:`pdopt.sim.ClusterSpec.kv_blocks` everywhere (``ceil(E(L) / block_tokens)``, ``E(L)`` the
full-token equivalents a sliding-window model holds; ``ceil(L / block_tokens)`` without one).
"""

from __future__ import annotations

import math
from collections import deque
from functools import partial

from pdopt.cluster._spec import ClusterSpec, Role
from pdopt.sim._arrivals import Arrivals
from pdopt.sim._control import Control
from pdopt.sim._decode import DecodeSide
from pdopt.sim._enums import Event, Status
from pdopt.sim._kernel import Handler, Kernel
from pdopt.sim._kv import KvBlocks
from pdopt.sim._links import Links
from pdopt.sim._migration import Migrations
from pdopt.sim._mixed import Colocated
from pdopt.sim._policy import PolicyDecisionError, PolicyProtocol, PolicyTraits, RequestInfo
from pdopt.sim._prefill import PrefillSide
from pdopt.sim._prefix_cache import PrefixCache
from pdopt.sim._requests import RequestTable
from pdopt.sim._view import ClusterView

_PREFILL_ROLES = (Role.PREFILL, Role.MIXED)
_DECODE_ROLES = (Role.DECODE, Role.MIXED)


class Engine:
    """The core of one simulation run (never reused); implements :class:`pdopt.sim._core.Core`.

    Build it, then :meth:`run`. ``recent_peaks`` (the KV peak footprints, in blocks, of the last
    256 admitted requests) and ``n_admitted`` feed the fragmentation reference
    (:meth:`pdopt.sim.ClusterView.reference_need_blocks`).
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        policy: PolicyProtocol,
        traits: PolicyTraits,
        table: RequestTable,
        n_total: int,
        *,
        tick_s: float,
        record_timeseries: bool,
        closed_loop: tuple[int, list[float]] | None = None,
        client_timeout_s: float | None = None,
    ) -> None:
        self.kernel = Kernel()
        self.client_timeout_s = client_timeout_s
        self.cluster = cluster
        self.policy = policy
        self.policy_name = policy.name
        self.table = table
        self.n_total = n_total
        self.n_done = 0
        self.bt = cluster.block_tokens
        self.names = tuple(w.name for w in cluster.workers)
        self.roles = [w.role for w in cluster.workers]
        self.pools = [w.pool for w in cluster.workers]
        self.caches = self._prefix_caches(cluster, table)
        self.kv = [
            KvBlocks(w.kv_capacity_blocks, self.caches[i] if self.caches else None)
            for i, w in enumerate(cluster.workers)
        ]
        window = cluster.kv_window
        specs = cluster.workers
        self.prefill = [PrefillSide(w, window, kv) for w, kv in zip(specs, self.kv, strict=True)]
        self.decode = [DecodeSide(w, window, kv) for w, kv in zip(specs, self.kv, strict=True)]
        if self.caches:
            for w, prefill in enumerate(self.prefill):
                prefill.prefix_hit = partial(self.prefix_hit, w)
        self.kv_blocks = cluster.block_counter()  # context tokens -> KV blocks (the window counted)
        for w, side in enumerate(self.decode):
            side.accepting = self.roles[w] in _DECODE_ROLES
        self.max_kv_tokens = max(w.kv_capacity_blocks * w.block_tokens for w in cluster.workers)
        self.kv_bytes_per_token = cluster.kv_bytes_per_token
        self.sliding_window = cluster.sliding_window
        self.recent_peaks: deque[int] = deque(maxlen=256)
        self.n_admitted = 0
        self.event_rows: list[tuple[float, str, str, int, str]] = []
        clients, think = closed_loop if closed_loop is not None else (0, None)
        self.arrivals = Arrivals(self.kernel, table, n_total, think, clients)
        self.links = Links(cluster)
        self.view = ClusterView(self)
        self.migrations = Migrations(self, cluster, self.links, n_total)
        self.colocated = Colocated(self, cluster, traits)
        self.pinned: dict[int, tuple[int, int]] = {}  # rid -> (worker, prefix blocks it holds)
        self.control = Control(
            self, cluster, policy, self.view, self.colocated, self.migrations, tick_s
        )
        self.control.record_timeseries = record_timeseries
        self.control.policy_ticks = traits.wants_ticks
        self.ticks = bool(n_total) and (record_timeseries or traits.wants_ticks)

    @staticmethod
    def _prefix_caches(cluster: ClusterSpec, table: RequestTable) -> list[PrefixCache]:
        """One prefix cache per worker (its ``kv``'s) when the cluster caches and the workload
        has prefix blocks (each prefill side asks through :meth:`prefix_hit`); else none."""
        if not cluster.prefix_caching or table.prefix_keys is None:
            return []
        per_block = -(-table.prefix_block_tokens // cluster.block_tokens)
        return [PrefixCache(per_block) for _ in cluster.workers]

    def prefix_hit(self, w: int, rid: int, free_blocks: int, pin: bool) -> int:
        """Prompt tokens of ``rid`` cached on worker ``w`` (its leading cached blocks, at most
        all but one token); with ``pin``, ``rid`` takes a reference on them and they count as
        its hit (:mod:`pdopt.sim._prefix_cache`)."""
        kv = self.kv[w]
        keys = self.table.prefix_keys_of(rid)
        n = kv.match(keys, free_blocks)
        hit = self._hit_tokens(rid, n)
        if pin:
            t = self.table
            self.release_prefix(rid)
            kv.pin(keys[:n])
            self.pinned[rid] = (w, n)
            t.cached_tokens[rid] = hit
            cache = self.caches[w]
            cache.lookups += 1
            cache.hit_tokens += hit
        return hit

    def cached_tokens(self, w: int, rid: int) -> int:
        """Prompt tokens of ``rid`` cached on worker ``w`` now, changing nothing (0 without
        a cache): what a router sees and what ``rid``'s queued work leaves out."""
        if not self.caches:
            return 0
        return self._hit_tokens(rid, self.kv[w].peek(self.table.prefix_keys_of(rid)))

    def _hit_tokens(self, rid: int, blocks: int) -> int:
        """Prompt tokens ``blocks`` leading cached blocks serve ``rid``'s coming prefill (its
        prompt plus tokens generated before a preemption): all but its last token at most, which
        the engine always computes."""
        t = self.table
        return min(blocks * t.prefix_block_tokens, t.input_tokens[rid] + t.generated[rid] - 1)

    def cache_prompt(self, w: int, rid: int) -> None:
        """``rid``'s prefill ended on ``w``: its prompt's blocks are cached there (it holds
        a reference on each until :meth:`release_prefix`)."""
        held = self.pinned.get(rid)
        if held is None:
            return
        keys = self.table.prefix_keys_of(rid)
        self.kv[w].pin(keys[held[1] :])
        self.pinned[rid] = (w, len(keys))

    def release_prefix(self, rid: int) -> None:
        """``rid`` leaves the worker whose cached blocks it holds (finished, preempted, sent
        away or restarted): drop its references."""
        held = self.pinned.pop(rid, None)
        if held is not None:
            w, n = held
            self.kv[w].unpin(self.table.prefix_keys_of(rid)[:n])

    def run(self) -> None:
        """Schedule the first arrivals (and tick) and run the kernel until every request ended
        or nothing is left to happen."""
        self.arrivals.start()
        if self.ticks:
            self.control.start()
        handlers: tuple[Handler, ...] = (  # indexed by Event
            self.on_arrival,
            self.on_prefill_done,
            self.on_transfer_done,
            self.on_decode,
            self.control.on_tick,
            self.migrations.on_copy_done,
            self.on_abort,
        )
        self.kernel.run(handlers)

    # -- what components and the view read -------------------------------------------------------
    def request_info(self, rid: int) -> RequestInfo:
        """What a policy sees of request ``rid`` when routing it."""
        t = self.table
        inp, out, gen = t.input_tokens[rid], t.output_tokens[rid], t.generated[rid]
        return RequestInfo(
            rid,
            t.arrival_s[rid],
            inp,
            out,
            inp + gen,
            self.kv_blocks(inp + max(gen, 1)),
            self.kv_blocks(inp + out - 1),
            t.preemptions[rid],
        )

    def kv_used_blocks(self, w: int, now: float) -> int:
        """KV blocks worker ``w`` holds at ``now``: running decodes, blocks held for migrations
        (never free) and the running prefill batch's prompts."""
        return self.kv[w].in_use(self.decode[w].used_blocks(now))

    def assign(self, w: int, role: Role, pool: str) -> Role:
        """Give worker ``w`` a new role and pool; return its old role (pool moves only)."""
        old = self.roles[w]
        self.roles[w] = role
        self.pools[w] = pool
        return old

    def log(self, now: float, kind: str, worker: int, rid: int, detail: str) -> None:
        """Append one row of the event log (``worker``/``rid`` -1 when none)."""
        name = self.names[worker] if worker >= 0 else ""
        self.event_rows.append((now, kind, name, rid, detail))

    # -- routing checks --------------------------------------------------------------------------
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
        """Request ``rid`` arrives (``Event.ARRIVAL``)."""
        t = self.table
        self.arrivals.after_arrival()
        inp, out = t.input_tokens[rid], t.output_tokens[rid]
        need = inp + out - 1 if out > 1 else inp
        if self.kv_blocks(need) > self.max_kv_tokens // self.bt:
            self.reject(
                rid,
                now,
                f"KV of {need} tokens exceeds the largest worker's "
                f"{self.max_kv_tokens} tokens ({self.max_kv_tokens // self.bt} blocks)",
            )
            return
        if self.client_timeout_s is not None:
            self.kernel.schedule(now + self.client_timeout_s, Event.ABORT, rid)
        self.route_prefill(rid, now)

    def on_abort(self, now: float, seq: int, rid: int) -> None:
        """``rid``'s client timed out (``Event.ABORT``): unless it ended, it ends now, aborted,
        and releases what it holds (module docstring; :meth:`_withdraw`)."""
        t = self.table
        if t.status[rid] != Status.PENDING:
            return
        t.status[rid] = Status.ABORTED
        t.finish_s[rid] = now
        w, state = self._withdraw(rid, now)
        reason = f"client timeout: no answer within {self.client_timeout_s:g} s ({state})"
        t.reason[rid] = reason
        self.log(now, "abort", w, rid, reason)
        self._ended(rid, now)

    def _withdraw(self, rid: int, now: float) -> tuple[int, str]:
        """Take aborted ``rid`` out of where it is (or mark it to leave at the end of the step
        in flight); return its worker (-1 when in transfer) and its state."""
        t = self.table
        if self.migrations.migrating(rid) and self.migrations.abort(rid, now):
            return t.decode_target[rid], "migrating"
        j = t.decode_target[rid]
        if j >= 0:
            side = self.decode[j]
            if rid in side.running:
                side.abort(rid)
                if not self.colocated.abort_decode(j, now):
                    n = side.first_boundary_after(now)
                    if side.next_n < 0 or n < side.next_n:
                        side.next_n = n
                        side.event_seq = self.kernel.schedule(side.time_at(n), Event.DECODE, j)
                return j, "decoding"
            if rid in side.queue:
                if self.pinned:
                    self.release_prefix(rid)
                if side.withdraw(rid) and side.queue:
                    self.wake_decode(j, now)
                return j, "waiting for decode admission"
        for w, p in enumerate(self.prefill):
            if rid in p.done:  # a chunked prompt started
                if p.in_flight(rid):
                    p.aborted.add(rid)  # dropped when the iteration in flight ends
                else:
                    p.drop(rid, t.prefill_tokens)
                    if self.pinned:
                        self.release_prefix(rid)
                    if self.roles[w] is Role.MIXED:
                        self.colocated.poke(w, now)  # the freed blocks may start the next one
                return w, "in prefill"
            if rid in p.batch:
                return w, "in prefill"  # dropped when the batch ends (prefill_completed)
            head = bool(p.queue) and p.queue[0] == rid
            if p.withdraw(rid, t.prefill_flop[rid]):
                if head and p.queue:  # the next one may fit where the head did not
                    if self.roles[w] is Role.MIXED:
                        self.colocated.poke(w, now)
                    elif not p.batch and self.decode[w].b == 0:
                        self.start_prefill(w, now)
                return w, "queued for prefill"
        return -1, "in KV transfer"  # dropped when it arrives (on_transfer_done)

    def route_prefill(self, rid: int, now: float, *, front: bool = False) -> None:
        """Ask the policy for a prefill worker for ``rid`` and queue it there (ahead of the
        requests waiting when ``front``)."""
        view = self.view
        t = self.table
        tokens = t.input_tokens[rid] + t.generated[rid]
        need = self.kv_blocks(tokens)
        view.open_call(prompt_blocks=need)  # its prefill_workers: those that hold the prompt
        choice = self.policy.route_prefill(self.request_info(rid), view)
        view.close_call()
        w = self._check_index("route_prefill", rid, choice, _PREFILL_ROLES)
        side = self.prefill[w]
        capacity = self.kv[w].capacity
        if need > capacity:
            raise self._bad(
                "route_prefill",
                rid,
                w,
                f"its KV capacity ({capacity} blocks) cannot hold the {tokens} prompt tokens",
            )
        if t.prefill_worker[rid] < 0:
            t.prefill_worker[rid] = w
        t.prefill_tokens[rid] = tokens
        flop = side.work_flop(tokens)
        if self.caches:  # queued work (Φ_T's numerator) leaves out what the cache serves now
            flop -= side.work_flop(self.cached_tokens(w, rid))
        t.prefill_flop[rid] = flop
        side.enqueue(rid, flop, front=front)
        if self.roles[w] is Role.MIXED:
            self.colocated.poke(w, now)
        elif not side.batch and self.decode[w].b == 0:
            self.start_prefill(w, now)

    def start_prefill(self, w: int, now: float) -> None:
        """Start a prefill batch on worker ``w`` (queue not empty) if its head's KV fits."""
        t = self.table
        side = self.prefill[w]
        # NOTE: blocks reserved for a migration still copying in (the worker left the decode pool
        # during its stop-and-copy) are not free: the head waits for them (_migration releases).
        kv = self.kv[w]
        limit = kv.capacity - kv.held
        if self.kv_blocks(t.prefill_tokens[side.queue[0]]) > limit:
            return
        end = side.start_batch(now, t.prefill_tokens, t.prefill_flop, limit)
        start = t.prefill_start_s
        for rid in side.batch:
            if math.isnan(start[rid]):
                start[rid] = now
        self.kernel.schedule(end, Event.PREFILL_DONE, w)

    def on_prefill_done(self, now: float, seq: int, w: int) -> None:
        """Worker ``w``'s prefill step ends (``Event.PREFILL_DONE``)."""
        side = self.prefill[w]
        colocated = self.colocated
        if colocated.stepping(w):  # a mixed worker's step (or one that ended being mixed)
            mixed = self.roles[w] is Role.MIXED
            if mixed:
                colocated.busy(w)  # arrivals during the hand-over wait for its next step
            self.prefill_completed(w, colocated.end_prefill(w), now)
            if mixed:
                colocated.settle(w, now)
                return
            colocated.leave(w, now)
        else:
            self.prefill_completed(w, side.finish_batch(), now)
        if side.queue and not side.batch and self.decode[w].b == 0:
            self.start_prefill(w, now)
        elif self.roles[w] in _DECODE_ROLES and not side.batch:
            self.decode[w].accepting = True
            if self.decode[w].queue:
                self.wake_decode(w, now)

    def prefill_completed(self, w: int, rids: list[int], now: float) -> None:
        """First token (end of the step finishing the prompt), then finish or route to decode."""
        t = self.table
        for rid in rids:
            if self.caches:
                self.cache_prompt(w, rid)
            if t.status[rid] == Status.ABORTED:  # its client left during the step: drop it
                if self.pinned:
                    self.release_prefix(rid)  # its computed blocks stay cached, as in vLLM
                continue
            gen = t.generated[rid] + 1
            t.generated[rid] = gen
            if t.prefill_end_s[rid] != t.prefill_end_s[rid]:  # NaN: first pass
                t.prefill_end_s[rid] = now
                t.first_token_s[rid] = now
            if gen >= t.output_tokens[rid]:
                self.finish(rid, now)
            else:
                self.route_decode(rid, w, now)

    # -- transfer and decode ---------------------------------------------------------------------
    def route_decode(self, rid: int, src: int, now: float) -> None:
        """Ask the policy for a decode worker for ``rid`` and send its KV there from ``src``."""
        view = self.view
        view.open_call()
        choice = self.policy.route_decode(self.request_info(rid), view)
        view.close_call()
        j = self._check_index("route_decode", rid, choice, _DECODE_ROLES)
        t = self.table
        peak = t.input_tokens[rid] + t.output_tokens[rid] - 1
        spec = self.cluster.workers[j]
        if self.kv_blocks(peak) > spec.kv_capacity_blocks:
            raise self._bad(
                "route_decode",
                rid,
                j,
                f"its KV capacity ({spec.kv_capacity_blocks} blocks) "
                f"cannot hold the request's peak footprint of {peak} tokens",
            )
        self.transfer(rid, src, j, now)

    def transfer(self, rid: int, src: int, dst: int, now: float) -> None:
        """Send ``rid``'s prefill KV from ``src`` to ``dst`` (none when they are the same)."""
        t = self.table
        t.decode_target[rid] = dst
        if t.decode_worker[rid] < 0:
            t.decode_worker[rid] = dst
        if src == dst:
            start = end = now
        else:
            self.release_prefix(rid)  # the KV leaves src; its cached blocks stay there
            tokens = t.prefill_tokens[rid]
            if self.sliding_window is not None:  # the sliding layers send their window only
                tokens = self.sliding_window.held_tokens(int(tokens))
            n_bytes = tokens * self.kv_bytes_per_token
            start, end = self.links.send(src, dst, n_bytes, now)
        if math.isnan(t.transfer_start_s[rid]):
            t.transfer_start_s[rid] = start
            t.transfer_end_s[rid] = end
        if src == dst:
            self.on_transfer_done(now, -1, rid)
        else:
            self.kernel.schedule(end, Event.TRANSFER_DONE, rid)

    def on_transfer_done(self, now: float, seq: int, rid: int) -> None:
        """``rid``'s KV has arrived (``Event.TRANSFER_DONE``): join the admission queue."""
        if self.table.status[rid] == Status.ABORTED:  # its client left while the KV was in flight
            if self.pinned:
                self.release_prefix(rid)
            return
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
            self.colocated.poke(j, now)
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
            side.event_seq = self.kernel.schedule(side.time_at(n), Event.DECODE, j)

    def schedule_decode(self, j: int) -> None:
        """Schedule worker ``j``'s next boundary that needs a visit (none when idle)."""
        side = self.decode[j]
        n = side.next_event_counter(self.table)
        side.next_n = n
        side.event_seq = -1 if n < 0 else self.kernel.schedule(side.time_at(n), Event.DECODE, j)

    def on_decode(self, now: float, seq: int, j: int) -> None:
        """A decode boundary of worker ``j`` (``Event.DECODE``; stale when rescheduled since)."""
        side = self.decode[j]
        if seq == side.event_seq:
            self.process_boundary(j, side.next_n, now)

    def process_boundary(self, j: int, n: int, now: float) -> None:
        """Process iteration boundary ``n`` of worker ``j``'s decode side at ``now``."""
        t = self.table
        side = self.decode[j]
        mixed = self.roles[j] is Role.MIXED
        if mixed:
            self.colocated.busy(j)  # arrivals during the boundary wait for its next step
        if self.prefill[j].chunk:  # a hybrid iteration (decodes plus chunks) ends here
            self.prefill_completed(j, self.colocated.end_hybrid(j), now)
            if not mixed:
                self.colocated.leave(j, now)
        finished: list[int] = []
        preempted: list[int] = []
        admitted: list[int] = []
        blocked = side.boundary(n, now, t, finished, preempted, admitted)
        if side.dropped:  # aborted requests left the batch here (their clients gave up)
            self._dropped(side.dropped, now)
        self.schedule_decode(j)
        self.migrations.after_boundary(j, now, finished, preempted)
        start = t.decode_start_s
        self.n_admitted += len(admitted)
        for rid in admitted:
            if math.isnan(start[rid]):
                start[rid] = now
            self.recent_peaks.append(self.kv_blocks(t.input_tokens[rid] + t.output_tokens[rid] - 1))
        for rid in finished:
            self.finish(rid, now)
        front = self.cluster.preempted_requeue == "front"
        for rid in preempted:  # youngest first: with ``front``, the oldest ends up at the head
            if self.pinned:
                self.release_prefix(rid)
            t.preemptions[rid] += 1
            self.log(now, "preemption", j, rid, f"generated={t.generated[rid]}")
            self.route_prefill(rid, now, front=front)
        if blocked >= 0:
            self.control.check_false_oom(blocked, now)
        if mixed:
            self.colocated.next_step(j, now)
            return
        if side.b == 0 and self.roles[j] not in _DECODE_ROLES:
            side.accepting = False
            if self.prefill[j].queue and not self.prefill[j].batch:
                self.start_prefill(j, now)

    # -- endings ----------------------------------------------------------------------------------
    def _dropped(self, rids: list[int], now: float) -> None:
        """Aborted requests left a running batch: drop their cache references and migrations."""
        for rid in rids:
            if self.pinned:
                self.release_prefix(rid)
            if self.migrations.migrating(rid):
                self.migrations.abort(rid, now)
        rids.clear()

    def finish(self, rid: int, now: float) -> None:
        """``rid`` emitted its last token at ``now`` (unless its client gave up before: it
        ended then, and only leaves here)."""
        if self.table.status[rid] == Status.ABORTED:
            if self.pinned:
                self.release_prefix(rid)
            return
        self.table.status[rid] = Status.FINISHED
        self.table.finish_s[rid] = now
        if self.pinned:
            self.release_prefix(rid)
        self._ended(rid, now)

    def reject(self, rid: int, now: float, reason: str) -> None:
        """``rid`` is rejected at ``now`` (logged with ``reason``)."""
        self.table.status[rid] = Status.REJECTED
        self.table.reason[rid] = reason
        self.log(now, "rejection", -1, rid, reason)
        self._ended(rid, now)

    def _ended(self, rid: int, now: float) -> None:
        self.n_done += 1
        self.arrivals.after_end(now)
        if self.n_done == self.n_total:
            self.kernel.stopped = True
