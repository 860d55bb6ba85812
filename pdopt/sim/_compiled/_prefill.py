"""A prefill worker's side, compiled (:mod:`pdopt.sim._prefill`), and the KV links.

A worker's FCFS queue is a linked list through the request rows (``R_QUEUE_NEXT``); its running
batch is its row of ``s.batches``. Every expression is written in the Python engine's order.
"""

from __future__ import annotations

from pdopt.sim._compiled._decode import enqueue_decode, unlink_queued
from pdopt.sim._compiled._heap import schedule
from pdopt.sim._compiled._jit import blocks_of, kernel, window_held_tokens
from pdopt.sim._compiled._prefix import (
    cached_tokens,
    hit_tokens,
    prefix_blocks,
    prefix_hit,
    prefix_take,
    release_prefix,
)
from pdopt.sim._compiled._state import (
    ERR_PREFILL_CAPACITY,
    ERR_UNSUPPORTED,
    F_PREFILL_FLOP,
    F_PREFILL_START,
    F_TRANSFER_END,
    F_TRANSFER_START,
    G_ERROR,
    G_PROMPT_NEED,
    G_STOPPED,
    R_ABORTING,
    R_CHUNK,
    R_DECODE_TARGET,
    R_DECODE_WORKER,
    R_DONE,
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
    W_ACCEPTING,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_CHUNK_N,
    W_COUNTED,
    W_HELD,
    W_INFLIGHT,
    W_MAX_SIZE,
    W_MAX_TOKENS,
    W_MIXED,
    W_PQ_HEAD,
    W_PQ_LEN,
    W_PQ_TAIL,
    W_PROMPTS,
    W_STEP,
)
from pdopt.sim._enums import Event, Step


@kernel
def holds_prompt(s, w):
    """Whether worker ``w``'s KV capacity holds the prompt being routed (``G_PROMPT_NEED``,
    set while ``route_prefill`` narrows the prefill workers to those; always true else)."""
    return s.wi[w, W_CAP] >= s.g[G_PROMPT_NEED]


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
    flop = work_flop(s, w, tokens)
    if s.ptoks:  # queued work (Φ_T's numerator) leaves out what the cache serves now
        flop -= work_flop(s, w, cached_tokens(s, w, rid))
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
    # a mixed worker's scheduler is poked by the caller (pdopt.sim._compiled._mixed.poke)
    if wi[w, W_MIXED] == 0 and wi[w, W_BATCH_N] == 0 and wi[w, W_B] == 0:
        start_prefill(s, w, now)


@kernel
def start_prefill(s, w, now):
    """Start a batch from the queue head when its KV fits; schedule its end. Blocks a
    migration holds here (the worker left the decode pool during its stop-and-copy) are not
    free: the head waits for them (Engine.start_prefill)."""
    ri = s.ri
    head = s.wi[w, W_PQ_HEAD]
    limit = s.wi[w, W_CAP] - s.wi[w, W_HELD]
    if blocks_of(s, ri[head, R_PREFILL_TOKENS]) > limit:
        return
    end = start_batch(s, w, now, limit, s.wi[w, W_MAX_SIZE])
    schedule(s, end, Event.PREFILL_DONE, w)


@kernel
def start_batch(s, w, now, limit, size):
    """PrefillSide.start_batch: a batch from the queue head within ``limit`` KV blocks and
    ``size`` requests, its prompts' start times set; returns its end."""
    rf = s.rf
    end = _start_batch(s, w, now, limit, size)
    for i in range(s.wi[w, W_BATCH_N]):
        rid = s.batches[w, i]
        if rf[rid, F_PREFILL_START] != rf[rid, F_PREFILL_START]:
            rf[rid, F_PREFILL_START] = now
    return end


@kernel
def end_batch(s, w):
    """Worker ``w``'s batch ended: count its busy time, clear it; its size (the requests stay
    in ``s.batches[w]``)."""
    wi, wf = s.wi, s.wf
    if wi[w, W_COUNTED]:
        wf[w, V_PREFILL_BUSY] += wf[w, V_BATCH_END] - wf[w, V_BATCH_START]
    size = wi[w, W_BATCH_N]
    wi[w, W_BATCH_N] = 0
    if wi[w, W_MIXED]:  # its batch's prompts were all it reserved
        wi[w, W_PROMPTS] = 0
    wf[w, V_BATCH_FLOP] = 0.0
    wi[w, W_INFLIGHT] = 0
    return size


@kernel
def prefill_wait_s(s, w, now):
    """WorkerModels.prefill_wait_s of worker ``w``: its outstanding prefill work over its
    P_peak, seconds (the policies' queueing delay of a new prompt)."""
    return outstanding_flop(s, w, now) / s.wf[w, V_P_PEAK]


@kernel
def predicted_prefill_s(s, w, length):
    """TtftModel.predict of worker ``w``'s TTFT predictor (the policy's own, State.ttft) at a
    prompt of ``length`` tokens (a float): ``a·l·l + b·l + c``, seconds."""
    return s.ttft[w, 0] * length * length + s.ttft[w, 1] * length + s.ttft[w, 2]


@kernel
def predicted_ttft_s(s, w, now, length):
    """WorkerModels.predicted_ttft_s of worker ``w``: its queueing delay plus the prompt's
    predicted prefill, seconds (Arrow Alg. 1, Mooncake, EcoServe)."""
    return prefill_wait_s(s, w, now) + predicted_prefill_s(s, w, length)


@kernel
def request_kv_blocks(s, rid):
    """RequestInfo.kv_blocks of ``rid``: the blocks of its prompt and its first token."""
    gen = s.ri[rid, R_GENERATED]
    return blocks_of(s, s.ri[rid, R_INPUT] + (gen if gen > 1 else 1))


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
    if src != dst:
        release_prefix(s, rid)  # the KV leaves src; its cached blocks stay there
    if src == dst:  # a worker decodes its own prompt: no transfer (Engine.transfer)
        if rf[rid, F_TRANSFER_START] != rf[rid, F_TRANSFER_START]:
            rf[rid, F_TRANSFER_START] = now
            rf[rid, F_TRANSFER_END] = now
        enqueue_decode(s, rid, now)
        # NOTE: the Python engine then wakes the worker, which ignores it: a mixed worker's step
        # is ending (Step.BUSY; its next step is chosen after the boundary that admits this
        # request), and a worker moved to decode admits only once its batch has ended, after
        # this (Engine.on_prefill_done)
        busy = s.wi[dst, W_STEP] == Step.BUSY if s.wi[dst, W_MIXED] else not s.wi[dst, W_ACCEPTING]
        if not busy:
            s.g[G_ERROR] = ERR_UNSUPPORTED
            s.g[G_STOPPED] = 1
        return
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
def _start_batch(s, w, now, limit, cap):
    """Form a batch from the queue head (FCFS, token budget, at most ``cap`` requests, at most
    ``limit`` KV blocks but for the head); return its end. Each prompt's prefix hit (its
    lookup evicts first) skips compute within the token budget and the work; the queued work
    leaves as it was queued."""
    ri, rf, wi, wf = s.ri, s.rf, s.wi, s.wf
    batch = s.batches[w]
    rid = wi[w, W_PQ_HEAD]
    wi[w, W_PQ_HEAD] = ri[rid, R_QUEUE_NEXT]
    wi[w, W_PQ_LEN] -= 1
    batch[0] = rid
    size = 1
    length = ri[rid, R_PREFILL_TOKENS]
    blocks = blocks_of(s, length)
    hit = prefix_hit(s, w, rid, limit - blocks)
    used = length - hit  # tokens computed
    queued = rf[rid, F_PREFILL_FLOP]
    work = work_flop(s, w, length) - work_flop(s, w, hit)
    while wi[w, W_PQ_LEN] > 0 and size < cap:
        rid = wi[w, W_PQ_HEAD]
        length = ri[rid, R_PREFILL_TOKENS]
        need = blocks_of(s, length)
        if blocks + need > limit:
            break
        n_hit = prefix_blocks(s, w, rid, limit - blocks - need)
        hit = hit_tokens(s, rid, n_hit)
        if used + length - hit > wi[w, W_MAX_TOKENS]:
            break
        wi[w, W_PQ_HEAD] = ri[rid, R_QUEUE_NEXT]
        wi[w, W_PQ_LEN] -= 1
        # Engine.prefix_hit(pin=True) again with the same free blocks: its match repeats the
        # one just made (no eviction, the same LRU order), so only the references are taken
        prefix_take(s, w, rid, n_hit, hit)
        batch[size] = rid
        size += 1
        used += length - hit
        blocks += need
        queued += rf[rid, F_PREFILL_FLOP]
        work += work_flop(s, w, length) - work_flop(s, w, hit)
    wf[w, V_QUEUED_FLOP] = wf[w, V_QUEUED_FLOP] - queued if wi[w, W_PQ_LEN] > 0 else 0.0
    wi[w, W_BATCH_N] = size
    wf[w, V_BATCH_FLOP] = work
    wf[w, V_BATCH_START] = now
    wf[w, V_BATCH_END] = now + wf[w, V_INTERCEPT] + work / wf[w, V_P_PEAK]
    wi[w, W_INFLIGHT] = 1
    wi[w, W_COUNTED] = 1
    if wi[w, W_MIXED]:  # the prompts' KV is reserved in the worker's one cache
        wi[w, W_PROMPTS] += blocks
    return wf[w, V_BATCH_END]


# =============================================================================================
# Chunked prefill (a mixed worker's hybrid schedule; PrefillSide.start_chunks / finish_chunks)
# =============================================================================================
@kernel
def work_flop(s, w, tokens):
    """PrefillSide.work_flop: ``alpha·l² + beta·P_m·l``."""
    wf = s.wf
    return wf[w, V_ALPHA] * tokens * tokens + wf[w, V_BETA_PM] * tokens


@kernel
def chunk_flop(s, w, done, tokens):
    """PrefillModel.chunk_work_flop: ``alpha·c·(2d + c) + beta·P_m·c``."""
    wf = s.wf
    return wf[w, V_ALPHA] * tokens * (2 * done + tokens) + wf[w, V_BETA_PM] * tokens


@kernel
def start_chunks(s, w, now, budget, kv_free, seats):
    """Choose this iteration's chunks within ``budget`` prefill tokens: the started prompts'
    first (``s.batches[w]``; the chunk is always a prefix of it, ``W_CHUNK_N`` long, its tokens
    in ``R_CHUNK``), then new prompts from the queue while their whole KV fits ``kv_free``
    blocks and ``seats`` allows; marks their start."""
    ri, rf, wi, wf = s.ri, s.rf, s.wi, s.wf
    batch = s.batches[w]
    work = 0.0
    skipped = 0.0
    left = budget
    k = 0
    for i in range(wi[w, W_BATCH_N]):
        if left <= 0:
            break
        rid = batch[i]
        d = ri[rid, R_DONE]
        c = ri[rid, R_PREFILL_TOKENS] - d
        c = c if c < left else left
        work += chunk_flop(s, w, d, c)
        ri[rid, R_CHUNK] = c
        k += 1
        left -= c
    reserved = 0
    while left > 0 and wi[w, W_PQ_LEN] > 0 and wi[w, W_BATCH_N] < wi[w, W_MAX_SIZE] and seats != 0:
        rid = wi[w, W_PQ_HEAD]
        length = ri[rid, R_PREFILL_TOKENS]
        need = blocks_of(s, length)
        if need > kv_free:
            break
        wi[w, W_PQ_HEAD] = ri[rid, R_QUEUE_NEXT]
        wi[w, W_PQ_LEN] -= 1
        kv_free -= need
        reserved += need
        seats -= 1
        batch[wi[w, W_BATCH_N]] = rid
        wi[w, W_BATCH_N] += 1
        hit = prefix_hit(s, w, rid, kv_free)
        ri[rid, R_DONE] = hit  # a prefix hit is prefilled already
        if rf[rid, F_PREFILL_START] != rf[rid, F_PREFILL_START]:
            rf[rid, F_PREFILL_START] = now
        c = length - hit if length - hit < left else left
        # the chunks subtract the work they compute; the rest of what was queued goes now
        skipped += rf[rid, F_PREFILL_FLOP] - (work_flop(s, w, length) - work_flop(s, w, hit))
        work += chunk_flop(s, w, hit, c)
        ri[rid, R_CHUNK] = c
        k += 1
        left -= c
    if reserved:
        wi[w, W_PROMPTS] += reserved
    remaining = k < wi[w, W_BATCH_N]
    for i in range(k):
        rid = batch[i]
        if ri[rid, R_PREFILL_TOKENS] - ri[rid, R_DONE] > ri[rid, R_CHUNK]:
            remaining = True
    if wi[w, W_PQ_LEN] > 0 or remaining:
        wf[w, V_QUEUED_FLOP] = wf[w, V_QUEUED_FLOP] - work - skipped
    else:
        wf[w, V_QUEUED_FLOP] = 0.0
    wi[w, W_CHUNK_N] = k
    wf[w, V_BATCH_FLOP] = work
    wf[w, V_BATCH_START] = now
    wi[w, W_INFLIGHT] = 1


@kernel
def finish_chunks(s, w):
    """Credit the chunk iteration in flight; the prompts it completed go to ``s.completed``
    (in order, their KV released); returns their count."""
    ri, wi, wf = s.ri, s.wi, s.wf
    batch = s.batches[w]
    count = 0
    freed = 0
    dropped = 0
    for i in range(wi[w, W_CHUNK_N]):
        rid = batch[i]
        d = ri[rid, R_DONE] + ri[rid, R_CHUNK]
        if d >= ri[rid, R_PREFILL_TOKENS]:
            ri[rid, R_DONE] = -1
            s.completed[count] = rid
            count += 1
            freed += blocks_of(s, ri[rid, R_PREFILL_TOKENS])
        else:
            ri[rid, R_DONE] = d
            if ri[rid, R_ABORTING]:  # its client gave up during the iteration: dropped now
                _forget(s, w, rid)
                release_prefix(s, rid)  # Colocated._release_dropped
                dropped += 1
                freed += blocks_of(s, ri[rid, R_PREFILL_TOKENS])
        ri[rid, R_ABORTING] = 0
    if count or dropped:
        kept = 0
        for i in range(wi[w, W_BATCH_N]):
            rid = batch[i]
            if ri[rid, R_DONE] >= 0:
                batch[kept] = rid
                kept += 1
        wi[w, W_BATCH_N] = kept
        wi[w, W_PROMPTS] -= freed
    if wi[w, W_COUNTED]:
        wf[w, V_PREFILL_BUSY] += wf[w, V_BATCH_END] - wf[w, V_BATCH_START]
    wi[w, W_CHUNK_N] = 0
    wf[w, V_BATCH_FLOP] = 0.0
    wi[w, W_INFLIGHT] = 0
    return count


# =============================================================================================
# Client timeouts (Engine._withdraw's prefill part; PrefillSide.withdraw, in_flight, drop)
# =============================================================================================
@kernel
def _forget(s, w, rid):
    """PrefillSide._forget: chunked prompt ``rid`` leaves ``done`` (``R_DONE`` -1) and its
    remaining work the queued work (``max(queued - chunk work, 0.0)``)."""
    ri, wf = s.ri, s.wf
    d = ri[rid, R_DONE]
    left = wf[w, V_QUEUED_FLOP] - chunk_flop(s, w, d, ri[rid, R_PREFILL_TOKENS] - d)
    wf[w, V_QUEUED_FLOP] = 0.0 if left < 0.0 else left
    ri[rid, R_DONE] = -1


@kernel
def batch_index(s, w, rid):
    """Where ``rid`` is in worker ``w``'s batch (a batch in flight, or its chunked prompts
    started); -1 when it is not there."""
    batch = s.batches[w]
    for i in range(s.wi[w, W_BATCH_N]):
        if batch[i] == rid:
            return i
    return -1


@kernel
def chunk_in_flight(s, w, i):
    """PrefillSide.in_flight of chunked prompt ``s.batches[w, i]``: its chunk is in the
    iteration in flight (the chunk is the batch's first ``W_CHUNK_N``)."""
    wi = s.wi
    if not wi[w, W_INFLIGHT]:
        return False
    return i < wi[w, W_CHUNK_N] if wi[w, W_CHUNK_N] > 0 else True


@kernel
def drop_chunked(s, w, i):
    """PrefillSide.drop of chunked prompt ``s.batches[w, i]`` (started, not in the step in
    flight; its client gave up): its remaining work leaves the queued work, it leaves the
    batch (the order kept) and its KV blocks free."""
    wi = s.wi
    batch = s.batches[w]
    rid = batch[i]
    _forget(s, w, rid)
    for k in range(i + 1, wi[w, W_BATCH_N]):
        batch[k - 1] = batch[k]
    wi[w, W_BATCH_N] -= 1
    wi[w, W_PROMPTS] -= blocks_of(s, s.ri[rid, R_PREFILL_TOKENS])


@kernel
def withdraw_prefill(s, w, rid):
    """PrefillSide.withdraw: take ``rid`` out of ``w``'s queue (its queued work leaves the
    queued work, which resets to 0.0 when the queue empties); -1 when it is not queued there,
    else whether it headed the queue (1) or not (0)."""
    wi, wf = s.wi, s.wf
    head = unlink_queued(s, w, rid, W_PQ_HEAD, W_PQ_TAIL, W_PQ_LEN)
    if head < 0:
        return -1
    if wi[w, W_PQ_LEN] > 0:
        rest = wf[w, V_QUEUED_FLOP] - s.rf[rid, F_PREFILL_FLOP]
        wf[w, V_QUEUED_FLOP] = 0.0 if rest < 0.0 else rest
    else:
        wf[w, V_QUEUED_FLOP] = 0.0
    return head
