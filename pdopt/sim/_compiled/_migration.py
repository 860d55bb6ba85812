"""KV migration of a running decode request, compiled: :mod:`pdopt.sim._migration`'s
``Migrations`` over the request rows (columns ``R_MIG_*``; the module docstring there gives the
semantics: a pipelined pre-copy, a stop-and-copy at an iteration boundary of the source, the
takeover at one of the destination).

This module holds the parts that touch no other worker's schedule: the list of migrations in
progress (``State.migs``), a migration's start (:func:`start`, validated as
``Migrations.start`` validates: an invalid action stops the run with ``ERR_POLICY`` and the
Python engine reruns it, raising the full error), its copies on the link, and its record. The
event handlers that may wake a worker (a copy's end, a cancel, the boundary's bookkeeping)
are :mod:`pdopt.sim._compiled._loop`'s; a source's departure and a destination's join happen in
its boundary (:func:`pdopt.sim._compiled._decode.boundary`).

A cancelled migration's pending copy is removed from the event heap (the Python engine skips it
when due), so the heap holds at most one copy per request.
"""

from __future__ import annotations

from pdopt.sim._compiled._decode import (
    blocks_for,
    counter_at,
    decode_limit,
    tighten,
    used_blocks_at,
)
from pdopt.sim._compiled._heap import float_bits, put_log, schedule
from pdopt.sim._compiled._jit import blocks_of, full_blocks_of, kernel
from pdopt.sim._compiled._state import (
    ERR_POLICY,
    F_MIG_BYTES,
    F_MIG_DOWNTIME,
    F_MIG_STOP,
    F_MIGRATED_BYTES,
    G_ERROR,
    G_N_MIGS,
    G_STOPPED,
    LOG_MIG_DOWNTIME,
    LOG_MIG_END,
    LOG_MIG_START,
    R_ADMIT_SEQ,
    R_DECODE_TARGET,
    R_INPUT,
    R_KV_OFFSET,
    R_MIG_COPIED,
    R_MIG_DEPART_AT,
    R_MIG_DST,
    R_MIG_EVPOS,
    R_MIG_HELD,
    R_MIG_MAX_STAGES,
    R_MIG_PHASE,
    R_MIG_SRC,
    R_MIG_SRC_HELD,
    R_MIG_STAGES,
    R_MIG_STOP_DIRTY,
    R_MIGRATIONS,
    R_OUTPUT,
    W_ACCEPTING,
    W_B,
    W_CAP,
    W_HELD,
    W_IS_DECODE,
    W_MAX_RUNNING,
    W_MIXED,
    W_PROMPTS,
    W_SLOTS_HELD,
)
from pdopt.sim._enums import Event, MigrationPhase

END_PACK = 1 << 20
"""A ``migration_end`` log entry's ``a`` packs ``src + END_PACK · (stages + END_PACK ·
rerouted)`` (see :func:`record`); unpacked by _io."""


# =============================================================================================
# The migrations in progress
# =============================================================================================
@kernel
def _add(s, rid):
    g = s.g
    s.migs[g[G_N_MIGS]] = rid
    g[G_N_MIGS] += 1


@kernel
def drop(s, rid):
    """``rid``'s migration ends (done or cancelled): off the list, its phase cleared."""
    g = s.g
    n = g[G_N_MIGS]
    for i in range(n):
        if s.migs[i] == rid:
            s.migs[i] = s.migs[n - 1]
            g[G_N_MIGS] = n - 1
            break
    s.ri[rid, R_MIG_PHASE] = -1
    s.ri[rid, R_MIG_DEPART_AT] = -1


@kernel
def dirty_blocks(s, copied_tokens, context_tokens):
    """pdopt.sim._migration.dirty_blocks: blocks written since a snapshot of
    ``copied_tokens``, ``kv_blocks(c) − kv_full_blocks(c')`` (0 when nothing was written)."""
    if context_tokens <= copied_tokens:
        return 0
    return blocks_of(s, context_tokens) - full_blocks_of(s, copied_tokens)


@kernel
def copy(s, rid, blocks, context, now):
    """Migrations._copy: queue a copy of ``blocks`` blocks on the link src → dst (FIFO with
    the prefill → decode transfers, pdopt.sim._links); the snapshot is ``context`` tokens."""
    ri = s.ri
    src, dst = ri[rid, R_MIG_SRC], ri[rid, R_MIG_DST]
    n_bytes = blocks * s.bt * s.kv_bytes
    free = s.link_free[src, dst]
    start = now if now > free else free
    wire = n_bytes / s.link_bw[src, dst]
    s.link_free[src, dst] = start + wire
    ri[rid, R_MIG_STAGES] += 1
    s.rf[rid, F_MIG_BYTES] += n_bytes
    ri[rid, R_MIG_COPIED] = context
    schedule(s, start + s.link_lat[src, dst] + wire, Event.MIGRATION, rid)


@kernel
def decode_free(s, j, now):
    """DecodeSide.free_blocks: blocks worker ``j``'s running batch may still take at ``now``."""
    return decode_limit(s, j) - used_blocks_at(s, j, now)


@kernel
def takes_decode(s, j):
    """Worker ``j``'s role is decode (or mixed) and its decode side admits (the condition a
    migration's destination must meet)."""
    wi = s.wi
    return (wi[j, W_IS_DECODE] == 1 or wi[j, W_MIXED] == 1) and wi[j, W_ACCEPTING] == 1


# =============================================================================================
# Start
# =============================================================================================
@kernel
def _refuse(s):
    s.g[G_ERROR] = ERR_POLICY
    s.g[G_STOPPED] = 1
    return False


@kernel
def start(s, rid, dst, stop_dirty_blocks, max_precopy_stages, now):
    """Migrations.start of ``Migrate(rid, dst, stop_dirty_blocks, max_precopy_stages)``: its
    checks (False and ``ERR_POLICY`` when one fails), the destination's hold and slot, and stage
    0's copy."""
    ri, wi = s.ri, s.wi
    if rid < 0 or rid >= ri.shape[0] or stop_dirty_blocks < 0 or max_precopy_stages < 1:
        return _refuse(s)
    if ri[rid, R_MIG_PHASE] >= 0:
        return _refuse(s)  # already migrating
    src = ri[rid, R_DECODE_TARGET]
    if src < 0 or ri[rid, R_ADMIT_SEQ] < 0:
        return _refuse(s)  # not running in a decode batch
    if dst < 0 or dst >= wi.shape[0] or dst == src or not takes_decode(s, dst):
        return _refuse(s)
    peak = blocks_of(s, ri[rid, R_INPUT] + ri[rid, R_OUTPUT] - 1)
    context = ri[rid, R_KV_OFFSET] + counter_at(s, src, now)
    need = blocks_for(s, dst, rid, context)  # what it holds there (a reservation, once)
    capacity = wi[dst, W_CAP] - wi[dst, W_PROMPTS] if wi[dst, W_MIXED] else wi[dst, W_CAP]
    if peak > capacity or need > decode_free(s, dst, now):
        return _refuse(s)
    if wi[dst, W_B] >= wi[dst, W_MAX_RUNNING] - wi[dst, W_SLOTS_HELD]:
        return _refuse(s)  # its running batch is full
    ri[rid, R_MIG_PHASE] = MigrationPhase.PRECOPY
    ri[rid, R_MIG_SRC] = src
    ri[rid, R_MIG_DST] = dst
    ri[rid, R_MIG_STAGES] = 0
    ri[rid, R_MIG_COPIED] = 0
    ri[rid, R_MIG_HELD] = need
    ri[rid, R_MIG_SRC_HELD] = 0
    ri[rid, R_MIG_DEPART_AT] = -1
    ri[rid, R_MIG_EVPOS] = -1
    ri[rid, R_MIG_STOP_DIRTY] = stop_dirty_blocks
    ri[rid, R_MIG_MAX_STAGES] = max_precopy_stages
    s.rf[rid, F_MIG_BYTES] = 0.0
    s.rf[rid, F_MIG_STOP] = float("nan")  # set by the stop-and-copy
    wi[dst, W_HELD] += need
    wi[dst, W_SLOTS_HELD] += 1
    tighten(s, dst)
    _add(s, rid)
    put_log(s, now, LOG_MIG_START, src, rid, dst, need)
    copy(s, rid, blocks_of(s, context), context, now)  # the context's, whatever dst holds
    return True


# =============================================================================================
# The record of a completed migration
# =============================================================================================
@kernel
def record(s, rid, now, rerouted):
    """Migrations._record: the request's migration count, downtime and bytes, and the
    ``migration_end`` log entry: ``(now, LOG_MIG_END, dst, rid, src + END_PACK · (stages +
    END_PACK · rerouted), bytes as float64 bits)`` followed by ``(downtime_s, LOG_MIG_DOWNTIME,
    -1, rid, 0, 0)`` (_io joins them)."""
    ri, rf = s.ri, s.rf
    downtime = now - rf[rid, F_MIG_STOP]
    n_bytes = rf[rid, F_MIG_BYTES]
    ri[rid, R_MIGRATIONS] += 1
    rf[rid, F_MIG_DOWNTIME] += downtime
    rf[rid, F_MIGRATED_BYTES] += n_bytes
    packed = ri[rid, R_MIG_SRC] + END_PACK * (ri[rid, R_MIG_STAGES] + END_PACK * rerouted)
    bits = float_bits(n_bytes)
    put_log(s, now, LOG_MIG_END, ri[rid, R_MIG_DST], rid, packed, bits)
    put_log(s, downtime, LOG_MIG_DOWNTIME, -1, rid, 0, 0)
