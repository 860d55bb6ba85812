"""The control tick, compiled: false-OOM checks and one time-series row per worker
(:mod:`pdopt.sim._control`'s ``on_tick``; when the policy does not act on ticks, the loop samples
the ticks before the next event at once when no false OOM can be logged there; a policy's tick
rule is :mod:`pdopt.sim._compiled._pools`').

A false OOM is a request that waits for KV while the decode workers' free blocks together would
hold it (DESIGN.md "Fragmentation"); it is logged once per request, when its worker's boundary
finds it blocked or a tick finds it at a queue head that does not fit.
"""

from __future__ import annotations

import math

import numpy as np

from pdopt.sim._compiled._decode import admission_blocks, decode_limit, kv_free, used_blocks_at
from pdopt.sim._compiled._heap import put_log
from pdopt.sim._compiled._jit import blocks_of, kernel
from pdopt.sim._compiled._prefill import clip01, outstanding_flop
from pdopt.sim._compiled._state import (
    F_DECODE_START,
    F_READY,
    G_ADMITTED,
    G_N_DECODE,
    LOG_FALSE_OOM,
    R_DECODE_TARGET,
    R_INPUT,
    R_OOM_FLAGGED,
    R_OUTPUT,
    R_PREFILL_TOKENS,
    RECENT_PEAKS,
    ROLE_MIXED,
    T_KV_FREE,
    T_KV_STRANDED,
    T_KV_USED,
    T_QUEUE_LEN,
    T_RUNNING,
    T_WORKER,
    TICK_NONE,
    U_BUSY_FRAC,
    U_POWER,
    U_QUEUED_FLOP,
    U_T,
    V_BATCH_START,
    V_BUSY_SINCE,
    V_DECODE_BUSY,
    V_IDLE_W,
    V_LAST_BUSY,
    V_MAX_W,
    V_PREFILL_BUSY,
    V_STALL_SINCE,
    W_ACCEPTING,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_COUNTED,
    W_DQ_HEAD,
    W_DQ_LEN,
    W_HELD,
    W_INFLIGHT,
    W_IS_DECODE,
    W_MIXED,
    W_POOL,
    W_PQ_LEN,
    W_PROMPTS,
)

ROLES = 3
"""A time-series row's worker column packs ``worker + workers · (role + ROLES · pool)``."""


@kernel
def tick_checks(s, now):
    """Check each decode worker's waiting head that does not fit for a false OOM; True when
    every waiting head is logged already (a later tick could log none: Control.on_tick)."""
    wi = s.wi
    settled = True
    for i in range(s.g[G_N_DECODE]):
        j = s.decode_idx[i]
        if wi[j, W_DQ_LEN] > 0 and wi[j, W_ACCEPTING]:
            head = wi[j, W_DQ_HEAD]
            need = admission_blocks(s, j, head)
            if need > decode_limit(s, j) - used_blocks_at(s, j, now):
                log_false_oom(s, head, now)
            settled = settled and s.ri[head, R_OOM_FLAGGED] == 1
    return settled


@kernel
def log_false_oom(s, rid, now):
    """Log ``rid``'s false OOM unless it was logged before (Control.check_false_oom)."""
    need, free = _false_oom(s, rid, now)
    if need >= 0:
        put_log(s, now, LOG_FALSE_OOM, s.ri[rid, R_DECODE_TARGET], rid, need, free)


FALSE_OOM_PACK = 1 << 32
"""``need + most_free · FALSE_OOM_PACK`` in a false OOM's log entry (see _false_oom)."""


@kernel
def _false_oom(s, rid, now):
    """(blocks ``rid`` needs packed with the most free blocks on one decode worker, free decode
    blocks) when this is its first false OOM (flagged now), else (-1, 0)."""
    ri = s.ri
    if ri[rid, R_OOM_FLAGGED]:
        return -1, 0
    need = admission_blocks(s, ri[rid, R_DECODE_TARGET], rid)
    free = 0
    most = 0
    for i in range(s.g[G_N_DECODE]):
        f = kv_free(s, s.decode_idx[i], now)
        free += f
        most = f if f > most else most
    if free >= need:
        ri[rid, R_OOM_FLAGGED] = 1
        # NOTE: the log entry has two int fields; the largest free space on one worker rides
        # in the high bits of ``need`` (blocks < 2**32), unpacked by _io._false_ooms
        return need + most * FALSE_OOM_PACK, free
    return -1, 0


@kernel
def sample(s, ts_i, ts_f, row, now):
    """Write one time-series row per worker from ``row`` on (Control.sample)."""
    ri, wi, wf = s.ri, s.wi, s.wf
    need = reference_need(s)
    n_w = wi.shape[0]
    for w in range(n_w):
        used = used_blocks_at(s, w, now) + wi[w, W_HELD]  # migrations' holds are in use too
        cap = wi[w, W_CAP]
        if wi[w, W_MIXED]:  # one cache: the prompts in prefill count, against the decodes'
            if wi[w, W_BATCH_N]:  # share too (DecodeSide.cap), as the Python engine samples
                used += wi[w, W_PROMPTS]
            cap -= wi[w, W_PROMPTS]
        else:
            for i in range(wi[w, W_BATCH_N]):
                used += blocks_of(s, ri[s.batches[w, i], R_PREFILL_TOKENS])
        free = cap - used if used < cap else 0
        busy = wf[w, V_PREFILL_BUSY]
        if wi[w, W_INFLIGHT] and wi[w, W_COUNTED]:
            busy += now - wf[w, V_BATCH_START]
        if wf[w, V_STALL_SINCE] >= 0.0:  # stalled decodes: the decode side counts them
            busy -= now - wf[w, V_STALL_SINCE]
        busy = busy + (wf[w, V_DECODE_BUSY] + (now - wf[w, V_BUSY_SINCE] if wi[w, W_B] else 0.0))
        frac = clip01((busy - wf[w, V_LAST_BUSY]) / s.tick_s)
        wf[w, V_LAST_BUSY] = busy
        decode = wi[w, W_IS_DECODE] == 1
        r = row + w
        # the worker and its layout (role and pool, which pool moves change), unpacked by _io
        if s.t_code != TICK_NONE:  # a policy that may move workers
            role = ROLE_MIXED if wi[w, W_MIXED] else wi[w, W_IS_DECODE]
            ts_i[T_WORKER, r] = w + n_w * (role + ROLES * wi[w, W_POOL])
        else:
            ts_i[T_WORKER, r] = w
        ts_i[T_QUEUE_LEN, r] = wi[w, W_DQ_LEN] if decode else wi[w, W_PQ_LEN]
        ts_i[T_RUNNING, r] = wi[w, W_BATCH_N] + wi[w, W_B]
        ts_i[T_KV_USED, r] = used
        ts_i[T_KV_FREE, r] = free
        # the reference need; _io applies pdopt.freeness.stranded_blocks to the column
        ts_i[T_KV_STRANDED, r] = need if decode or wi[w, W_MIXED] else 0
        ts_f[U_T, r] = now
        ts_f[U_QUEUED_FLOP, r] = outstanding_flop(s, w, now)
        ts_f[U_BUSY_FRAC, r] = frac
        ts_f[U_POWER, r] = wf[w, V_IDLE_W] + (wf[w, V_MAX_W] - wf[w, V_IDLE_W]) * frac


@kernel
def record_admitted(s, ids, count, now):
    """Engine.process_boundary's admitted requests ``ids[:count]``: each one's decode start (its
    first admission's) and its peak blocks in the ring of recent peaks."""
    ri, rf = s.ri, s.rf
    for i in range(count):
        rid = ids[i]
        if rf[rid, F_DECODE_START] != rf[rid, F_DECODE_START]:
            rf[rid, F_DECODE_START] = now
        remember_peak(s, blocks_of(s, ri[rid, R_INPUT] + ri[rid, R_OUTPUT] - 1))


@kernel
def remember_peak(s, blocks):
    """Put an admitted request's peak blocks in the ring (evicting the oldest once full) and
    keep the ring's values sorted in ``peaks[1]``, so a p90 is a lookup (Engine.recent_peaks)."""
    peaks, g = s.peaks, s.g
    m = min(g[G_ADMITTED], RECENT_PEAKS)
    ranked = peaks[1]
    slot = g[G_ADMITTED] % RECENT_PEAKS
    if m == RECENT_PEAKS:  # drop the evicted value: shift the larger ones left
        for k in range(np.searchsorted(ranked, peaks[0, slot]), m - 1):
            ranked[k] = ranked[k + 1]
        m -= 1
    k = m
    while k > 0 and ranked[k - 1] > blocks:  # insertion: shift the larger ones right
        ranked[k] = ranked[k - 1]
        k -= 1
    ranked[k] = blocks
    peaks[0, slot] = blocks
    g[G_ADMITTED] += 1


@kernel
def reference_need(s):
    """ClusterView.reference_need_blocks: the earliest-ready waiting head's admission need on
    its worker, else the p90 (nearest rank) of the last RECENT_PEAKS admitted peak footprints,
    else 0."""
    rf, wi = s.rf, s.wi
    best, at = -1, -1
    for j in range(wi.shape[0]):
        if wi[j, W_DQ_LEN] > 0:
            head = wi[j, W_DQ_HEAD]
            if (
                best < 0
                or rf[head, F_READY] < rf[best, F_READY]
                or (rf[head, F_READY] == rf[best, F_READY] and head < best)
            ):
                best, at = head, j
    if best >= 0:
        return admission_blocks(s, at, best)
    m = min(s.g[G_ADMITTED], RECENT_PEAKS)
    return s.peaks[1, math.ceil(0.9 * m) - 1] if m else 0
