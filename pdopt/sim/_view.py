"""The read-only view a policy sees: per-worker numpy arrays computed at the current time.

Every property is computed when read (so it is always current) and returned as a read-only
array; a view is valid only during the policy call it was passed to. During one policy call
(between :meth:`ClusterView.open_call` and :meth:`ClusterView.close_call`, which the engine
brackets every ``route_prefill``, ``route_decode`` and ``on_tick`` with) the simulation does not
move, so the per-worker arrays are computed once per call and shared: a policy that reads
``kv_free_blocks[w]`` for each of its workers costs one pass over the workers, not one per
worker. Outside a call (the engine's own checks) every read is computed afresh.

The view asks the engine's core and components through their public methods and attributes
(queues, batch sizes, KV accounting), never their internals; stranded blocks follow
:func:`pdopt.freeness.stranded_blocks`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pdopt.cluster._spec import Role
from pdopt.freeness import stranded_blocks

if TYPE_CHECKING:
    from pdopt.sim._engine import Engine

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def _frozen(values: list[int] | list[float], dtype: type) -> npt.NDArray[np.generic]:
    out: npt.NDArray[np.generic] = np.array(values, dtype=dtype)
    out.setflags(write=False)
    return out


class ClusterView:
    """What a policy may read. Worker ``w`` is index ``w`` of every array.

    Attributes (all arrays have one entry per worker)
    -------------------------------------------------
    now_s : current simulated time, seconds.
    names, roles, pools : tuples of the workers' names, current roles and pools.
    prefill_workers, decode_workers : indices of workers whose role is prefill/mixed, decode/mixed.
        While ``route_prefill`` routes a prompt that some of them cannot hold (its KV blocks over
        a worker's capacity; the prompt plus the tokens generated before a preemption),
        ``prefill_workers`` lists only those that can (all of them when none can: the engine
        then refuses the choice, naming it).
    prefill_queue_len : requests waiting in the prefill queue (not the running batch).
    decode_queue_len : requests waiting for decode admission (KV space).
    queue_len : prefill_queue_len for prefill workers, decode_queue_len for decode workers.
    queued_prefill_flop : prefill work queued plus the running batch's work not yet done (FLOP,
        the Φ_T numerator, DESIGN.md "Virtual Freeness").
    running : requests in the running prefill batch plus running decode requests.
    kv_capacity_blocks, kv_used_blocks, kv_free_blocks : paged KV in blocks.
    kv_stranded_blocks : free blocks stranded (DESIGN.md "Fragmentation"): all of a decode
        worker's free blocks when the next waiting request (or, with none waiting, the p90 peak
        footprint of the last 256 admitted requests, nearest-rank) does not fit there, else 0.
    min_kv_capacity_blocks : the smallest worker KV capacity (an int; capacities never change).
    head_kv_need_blocks : blocks the head of the worker's decode admission queue needs (0: none).
    kv_reserved_blocks : blocks held for migrations (counted in kv_used_blocks, never free):
        reserved on a destination for KV being copied in, or held on a source during a
        stop-and-copy (:mod:`pdopt.sim._migration`).
    running_slots_free : decode requests the worker may still add to its running batch
        (``max_running`` less running requests and incoming migrations).
    migrating_requests : ids of requests with a migration in progress (sorted); ``migrations()``
        gives their source, destination, phase and reserved blocks.
    accepting_decode : bool per worker, whether it admits decode work (and migrations) now.
    prefix_cached_tokens(request_id) : per worker, the request's prompt tokens its prefix cache
        holds now (0 without prefix caching).
    prefill_waiting(w), waiting_requests(w) : ids waiting in ``w``'s prefill queue and decode
        admission queue, head first.
    running_contexts(w) : ids and context tokens of ``w``'s running decodes, the cheap part of
        ``running_requests(w)``.

    A defragmenting policy reads, per decode worker ``w``: ``running_requests(w)`` (ids, context,
    KV blocks, remaining tokens, whether migrating), ``head_kv_need_blocks``,
    ``kv_free_blocks`` and ``kv_stranded_blocks``. A :class:`pdopt.sim.Migrate` is valid when the
    request is running and not migrating, and the destination is another decode worker with
    ``kv_free_blocks >= kv_blocks`` of the request, ``running_slots_free >= 1`` and
    ``accepting_decode``; actions of one
    tick apply in order, so a policy sending several to one worker must count them itself.
    """

    def __init__(self, engine: Engine) -> None:
        self._e = engine
        self._prefill_idx: IntArray | None = None
        self._decode_idx: IntArray | None = None
        self._capacity: IntArray = _frozen([kv.capacity for kv in engine.kv], np.int64)  # type: ignore[assignment]
        self.min_kv_capacity_blocks = int(self._capacity.min())
        self._p90 = (-1, 0)
        self._memo: dict[str, Any] | None = None
        self._prompt_blocks = 0  # the KV blocks of the prompt being routed (0: none)

    def open_call(self, prompt_blocks: int = 0) -> None:
        """Start a policy call: per-worker arrays are computed once until :meth:`close_call`;
        ``prompt_blocks``: the KV blocks of the prompt ``route_prefill`` routes (see
        ``prefill_workers``)."""
        self._memo = {}
        self._prompt_blocks = prompt_blocks

    def close_call(self) -> None:
        """End a policy call: the next read computes afresh."""
        self._memo = None
        self._prompt_blocks = 0

    def _once(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, memoised for the current policy call (computed afresh outside one)."""
        memo = self._memo
        if memo is None:
            return compute()
        out = memo.get(name)
        if out is None:
            out = memo[name] = compute()
        return out

    def invalidate(self) -> None:
        """Forget cached role indices and arrays (after a pool move)."""
        self._prefill_idx = None
        self._decode_idx = None
        if self._memo is not None:
            self._memo = {}

    @property
    def now_s(self) -> float:
        return self._e.kernel.now

    @property
    def n_workers(self) -> int:
        return len(self._e.names)

    @property
    def names(self) -> tuple[str, ...]:
        return self._e.names

    @property
    def roles(self) -> tuple[Role, ...]:
        return tuple(self._e.roles)

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(self._e.pools)

    @property
    def block_tokens(self) -> int:
        return self._e.bt

    @property
    def prefill_workers(self) -> IntArray:
        if self._prefill_idx is None:
            idx = [w for w, r in enumerate(self._e.roles) if r is not Role.DECODE]
            self._prefill_idx = _frozen(idx, np.int64)  # type: ignore[assignment]
        if self._prompt_blocks <= self.min_kv_capacity_blocks:
            return self._prefill_idx  # type: ignore[return-value]
        return self._once("prefill_workers", self._holding_prompt)  # type: ignore[no-any-return]

    def _holding_prompt(self) -> IntArray:
        """The prefill workers whose KV capacity holds the prompt being routed (all of them
        when none does)."""
        idx = self._prefill_idx
        assert idx is not None
        held = idx[self._capacity[idx] >= self._prompt_blocks]
        if not len(held):
            return idx
        held.setflags(write=False)  # read-only, as every array of the view
        return held

    @property
    def decode_workers(self) -> IntArray:
        if self._decode_idx is None:
            idx = [w for w, r in enumerate(self._e.roles) if r is not Role.PREFILL]
            self._decode_idx = _frozen(idx, np.int64)  # type: ignore[assignment]
        return self._decode_idx  # type: ignore[return-value]

    @property
    def prefill_queue_len(self) -> IntArray:
        return self._once(  # type: ignore[no-any-return]
            "prefill_queue_len", lambda: _frozen([len(p.queue) for p in self._e.prefill], np.int64)
        )

    @property
    def decode_queue_len(self) -> IntArray:
        return self._once(  # type: ignore[no-any-return]
            "decode_queue_len", lambda: _frozen([len(d.queue) for d in self._e.decode], np.int64)
        )

    @property
    def queue_len(self) -> IntArray:
        e = self._e
        values = [
            len(d.queue) if r is Role.DECODE else len(p.queue)
            for p, d, r in zip(e.prefill, e.decode, e.roles, strict=True)
        ]
        return _frozen(values, np.int64)  # type: ignore[return-value]

    @property
    def queued_prefill_flop(self) -> FloatArray:
        return self._once("queued_prefill_flop", self._queued_prefill_flop)  # type: ignore[no-any-return]

    def _queued_prefill_flop(self) -> npt.NDArray[np.generic]:
        now = self.now_s
        return _frozen([p.outstanding_flop(now) for p in self._e.prefill], np.float64)

    @property
    def running(self) -> IntArray:
        return self._once("running", self._running)  # type: ignore[no-any-return]

    def _running(self) -> npt.NDArray[np.generic]:
        e = self._e
        return _frozen(
            [len(p.batch) + d.b for p, d in zip(e.prefill, e.decode, strict=True)], np.int64
        )

    @property
    def kv_capacity_blocks(self) -> IntArray:
        return self._capacity

    @property
    def kv_used_blocks(self) -> IntArray:
        return self._once("kv_used_blocks", self._kv_used_blocks)  # type: ignore[no-any-return]

    def _kv_used_blocks(self) -> npt.NDArray[np.generic]:
        e = self._e
        now = self.now_s
        return _frozen([e.kv_used_blocks(w, now) for w in range(len(e.names))], np.int64)

    @property
    def kv_free_blocks(self) -> IntArray:
        return self._once("kv_free_blocks", self._kv_free_blocks)  # type: ignore[no-any-return]

    def _kv_free_blocks(self) -> npt.NDArray[np.generic]:
        free: IntArray = np.maximum(self.kv_capacity_blocks - self.kv_used_blocks, 0)
        free.setflags(write=False)
        return free

    @property
    def head_kv_need_blocks(self) -> IntArray:
        return self._once("head_kv_need_blocks", self._head_kv_need_blocks)  # type: ignore[no-any-return]

    def _head_kv_need_blocks(self) -> npt.NDArray[np.generic]:
        e = self._e
        t = e.table
        needs = [d.admission_blocks(d.queue[0], t) if d.queue else 0 for d in e.decode]
        return _frozen(needs, np.int64)

    def reference_need_blocks(self) -> int:
        """Blocks of the next request waiting for decode (earliest ready), else the p90
        (nearest-rank) peak footprint of the last 256 admitted requests, else 0 (DESIGN.md
        "Fragmentation")."""
        e = self._e
        heads = [(d.queue[0], d) for d in e.decode if d.queue]
        if heads:
            t = e.table
            ready = t.ready_s
            rid, side = min(heads, key=lambda h: (ready[h[0]], h[0]))
            return side.admission_blocks(rid, t)
        if not e.recent_peaks:
            return 0
        if self._p90[0] != e.n_admitted:
            # NOTE: cached until the next admission; sorting 256 ints beats np.percentile.
            ranked = sorted(e.recent_peaks)
            self._p90 = (e.n_admitted, ranked[math.ceil(0.9 * len(ranked)) - 1])
        return self._p90[1]

    @property
    def kv_stranded_blocks(self) -> IntArray:
        out: IntArray = np.zeros(self.n_workers, dtype=np.int64)
        idx = self.decode_workers
        out[idx] = stranded_blocks(self.kv_free_blocks[idx], self.reference_need_blocks())
        out.setflags(write=False)
        return out

    @property
    def accepting_decode(self) -> npt.NDArray[np.bool_]:
        """True where the worker admits decode work now: its role is decode or mixed and it is
        not still finishing a prefill batch from before a pool move."""
        e = self._e
        values = [
            r is not Role.PREFILL and d.accepting for r, d in zip(e.roles, e.decode, strict=True)
        ]
        out = np.array(values, dtype=np.bool_)
        out.setflags(write=False)
        return out

    @property
    def kv_reserved_blocks(self) -> IntArray:
        return _frozen([kv.held for kv in self._e.kv], np.int64)  # type: ignore[return-value]

    @property
    def running_slots_free(self) -> IntArray:
        return self._once(  # type: ignore[no-any-return]
            "running_slots_free",
            lambda: _frozen([max(d.run_limit - d.b, 0) for d in self._e.decode], np.int64),
        )

    @property
    def migrating_requests(self) -> IntArray:
        ids = [m.rid for m in self._e.migrations.in_progress()]
        return _frozen(ids, np.int64)  # type: ignore[return-value]

    def migrations(self) -> dict[str, IntArray]:
        """Migrations in progress, by request id: request_id, src, dst (worker indices), phase
        (0 pre-copy, 1 waiting to leave src, 2 stop-and-copy, 3 joining dst), stages (copies
        issued so far), reserved_blocks (held on dst)."""
        migs = self._e.migrations.in_progress()
        cols = {
            "request_id": [m.rid for m in migs],
            "src": [m.src for m in migs],
            "dst": [m.dst for m in migs],
            "phase": [m.phase for m in migs],
            "stages": [m.stages for m in migs],
            "reserved_blocks": [m.held for m in migs],
        }
        return {k: _frozen(v, np.int64) for k, v in cols.items()}  # type: ignore[misc]

    def running_contexts(self, worker: int) -> dict[str, IntArray]:
        """Running decode requests of ``worker``: request_id and context_tokens (the first two
        columns of :meth:`running_requests`, at a fraction of its cost), admission order."""
        return dict(self._once(f"running_contexts:{worker}", lambda: self._contexts(worker)))

    def _contexts(self, worker: int) -> dict[str, IntArray]:
        d = self._e.decode[worker]
        offset = self._e.table.kv_offset
        m = d.counter_at(self.now_s)
        ids = list(d.running)
        return {
            "request_id": _frozen(ids, np.int64),  # type: ignore[dict-item]
            "context_tokens": _frozen([offset[r] + m for r in ids], np.int64),  # type: ignore[dict-item]
        }

    def running_requests(self, worker: int) -> dict[str, IntArray]:
        """Running decode requests of ``worker``: request_id, context_tokens, kv_blocks,
        remaining_tokens (tokens still to emit), migrating (1 while a migration of it is in
        pre-copy, else 0), in admission order (last = youngest)."""
        return dict(self._once(f"running_requests:{worker}", lambda: self._requests(worker)))

    def _requests(self, worker: int) -> dict[str, IntArray]:
        e = self._e
        d = e.decode[worker]
        t = e.table
        out = self.running_contexts(worker)
        ids = out["request_id"].tolist()
        ctx = out["context_tokens"].tolist()
        migrating = e.migrations.migrating
        out["kv_blocks"] = _frozen(d.blocks_for_each(ids, ctx, t), np.int64)  # type: ignore[assignment]
        left = d.remaining_tokens(t, d.counter_at(self.now_s))
        out["remaining_tokens"] = _frozen(left, np.int64)  # type: ignore[assignment]
        out["migrating"] = _frozen([int(migrating(r)) for r in ids], np.int64)  # type: ignore[assignment]
        return out

    def prefill_waiting(self, worker: int) -> IntArray:
        """Ids waiting in ``worker``'s prefill queue (not the batch in service), head first."""
        return _frozen(list(self._e.prefill[worker].queue), np.int64)  # type: ignore[return-value]

    def waiting_requests(self, worker: int) -> IntArray:
        """Ids waiting in ``worker``'s decode admission queue, head first."""
        return _frozen(list(self._e.decode[worker].queue), np.int64)  # type: ignore[return-value]

    def prefix_cached_tokens(self, request_id: int) -> IntArray:
        """Tokens of the request's prompt each worker's prefix cache holds now (its leading
        cached blocks, at most all but one token; all 0 without prefix caching): what a
        cache-aware router weighs against load (:mod:`pdopt.sim._prefix_cache`)."""
        e = self._e
        return _frozen(  # type: ignore[return-value]
            [e.cached_tokens(w, request_id) for w in range(len(e.names))], np.int64
        )
