"""A prefill worker's side, compiled (:mod:`pdopt.sim._prefill`), and the KV links.

A worker's FCFS queue is a linked list through the request rows (``R_QUEUE_NEXT``); its running
batch is its row of ``s.batches``. Every expression is written in the Python engine's order.
"""

from __future__ import annotations

from pdopt.sim._compiled._heap import schedule
from pdopt.sim._compiled._jit import blocks_of, kernel, window_held_tokens
from pdopt.sim._compiled._state import (
    ERR_PREFILL_CAPACITY,
    F_PREFILL_FLOP,
    F_PREFILL_START,
    F_TRANSFER_END,
    F_TRANSFER_START,
    G_ERROR,
    G_STOPPED,
    R_DECODE_TARGET,
    R_DECODE_WORKER,
    R_GENERATED,
    R_INPUT,
    R_PREFILL_TOKENS,
    R_PREFILL_WORKER,
    R_QUEUE_NEXT,
    V_ALPHA,
    V_BATCH_END,
    V_BATCH_FLOP,
    V_BATCH_START,
    V_BETA_PM,
    V_INTERCEPT,
    V_P_PEAK,
    V_PREFILL_BUSY,
    V_QUEUED_FLOP,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_INFLIGHT,
    W_MAX_SIZE,
    W_MAX_TOKENS,
    W_PQ_HEAD,
    W_PQ_LEN,
    W_PQ_TAIL,
)
from pdopt.sim._enums import Event


@kernel
def enqueue_prefill(s, rid, w, now, front):
    """Engine.route_prefill after routing: queue ``rid`` on worker ``w`` (at the tail, or at the
    head when ``front``) and start a batch when ``w`` is idle; stop the run when its KV cannot
    hold the prompt."""
    ri, wi, wf = s.ri, s.wi, s.wf
    tokens = ri[rid, R_INPUT] + ri[rid, R_GENERATED]
    if blocks_of(s, tokens) > wi[w, W_CAP]:
        s.g[G_ERROR] = ERR_PREFILL_CAPACITY
        s.g[G_STOPPED] = 1
        return
    if ri[rid, R_PREFILL_WORKER] < 0:
        ri[rid, R_PREFILL_WORKER] = w
    ri[rid, R_PREFILL_TOKENS] = tokens
    flop = wf[w, V_ALPHA] * tokens * tokens + wf[w, V_BETA_PM] * tokens
    s.rf[rid, F_PREFILL_FLOP] = flop
    if wi[w, W_PQ_LEN] == 0:
        ri[rid, R_QUEUE_NEXT] = -1
        wi[w, W_PQ_HEAD] = rid
        wi[w, W_PQ_TAIL] = rid
    elif front:
        ri[rid, R_QUEUE_NEXT] = wi[w, W_PQ_HEAD]
        wi[w, W_PQ_HEAD] = rid
    else:
        ri[rid, R_QUEUE_NEXT] = -1
        ri[wi[w, W_PQ_TAIL], R_QUEUE_NEXT] = rid
        wi[w, W_PQ_TAIL] = rid
    wi[w, W_PQ_LEN] += 1
    wf[w, V_QUEUED_FLOP] += flop
    if wi[w, W_BATCH_N] == 0 and wi[w, W_B] == 0:
        start_prefill(s, w, now)


@kernel
def start_prefill(s, w, now):
    """Start a batch from the queue head when its KV fits; schedule its end."""
    ri, rf = s.ri, s.rf
    head = s.wi[w, W_PQ_HEAD]
    if blocks_of(s, ri[head, R_PREFILL_TOKENS]) > s.wi[w, W_CAP]:
        return
    end = _start_batch(s, w, now)
    for i in range(s.wi[w, W_BATCH_N]):
        rid = s.batches[w, i]
        if rf[rid, F_PREFILL_START] != rf[rid, F_PREFILL_START]:
            rf[rid, F_PREFILL_START] = now
    schedule(s, end, Event.PREFILL_DONE, w)


@kernel
def end_batch(s, w):
    """Worker ``w``'s batch ended: count its busy time, clear it; its size (the requests stay
    in ``s.batches[w]``)."""
    wi, wf = s.wi, s.wf
    wf[w, V_PREFILL_BUSY] += wf[w, V_BATCH_END] - wf[w, V_BATCH_START]
    size = wi[w, W_BATCH_N]
    wi[w, W_BATCH_N] = 0
    wf[w, V_BATCH_FLOP] = 0.0
    wi[w, W_INFLIGHT] = 0
    return size


@kernel
def outstanding_flop(s, w, now):
    """Queued prefill work plus the running batch's unfinished share, FLOP (PrefillSide)."""
    wi, wf = s.wi, s.wf
    if wi[w, W_INFLIGHT] == 0:
        return wf[w, V_QUEUED_FLOP]
    span = wf[w, V_BATCH_END] - wf[w, V_BATCH_START]
    left = (wf[w, V_BATCH_END] - now) / span if span > 0 else 0.0
    return wf[w, V_QUEUED_FLOP] + wf[w, V_BATCH_FLOP] * clip01(left)


@kernel
def clip01(x):
    """Python's ``min(1.0, max(0.0, x))``, including which zero it returns."""
    x = x if x > 0.0 else 0.0
    return x if x < 1.0 else 1.0


@kernel
def transfer(s, rid, src, dst, now):
    """Send ``rid``'s KV from ``src`` to ``dst`` over their FIFO link; schedule its landing."""
    ri, rf, link_free = s.ri, s.rf, s.link_free
    ri[rid, R_DECODE_TARGET] = dst
    if ri[rid, R_DECODE_WORKER] < 0:
        ri[rid, R_DECODE_WORKER] = dst
    start = now if now > link_free[src, dst] else link_free[src, dst]
    tokens = ri[rid, R_PREFILL_TOKENS]
    if s.kv_window > 0:  # the sliding layers send their window only (Engine.transfer)
        held = window_held_tokens(tokens, s.kv_window, s.kv_sliding_layers, s.kv_layers)
        wire = held * s.kv_bytes / s.link_bw[src, dst]
    else:
        wire = tokens * s.kv_bytes / s.link_bw[src, dst]
    link_free[src, dst] = start + wire
    end = start + s.link_lat[src, dst] + wire
    if rf[rid, F_TRANSFER_START] != rf[rid, F_TRANSFER_START]:
        rf[rid, F_TRANSFER_START] = start
        rf[rid, F_TRANSFER_END] = end
    schedule(s, end, Event.TRANSFER_DONE, rid)


@kernel
def _start_batch(s, w, now):
    """Form a batch from the queue head (FCFS, token budget, batch cap, KV); return its end."""
    ri, rf, wi, wf = s.ri, s.rf, s.wi, s.wf
    batch = s.batches[w]
    rid = wi[w, W_PQ_HEAD]
    wi[w, W_PQ_HEAD] = ri[rid, R_QUEUE_NEXT]
    wi[w, W_PQ_LEN] -= 1
    batch[0] = rid
    size = 1
    used = ri[rid, R_PREFILL_TOKENS]
    limit = wi[w, W_CAP]
    blocks = blocks_of(s, used)
    work = rf[rid, F_PREFILL_FLOP]
    while wi[w, W_PQ_LEN] > 0 and size < wi[w, W_MAX_SIZE]:
        rid = wi[w, W_PQ_HEAD]
        length = ri[rid, R_PREFILL_TOKENS]
        need = blocks_of(s, length)
        if used + length > wi[w, W_MAX_TOKENS] or blocks + need > limit:
            break
        wi[w, W_PQ_HEAD] = ri[rid, R_QUEUE_NEXT]
        wi[w, W_PQ_LEN] -= 1
        batch[size] = rid
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
