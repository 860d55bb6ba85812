"""The compiled engine: the request-level engine's semantics, bit for bit, in numba.

The Python engine (:mod:`pdopt.sim._engine`) is the reference and runs everything. This module
re-implements the part of it that long runs spend their time in, for runs that qualify
(``simulate``'s ``engine`` argument): an open- or closed-loop driver on a disaggregated cluster
(every worker prefill or decode, no mixed ones) under a built-in routing policy whose
``compiled_routing()`` names its twin here (round_robin, least_loaded, static_split, distserve,
memory_centric; the policy object's hooks are not called). Such a policy never acts on a tick,
so a run never migrates, moves a worker or changes a phase: what is left is arrivals, FCFS
prefill batches, FIFO KV links, decode admission queues, continuous batching advanced in closed
form, and, with a time series, the control tick's false-OOM checks and telemetry rows.

Exactness: every floating-point expression is written in the same order as in the Python engine
(numba compiles without fast-math, so IEEE semantics hold), events get the same sequence numbers,
and ties break the same way, so the per-request table, the event log, busy times and makespan
are identical (tests/sim/test_sim_compiled.py compares them on random workloads and clusters).
Two things differ in form, not in result: a decode worker's superseded boundary event is removed
from the event heap instead of being skipped when popped, and a decode worker's finish heap
removes a preempted request at once instead of lazily. A run that hits an error (a policy
decision the engine must refuse) stops and returns a code; the caller reruns it on the Python
engine, which raises the full error.

Layout: per-request state is one int64 and one float64 row per request (columns ``R_*`` and
``F_*``), per-worker state one int64 and one float64 row per worker (``W_*`` and ``V_*``);
queues and the running batch are linked lists threaded through the request rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numba import njit

from pdopt.sim._policy import PolicyTraits
from pdopt.sim._result import TIMESERIES_COLUMNS

# NOTE: helpers are compiled without numba's reference counting (``_nrt=False``, a numba
# option used in its own test suite): otherwise every call increments and decrements the count
# of each array argument atomically, which measured ~40% of the run time. They allocate nothing
# and keep no array beyond the call; the functions that allocate or append to the event log
# (a list) keep ``@njit``. Tested with numba 0.68.
_kernel = njit(cache=True, _nrt=False)  # type: ignore[call-overload]  # numba's stubs omit it

# -- request columns (int64) ------------------------------------------------------------------
R_INPUT, R_OUTPUT, R_GENERATED, R_PREFILL_WORKER, R_DECODE_WORKER, R_DECODE_TARGET = range(6)
R_PREFILL_TOKENS, R_STATUS, R_PREEMPTIONS, R_KV_OFFSET, R_ADMIT_SEQ = range(6, 11)
R_QUEUE_NEXT, R_RUN_PREV, R_RUN_NEXT, R_OOM_FLAGGED = range(11, 15)
N_R = 15
# -- request columns (float64) ----------------------------------------------------------------
F_ARRIVAL, F_PREFILL_START, F_PREFILL_END, F_FIRST_TOKEN, F_TRANSFER_START = range(5)
F_TRANSFER_END, F_READY, F_DECODE_START, F_FINISH, F_PREFILL_FLOP, F_THINK = range(5, 11)
N_F = 11  # F_THINK: closed loop, the think time before this request is sent
# -- worker columns (int64) -------------------------------------------------------------------
W_IS_DECODE, W_CAP, W_MAX_SIZE, W_MAX_TOKENS, W_MAX_RUNNING = range(5)
W_PQ_HEAD, W_PQ_TAIL, W_PQ_LEN, W_BATCH_N, W_INFLIGHT = range(5, 10)
W_DQ_HEAD, W_DQ_TAIL, W_DQ_LEN, W_B, W_S, W_N_SEG, W_U_SEG = range(10, 17)
W_NEXT_N, W_EVENT_POS, W_RUN_HEAD, W_RUN_TAIL, W_HEAP_N = range(17, 22)
N_W = 22
# -- worker columns (float64) -----------------------------------------------------------------
V_ALPHA, V_BETA_PM, V_P_PEAK, V_INTERCEPT, V_QUEUED_FLOP, V_BATCH_FLOP = range(6)
V_BATCH_START, V_BATCH_END, V_PREFILL_BUSY, V_D0, V_D1, V_D2 = range(6, 12)
V_T_SEG, V_A_SEG, V_HALF_D2B, V_DECODE_BUSY, V_BUSY_SINCE = range(12, 17)
V_IDLE_W, V_MAX_W, V_LAST_BUSY = range(17, 20)
N_V = 20
# -- run counters (int64) ---------------------------------------------------------------------
G_HEAP_N, G_SEQ, G_DONE, G_STOPPED, G_NEXT_RID, G_RR_P, G_RR_D, G_ADMIT_SEQ, G_ERROR = range(9)
G_ADMITTED, G_TS_N, G_CLIENTS = range(9, 12)
N_G = 12
RECENT_PEAKS = 256  # admitted peak footprints kept for the stranded-block reference (a ring)

ARRIVAL, PREFILL_DONE, TRANSFER_DONE, DECODE, TICK = 0, 1, 2, 3, 4  # as in the Python engine
PENDING, FINISHED, REJECTED = 0, 1, 2
LOG_REJECTION, LOG_PREEMPTION, LOG_FALSE_OOM = 0, 1, 2
# Errors the Python engine raises with a full message (the caller reruns there):
ERR_NO_DECODE_WORKER = 1  # a request's peak KV fits no decode worker
ERR_PREFILL_CAPACITY = 2  # a (re-)prefill's KV exceeds the chosen prefill worker's capacity
ERR_STUCK = 3  # requests wait but nothing is scheduled (an internal error in either engine)
# time-series row columns: int64 and float64 parts (TIMESERIES_COLUMNS order within each)
T_WORKER, T_QUEUE_LEN, T_RUNNING, T_KV_USED, T_KV_FREE, T_KV_STRANDED = range(6)
U_T, U_QUEUED_FLOP, U_BUSY_FRAC, U_POWER = range(4)

PREFILL_ROUTING = {"round_robin": 0, "least_loaded": 1, "least_outstanding": 2, "most_free_kv": 3}
"""Prefill routing codes: round robin, least queued work (FLOP), least queued plus running, most
free KV blocks."""
DECODE_ROUTING = {"round_robin": 0, "least_loaded": 1, "most_free_kv": 2}
"""Decode routing codes: round robin, fewest running plus waiting, most free KV blocks."""


# =============================================================================================
# The event heap: (time, seq) order; a decode worker's pending boundary event is indexed.
# =============================================================================================
@_kernel
def _place(ev_t, ev_i, wi, k, t, seq, kind, arg):
    ev_t[k] = t
    ev_i[k, 0] = seq
    ev_i[k, 1] = kind
    ev_i[k, 2] = arg
    if kind == DECODE:
        wi[arg, W_EVENT_POS] = k


@_kernel
def _sift(ev_t, ev_i, wi, k, n):
    """Restore heap order around slot ``k`` of a heap of ``n`` entries (up, then down)."""
    t, seq, kind, arg = ev_t[k], ev_i[k, 0], ev_i[k, 1], ev_i[k, 2]
    while k > 0:
        p = (k - 1) >> 1
        if t < ev_t[p] or (t == ev_t[p] and seq < ev_i[p, 0]):
            _place(ev_t, ev_i, wi, k, ev_t[p], ev_i[p, 0], ev_i[p, 1], ev_i[p, 2])
            k = p
        else:
            break
    while True:
        c = 2 * k + 1
        if c >= n:
            break
        if c + 1 < n and (
            ev_t[c + 1] < ev_t[c] or (ev_t[c + 1] == ev_t[c] and ev_i[c + 1, 0] < ev_i[c, 0])
        ):
            c += 1
        if ev_t[c] < t or (ev_t[c] == t and ev_i[c, 0] < seq):
            _place(ev_t, ev_i, wi, k, ev_t[c], ev_i[c, 0], ev_i[c, 1], ev_i[c, 2])
            k = c
        else:
            break
    _place(ev_t, ev_i, wi, k, t, seq, kind, arg)


@_kernel
def _schedule(ev_t, ev_i, wi, g, t, kind, arg):
    seq = g[G_SEQ]
    g[G_SEQ] = seq + 1
    n = g[G_HEAP_N]
    g[G_HEAP_N] = n + 1
    _place(ev_t, ev_i, wi, n, t, seq, kind, arg)
    _sift(ev_t, ev_i, wi, n, n + 1)
    return seq


@_kernel
def _remove_event(ev_t, ev_i, wi, g, k):
    if ev_i[k, 1] == DECODE:
        wi[ev_i[k, 2], W_EVENT_POS] = -1
    n = g[G_HEAP_N] - 1
    g[G_HEAP_N] = n
    if k != n:
        _place(ev_t, ev_i, wi, k, ev_t[n], ev_i[n, 0], ev_i[n, 1], ev_i[n, 2])
        _sift(ev_t, ev_i, wi, k, n)


# =============================================================================================
# A decode worker's finish heap: running requests by (finish counter, admission seq).
# =============================================================================================
# NOTE: entries hold their keys (not just request ids): sifting then reads one worker's
# contiguous heap instead of request rows scattered over memory.
@_kernel
def _fin_sift(heap, k, n):
    """Restore order around entry ``k`` of ``heap[:n]``: rows (finish counter, admit seq, rid)."""
    c, s, r = heap[k, 0], heap[k, 1], heap[k, 2]
    while k > 0:
        p = (k - 1) >> 1
        if c < heap[p, 0] or (c == heap[p, 0] and s < heap[p, 1]):
            heap[k, 0], heap[k, 1], heap[k, 2] = heap[p, 0], heap[p, 1], heap[p, 2]
            k = p
        else:
            break
    while True:
        ch = 2 * k + 1
        if ch >= n:
            break
        if ch + 1 < n and (
            heap[ch + 1, 0] < heap[ch, 0]
            or (heap[ch + 1, 0] == heap[ch, 0] and heap[ch + 1, 1] < heap[ch, 1])
        ):
            ch += 1
        if heap[ch, 0] < c or (heap[ch, 0] == c and heap[ch, 1] < s):
            heap[k, 0], heap[k, 1], heap[k, 2] = heap[ch, 0], heap[ch, 1], heap[ch, 2]
            k = ch
        else:
            break
    heap[k, 0], heap[k, 1], heap[k, 2] = c, s, r


@_kernel
def _fin_push(wi, heaps, j, counter, seq, rid):
    n = wi[j, W_HEAP_N]
    heaps[j, n, 0], heaps[j, n, 1], heaps[j, n, 2] = counter, seq, rid
    wi[j, W_HEAP_N] = n + 1
    _fin_sift(heaps[j], n, n + 1)


@_kernel
def _fin_remove_at(wi, heaps, j, k):
    n = wi[j, W_HEAP_N] - 1
    wi[j, W_HEAP_N] = n
    if k != n:
        heap = heaps[j]
        heap[k, 0], heap[k, 1], heap[k, 2] = heap[n, 0], heap[n, 1], heap[n, 2]
        _fin_sift(heap, k, n)


@_kernel
def _fin_remove(wi, heaps, j, rid):
    """Remove ``rid`` (a preemption: rare, so a scan of the worker's heap)."""
    for k in range(wi[j, W_HEAP_N]):
        if heaps[j, k, 2] == rid:
            _fin_remove_at(wi, heaps, j, k)
            return


# =============================================================================================
# Prefill side (pdopt.sim._prefill.PrefillSide)
# =============================================================================================
@_kernel
def _outstanding_flop(wf, wi, w, now):
    if wi[w, W_INFLIGHT] == 0:
        return wf[w, V_QUEUED_FLOP]
    span = wf[w, V_BATCH_END] - wf[w, V_BATCH_START]
    left = (wf[w, V_BATCH_END] - now) / span if span > 0 else 0.0
    return wf[w, V_QUEUED_FLOP] + wf[w, V_BATCH_FLOP] * _clip01(left)


@_kernel
def _clip01(x):
    """Python's ``min(1.0, max(0.0, x))``, including which zero it returns."""
    x = x if x > 0.0 else 0.0
    return x if x < 1.0 else 1.0


@_kernel
def _start_batch(ri, rf, wi, wf, batches, w, now, bt):
    """Form a batch from the queue head (FCFS, token budget, batch cap, KV); return its end."""
    rid = wi[w, W_PQ_HEAD]
    wi[w, W_PQ_HEAD] = ri[rid, R_QUEUE_NEXT]
    wi[w, W_PQ_LEN] -= 1
    batches[w, 0] = rid
    size = 1
    used = ri[rid, R_PREFILL_TOKENS]
    limit = wi[w, W_CAP]
    blocks = (used + bt - 1) // bt
    work = rf[rid, F_PREFILL_FLOP]
    while wi[w, W_PQ_LEN] > 0 and size < wi[w, W_MAX_SIZE]:
        rid = wi[w, W_PQ_HEAD]
        length = ri[rid, R_PREFILL_TOKENS]
        need = (length + bt - 1) // bt
        if used + length > wi[w, W_MAX_TOKENS] or blocks + need > limit:
            break
        wi[w, W_PQ_HEAD] = ri[rid, R_QUEUE_NEXT]
        wi[w, W_PQ_LEN] -= 1
        batches[w, size] = rid
        size += 1
        used += length
        blocks += need
        work += rf[rid, F_PREFILL_FLOP]
    wf[w, V_QUEUED_FLOP] = wf[w, V_QUEUED_FLOP] - work if wi[w, W_PQ_LEN] > 0 else 0.0
    wi[w, W_BATCH_N] = size
    wf[w, V_BATCH_FLOP] = work
    wf[w, V_BATCH_START] = now
    wf[w, V_BATCH_END] = now + wf[w, V_INTERCEPT] + work / wf[w, V_P_PEAK]
    wi[w, W_INFLIGHT] = 1
    return wf[w, V_BATCH_END]


# =============================================================================================
# Decode side (pdopt.sim._decode.DecodeSide): closed forms
# =============================================================================================
@_kernel
def _time_at(wi, wf, j, n):
    k = n - wi[j, W_N_SEG]
    return wf[j, V_T_SEG] + k * wf[j, V_A_SEG] + wf[j, V_HALF_D2B] * (k * (k - 1))


@_kernel
def _growth(wi, cnt, j, m1, m2, bt):
    length = m2 - m1 + 1
    if length <= 0:
        return 0
    full = length // bt
    rem = length - full * bt
    total = full * wi[j, W_B]
    for i in range(rem):
        total += cnt[j, (m1 + i) % bt]
    return total


@_kernel
def _first_growth_failure(wi, cnt, j, n, free, bt):
    b = wi[j, W_B]
    periods = free // b
    acc = periods * b
    m = n + periods * bt
    while True:
        m += 1
        acc += cnt[j, m % bt]
        if acc > free:
            return m


@_kernel
def _boundaries_before(wi, wf, j, t):
    a, h = wf[j, V_A_SEG], wf[j, V_HALF_D2B]
    dt = t - wf[j, V_T_SEG]
    if dt <= 0:
        return 0
    if h > 0:
        lin = a - h
        k = int((-lin + math.sqrt(lin * lin + 4.0 * h * dt)) / (2.0 * h))
    else:
        k = int(dt / a)
    n0 = wi[j, W_N_SEG]
    while k > 0 and _time_at(wi, wf, j, n0 + k) > t:
        k -= 1
    while _time_at(wi, wf, j, n0 + k + 1) <= t:
        k += 1
    return k


@_kernel
def _first_boundary_after(wi, wf, j, t):
    k = _boundaries_before(wi, wf, j, t)
    n = wi[j, W_N_SEG] + k
    if k > 0 and _time_at(wi, wf, j, n) == t:
        return n
    return n + 1


@_kernel
def _used_blocks(wi, wf, cnt, j, t, bt):
    if wi[j, W_B] == 0:
        return wi[j, W_U_SEG]
    k = _boundaries_before(wi, wf, j, t)
    n_seg = wi[j, W_N_SEG]
    return wi[j, W_U_SEG] + _growth(wi, cnt, j, n_seg + 1, n_seg + k, bt)


# =============================================================================================
# Decode side: one boundary
# =============================================================================================
@_kernel
def _leave(ri, wi, cnt, j, rid, n, bt):
    """Take ``rid`` out of the running batch; return the blocks it held at boundary ``n``."""
    o = ri[rid, R_KV_OFFSET]
    cnt[j, (1 - o) % bt] -= 1
    wi[j, W_S] -= o
    wi[j, W_B] -= 1
    prev, nxt = ri[rid, R_RUN_PREV], ri[rid, R_RUN_NEXT]
    if prev >= 0:
        ri[prev, R_RUN_NEXT] = nxt
    else:
        wi[j, W_RUN_HEAD] = nxt
    if nxt >= 0:
        ri[nxt, R_RUN_PREV] = prev
    else:
        wi[j, W_RUN_TAIL] = prev
    return (o + n + bt - 1) // bt


@_kernel
def _complete(ri, wi, cnt, heaps, j, n, used, finished, bt):
    count = 0
    while wi[j, W_HEAP_N] > 0 and heaps[j, 0, 0] <= n:
        rid = heaps[j, 0, 2]
        _fin_remove_at(wi, heaps, j, 0)
        ri[rid, R_ADMIT_SEQ] = -1
        used -= _leave(ri, wi, cnt, j, rid, n, bt)
        ri[rid, R_GENERATED] = ri[rid, R_OUTPUT]
        finished[count] = rid
        count += 1
    return used, count


@_kernel
def _preempt(ri, wi, cnt, heaps, j, n, used, preempted, bt):
    count = 0
    while used > wi[j, W_CAP] and wi[j, W_B] > 0:
        rid = wi[j, W_RUN_TAIL]  # the youngest
        o = ri[rid, R_KV_OFFSET]
        _fin_remove(wi, heaps, j, rid)
        used -= _leave(ri, wi, cnt, j, rid, n, bt)
        ri[rid, R_GENERATED] = o + n - ri[rid, R_INPUT]
        ri[rid, R_ADMIT_SEQ] = -1
        preempted[count] = rid
        count += 1
    return used, count


@_kernel
def _admit(ri, wi, cnt, heaps, g, j, n, used, admitted, bt):
    """Admit from the queue head while KV and the batch cap allow; (used, count, blocked id)."""
    count = 0
    limit = wi[j, W_CAP]
    while wi[j, W_DQ_LEN] > 0 and wi[j, W_B] < wi[j, W_MAX_RUNNING]:
        rid = wi[j, W_DQ_HEAD]
        generated = ri[rid, R_GENERATED]
        context = ri[rid, R_INPUT] + generated
        need = (context + bt - 1) // bt
        if used + need > limit:
            return used, count, rid
        wi[j, W_DQ_HEAD] = ri[rid, R_QUEUE_NEXT]
        wi[j, W_DQ_LEN] -= 1
        o = context - n
        ri[rid, R_KV_OFFSET] = o
        seq = g[G_ADMIT_SEQ]
        g[G_ADMIT_SEQ] = seq + 1
        ri[rid, R_ADMIT_SEQ] = seq
        _fin_push(wi, heaps, j, n + ri[rid, R_OUTPUT] - generated, seq, rid)
        tail = wi[j, W_RUN_TAIL]
        ri[rid, R_RUN_PREV] = tail
        ri[rid, R_RUN_NEXT] = -1
        if tail >= 0:
            ri[tail, R_RUN_NEXT] = rid
        else:
            wi[j, W_RUN_HEAD] = rid
        wi[j, W_RUN_TAIL] = rid
        cnt[j, (1 - o) % bt] += 1
        wi[j, W_S] += o
        wi[j, W_B] += 1
        used += need
        admitted[count] = rid
        count += 1
    return used, count, -1


@_kernel
def _boundary(ri, wi, wf, cnt, heaps, g, j, n, t, finished, preempted, admitted, bt):
    """Process boundary ``n`` at ``t`` (DecodeSide.boundary); counts and the blocked head."""
    used = wi[j, W_U_SEG] + _growth(wi, cnt, j, wi[j, W_N_SEG] + 1, n, bt)
    was_busy = wi[j, W_B] > 0
    used, n_fin = _complete(ri, wi, cnt, heaps, j, n, used, finished, bt)
    used, n_pre = _preempt(ri, wi, cnt, heaps, j, n, used, preempted, bt)
    used, n_adm, blocked = _admit(ri, wi, cnt, heaps, g, j, n, used, admitted, bt)
    b = wi[j, W_B]
    wi[j, W_N_SEG] = n
    wf[j, V_T_SEG] = t
    wi[j, W_U_SEG] = used
    wf[j, V_A_SEG] = wf[j, V_D0] + wf[j, V_D1] * b + wf[j, V_D2] * (wi[j, W_S] + b * n)
    wf[j, V_HALF_D2B] = 0.5 * wf[j, V_D2] * b
    if was_busy and b == 0:
        wf[j, V_DECODE_BUSY] += t - wf[j, V_BUSY_SINCE]
    elif not was_busy and b > 0:
        wf[j, V_BUSY_SINCE] = t
    return n_fin, n_pre, n_adm, blocked


@_kernel
def _schedule_decode(ri, wi, wf, cnt, heaps, ev_t, ev_i, g, j, bt):
    if wi[j, W_B] == 0:
        wi[j, W_NEXT_N] = -1
        return
    fin = heaps[j, 0, 0]
    free = wi[j, W_CAP] - wi[j, W_U_SEG]
    fail = _first_growth_failure(wi, cnt, j, wi[j, W_N_SEG], free, bt)
    n = fin if fin < fail else fail
    wi[j, W_NEXT_N] = n
    _schedule(ev_t, ev_i, wi, g, _time_at(wi, wf, j, n), DECODE, j)


# =============================================================================================
# Routing: the compiled twins of the built-in policies (pdopt.policies._baselines)
# =============================================================================================
@_kernel
def _route_prefill(ri, wi, wf, g, batches, prefill_idx, code, now, bt):
    if code == 0:  # round robin
        g[G_RR_P] += 1
        return prefill_idx[(g[G_RR_P] - 1) % len(prefill_idx)]
    best = prefill_idx[0]
    best_load = 0.0
    for i in range(len(prefill_idx)):
        w = prefill_idx[i]
        if code == 1:  # least queued prefill work
            load = _outstanding_flop(wf, wi, w, now)
        elif code == 2:  # least outstanding requests: queued plus running
            load = float(wi[w, W_PQ_LEN] + wi[w, W_BATCH_N] + wi[w, W_B])
        else:  # most free KV blocks (argmax as a negated load): only a running batch holds KV
            used = wi[w, W_U_SEG]
            for k in range(wi[w, W_BATCH_N]):
                used += (ri[batches[w, k], R_PREFILL_TOKENS] + bt - 1) // bt
            free = wi[w, W_CAP] - used
            load = -float(free if free > 0 else 0)
        if i == 0 or load < best_load:
            best, best_load = w, load
    return best


@_kernel
def _route_decode(ri, wi, wf, cnt, g, decode_idx, min_cap, code, rid, now, bt):
    """The decode worker for ``rid``, or -1 when no decode worker holds its peak KV."""
    peak = (ri[rid, R_INPUT] + ri[rid, R_OUTPUT] - 1 + bt - 1) // bt
    n_ok = 0
    for i in range(len(decode_idx)):
        if peak <= min_cap or wi[decode_idx[i], W_CAP] >= peak:
            n_ok += 1
    if n_ok == 0:
        return -1
    pick = 0
    if code == 0:  # round robin over the feasible workers
        g[G_RR_D] += 1
        pick = (g[G_RR_D] - 1) % n_ok
    best, best_load, k = -1, 0, 0
    for i in range(len(decode_idx)):
        j = decode_idx[i]
        if not (peak <= min_cap or wi[j, W_CAP] >= peak):
            continue
        if code == 0:
            if k == pick:
                return j
            k += 1
            continue
        if code == 1:  # fewest running plus waiting (argmin, ties: lowest index)
            load = wi[j, W_BATCH_N] + wi[j, W_B] + wi[j, W_DQ_LEN]
        else:  # most free KV blocks (argmax, ties: lowest index), as a negated load
            free = wi[j, W_CAP] - _used_blocks(wi, wf, cnt, j, now, bt)
            load = -(free if free > 0 else 0)
        if best < 0 or load < best_load:
            best, best_load = j, load
    return best


# =============================================================================================
# The run
# =============================================================================================
@njit(cache=True)
def run_compiled(
    ri,
    rf,
    wi,
    wf,
    cnt,
    heaps,
    batches,
    link_bw,
    link_lat,
    decode_idx,
    prefill_idx,
    params,
    fparams,
):
    """Run to the end.

    ``params`` (int64): block_tokens, max_kv_tokens, min_kv_capacity_blocks, prefill routing
    code, decode routing code, 1 to run control ticks (time series), closed-loop clients (0:
    open loop; think times in column F_THINK), ticks to allocate time-series rows for.
    ``fparams`` (float64): kv_bytes_per_token, tick_s. Returns (log, now, counters, time-series
    ints and floats, one row per column).
    """
    bt, max_kv, min_cap, p_code, d_code = params[0], params[1], params[2], params[3], params[4]
    kv_bytes, tick_s = fparams[0], fparams[1]
    n_req, n_workers = ri.shape[0], wi.shape[0]
    # pending events: ≤ 1 arrival or transfer per request, 1 tick, 1 batch and 1 boundary per worker
    ev_t = np.empty(n_req + 2 * n_workers + 2, np.float64)
    ev_i = np.empty((n_req + 2 * n_workers + 2, 3), np.int64)
    link_free = np.zeros((n_workers, n_workers), np.float64)
    g = np.zeros(N_G, np.int64)
    finished = np.empty(heaps.shape[1], np.int64)
    preempted = np.empty(heaps.shape[1], np.int64)
    admitted = np.empty(heaps.shape[1], np.int64)
    peaks = np.zeros((2, RECENT_PEAKS), np.int64)  # the ring, and its values sorted
    ts_rows = params[7] * n_workers if params[5] else 0  # column-major: one row per column
    ts_i = np.empty((6, ts_rows), np.int64)
    ts_f = np.empty((4, ts_rows), np.float64)
    log = [(0.0, 0, 0, 0, 0, 0)]
    log.clear()
    now = 0.0
    _start(rf, wi, ev_t, ev_i, g, params[6])
    if n_req and params[5]:
        _schedule(ev_t, ev_i, wi, g, tick_s, TICK, 1)
    while g[G_HEAP_N] > 0 and g[G_STOPPED] == 0:
        now = ev_t[0]
        kind, arg = ev_i[0, 1], ev_i[0, 2]
        _remove_event(ev_t, ev_i, wi, g, 0)
        if kind == ARRIVAL:
            _on_arrival(
                ri,
                rf,
                wi,
                wf,
                batches,
                ev_t,
                ev_i,
                g,
                prefill_idx,
                p_code,
                log,
                arg,
                now,
                bt,
                max_kv,
            )
        elif kind == PREFILL_DONE:
            _on_prefill_done(
                ri,
                rf,
                wi,
                wf,
                cnt,
                batches,
                ev_t,
                ev_i,
                g,
                link_bw,
                link_lat,
                link_free,
                decode_idx,
                min_cap,
                d_code,
                kv_bytes,
                arg,
                now,
                bt,
            )
        elif kind != TICK:  # TRANSFER_DONE or DECODE: a boundary of decode worker j, now
            if kind == DECODE:  # only a worker's pending boundary event is ever in the heap
                j, n = arg, wi[arg, W_NEXT_N]
            else:
                j = _enqueue_decode(ri, rf, wi, arg, now)
                if wi[j, W_DQ_LEN] > 1:
                    continue
                if wi[j, W_B] > 0:  # Engine.wake_decode: the new head waits for a boundary
                    _advance_boundary(wi, wf, ev_t, ev_i, g, j, now)
                    continue
                wf[j, V_T_SEG] = now  # an idle worker admits it now
                n = wi[j, W_N_SEG]
            _process_boundary(
                ri, rf, wi, wf, cnt, heaps, batches, ev_t, ev_i, g, prefill_idx, p_code, log,
                finished, preempted, admitted, decode_idx, peaks, j, n, now, bt,
            )  # fmt: skip
        else:  # TICK number ``arg``
            _tick_checks(ri, wi, wf, cnt, decode_idx, log, now, bt)
            row = g[G_TS_N]
            if row + n_workers > ts_i.shape[1]:
                ts_i, ts_f = _grown(ts_i), _grown(ts_f)
            _sample(ri, rf, wi, wf, cnt, batches, g, peaks, ts_i, ts_f, row, now, tick_s, bt)
            g[G_TS_N] = row + n_workers
            if g[G_DONE] < n_req:
                if g[G_HEAP_N] == 0:
                    g[G_ERROR] = ERR_STUCK
                    break
                _schedule(ev_t, ev_i, wi, g, (arg + 1) * tick_s, TICK, arg + 1)
    return log, now, g, ts_i[:, : g[G_TS_N]], ts_f[:, : g[G_TS_N]]


@njit(cache=True)
def _grown(a):
    out = np.empty((a.shape[0], 2 * a.shape[1] + 64), a.dtype)
    out[:, : a.shape[1]] = a
    return out


@_kernel
def _start(rf, wi, ev_t, ev_i, g, clients):
    """The first arrival (open loop, ``clients == 0``) or every client's first request at t = 0
    (closed loop; Control.start)."""
    n_req = rf.shape[0]
    g[G_CLIENTS] = clients
    if clients == 0:
        if n_req:
            _schedule(ev_t, ev_i, wi, g, rf[0, F_ARRIVAL], ARRIVAL, 0)
        g[G_NEXT_RID] = 1
        return
    first = min(n_req, clients)
    for rid in range(first):
        rf[rid, F_ARRIVAL] = 0.0
        _schedule(ev_t, ev_i, wi, g, 0.0, ARRIVAL, rid)
    g[G_NEXT_RID] = first


@njit(cache=True)
def _on_arrival(
    ri, rf, wi, wf, batches, ev_t, ev_i, g, prefill_idx, p_code, log, rid, now, bt, max_kv
):
    """Schedule the next arrival; reject a request no worker's KV holds, else route it."""
    nxt = g[G_NEXT_RID]
    if g[G_CLIENTS] == 0 and nxt < ri.shape[0]:
        g[G_NEXT_RID] = nxt + 1
        _schedule(ev_t, ev_i, wi, g, rf[nxt, F_ARRIVAL], ARRIVAL, nxt)
    inp, out = ri[rid, R_INPUT], ri[rid, R_OUTPUT]
    need = inp + out - 1 if out > 1 else inp
    if need > max_kv:
        ri[rid, R_STATUS] = REJECTED
        log.append((now, LOG_REJECTION, -1, rid, need, 0))
        _ended(rf, wi, ev_t, ev_i, g, now)
    else:
        _to_prefill(ri, rf, wi, wf, batches, ev_t, ev_i, g, prefill_idx, p_code, rid, now, bt)


@_kernel
def _on_prefill_done(
    ri,
    rf,
    wi,
    wf,
    cnt,
    batches,
    ev_t,
    ev_i,
    g,
    link_bw,
    link_lat,
    link_free,
    decode_idx,
    min_cap,
    d_code,
    kv_bytes,
    w,
    now,
    bt,
):
    """First tokens of worker ``w``'s batch; finish or send each on; start the next batch."""
    wf[w, V_PREFILL_BUSY] += wf[w, V_BATCH_END] - wf[w, V_BATCH_START]
    size = wi[w, W_BATCH_N]
    wi[w, W_BATCH_N] = 0
    wf[w, V_BATCH_FLOP] = 0.0
    wi[w, W_INFLIGHT] = 0
    for i in range(size):
        rid = batches[w, i]
        gen = ri[rid, R_GENERATED] + 1
        ri[rid, R_GENERATED] = gen
        if rf[rid, F_PREFILL_END] != rf[rid, F_PREFILL_END]:
            rf[rid, F_PREFILL_END] = now
            rf[rid, F_FIRST_TOKEN] = now
        if gen >= ri[rid, R_OUTPUT]:
            _finish(ri, rf, wi, ev_t, ev_i, g, rid, now)
            continue
        j = _route_decode(ri, wi, wf, cnt, g, decode_idx, min_cap, d_code, rid, now, bt)
        if j < 0:
            g[G_ERROR] = ERR_NO_DECODE_WORKER
            g[G_STOPPED] = 1
            return
        _transfer(ri, rf, wi, link_bw, link_lat, link_free, ev_t, ev_i, g, kv_bytes, rid, w, j, now)
    if wi[w, W_PQ_LEN] > 0 and wi[w, W_B] == 0:
        _start_prefill(ri, rf, wi, wf, batches, ev_t, ev_i, g, w, now, bt)


@_kernel
def _enqueue_decode(ri, rf, wi, rid, now):
    """A transfer landed: ``rid`` joins its decode worker's admission queue; returns it."""
    j = ri[rid, R_DECODE_TARGET]
    rf[rid, F_READY] = now
    ri[rid, R_QUEUE_NEXT] = -1
    if wi[j, W_DQ_LEN] == 0:
        wi[j, W_DQ_HEAD] = rid
    else:
        ri[wi[j, W_DQ_TAIL], R_QUEUE_NEXT] = rid
    wi[j, W_DQ_TAIL] = rid
    wi[j, W_DQ_LEN] += 1
    return j


@_kernel
def _advance_boundary(wi, wf, ev_t, ev_i, g, j, now):
    """Visit busy worker ``j`` at its first boundary from ``now`` on, if that is earlier than
    the one scheduled (the scheduled event is replaced: the Python engine skips it when due)."""
    n = _first_boundary_after(wi, wf, j, now)
    if n < wi[j, W_NEXT_N]:
        _remove_event(ev_t, ev_i, wi, g, wi[j, W_EVENT_POS])
        wi[j, W_NEXT_N] = n
        _schedule(ev_t, ev_i, wi, g, _time_at(wi, wf, j, n), DECODE, j)


@_kernel
def _ended(rf, wi, ev_t, ev_i, g, now):
    """A request ended: in a closed loop its client sends the next request after its think time
    (Control.request_ended); the run stops once every request has ended."""
    g[G_DONE] += 1
    nxt = g[G_NEXT_RID]
    if g[G_CLIENTS] > 0 and nxt < rf.shape[0]:
        at = now + rf[nxt, F_THINK]
        g[G_NEXT_RID] = nxt + 1
        rf[nxt, F_ARRIVAL] = at
        _schedule(ev_t, ev_i, wi, g, at, ARRIVAL, nxt)
    if g[G_DONE] == rf.shape[0]:
        g[G_STOPPED] = 1


@_kernel
def _finish(ri, rf, wi, ev_t, ev_i, g, rid, now):
    ri[rid, R_STATUS] = FINISHED
    rf[rid, F_FINISH] = now
    _ended(rf, wi, ev_t, ev_i, g, now)


@_kernel
def _start_prefill(ri, rf, wi, wf, batches, ev_t, ev_i, g, w, now, bt):
    head = wi[w, W_PQ_HEAD]
    if (ri[head, R_PREFILL_TOKENS] + bt - 1) // bt > wi[w, W_CAP]:
        return
    end = _start_batch(ri, rf, wi, wf, batches, w, now, bt)
    for i in range(wi[w, W_BATCH_N]):
        rid = batches[w, i]
        if rf[rid, F_PREFILL_START] != rf[rid, F_PREFILL_START]:
            rf[rid, F_PREFILL_START] = now
    _schedule(ev_t, ev_i, wi, g, end, PREFILL_DONE, w)


@_kernel
def _to_prefill(ri, rf, wi, wf, batches, ev_t, ev_i, g, prefill_idx, p_code, rid, now, bt):
    """Engine.route_prefill: route, enqueue (FCFS) and start a batch on an idle worker."""
    w = _route_prefill(ri, wi, wf, g, batches, prefill_idx, p_code, now, bt)
    tokens = ri[rid, R_INPUT] + ri[rid, R_GENERATED]
    if tokens > wi[w, W_CAP] * bt:
        g[G_ERROR] = ERR_PREFILL_CAPACITY
        g[G_STOPPED] = 1
        return
    if ri[rid, R_PREFILL_WORKER] < 0:
        ri[rid, R_PREFILL_WORKER] = w
    ri[rid, R_PREFILL_TOKENS] = tokens
    flop = wf[w, V_ALPHA] * tokens * tokens + wf[w, V_BETA_PM] * tokens
    rf[rid, F_PREFILL_FLOP] = flop
    ri[rid, R_QUEUE_NEXT] = -1
    if wi[w, W_PQ_LEN] == 0:
        wi[w, W_PQ_HEAD] = rid
    else:
        ri[wi[w, W_PQ_TAIL], R_QUEUE_NEXT] = rid
    wi[w, W_PQ_TAIL] = rid
    wi[w, W_PQ_LEN] += 1
    wf[w, V_QUEUED_FLOP] += flop
    if wi[w, W_BATCH_N] == 0 and wi[w, W_B] == 0:
        _start_prefill(ri, rf, wi, wf, batches, ev_t, ev_i, g, w, now, bt)


@_kernel
def _transfer(
    ri, rf, wi, link_bw, link_lat, link_free, ev_t, ev_i, g, kv_bytes, rid, src, dst, now
):
    ri[rid, R_DECODE_TARGET] = dst
    if ri[rid, R_DECODE_WORKER] < 0:
        ri[rid, R_DECODE_WORKER] = dst
    start = now if now > link_free[src, dst] else link_free[src, dst]
    wire = ri[rid, R_PREFILL_TOKENS] * kv_bytes / link_bw[src, dst]
    link_free[src, dst] = start + wire
    end = start + link_lat[src, dst] + wire
    if rf[rid, F_TRANSFER_START] != rf[rid, F_TRANSFER_START]:
        rf[rid, F_TRANSFER_START] = start
        rf[rid, F_TRANSFER_END] = end
    _schedule(ev_t, ev_i, wi, g, end, TRANSFER_DONE, rid)


@njit(cache=True)
def _process_boundary(
    ri,
    rf,
    wi,
    wf,
    cnt,
    heaps,
    batches,
    ev_t,
    ev_i,
    g,
    prefill_idx,
    p_code,
    log,
    finished,
    preempted,
    admitted,
    decode_idx,
    peaks,
    j,
    n,
    now,
    bt,
):
    """Engine.process_boundary for a decode worker."""
    n_fin, n_pre, n_adm, blocked = _boundary(
        ri, wi, wf, cnt, heaps, g, j, n, now, finished, preempted, admitted, bt
    )
    _schedule_decode(ri, wi, wf, cnt, heaps, ev_t, ev_i, g, j, bt)
    for i in range(n_adm):
        rid = admitted[i]
        if rf[rid, F_DECODE_START] != rf[rid, F_DECODE_START]:
            rf[rid, F_DECODE_START] = now
        peak_tokens = ri[rid, R_INPUT] + ri[rid, R_OUTPUT] - 1
        _remember_peak(peaks, g, (peak_tokens + bt - 1) // bt)
    for i in range(n_fin):
        _finish(ri, rf, wi, ev_t, ev_i, g, finished[i], now)
    for i in range(n_pre):
        rid = preempted[i]
        ri[rid, R_PREEMPTIONS] += 1
        log.append((now, LOG_PREEMPTION, j, rid, ri[rid, R_GENERATED], 0))
        _to_prefill(ri, rf, wi, wf, batches, ev_t, ev_i, g, prefill_idx, p_code, rid, now, bt)
    if blocked >= 0:
        _check_false_oom(ri, wi, wf, cnt, decode_idx, log, blocked, now, bt)


@njit(cache=True)
def _check_false_oom(ri, wi, wf, cnt, decode_idx, log, rid, now, bt):
    """Log a false OOM once per request: it waits for KV while the decode workers' free blocks
    together would hold it (Control.check_false_oom)."""
    if ri[rid, R_OOM_FLAGGED]:
        return
    need = (ri[rid, R_INPUT] + ri[rid, R_GENERATED] + bt - 1) // bt
    free = 0
    for i in range(len(decode_idx)):
        d = decode_idx[i]
        f = wi[d, W_CAP] - _used_blocks(wi, wf, cnt, d, now, bt)
        free += f if f > 0 else 0
    if free >= need:
        ri[rid, R_OOM_FLAGGED] = 1
        log.append((now, LOG_FALSE_OOM, ri[rid, R_DECODE_TARGET], rid, need, free))


# =============================================================================================
# The control tick: false-OOM checks and one time-series row per worker (Control.on_tick)
# =============================================================================================
@njit(cache=True)
def _tick_checks(ri, wi, wf, cnt, decode_idx, log, now, bt):
    for i in range(len(decode_idx)):
        j = decode_idx[i]
        if wi[j, W_DQ_LEN] > 0:
            head = wi[j, W_DQ_HEAD]
            need = (ri[head, R_INPUT] + ri[head, R_GENERATED] + bt - 1) // bt
            if need > wi[j, W_CAP] - _used_blocks(wi, wf, cnt, j, now, bt):
                _check_false_oom(ri, wi, wf, cnt, decode_idx, log, head, now, bt)


@_kernel
def _reference_need(ri, rf, wi, g, peaks, bt):
    """ClusterView.reference_need_blocks: the earliest-ready waiting head's blocks, else the
    p90 (nearest rank) of the last RECENT_PEAKS admitted peak footprints, else 0."""
    best = -1
    for j in range(wi.shape[0]):
        if wi[j, W_DQ_LEN] > 0:
            head = wi[j, W_DQ_HEAD]
            if (
                best < 0
                or rf[head, F_READY] < rf[best, F_READY]
                or (rf[head, F_READY] == rf[best, F_READY] and head < best)
            ):
                best = head
    if best >= 0:
        return (ri[best, R_INPUT] + ri[best, R_GENERATED] + bt - 1) // bt
    m = min(g[G_ADMITTED], RECENT_PEAKS)
    return peaks[1, math.ceil(0.9 * m) - 1] if m else 0


@_kernel
def _remember_peak(peaks, g, blocks):
    """Put an admitted request's peak blocks in the ring (evicting the oldest once full) and
    keep the ring's values sorted in ``peaks[1]``, so a p90 is a lookup (Engine.recent_peaks)."""
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


@_kernel
def _sample(ri, rf, wi, wf, cnt, batches, g, peaks, ts_i, ts_f, row, now, tick_s, bt):
    """Write one row per worker from ``row`` on (Control.sample)."""
    need = _reference_need(ri, rf, wi, g, peaks, bt)
    for w in range(wi.shape[0]):
        used = _used_blocks(wi, wf, cnt, w, now, bt)
        for i in range(wi[w, W_BATCH_N]):
            used += (ri[batches[w, i], R_PREFILL_TOKENS] + bt - 1) // bt
        free = wi[w, W_CAP] - used if used < wi[w, W_CAP] else 0
        busy = wf[w, V_PREFILL_BUSY]
        if wi[w, W_INFLIGHT]:
            busy += now - wf[w, V_BATCH_START]
        busy = busy + (wf[w, V_DECODE_BUSY] + (now - wf[w, V_BUSY_SINCE] if wi[w, W_B] else 0.0))
        frac = _clip01((busy - wf[w, V_LAST_BUSY]) / tick_s)
        wf[w, V_LAST_BUSY] = busy
        decode = wi[w, W_IS_DECODE] == 1
        r = row + w
        ts_i[T_WORKER, r] = w
        ts_i[T_QUEUE_LEN, r] = wi[w, W_DQ_LEN] if decode else wi[w, W_PQ_LEN]
        ts_i[T_RUNNING, r] = wi[w, W_BATCH_N] + wi[w, W_B]
        ts_i[T_KV_USED, r] = used
        ts_i[T_KV_FREE, r] = free
        ts_i[T_KV_STRANDED, r] = free if decode and free < need else 0
        ts_f[U_T, r] = now
        ts_f[U_QUEUED_FLOP, r] = _outstanding_flop(wf, wi, w, now)
        ts_f[U_BUSY_FRAC, r] = frac
        ts_f[U_POWER, r] = wf[w, V_IDLE_W] + (wf[w, V_MAX_W] - wf[w, V_IDLE_W]) * frac


def pack(
    cluster: Any, arrival: np.ndarray, inputs: np.ndarray, outputs: np.ndarray
) -> tuple[np.ndarray, ...]:
    """The initial state arrays of a run (see :func:`run_compiled`)."""
    n, workers = len(inputs), cluster.workers
    ri = np.zeros((n, N_R), np.int64)
    ri[:, R_INPUT] = inputs
    ri[:, R_OUTPUT] = outputs
    for col in (R_PREFILL_WORKER, R_DECODE_WORKER, R_DECODE_TARGET):
        ri[:, col] = -1
    rf = np.full((n, N_F), np.nan)
    rf[:, F_ARRIVAL] = arrival
    wi = np.zeros((len(workers), N_W), np.int64)
    wf = np.zeros((len(workers), N_V), np.float64)
    for w, spec in enumerate(workers):
        pre, dec = spec.cost.prefill, spec.cost.decode
        wi[w, W_IS_DECODE] = int(str(spec.role) == "decode")
        wi[w, W_CAP] = spec.kv_capacity_blocks
        wi[w, W_MAX_SIZE] = spec.max_batch_size
        wi[w, W_MAX_TOKENS] = spec.max_batch_tokens
        wi[w, W_MAX_RUNNING] = spec.max_running
        for col in (W_NEXT_N, W_EVENT_POS, W_RUN_HEAD, W_RUN_TAIL):
            wi[w, col] = -1
        wf[w, V_ALPHA] = pre.alpha_flop_per_token2
        wf[w, V_BETA_PM] = pre.beta_flop_per_token * pre.p_m
        wf[w, V_P_PEAK] = pre.p_peak_flops
        wf[w, V_INTERCEPT] = pre.intercept_s
        wf[w, V_D0] = dec.d0_s
        wf[w, V_D1] = dec.d1_s_per_request
        wf[w, V_D2] = dec.d2_s_per_token
        wf[w, V_IDLE_W] = spec.idle_power_w
        wf[w, V_MAX_W] = spec.max_power_w
    bt = cluster.block_tokens
    cnt = np.zeros((len(workers), bt), np.int64)
    heaps = np.zeros((len(workers), max(w.max_running for w in workers) + 1, 3), np.int64)
    batches = np.zeros((len(workers), max(w.max_batch_size for w in workers)), np.int64)
    links = [[cluster.link_between(a.name, b.name) for b in workers] for a in workers]
    link_bw = np.array([[x.bw_bytes_per_s for x in row] for row in links], np.float64)
    link_lat = np.array([[x.latency_s for x in row] for row in links], np.float64)
    return ri, rf, wi, wf, cnt, heaps, batches, link_bw, link_lat


# =============================================================================================
# The Python side: which runs qualify, and a run's state in and out of the request table
# =============================================================================================
_TABLE_INTS = {
    "generated": R_GENERATED,
    "prefill_worker": R_PREFILL_WORKER,
    "decode_worker": R_DECODE_WORKER,
    "decode_target": R_DECODE_TARGET,
    "prefill_tokens": R_PREFILL_TOKENS,
    "status": R_STATUS,
    "preemptions": R_PREEMPTIONS,
    "kv_offset": R_KV_OFFSET,
    "admit_seq": R_ADMIT_SEQ,
}
_TABLE_FLOATS = {
    "arrival_s": F_ARRIVAL,
    "prefill_start_s": F_PREFILL_START,
    "prefill_end_s": F_PREFILL_END,
    "first_token_s": F_FIRST_TOKEN,
    "transfer_start_s": F_TRANSFER_START,
    "transfer_end_s": F_TRANSFER_END,
    "ready_s": F_READY,
    "decode_start_s": F_DECODE_START,
    "finish_s": F_FINISH,
    "prefill_flop": F_PREFILL_FLOP,
}


def routing_codes(traits: PolicyTraits) -> tuple[int, int] | None:
    """(prefill, decode) routing codes of a policy's compiled twin, or None when it has none
    (``traits.compiled_routing`` names them; a policy that wants ticks never qualifies)."""
    names = traits.compiled_routing
    if names is None or traits.wants_ticks:
        return None
    return PREFILL_ROUTING[names[0]], DECODE_ROUTING[names[1]]


@dataclass(frozen=True)
class CompiledOutcome:
    """What the engine's result needs from a compiled run, besides the request table."""

    now_s: float
    event_rows: list[tuple[float, str, str, int, str]]
    busy_s: tuple[float, ...]
    timeseries: pd.DataFrame


def run(
    table: Any,
    cluster: Any,
    codes: tuple[int, int],
    tick_s: float,
    record_timeseries: bool,
    closed_loop: tuple[int, list[float]] | None = None,
) -> CompiledOutcome | None:
    """Run ``table``'s requests on ``cluster``; fill the table in place.

    Open loop: the table's arrival times. ``closed_loop = (clients, think_s)``: every client
    sends its first request at 0 and request ``i >= clients`` ``think_s[i - clients]`` after a
    request ends (:class:`pdopt.sim.ClosedLoop`). Returns None when the run stopped on an
    error (the table is then untouched): the caller reruns it on the Python engine, which raises
    the error with its full message.
    """
    n = table.n
    arrival = np.frombuffer(table.arrival_s, dtype=np.float64)
    inputs = np.frombuffer(table.input_tokens, dtype=np.int64)
    outputs = np.frombuffer(table.output_tokens, dtype=np.int64)
    ri, rf, wi, wf, cnt, heaps, batches, link_bw, link_lat = pack(cluster, arrival, inputs, outputs)
    clients = 0
    if closed_loop is not None:
        clients, think = closed_loop
        rf[clients:, F_THINK] = np.asarray(think, dtype=np.float64)[: max(n - clients, 0)]
    workers = cluster.workers
    roles = [str(w.role) for w in workers]
    bt = cluster.block_tokens
    params = np.array(
        [
            bt,
            max(w.kv_capacity_blocks * w.block_tokens for w in workers),
            min(w.kv_capacity_blocks for w in workers),
            codes[0],
            codes[1],
            int(record_timeseries and n > 0),
            clients,
            _expected_ticks(arrival, tick_s, closed_loop is None),
        ],
        np.int64,
    )
    decode_idx = np.array([w for w, r in enumerate(roles) if r == "decode"], np.int64)
    prefill_idx = np.array([w for w, r in enumerate(roles) if r == "prefill"], np.int64)
    fparams = np.array([cluster.kv_bytes_per_token, tick_s], np.float64)
    log, now, counters, ts_i, ts_f = run_compiled(
        ri,
        rf,
        wi,
        wf,
        cnt,
        heaps,
        batches,
        link_bw,
        link_lat,
        decode_idx,
        prefill_idx,
        params,
        fparams,
    )
    if counters[G_ERROR]:
        return None
    for name, col in _TABLE_INTS.items():
        np.frombuffer(getattr(table, name), dtype=np.int64)[:] = ri[:, col]
    for name, col in _TABLE_FLOATS.items():
        np.frombuffer(getattr(table, name), dtype=np.float64)[:] = rf[:, col]
    table.next_admit_seq = int(counters[G_ADMIT_SEQ])
    names = tuple(w.name for w in workers)
    rows = [_event_row(entry, names, int(params[1]), bt, table) for entry in log]
    if counters[G_DONE] != n or wi[:, W_INFLIGHT].any() or wi[:, W_B].any():
        raise RuntimeError(
            f"pdopt.sim internal error (compiled engine): {n - counters[G_DONE]} requests never "
            "ended; please report it with the inputs (engine='python' runs it meanwhile)"
        )
    # the engine's p.busy_until(end) + d.busy_until(end) with nothing in flight at the end
    busy = tuple(
        float(wf[w, V_PREFILL_BUSY]) + (float(wf[w, V_DECODE_BUSY]) + 0.0)
        for w in range(len(workers))
    )
    return CompiledOutcome(float(now), rows, busy, _timeseries(ts_i, ts_f, workers))


def _expected_ticks(arrival: np.ndarray, tick_s: float, open_loop: bool) -> int:
    """Ticks to allocate time-series rows for (they grow if the run lasts longer): an open
    loop lasts at least until its last arrival."""
    last = float(arrival[-1]) if open_loop and len(arrival) else 0.0
    return int(min(last / tick_s, 1e8)) + 64


def _timeseries(ts_i: np.ndarray, ts_f: np.ndarray, workers: Any) -> pd.DataFrame:
    """The time-series frame, with the dtypes the Python engine's records give."""
    if not ts_i.shape[1]:
        return pd.DataFrame.from_records([], columns=list(TIMESERIES_COLUMNS))
    w = ts_i[T_WORKER]
    label = {
        "worker": np.array([x.name for x in workers], dtype=object)[w],
        "pool": np.array([x.pool for x in workers], dtype=object)[w],
        "role": np.array([str(x.role) for x in workers], dtype=object)[w],
    }
    columns = {
        "t_s": ts_f[U_T],
        **label,
        "queue_len": ts_i[T_QUEUE_LEN],
        "queued_prefill_flop": ts_f[U_QUEUED_FLOP],
        "running": ts_i[T_RUNNING],
        "kv_used_blocks": ts_i[T_KV_USED],
        "kv_free_blocks": ts_i[T_KV_FREE],
        "kv_stranded_blocks": ts_i[T_KV_STRANDED],
        "busy_frac": ts_f[U_BUSY_FRAC],
        "power_w": ts_f[U_POWER],
    }
    # NOTE: copy=False keeps each column as its own block instead of copying them into one
    # (the arrays belong to this frame alone); it halves the build of a 10^6-row frame.
    return pd.DataFrame({name: columns[name] for name in TIMESERIES_COLUMNS}, copy=False)


def _event_row(
    entry: tuple[float, int, int, int, int, int],
    names: tuple[str, ...],
    max_kv: int,
    bt: int,
    table: Any,
) -> tuple[float, str, str, int, str]:
    """One event-log row, worded exactly as the Python engine logs it."""
    now, kind, worker, rid, a, b = entry
    name = names[worker] if worker >= 0 else ""
    if kind == LOG_PREEMPTION:
        return (now, "preemption", name, rid, f"generated={a}")
    if kind == LOG_FALSE_OOM:
        return (now, "false_oom", name, rid, f"need={a} free={b}")
    reason = (
        f"KV of {a} tokens exceeds the largest worker's {max_kv} tokens ({max_kv // bt} blocks)"
    )
    table.reason[rid] = reason
    return (now, "rejection", name, rid, reason)
