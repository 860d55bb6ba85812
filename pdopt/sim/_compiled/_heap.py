"""The compiled engine's two kinds of heap.

* The event heap, in ``(time, seq)`` order as the Python engine's kernel
  (:mod:`pdopt.sim._kernel`); a decode worker's one pending boundary event is indexed
  (``W_EVENT_POS``) so that it can be replaced, and a migration's one pending copy
  (``R_MIG_EVPOS``) so that a cancelled migration's copy can be removed.
* Each decode worker's finish heap: its running requests by ``(finish counter, admission seq)``
  (:class:`pdopt.sim._decode.DecodeSide`'s ``fin_heap``).

The event log's entries are written here too (:func:`put_log`), into State arrays that grow as
needed, so the handlers take no list argument.
"""

from __future__ import annotations

import math

import numpy as np

from pdopt.sim._compiled._jit import kernel
from pdopt.sim._compiled._state import (
    G_HEAP_N,
    G_LOG_N,
    G_SEQ,
    R_MIG_EVPOS,
    W_EVENT_POS,
    W_HEAP_N,
)
from pdopt.sim._enums import Event


# =============================================================================================
# The event log
# =============================================================================================
@kernel
def put_log(s, now, kind, worker, rid, a, b):
    """Append the log entry ``(now, kind, worker, rid, a, b)`` (``LOG_*`` kinds) to the run's
    event log, ``State.logt``/``logi``'s first ``g[G_LOG_N]`` rows (twice as long when full)."""
    n = s.g[G_LOG_N]
    if n >= s.logt.shape[0]:
        _grow_log(s, n)
    s.logt[n] = now
    row = s.logi[n]
    row[0], row[1], row[2], row[3], row[4] = kind, worker, rid, a, b
    s.g[G_LOG_N] = n + 1


@kernel
def _grow_log(s, n):
    """Replace the event log's ``n``-row arrays by ones twice as long holding the same rows
    (the State's fields are the reference's: compiled code reads them through ``s``)."""
    size = 2 * n + 64
    logt = np.empty(size, np.float64)
    logt[:n] = s.logt[:n]
    logi = np.empty((size, 5), np.int64)
    logi[:n] = s.logi[:n]
    s.logt = logt
    s.logi = logi


@kernel
def float_bits(x):
    """The IEEE 754 bits of ``x`` (0 or a positive normal float64) as an int64, without an
    array view (``struct.pack("<d", x)`` read as ``"<q"``): ``x = m·2**e`` with ``m`` in
    [0.5, 1) (math.frexp), so the biased exponent is ``e + 1022`` and the 52 stored mantissa
    bits are ``(2m − 1)·2**52``, an exact integer."""
    if x == 0.0:
        return 0
    m, e = math.frexp(x)
    return ((e + 1022) << 52) | int((2.0 * m - 1.0) * 4503599627370496.0)


# =============================================================================================
# The event heap
# =============================================================================================
@kernel
def schedule(s, t, kind, arg):
    """Push event ``kind`` (an :class:`Event`) with argument ``arg`` at ``t``; its seq."""
    seq = s.g[G_SEQ]
    s.g[G_SEQ] = seq + 1
    schedule_as(s, t, kind, arg, seq)
    return seq


@kernel
def schedule_as(s, t, kind, arg, seq):
    """Push event ``kind`` with argument ``arg`` at ``t`` under ``seq``, a sequence number taken
    earlier (the event's place among ties is where it was taken)."""
    n = s.g[G_HEAP_N]
    s.g[G_HEAP_N] = n + 1
    _place(s, n, t, seq, kind, arg)
    _sift(s, n, n + 1)


@kernel
def remove_event(s, k):
    """Remove the event in slot ``k`` (0: the earliest)."""
    ev_i = s.ev_i
    if ev_i[k, 1] == Event.DECODE:
        s.wi[ev_i[k, 2], W_EVENT_POS] = -1
    elif ev_i[k, 1] == Event.MIGRATION:
        s.ri[ev_i[k, 2], R_MIG_EVPOS] = -1
    n = s.g[G_HEAP_N] - 1
    s.g[G_HEAP_N] = n
    if k != n:
        _place(s, k, s.ev_t[n], ev_i[n, 0], ev_i[n, 1], ev_i[n, 2])
        _sift(s, k, n)


@kernel
def _place(s, k, t, seq, kind, arg):
    s.ev_t[k] = t
    ev_i = s.ev_i
    ev_i[k, 0] = seq
    ev_i[k, 1] = kind
    ev_i[k, 2] = arg
    if kind == Event.DECODE:
        s.wi[arg, W_EVENT_POS] = k
    elif kind == Event.MIGRATION:
        s.ri[arg, R_MIG_EVPOS] = k


@kernel
def _sift(s, k, n):
    """Restore heap order around slot ``k`` of a heap of ``n`` entries (up, then down)."""
    ev_t, ev_i = s.ev_t, s.ev_i
    t, seq, kind, arg = ev_t[k], ev_i[k, 0], ev_i[k, 1], ev_i[k, 2]
    while k > 0:
        p = (k - 1) >> 1
        if t < ev_t[p] or (t == ev_t[p] and seq < ev_i[p, 0]):
            _place(s, k, ev_t[p], ev_i[p, 0], ev_i[p, 1], ev_i[p, 2])
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
            _place(s, k, ev_t[c], ev_i[c, 0], ev_i[c, 1], ev_i[c, 2])
            k = c
        else:
            break
    _place(s, k, t, seq, kind, arg)


# =============================================================================================
# A decode worker's finish heap
# =============================================================================================
# NOTE: entries hold their keys (not just request ids): sifting then reads one worker's
# contiguous heap instead of request rows scattered over memory.
@kernel
def fin_push(s, j, counter, seq, rid):
    """Add ``rid``, leaving at boundary ``counter``, admitted as ``seq``, to worker ``j``."""
    n = s.wi[j, W_HEAP_N]
    heap = s.fin[j]
    heap[n, 0], heap[n, 1], heap[n, 2] = counter, seq, rid
    s.wi[j, W_HEAP_N] = n + 1
    _fin_sift(heap, n, n + 1)


@kernel
def fin_remove_at(s, j, k):
    """Remove entry ``k`` (0: the earliest) of worker ``j``'s finish heap."""
    n = s.wi[j, W_HEAP_N] - 1
    s.wi[j, W_HEAP_N] = n
    if k != n:
        heap = s.fin[j]
        heap[k, 0], heap[k, 1], heap[k, 2] = heap[n, 0], heap[n, 1], heap[n, 2]
        _fin_sift(heap, k, n)


@kernel
def fin_remove(s, j, rid):
    """Remove ``rid`` (a preemption: rare, so a scan of the worker's heap)."""
    heap = s.fin[j]
    for k in range(s.wi[j, W_HEAP_N]):
        if heap[k, 2] == rid:
            fin_remove_at(s, j, k)
            return


@kernel
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
