"""KV migration of a running decode request with pipelined pre-copy (DESIGN.md "Migration").

A :class:`pdopt.sim.Migrate` action moves running request ``r`` from its decode worker ``src`` to
decode worker ``dst`` over the link ``src → dst``:

1. **Start** (at the control tick that returns the action). ``dst`` reserves the blocks ``r``
   holds now and one running-batch slot, so neither can be taken by ``dst``'s own admissions or
   growth (``dst``'s growth preempts its own requests instead).
2. **Pre-copy stage 0** copies the snapshot: ``kv_blocks(c0)`` blocks, with ``c0`` the
   context ``r`` has at the start. ``r`` keeps decoding on ``src`` meanwhile.
3. **Stage k ≥ 1**, issued when stage ``k - 1`` ends at time ``t`` with ``r`` at context ``c``,
   copies the blocks dirtied since the previous snapshot ``c'``: the partly filled last block and
   every block started since, ``kv_blocks(c) - kv_full_blocks(c')`` (``ceil(c / bt) -
   floor(c' / bt)`` without a sliding window). ``dst`` grows its reservation to
   ``kv_blocks(c)`` first; if it has no room the migration is cancelled.
4. **Stop-and-copy**: when a stage ends with at most ``stop_dirty_blocks`` blocks dirty, or
   ``max_precopy_stages`` stages have been issued, ``r`` leaves ``src``'s running batch at
   ``src``'s next iteration boundary ``n`` (context ``c_n``; ``dst`` reserves
   ``kv_blocks(c_n)`` before). Its blocks stay held on ``src`` while the last dirty blocks are
   copied; this copy is the downtime.
5. **Takeover**: when that copy ends, ``src``'s blocks are freed and ``r`` joins ``dst``'s
   running batch at ``dst``'s next iteration boundary (at once if ``dst`` is idle), ahead of
   ``dst``'s admission queue; its reservation becomes ordinary use. ``downtime_s`` runs from
   leaving ``src`` to joining ``dst``.

On a worker with ``kv_allocation = "reserve_output"`` a request holds its whole reservation
(:meth:`pdopt.sim._decode.DecodeSide.blocks_for`), so that is what ``src`` holds and ``dst``
reserves (once: it does not grow); the copies still move only the context's blocks.

Every copy moves ``blocks × block_tokens × kv_bytes_per_token`` bytes (paged KV is copied by
block) and queues FIFO on the link with the ordinary prefill → decode transfers: it starts when
the previous transfer has put its last byte on the wire and ends ``latency_s + bytes / bw`` later.

If ``r`` finishes or is preempted on ``src`` before it leaves, or ``dst`` leaves the decode pool
or lacks room to grow the reservation, the migration is cancelled (logged ``migration_cancel``)
and the reservation released; ``r`` carries on at ``src``. If ``dst`` left the decode pool during
the stop-and-copy, ``r``'s KV is routed on from ``dst`` through ``route_decode`` (as KV in flight
to a worker that left the pool is; :mod:`pdopt.sim._control`).

If ``r``'s client gives up (``client_timeout_s``, :meth:`Migrations.abort`) while it still runs on
``src`` (pre-copy, or waiting to depart), the migration is cancelled and ``r`` leaves ``src``'s
batch at its next boundary as any aborted request; during the stop-and-copy or while waiting to
join ``dst``, ``r`` runs nowhere, so both sides' holds and ``dst``'s slot are freed at once (the
copy already on the link keeps its wire time; its end is ignored).

The :class:`Migrations` component owns the migrations in progress; it reaches the engine's core
through :class:`pdopt.sim._core.Core` and its copies go through :class:`pdopt.sim._links.Links`.
Blocks reserved on ``dst`` and released on either side go through the worker's
:class:`pdopt.sim._kv.KvBlocks` (:meth:`~pdopt.sim._kv.KvBlocks.reserve`,
:meth:`~pdopt.sim._kv.KvBlocks.release`; ``src``'s hold is taken by its decode side when ``r``
leaves), the running-batch slot through the decode side's
:meth:`~pdopt.sim._decode.DecodeSide.reserve_slot`.

Logged events: ``migration_start`` (worker = src), ``migration_end`` (worker = dst; bytes, stages
including the stop-and-copy, downtime_s), ``migration_cancel`` (reason). Per request:
``migrations``, ``migration_downtime_s``, ``migrated_bytes`` (completed migrations only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pdopt.cluster._spec import ClusterSpec, Role
from pdopt.sim._closed_form import kv_blocks, kv_full_blocks
from pdopt.sim._enums import Event, MigrationPhase
from pdopt.sim._policy import Migrate, PolicyDecisionError, as_index

if TYPE_CHECKING:
    from pdopt.sim._core import Core
    from pdopt.sim._links import Links

_DECODE_ROLES = (Role.DECODE, Role.MIXED)


@dataclass(slots=True)
class MigrationState:
    """One migration in progress (engine-internal, mutable)."""

    rid: int
    src: int
    dst: int
    start_s: float
    stop_dirty_blocks: int
    max_stages: int
    phase: int = MigrationPhase.PRECOPY
    stages: int = 0  # copies issued, the stop-and-copy included
    copied_tokens: int = 0  # context tokens whose KV has been sent (the last snapshot)
    bytes: float = 0.0
    held: int = 0  # blocks reserved on dst
    src_held: int = 0  # blocks held on src during the stop-and-copy
    stop_s: float = float("nan")
    seq: int = -1  # kernel sequence number of the pending copy-end event


def dirty_blocks(
    copied_tokens: int,
    context_tokens: int,
    block_tokens: int,
    window: tuple[int, int, int] = (0, 0, 1),
) -> int:
    """Blocks written since a snapshot of ``copied_tokens``: the partly filled block and every
    block started since, ``kv_blocks(c) − kv_full_blocks(c')`` (0 when nothing was written).

    With a sliding window (``window = (W, S, N)``, :attr:`pdopt.sim.ClusterSpec.kv_window`)
    both count full-token equivalents (:func:`pdopt.sim._closed_form.kv_blocks`): first order,
    it leaves out that a sliding layer rewrites the blocks of its moving window."""
    if context_tokens <= copied_tokens:
        return 0
    return kv_blocks(context_tokens, block_tokens, *window) - kv_full_blocks(
        copied_tokens, block_tokens, *window
    )


def _as_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return None
    return int(value)


class Migrations:
    """The migrations of one run, by request id (see the module docstring)."""

    def __init__(self, core: Core, cluster: ClusterSpec, links: Links, n_total: int) -> None:
        self._core = core
        self._links = links
        self._bt = cluster.block_tokens
        self._win = cluster.kv_window
        self._kv_blocks = cluster.block_counter()
        self._kv_bytes_per_token = cluster.kv_bytes_per_token
        self._n_total = n_total
        self._migs: dict[int, MigrationState] = {}

    # -- what the view reads ---------------------------------------------------------------------
    def migrating(self, rid: int) -> bool:
        """Whether request ``rid`` has a migration in progress."""
        return rid in self._migs

    def in_progress(self) -> list[MigrationState]:
        """The migrations in progress, by request id (read-only by convention)."""
        return [self._migs[r] for r in sorted(self._migs)]

    # -- start -----------------------------------------------------------------------------------
    def _error(self, action: Migrate, rule: str) -> PolicyDecisionError:
        return PolicyDecisionError(
            f"policy {self._core.policy_name!r}: {action!r} is invalid: {rule}"
        )

    def start(self, action: Migrate, now: float) -> None:
        """Validate ``action`` and start its stage 0 (raises PolicyDecisionError)."""
        rid = _as_int(action.request_id)
        if rid is None or not 0 <= rid < self._n_total:
            raise self._error(action, f"request_id must be an int in 0..{self._n_total - 1}")
        stop = _as_int(action.stop_dirty_blocks)
        stages = _as_int(action.max_precopy_stages)
        if stop is None or stop < 0 or stages is None or stages < 1:
            raise self._error(
                action, "stop_dirty_blocks must be an int >= 0 and max_precopy_stages >= 1"
            )
        if rid in self._migs:
            raise self._error(action, f"request {rid} is already migrating")
        core = self._core
        t = core.table
        src = t.decode_target[rid]
        if src < 0 or rid not in core.decode[src].running:
            raise self._error(
                action,
                f"request {rid} is not running in a decode batch (not yet admitted, "
                "finished, or preempted)",
            )
        dst = self._check_destination(action, rid, src, now)
        side = core.decode[dst]
        context = t.kv_offset[rid] + core.decode[src].counter_at(now)
        mig = MigrationState(rid, src, dst, now, stop, stages)
        mig.held = side.blocks_for(rid, context, t)
        core.kv[dst].reserve(mig.held)
        side.reserve_slot()
        self._tighten(dst)
        self._migs[rid] = mig
        core.log(now, "migration_start", src, rid, f"dst={core.names[dst]} blocks={mig.held}")
        # the context's blocks: a reserving destination holds more than is written (module doc)
        self._copy(mig, self._kv_blocks(context), context, now)

    def _check_destination(self, action: Migrate, rid: int, src: int, now: float) -> int:
        core = self._core
        roles = core.roles
        dst = as_index(action.dst_worker, len(roles))
        if dst is None:
            raise self._error(action, f"dst_worker must be a worker index in 0..{len(roles) - 1}")
        if dst == src:
            raise self._error(action, f"request {rid} already runs on worker {dst}")
        side = core.decode[dst]
        if roles[dst] not in _DECODE_ROLES or not side.accepting:
            raise self._error(
                action,
                f"worker {dst} ({core.names[dst]}, role {roles[dst]}) does not "
                "take decode work now",
            )
        t = core.table
        peak = self._kv_blocks(t.input_tokens[rid] + t.output_tokens[rid] - 1)
        context = t.kv_offset[rid] + core.decode[src].counter_at(now)
        need = side.blocks_for(rid, context, t)
        free = side.free_blocks(now)
        capacity = core.kv[dst].decode_capacity()
        if peak > capacity or need > free:
            raise self._error(
                action,
                f"worker {dst} has room for {free} of the {need} blocks request {rid} "
                f"holds now (capacity {capacity}, request peak {peak})",
            )
        if side.b >= side.run_limit:
            raise self._error(action, f"worker {dst}'s running batch is full")
        return dst

    # -- copies ----------------------------------------------------------------------------------
    def _copy(self, mig: MigrationState, blocks: int, context: int, now: float) -> None:
        """Queue one copy of ``blocks`` on the link src → dst; the snapshot is ``context``
        tokens."""
        n_bytes = blocks * self._bt * self._kv_bytes_per_token
        _, end = self._links.send(mig.src, mig.dst, n_bytes, now)
        mig.stages += 1
        mig.bytes += n_bytes
        mig.copied_tokens = context
        mig.seq = self._core.kernel.schedule(end, Event.MIGRATION, mig.rid)

    def _tighten(self, j: int) -> None:
        """Worker ``j``'s KV limit shrank: visit the boundary where growth now fails, if
        earlier than the one scheduled."""
        side = self._core.decode[j]
        n = side.first_growth_failure()
        if n >= 0 and (side.next_n < 0 or n < side.next_n):
            side.next_n = n
            side.event_seq = self._core.kernel.schedule(side.time_at(n), Event.DECODE, j)

    def _hold(self, mig: MigrationState, context: int, now: float) -> bool:
        """Grow dst's reservation to ``context`` tokens; cancel and return False without room."""
        side = self._core.decode[mig.dst]
        need = side.blocks_for(mig.rid, context, self._core.table)
        extra = need - mig.held
        if extra <= 0:
            return True
        free = side.free_blocks(now)
        if extra > free:
            self._cancel(mig, now, f"destination has {free} free blocks, needs {extra} more")
            return False
        self._core.kv[mig.dst].reserve(extra)
        mig.held = need
        self._tighten(mig.dst)
        return True

    # -- events ----------------------------------------------------------------------------------
    def on_copy_done(self, now: float, seq: int, rid: int) -> None:
        """A copy ended (the kernel's ``Event.MIGRATION`` handler)."""
        mig = self._migs.get(rid)
        if mig is None or seq != mig.seq:
            return  # cancelled since
        if mig.phase == MigrationPhase.PRECOPY:
            self._precopy_done(mig, now)
        else:
            self._takeover(mig, now)

    def _precopy_done(self, mig: MigrationState, now: float) -> None:
        core = self._core
        dst = core.decode[mig.dst]
        if core.roles[mig.dst] not in _DECODE_ROLES or not dst.accepting:
            self._cancel(mig, now, "destination left the decode pool")
            return
        src = core.decode[mig.src]
        offset = core.table.kv_offset[mig.rid]
        context = offset + src.counter_at(now)
        dirty = dirty_blocks(mig.copied_tokens, context, self._bt, self._win)
        if dirty > mig.stop_dirty_blocks and mig.stages < mig.max_stages:
            if self._hold(mig, context, now):
                self._copy(mig, dirty, context, now)
            return
        # stop-and-copy: leave src at its next iteration boundary
        n = src.first_boundary_after(now)
        if not self._hold(mig, offset + n, now):
            return
        mig.phase = MigrationPhase.DEPARTING
        src.departing[mig.rid] = n
        if n < src.next_n:
            src.next_n = n
            src.event_seq = core.kernel.schedule(src.time_at(n), Event.DECODE, mig.src)

    def after_boundary(self, j: int, now: float, finished: list[int], preempted: list[int]) -> None:
        """After decode worker ``j`` processed a boundary: cancel migrations of requests that
        ended or were preempted there, start stop-and-copies, complete joins."""
        migs = self._migs
        if not migs:
            return  # nothing departs or joins without a migration in progress
        for rid in finished:
            if rid in migs:
                self._cancel(migs[rid], now, "request finished")
        for rid in preempted:
            if rid in migs:
                self._cancel(migs[rid], now, "request preempted")
        side = self._core.decode[j]
        if side.departed:
            for rid in side.departed:
                self._stop_copy(migs[rid], now)
            side.departed.clear()
        if side.joined:
            for rid in side.joined:
                self._joined(migs.pop(rid), now)
            side.joined.clear()

    def _stop_copy(self, mig: MigrationState, now: float) -> None:
        t = self._core.table
        context = t.input_tokens[mig.rid] + t.generated[mig.rid]
        mig.phase = MigrationPhase.STOPCOPY
        mig.stop_s = now
        mig.src_held = self._core.decode[mig.src].blocks_for(mig.rid, context, t)
        dirty = dirty_blocks(mig.copied_tokens, context, self._bt, self._win)
        self._copy(mig, dirty, context, now)

    def _takeover(self, mig: MigrationState, now: float) -> None:
        core = self._core
        src = core.decode[mig.src]
        core.kv[mig.src].release(mig.src_held)
        if src.queue:
            core.wake_decode(mig.src, now)  # the freed blocks may admit the head
        # src left the decode pool during the stop-and-copy: its prefill head may have waited
        # for these blocks (pdopt.sim._engine.Engine.start_prefill), and nothing else starts it
        self._release_prefill(mig.src, now)
        dst = core.decode[mig.dst]
        if core.roles[mig.dst] in _DECODE_ROLES and dst.accepting:
            mig.phase = MigrationPhase.JOINING
            dst.incoming.append((mig.rid, mig.held))
            core.wake_decode(mig.dst, now)  # joins at dst's next boundary (at once when idle)
            return
        # dst left the decode pool during the stop-and-copy: route the KV on from there
        del self._migs[mig.rid]
        core.kv[mig.dst].release(mig.held)
        dst.release_slot()
        t = core.table
        t.prefill_tokens[mig.rid] = t.input_tokens[mig.rid] + t.generated[mig.rid]
        self._record(mig, now, "rerouted")
        core.route_decode(mig.rid, mig.dst, now)
        self._release_prefill(mig.dst, now)

    def _joined(self, mig: MigrationState, now: float) -> None:
        self._core.table.decode_target[mig.rid] = mig.dst
        self._record(mig, now, "")

    def _record(self, mig: MigrationState, now: float, note: str) -> None:
        t = self._core.table
        rid = mig.rid
        downtime = now - mig.stop_s
        t.migrations[rid] += 1
        t.migration_downtime_s[rid] += downtime
        t.migrated_bytes[rid] += mig.bytes
        detail = (
            f"src={self._core.names[mig.src]} bytes={mig.bytes:.0f} stages={mig.stages} "
            f"downtime_s={downtime:.9g}"
        )
        self._core.log(now, "migration_end", mig.dst, rid, detail + (f" {note}" if note else ""))

    def abort(self, rid: int, now: float) -> bool:
        """``rid``'s client gave up: end its migration, if any (module docstring). Returns
        True when ``rid`` no longer runs on its source (its KV was only held, now freed)."""
        mig = self._migs.get(rid)
        if mig is None:
            return False
        if mig.phase in (MigrationPhase.PRECOPY, MigrationPhase.DEPARTING):
            self._cancel(mig, now, "client timeout")
            return False
        core = self._core
        del self._migs[rid]
        if mig.phase == MigrationPhase.STOPCOPY:
            core.kv[mig.src].release(mig.src_held)
            if core.decode[mig.src].queue:
                core.wake_decode(mig.src, now)  # the freed blocks may admit the head
            self._release_prefill(mig.src, now)
        dst = core.decode[mig.dst]
        dst.incoming = [(r, held) for r, held in dst.incoming if r != rid]
        core.kv[mig.dst].release(mig.held)
        dst.release_slot()
        core.log(now, "migration_cancel", mig.src, rid, "client timeout")
        if dst.queue and dst.accepting:
            core.wake_decode(mig.dst, now)
        self._release_prefill(mig.dst, now)
        return True

    def _cancel(self, mig: MigrationState, now: float, reason: str) -> None:
        """Abort a migration whose request still runs on src (or just ended there)."""
        core = self._core
        del self._migs[mig.rid]
        dst = core.decode[mig.dst]
        core.kv[mig.dst].release(mig.held)
        dst.release_slot()
        core.decode[mig.src].departing.pop(mig.rid, None)
        core.log(now, "migration_cancel", mig.src, mig.rid, reason)
        if dst.queue and dst.accepting:
            core.wake_decode(mig.dst, now)
        self._release_prefill(mig.dst, now)

    def _release_prefill(self, w: int, now: float) -> None:
        """Start ``w``'s prefill head if it was waiting for the KV a migration held there."""
        core = self._core
        side = core.prefill[w]
        if core.roles[w] is Role.PREFILL and side.queue and not side.batch and not core.decode[w].b:
            core.start_prefill(w, now)
