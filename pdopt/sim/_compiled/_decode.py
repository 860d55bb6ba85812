"""A decode worker's side, compiled: :class:`pdopt.sim._decode.DecodeSide`'s control flow over
worker ``j``'s rows of the :class:`State`.

The closed forms (boundary times, boundaries before ``t``, KV growth, the first growth failure)
are :mod:`pdopt.sim._closed_form`'s functions compiled (:mod:`pdopt.sim._compiled._jit`); this
module only reads their inputs from the worker's columns (with a sliding window, the running
requests' KV offsets gathered into ``s.offsets`` by :func:`running_offsets`). A worker with
``kv_allocation = "reserve_output"`` (``W_RESERVE``) holds each running request's whole
reservation (:func:`blocks_for`): its blocks never grow, so it has no growth to count. The
running batch is a linked list through the request rows (``R_RUN_PREV``/``R_RUN_NEXT``,
admission order: the tail is the youngest), the admission queue another (``R_QUEUE_NEXT``).
"""

from __future__ import annotations

import math

from pdopt.sim._closed_form import NEVER
from pdopt.sim._compiled._heap import (
    fin_push,
    fin_remove,
    fin_remove_at,
    remove_event,
    schedule,
    schedule_as,
)
from pdopt.sim._compiled._jit import (
    blocks_of,
    boundaries_before,
    boundary_time,
    expert_coverage,
    first_boundary_after,
    first_growth_failure,
    growth,
    kernel,
    segment_slopes,
    used_blocks_span,
    window_first_growth_failure,
    window_growth,
    window_used_blocks_span,
)
from pdopt.sim._compiled._prefix import release_prefix
from pdopt.sim._compiled._state import (
    F_READY,
    G_ADMIT_SEQ,
    G_DROP_N,
    G_N_MIGS,
    G_SEQ,
    R_ABORTING,
    R_ADMIT_SEQ,
    R_DECODE_TARGET,
    R_GENERATED,
    R_INPUT,
    R_KV_OFFSET,
    R_MIG_DEPART_AT,
    R_MIG_DST,
    R_MIG_HELD,
    R_MIG_ORDER,
    R_MIG_PHASE,
    R_MIG_SRC,
    R_OUTPUT,
    R_PREFILL_TOKENS,
    R_QUEUE_NEXT,
    R_RUN_NEXT,
    R_RUN_PREV,
    V_A_SEG,
    V_BUSY_SINCE,
    V_D0,
    V_D1,
    V_D2,
    V_D3,
    V_DECODE_BUSY,
    V_EXPERTS,
    V_EXPERTS_PER_TOKEN,
    V_HALF_D2B,
    V_T_SEG,
    V_USED_SINCE,
    V_USED_UNTIL,
    W_ABORTING,
    W_ACCEPTING,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_DEFER_SEQ,
    W_DQ_HEAD,
    W_DQ_LEN,
    W_DQ_NEED,
    W_DQ_TAIL,
    W_EVENT_POS,
    W_HEAP_N,
    W_HELD,
    W_MAX_RUNNING,
    W_MIXED,
    W_N_SEG,
    W_NEXT_N,
    W_PROMPTS,
    W_RESERVE,
    W_RUN_HEAD,
    W_RUN_TAIL,
    W_S,
    W_SEG_SERIAL,
    W_SLOTS_HELD,
    W_SNAP_M,
    W_SNAP_OUT,
    W_SNAP_SEQ,
    W_U_SEG,
    W_USED,
)
from pdopt.sim._enums import Event, MigrationPhase


@kernel
def decode_limit(s, j):
    """Blocks worker ``j``'s running batch may hold (KvBlocks.decode_limit): its capacity, less
    the blocks migrations hold and the prompts a mixed worker has in prefill (one cache for both
    phases)."""
    wi = s.wi
    limit = wi[j, W_CAP] - wi[j, W_HELD]
    return limit - wi[j, W_PROMPTS] if wi[j, W_MIXED] else limit


@kernel
def kv_used(s, j, now):
    """ClusterView.kv_used_blocks of worker ``j`` at ``now`` (KvBlocks.in_use): its running
    decodes' blocks, the blocks migrations hold and its prompts in prefill (a mixed worker's,
    or the running batch of a prefill worker or of one moved to decode)."""
    wi = s.wi
    used = used_blocks_at(s, j, now) + wi[j, W_HELD]
    if wi[j, W_MIXED]:
        return used + wi[j, W_PROMPTS]
    for i in range(wi[j, W_BATCH_N]):
        used += blocks_of(s, s.ri[s.batches[j, i], R_PREFILL_TOKENS])
    return used


@kernel
def iteration_s(s, j, b, context):
    """DecodeModel.iteration_time_s(b, context) of worker ``j`` as the policies evaluate it (one
    B and C, floats): ``d0 + d1·B + d2·C``, then ``+ d3·cover(B)`` for an MoE model (a float
    power, the C library's ``pow`` in both), seconds."""
    wf = s.wf
    linear = wf[j, V_D0] + wf[j, V_D1] * b + wf[j, V_D2] * context
    return linear + expert_s(s, j, b) if wf[j, V_D3] > 0.0 else linear


@kernel
def expert_s(s, j, b):
    """DecodeModel.expert_time_s(b) of worker ``j`` (one B): ``d3·cover(B)``, 0 for a dense
    model, seconds."""
    wf = s.wf
    if wf[j, V_D3] > 0.0:
        return wf[j, V_D3] * expert_coverage(b, wf[j, V_EXPERTS], wf[j, V_EXPERTS_PER_TOKEN])
    return 0.0


@kernel
def kv_free(s, j, now):
    """ClusterView.kv_free_blocks of worker ``j`` at ``now``: its capacity less
    :func:`kv_used`, at least 0."""
    free = s.wi[j, W_CAP] - kv_used(s, j, now)
    return free if free > 0 else 0


@kernel
def blocks_for(s, j, rid, context):
    """DecodeSide.blocks_for: KV blocks ``rid`` holds on worker ``j`` with ``context`` tokens,
    ``kv_blocks(context)``; on a worker that reserves (``W_RESERVE``) its whole reservation
    ``kv_blocks(input + output − 1)`` whatever its context."""
    if s.wi[j, W_RESERVE]:
        context = s.ri[rid, R_INPUT] + s.ri[rid, R_OUTPUT] - 1
    return blocks_of(s, context)


@kernel
def admission_blocks(s, j, rid):
    """DecodeSide.admission_blocks: KV blocks ``rid`` (prompt + tokens generated so far) needs
    to be admitted to worker ``j``'s running batch (:func:`blocks_for`)."""
    return blocks_for(s, j, rid, s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED])


# =============================================================================================
# Closed forms of worker j's current segment
# =============================================================================================
@kernel
def time_at(s, j, n):
    """Time of boundary ``n`` of worker ``j`` (DecodeSide.time_at)."""
    wf = s.wf
    return boundary_time(wf[j, V_T_SEG], wf[j, V_A_SEG], wf[j, V_HALF_D2B], n - s.wi[j, W_N_SEG])


@kernel
def running_offsets(s, j):
    """Put worker ``j``'s running requests' KV offsets in ``s.offsets[:b]`` (admission order,
    as DecodeSide.running's values)."""
    ri = s.ri
    rid = s.wi[j, W_RUN_HEAD]
    i = 0
    while rid >= 0:
        s.offsets[i] = ri[rid, R_KV_OFFSET]
        i += 1
        rid = ri[rid, R_RUN_NEXT]


@kernel
def _growth(s, j, m1, m2):
    """Blocks worker ``j``'s running requests gain at boundaries ``m1..m2`` (DecodeSide.growth;
    none when it reserves)."""
    if s.wi[j, W_RESERVE]:
        return 0
    b = s.wi[j, W_B]
    if s.kv_sliding_layers > 0:
        running_offsets(s, j)
        return window_growth(
            s.offsets, b, s.bt, s.kv_window, s.kv_sliding_layers, s.kv_layers, m1, m2
        )
    return growth(s.cnt[j], b, s.bt, m1, m2)


@kernel
def used_blocks_at(s, j, t):
    """KV blocks worker ``j``'s running requests hold at ``t`` (DecodeSide.used_blocks).

    Read 20 times a routed request and a control tick under Phasor: the value is kept with the
    span of time it holds over (between two boundaries of the segment; with a sliding window
    too, where computing it walks the running requests), and every change to the segment or
    the running set calls :func:`forget_used`. A worker that reserves holds its boundary's
    blocks all segment long."""
    wi, wf = s.wi, s.wf
    if wi[j, W_RESERVE]:
        return wi[j, W_U_SEG]
    if wf[j, V_USED_SINCE] <= t < wf[j, V_USED_UNTIL]:
        return wi[j, W_USED]
    if s.kv_sliding_layers > 0:
        running_offsets(s, j)
        used, since, until = window_used_blocks_span(
            s.offsets, wi[j, W_B], s.bt, s.kv_window, s.kv_sliding_layers,
            s.kv_layers, wi[j, W_N_SEG], wi[j, W_U_SEG],
            wf[j, V_T_SEG], wf[j, V_A_SEG], wf[j, V_HALF_D2B], t,
        )  # fmt: skip
    else:
        used, since, until = used_blocks_span(
            s.cnt[j], wi[j, W_B], s.bt, wi[j, W_N_SEG], wi[j, W_U_SEG],
            wf[j, V_T_SEG], wf[j, V_A_SEG], wf[j, V_HALF_D2B], t,
        )  # fmt: skip
    wi[j, W_USED] = used
    wf[j, V_USED_SINCE] = since
    wf[j, V_USED_UNTIL] = until
    return used


@kernel
def forget_used(s, j):
    """Worker ``j``'s segment or running set changed: :func:`used_blocks_at` reads it anew (and
    the count of such changes, W_SEG_SERIAL, moves on)."""
    s.wf[j, V_USED_UNTIL] = -math.inf
    s.wi[j, W_SEG_SERIAL] += 1


# =============================================================================================
# Requests arrive; boundaries are scheduled
# =============================================================================================
@kernel
def enqueue_decode(s, rid, now):
    """A transfer landed: ``rid`` joins its decode worker's admission queue; returns it."""
    ri, wi = s.ri, s.wi
    j = ri[rid, R_DECODE_TARGET]
    s.rf[rid, F_READY] = now
    ri[rid, R_QUEUE_NEXT] = -1
    if wi[j, W_DQ_LEN] == 0:
        wi[j, W_DQ_HEAD] = rid
    else:
        ri[wi[j, W_DQ_TAIL], R_QUEUE_NEXT] = rid
    wi[j, W_DQ_TAIL] = rid
    wi[j, W_DQ_LEN] += 1
    wi[j, W_DQ_NEED] += blocks_of(s, ri[rid, R_INPUT] + ri[rid, R_GENERATED])
    return j


@kernel
def advance_boundary(s, j, now):
    """Visit busy worker ``j`` at its first boundary from ``now`` on, if that is earlier than
    the one scheduled (the scheduled event is replaced: the Python engine skips it when due)."""
    wi, wf = s.wi, s.wf
    k = first_boundary_after(wf[j, V_T_SEG], wf[j, V_A_SEG], wf[j, V_HALF_D2B], now)
    n = wi[j, W_N_SEG] + k
    if n < wi[j, W_NEXT_N]:
        visit_at(s, j, n)


@kernel
def schedule_boundary(s, j):
    """Schedule worker ``j``'s next boundary that needs a visit: the first finish, departure
    of a migrating request or growth failure (DecodeSide.next_event_counter); none when
    idle."""
    if s.wi[j, W_B] == 0:
        s.wi[j, W_NEXT_N] = -1
        return
    schedule(s, time_at(s, j, next_boundary(s, j)), Event.DECODE, j)


@kernel
def defer_boundary(s, j):
    """:func:`schedule_boundary` for a mixed worker at a boundary, whose next step decides:
    only its sequence number is taken now (the Python engine schedules the boundary here and
    leaves it stale when a hybrid iteration or a stall replaces it); :func:`place_deferred`
    pushes it if the step keeps it."""
    if s.wi[j, W_B] == 0:
        s.wi[j, W_NEXT_N] = -1
        return
    s.wi[j, W_DEFER_SEQ] = s.g[G_SEQ]
    s.g[G_SEQ] += 1


@kernel
def place_deferred(s, j, seq):
    """Push the boundary :func:`defer_boundary` decided under its sequence number ``seq``
    (worker ``j``'s decode side has not changed since: nothing runs between)."""
    schedule_as(s, time_at(s, j, next_boundary(s, j)), Event.DECODE, j, seq)


@kernel
def next_boundary(s, j):
    """The boundary :func:`schedule_boundary` schedules (set as ``W_NEXT_N``); ``j`` runs."""
    wi = s.wi
    fin = s.fin[j, 0, 0]
    for i in range(s.g[G_N_MIGS]):  # a migrating request leaves at its stop-and-copy boundary
        at = s.ri[s.migs[i], R_MIG_DEPART_AT]
        if at >= 0 and at < fin and s.ri[s.migs[i], R_MIG_SRC] == j:
            fin = at
    fail = _growth_failure(s, j)
    n = fin if fin < fail else fail
    wi[j, W_NEXT_N] = n
    return n


@kernel
def _growth_failure(s, j):
    """The first boundary of worker ``j``'s segment where its batch's growth exceeds its KV
    limit (``NEVER``: none; DecodeSide._first_growth_failure: a worker that reserves has no
    growth, so the next boundary when its blocks are already over the limit, else ``NEVER``)."""
    wi = s.wi
    free = decode_limit(s, j) - wi[j, W_U_SEG]
    if wi[j, W_RESERVE]:
        return wi[j, W_N_SEG] + 1 if free < 0 else NEVER
    if s.kv_sliding_layers > 0:
        running_offsets(s, j)
        return window_first_growth_failure(
            s.offsets, wi[j, W_B], s.bt, s.kv_window, s.kv_sliding_layers, s.kv_layers,
            wi[j, W_N_SEG], free,
        )  # fmt: skip
    return first_growth_failure(s.cnt[j], wi[j, W_B], s.bt, wi[j, W_N_SEG], free)


@kernel
def visit_at(s, j, n):
    """Visit busy worker ``j`` at boundary ``n`` instead of the one scheduled (which is removed
    from the heap; the Python engine skips it when due)."""
    wi = s.wi
    if wi[j, W_EVENT_POS] >= 0:
        remove_event(s, wi[j, W_EVENT_POS])
    wi[j, W_NEXT_N] = n
    schedule(s, time_at(s, j, n), Event.DECODE, j)


@kernel
def tighten(s, j):
    """Worker ``j``'s KV limit shrank (a migration holds blocks there): visit the boundary where
    growth now fails, if earlier than the one scheduled (Migrations._tighten)."""
    wi = s.wi
    if wi[j, W_B] == 0:
        return
    m = _growth_failure(s, j)
    if m != NEVER and (wi[j, W_NEXT_N] < 0 or m < wi[j, W_NEXT_N]):
        visit_at(s, j, m)


@kernel
def counter_at(s, j, t):
    """The iteration counter worker ``j`` runs at time ``t`` (DecodeSide.counter_at)."""
    wi, wf = s.wi, s.wf
    if wi[j, W_B] == 0:
        return wi[j, W_N_SEG]
    return wi[j, W_N_SEG] + boundaries_before(wf[j, V_T_SEG], wf[j, V_A_SEG], wf[j, V_HALF_D2B], t)


# =============================================================================================
# One boundary (DecodeSide.boundary)
# =============================================================================================
L_FIN, L_PRE, L_ADM, L_DEP, L_JOIN, L_DROP = range(6)
"""Rows of a boundary's out lists (``State.lists[depth]``): requests that finished, were
preempted, were admitted, departed (a migration's stop-and-copy starts) and joined (a migration
ends) at it, and those it dropped (their clients gave up) left for the engine to release
(``G_DROP_N`` of them, :func:`_drop`)."""


@kernel
def boundary(s, j, n, t, out):
    """Process boundary ``n`` of worker ``j`` at ``t``: finishes, preemptions, departures and
    joins of migrations, admissions (ids in ``out``'s rows, module L_*); (finished, preempted,
    admitted, departed, joined counts, the blocked head's id: -1 when none waits for KV).

    NOTE: growth at ``n`` must fit before a departing request's blocks turn into a hold (a
    departure at ``n`` keeps the block it grew at ``n``), so departures follow preemption."""
    wi, wf = s.wi, s.wf
    used = wi[j, W_U_SEG] + _growth(s, j, wi[j, W_N_SEG] + 1, n)
    was_busy = wi[j, W_B] > 0
    used, n_fin = _complete(s, j, n, used, out[L_FIN])
    if wi[j, W_ABORTING]:
        used = _drop(s, j, n, used, out[L_DROP])
    used, n_pre = _preempt(s, j, n, used, out[L_PRE])
    n_dep, n_join = 0, 0
    if s.g[G_N_MIGS] > 0:
        used, n_dep = _depart(s, j, n, used, out[L_DEP])
        used, n_join = _join(s, j, n, used, out[L_JOIN])
    n_adm, blocked = 0, -1
    if wi[j, W_ACCEPTING]:
        used, n_adm, blocked = _admit(s, j, n, used, out[L_ADM])
    b = wi[j, W_B]
    wi[j, W_N_SEG] = n
    wf[j, V_T_SEG] = t
    wi[j, W_U_SEG] = used
    wf[j, V_A_SEG], wf[j, V_HALF_D2B] = segment_slopes(
        wf[j, V_D0],
        wf[j, V_D1],
        wf[j, V_D2],
        wf[j, V_D3],
        wf[j, V_EXPERTS],
        wf[j, V_EXPERTS_PER_TOKEN],
        b,
        wi[j, W_S],
        n,
    )
    forget_used(s, j)
    if was_busy and b == 0:
        wf[j, V_DECODE_BUSY] += t - wf[j, V_BUSY_SINCE]
    elif not was_busy and b > 0:
        wf[j, V_BUSY_SINCE] = t
    return n_fin, n_pre, n_adm, n_dep, n_join, blocked


@kernel
def _complete(s, j, n, used, finished):
    """Requests whose last token came at ``n`` leave; (used blocks, count)."""
    ri, heap = s.ri, s.fin[j]
    count = 0
    while s.wi[j, W_HEAP_N] > 0 and heap[0, 0] <= n:
        rid = heap[0, 2]
        fin_remove_at(s, j, 0)
        _left_snapshot(s, j, rid)
        ri[rid, R_ADMIT_SEQ] = -1
        used -= _leave(s, j, rid, n)
        ri[rid, R_GENERATED] = ri[rid, R_OUTPUT]
        finished[count] = rid
        count += 1
    return used, count


@kernel
def _drop(s, j, n, used, dropped):
    """DecodeSide._drop: the running requests whose clients gave up (``R_ABORTING``) leave at
    ``n``, in admission order (their blocks free, their tokens so far recorded), and
    Engine._dropped: their cached blocks' references go; used blocks. Those that finished at
    ``n`` left with the finished ones. From the first with a migration on (Phasor started it
    after the abort), they are listed in ``dropped`` (``G_DROP_N``) instead: the engine releases
    their blocks and cancels their migrations after the boundary, in this order
    (pdopt.sim._compiled._loop._boundary_start; a cancel may wake another worker)."""
    ri = s.ri
    count = 0
    rid = s.wi[j, W_RUN_HEAD]
    while rid >= 0:
        nxt = ri[rid, R_RUN_NEXT]
        if ri[rid, R_ABORTING]:
            ri[rid, R_ABORTING] = 0
            used -= _stop_running(s, j, rid, n)
            if count or ri[rid, R_MIG_PHASE] >= 0:
                dropped[count] = rid
                count += 1
            else:
                release_prefix(s, rid)
        rid = nxt
    s.wi[j, W_ABORTING] = 0
    s.g[G_DROP_N] = count
    return used


@kernel
def abort_running(s, j, rid):
    """DecodeSide.abort: ``rid`` runs on ``j``: True, and it leaves at the next boundary ``j``
    processes (the caller makes sure one is visited); False when it does not run there."""
    ri = s.ri
    k = s.wi[j, W_RUN_HEAD]
    while k >= 0 and k != rid:
        k = ri[k, R_RUN_NEXT]
    if k < 0:
        return False
    ri[rid, R_ABORTING] = 1
    s.wi[j, W_ABORTING] += 1
    return True


@kernel
def withdraw_decode(s, j, rid):
    """DecodeSide.withdraw: take ``rid`` out of ``j``'s admission queue (its client gave up; a
    queued request holds no blocks here); -1 when it is not queued there, else whether it
    headed the queue (1) or not (0)."""
    head = unlink_queued(s, j, rid, W_DQ_HEAD, W_DQ_TAIL, W_DQ_LEN)
    if head >= 0:
        s.wi[j, W_DQ_NEED] -= blocks_of(s, s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED])
    return head


@kernel
def unlink_queued(s, w, rid, head_col, tail_col, len_col):
    """Take ``rid`` out of worker ``w``'s queue threaded through ``R_QUEUE_NEXT`` whose head,
    tail and length are the columns ``head_col``, ``tail_col``, ``len_col`` (the admission
    queue's or the prefill queue's); -1 when it is not queued there, else whether it headed
    the queue (1) or not (0)."""
    ri, wi = s.ri, s.wi
    prev, k, left = -1, wi[w, head_col], wi[w, len_col]
    while left > 0 and k != rid:
        prev = k
        k = ri[k, R_QUEUE_NEXT]
        left -= 1
    if left == 0:
        return -1
    nxt = ri[rid, R_QUEUE_NEXT]
    if prev < 0:
        wi[w, head_col] = nxt
    else:
        ri[prev, R_QUEUE_NEXT] = nxt
    if wi[w, tail_col] == rid:
        wi[w, tail_col] = prev
    wi[w, len_col] -= 1
    return 1 if prev < 0 else 0


@kernel
def _preempt(s, j, n, used, preempted):
    """While the growth does not fit, the youngest running request is preempted (recompute);
    (used blocks, count)."""
    wi = s.wi
    count = 0
    limit = decode_limit(s, j)
    while used > limit and wi[j, W_B] > 0:
        rid = wi[j, W_RUN_TAIL]
        used -= _stop_running(s, j, rid, n)
        preempted[count] = rid
        count += 1
    return used, count


@kernel
def _admit(s, j, n, used, admitted):
    """Admit from the queue head while KV and the batch cap (less the slots promised to
    migrations) allow; (used, count, blocked id)."""
    ri, wi = s.ri, s.wi
    count = 0
    limit = decode_limit(s, j)
    while wi[j, W_DQ_LEN] > 0 and wi[j, W_B] < wi[j, W_MAX_RUNNING] - wi[j, W_SLOTS_HELD]:
        rid = wi[j, W_DQ_HEAD]
        context = ri[rid, R_INPUT] + ri[rid, R_GENERATED]
        need = blocks_for(s, j, rid, context)
        if used + need > limit:
            return used, count, rid
        wi[j, W_DQ_HEAD] = ri[rid, R_QUEUE_NEXT]
        wi[j, W_DQ_LEN] -= 1
        # W_DQ_NEED counts kv_blocks(context) (enqueue_decode), not a reservation
        wi[j, W_DQ_NEED] -= blocks_of(s, context) if wi[j, W_RESERVE] else need
        _insert(s, j, rid, context, n)
        used += need
        admitted[count] = rid
        count += 1
    return used, count, -1


@kernel
def _insert(s, j, rid, context, n):
    """Add ``rid`` with ``context`` tokens to worker ``j``'s running batch (its youngest) at
    boundary ``n`` (DecodeSide._insert)."""
    ri, wi = s.ri, s.wi
    o = context - n
    ri[rid, R_KV_OFFSET] = o
    seq = s.g[G_ADMIT_SEQ]
    s.g[G_ADMIT_SEQ] = seq + 1
    ri[rid, R_ADMIT_SEQ] = seq
    fin_push(s, j, n + ri[rid, R_OUTPUT] - ri[rid, R_GENERATED], seq, rid)
    tail = wi[j, W_RUN_TAIL]
    ri[rid, R_RUN_PREV] = tail
    ri[rid, R_RUN_NEXT] = -1
    if tail >= 0:
        ri[tail, R_RUN_NEXT] = rid
    else:
        wi[j, W_RUN_HEAD] = rid
    wi[j, W_RUN_TAIL] = rid
    s.cnt[j, (1 - o) % s.bt] += 1
    wi[j, W_S] += o
    wi[j, W_B] += 1
    forget_used(s, j)


@kernel
def _by_phase_order(s, ids, count):
    """Sort ``ids[:count]`` by the order their migrations entered their phase (insertion: a
    boundary has few)."""
    ri = s.ri
    for a in range(1, count):
        rid = ids[a]
        b = a
        while b > 0 and ri[ids[b - 1], R_MIG_ORDER] > ri[rid, R_MIG_ORDER]:
            ids[b] = ids[b - 1]
            b -= 1
        ids[b] = rid


@kernel
def _depart(s, j, n, used, departed):
    """DecodeSide._depart: the requests due to leave ``j`` at or before ``n`` (in the order
    they became due) stop decoding; their blocks stay held until their stop-and-copy ends. One
    that finished or was preempted here is only taken off the departing list."""
    ri = s.ri
    due = 0
    for i in range(s.g[G_N_MIGS]):
        rid = s.migs[i]
        at = ri[rid, R_MIG_DEPART_AT]
        if ri[rid, R_MIG_SRC] == j and at >= 0 and at <= n:
            departed[due] = rid
            due += 1
    _by_phase_order(s, departed, due)
    count = 0
    for i in range(due):
        rid = departed[i]
        ri[rid, R_MIG_DEPART_AT] = -1
        if ri[rid, R_ADMIT_SEQ] < 0:
            continue  # it finished or was preempted here: the migration is cancelled
        blocks = _stop_running(s, j, rid, n)
        used -= blocks
        s.wi[j, W_HELD] += blocks  # the migration holds them until its stop-and-copy ends
        departed[count] = rid
        count += 1
    return used, count


@kernel
def _join(s, j, n, used, joined):
    """DecodeSide._join: the migrated requests copied in join ``j``'s running batch (in the
    order their copies ended); their held blocks and promised slots become ordinary use."""
    ri, wi = s.ri, s.wi
    count = 0
    for i in range(s.g[G_N_MIGS]):
        rid = s.migs[i]
        if ri[rid, R_MIG_PHASE] == MigrationPhase.JOINING and ri[rid, R_MIG_DST] == j:
            joined[count] = rid
            count += 1
    _by_phase_order(s, joined, count)
    for i in range(count):
        rid = joined[i]
        wi[j, W_HELD] -= ri[rid, R_MIG_HELD]
        wi[j, W_SLOTS_HELD] -= 1
        context = ri[rid, R_INPUT] + ri[rid, R_GENERATED]
        used += blocks_for(s, j, rid, context)
        _insert(s, j, rid, context, n)
    return used, count


@kernel
def _stop_running(s, j, rid, n):
    """``rid`` stops decoding on ``j`` at boundary ``n`` before its end (preempted, or departing
    for a migration): out of the batch and its finish heap, its tokens so far recorded; the
    blocks it held."""
    ri = s.ri
    o = ri[rid, R_KV_OFFSET]
    _left_snapshot(s, j, rid)
    fin_remove(s, j, rid)
    blocks = _leave(s, j, rid, n)
    ri[rid, R_GENERATED] = o + n - ri[rid, R_INPUT]
    ri[rid, R_ADMIT_SEQ] = -1
    return blocks


@kernel
def _left_snapshot(s, j, rid):
    """``rid`` stops running on ``j``: if ``j``'s last snapshot (Arrow's monitor, EcoServe's
    finished requests) held it, list it with its context then. A running request's admission
    number is at least the snapshot's when it was admitted (again) since; every run's State has
    W_SNAP_SEQ 0 until a snapshot, so nothing is listed under the other policies."""
    wi = s.wi
    if s.ri[rid, R_ADMIT_SEQ] < wi[j, W_SNAP_SEQ]:
        out = wi[j, W_SNAP_OUT]
        s.snap_out[j, out, 0] = rid
        s.snap_out[j, out, 1] = s.ri[rid, R_KV_OFFSET] + wi[j, W_SNAP_M]
        wi[j, W_SNAP_OUT] = out + 1


@kernel
def _leave(s, j, rid, n):
    """Take ``rid`` out of the running batch; return the blocks it held at boundary ``n``."""
    ri, wi, bt = s.ri, s.wi, s.bt
    o = ri[rid, R_KV_OFFSET]
    s.cnt[j, (1 - o) % bt] -= 1
    wi[j, W_S] -= o
    wi[j, W_B] -= 1
    forget_used(s, j)
    prev, nxt = ri[rid, R_RUN_PREV], ri[rid, R_RUN_NEXT]
    if prev >= 0:
        ri[prev, R_RUN_NEXT] = nxt
    else:
        wi[j, W_RUN_HEAD] = nxt
    if nxt >= 0:
        ri[nxt, R_RUN_PREV] = prev
    else:
        wi[j, W_RUN_TAIL] = prev
    return blocks_for(s, j, rid, o + n)
