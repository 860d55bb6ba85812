"""Phasor's control tick, compiled (:meth:`pdopt.policies.phasor.Phasor.on_tick`): every Δt,
on the first engine tick at or after it, the meso loop (``defrag_actions``), the macro loop
(``flow_actions``: at most one Mixed-pool member moves, on the pools' mean Φ,
:func:`pdopt.sim._compiled._freeness.flow_decision`) and the evacuation of members promoted from
decode to prefill (``evacuation_actions``). As in the Python engine, every action is decided on
the state before any is applied, then applied in the policy's order: the defragmentation's
migrations, the member's move (:func:`pdopt.sim._compiled._pools.move_worker`), the evacuation's
migrations (:func:`pdopt.sim._compiled._migration.start`).

The policy's own records are the engine's state: ``_draining`` is ``W_DRAINING``, ``_moved_at``
``V_MOVED_AT``, ``_inflight`` (the migrations it issued, by request, and their sources) is
``State.inflight`` in insertion order with the sources in ``R_INFLIGHT``.
"""

from __future__ import annotations

import math

import numpy as np

from pdopt.sim._compiled._decode import (
    admission_blocks,
    blocks_for,
    counter_at,
    kv_free,
    kv_used,
)
from pdopt.sim._compiled._freeness import flow_decision, plan_defrag_into, stranded
from pdopt.sim._compiled._freeness import spatial_phi as phi_s
from pdopt.sim._compiled._jit import blocks_of, kernel
from pdopt.sim._compiled._migration import start, takes_decode
from pdopt.sim._compiled._phasor import (
    EPS,
    effective_free,
    pairwise_sum,
    spatial_phi,
    temporal_phi,
)
from pdopt.sim._compiled._pools import move_worker
from pdopt.sim._compiled._prefill import outstanding_flop
from pdopt.sim._compiled._state import (
    G_ERROR,
    G_N_DECODE,
    G_N_INFLIGHT,
    G_N_PREFILL,
    K_COOL,
    K_DEFRAG,
    K_DELTA_T,
    K_EVACUATE,
    K_MAX_MOVES,
    K_MIN_REMAINING,
    K_MIXED_POOL,
    K_NEXT_ACT,
    K_PROACTIVE,
    K_RELEASE,
    K_THETA_FLOW,
    K_THETA_FRAG,
    PT_HOMES,
    PT_MEMBERS,
    PT_MOVED_AT,
    PT_PHI,
    PT_ROLES,
    PT_WANTING,
    R_ADMIT_SEQ,
    R_DECODE_TARGET,
    R_INFLIGHT,
    R_INPUT,
    R_KV_OFFSET,
    R_OUTPUT,
    R_RUN_NEXT,
    ROLE_DECODE,
    ROLE_PREFILL,
    V_MOVED_AT,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_DQ_HEAD,
    W_DQ_LEN,
    W_DRAINING,
    W_HOME_DECODE,
    W_IS_DECODE,
    W_MAX_RUNNING,
    W_MEMBER,
    W_RESERVE,
    W_RUN_HEAD,
    W_SLOTS_HELD,
)
from pdopt.sim._compiled._tick import reference_need

STOP_DIRTY_BLOCKS, MAX_PRECOPY_STAGES = 2, 8
"""The Migrate defaults Phasor's migrations carry (:class:`pdopt.sim.Migrate`)."""


@kernel
def phasor_tick(s, now):
    """Phasor.on_tick at ``now``: nothing before the next Δt (returns False: not due); then
    the three loops' actions (True)."""
    k = s.tick_f
    if now + EPS < k[K_NEXT_ACT]:
        return False
    delta_t = k[K_DELTA_T]
    k[K_NEXT_ACT] = (math.floor((now + EPS) / delta_t) + 1) * delta_t
    moves = s.acts  # rows (request, destination) of this tick's migrations (_io._action_rows)
    n_defrag = 0
    if k[K_DEFRAG] != 0.0 and _defrag_due(s, now):  # NOTE: the common tick finds no source
        n_defrag = _defrag(s, now, moves)
    member, to_role, to_pool = -1, -1, -1
    if k[K_MIXED_POOL] != 0.0 and _any(s, W_MEMBER):
        member, to_role, to_pool = _flow(s, now)
    n_moves = n_defrag
    if k[K_MIXED_POOL] != 0.0 and k[K_EVACUATE] != 0.0 and _any(s, W_DRAINING):
        n_moves = _evacuation(s, now, moves, n_defrag)
    for i in range(n_defrag):
        if not _migrate(s, moves, i, now):
            return True
    if member >= 0:
        move_worker(s, member, to_role, to_pool, now)
        if s.g[G_ERROR]:
            return True
    for i in range(n_defrag, n_moves):
        if not _migrate(s, moves, i, now):
            return True
    return True


@kernel
def _migrate(s, moves, i, now):
    """Apply the ``i``-th planned Migrate; False when the engine refused it (the run stops)."""
    return start(s, moves[i, 0], moves[i, 1], STOP_DIRTY_BLOCKS, MAX_PRECOPY_STAGES, now)


@kernel
def _any(s, col):
    """Whether any worker's ``col`` is set (a loop: numba compiles no generator)."""
    for w in range(s.wi.shape[0]):  # noqa: SIM110
        if s.wi[w, col]:
            return True
    return False


@kernel
def _defrag_due(s, now):
    """The start of Phasor.defrag_actions, without its arrays: at least two decode workers not
    just moved there, the finished migrations forgotten, and a source among them (fragmented,
    blocked when reactive, not the source of a migration in flight: :func:`_defrag`'s test);
    else the tick plans no defragmentation. One pass over the decode workers."""
    wi, ri = s.wi, s.ri
    n_d = s.g[G_N_DECODE]
    wanting = s.tick_wi[PT_WANTING]  # the workers that pass the test but the source check
    n_wanting = 0
    m = 0
    reference = -1  # reference_need, read when a worker has no waiting head
    for i in range(n_d):
        j = s.decode_idx[i]
        if outstanding_flop(s, j, now) > 0:  # a worker just moved to decode takes nothing
            continue  # until its batch ends
        m += 1
        head = 0
        if wi[j, W_DQ_LEN] > 0:
            head = admission_blocks(s, j, wi[j, W_DQ_HEAD])
        elif reference < 0:
            reference = reference_need(s)
        if _wants_room(s, j, head, kv_free(s, j, now), head if head > 0 else reference):
            wanting[n_wanting] = j
            n_wanting += 1
    if m < 2:
        return False
    forget_finished_migrations(s)  # the source check reads what is still in flight
    for a in range(n_wanting):
        source = False
        for x in range(s.g[G_N_INFLIGHT]):
            source = source or ri[s.inflight[x], R_INFLIGHT] == wanting[a]
        if not source:
            return True
    return False


@kernel
def _defrag(s, now, moves):
    """Phasor.defrag_actions: migrations for the fragmented decode workers, written to
    ``moves``; their count. Sources (Φ_S < θ_frag with stranded blocks against their head's
    need, else the reference request's; with ``proactive=False`` only those whose head waits for
    KV) are taken smallest deficit first; each plans with :func:`plan_defrag_into` over the other
    decode workers' room (a reactive source: their free blocks net of their waiting requests, or
    all free when their own head is blocked; a proactive one: their stranded blocks only), less
    a free block per running request."""
    wi, ri, k = s.wi, s.ri, s.tick_f
    n_w = wi.shape[0]
    n_d = s.g[G_N_DECODE]
    m = 0  # the decode workers not just moved there (_defrag_due: at least two)
    for i in range(n_d):
        if outstanding_flop(s, s.decode_idx[i], now) <= 0:
            m += 1
    idx = np.empty(m, np.int64)
    m = 0
    for i in range(n_d):
        j = s.decode_idx[i]
        if outstanding_flop(s, j, now) <= 0:
            idx[m] = j
            m += 1
    head = np.zeros(n_w, np.int64)
    free = np.empty(n_w, np.int64)
    for w in range(n_w):
        if wi[w, W_DQ_LEN] > 0:
            head[w] = admission_blocks(s, w, wi[w, W_DQ_HEAD])
        free[w] = kv_free(s, w, now)
    reference = reference_need(s)
    need = np.where(head > 0, head, reference)
    is_source = np.zeros(n_w, np.bool_)  # set(self._inflight.values()), then this tick's
    for i in range(s.g[G_N_INFLIGHT]):
        is_source[ri[s.inflight[i], R_INFLIGHT]] = True
    blocked = np.empty(m, np.int64)
    n_blocked = 0
    for j in idx:
        if _wants_room(s, j, head[j], free[j], need[j]) and not is_source[j]:
            blocked[n_blocked] = j
            n_blocked += 1
    if n_blocked == 0:
        return 0
    deficit = np.empty(n_w, np.int64)
    for w in range(n_w):  # what one more request of ``need`` lacks: need − free mod need
        deficit[w] = need[w] - stranded(free[w], need[w])
    dst_free = np.empty(m, np.int64)
    dst_holes = np.empty(m, np.int64)
    for x in range(m):
        j = idx[x]
        running = wi[j, W_BATCH_N] + wi[j, W_B]
        base = free[j] if head[j] > free[j] else effective_free(s, j, now)
        dst_free[x] = base - running
        holes = stranded(free[j], need[j]) - running
        dst_holes[x] = dst_free[x] if dst_free[x] < holes else holes
    slots = np.zeros(n_w, np.int64)
    for w in range(n_w):
        if takes_decode(s, w):
            free_slots = wi[w, W_MAX_RUNNING] - wi[w, W_SLOTS_HELD] - wi[w, W_B]
            slots[w] = free_slots if free_slots > 0 else 0
    order = np.empty(n_blocked, np.int64)  # sorted by (deficit, worker)
    for a in range(n_blocked):
        w = blocked[a]
        b = a
        while b > 0 and (
            deficit[order[b - 1]] > deficit[w]
            or (deficit[order[b - 1]] == deficit[w] and order[b - 1] > w)
        ):
            order[b] = order[b - 1]
            b -= 1
        order[b] = w
    max_moves = int(k[K_MAX_MOVES])
    plan_ids = np.empty(max_moves, np.int64)
    plan_dst = np.empty(max_moves, np.int64)
    plan_blocks = np.empty(max_moves, np.int64)
    count = 0
    for src in order:
        ok = np.empty(m, np.int64)  # positions in idx of the destinations
        n_ok = 0
        for x in range(m):
            j = idx[x]
            if j != src and not is_source[j] and slots[j] >= 1:
                ok[n_ok] = x
                n_ok += 1
        reactive = head[src] > free[src]
        base = dst_free if reactive else dst_holes
        room = np.empty(n_ok, np.int64)
        total = 0
        for y in range(n_ok):
            room[y] = base[ok[y]]
            total += room[y] if room[y] > 0 else 0
        if total < deficit[src]:
            continue  # NOTE: the policy's cheap bound
        target = free[src] + deficit[src]  # free blocks that host one more request
        n_plan = _plan_source(
            s, src, target, free[src], idx, ok, n_ok, room, plan_ids, plan_dst, plan_blocks, now
        )
        for y in range(n_ok):
            taken = base[ok[y]] - room[y]
            dst_free[ok[y]] -= taken
            dst_holes[ok[y]] -= taken
        for i in range(n_plan):
            dst = plan_dst[i]
            if slots[dst] < 1:
                continue  # the plan put more requests there than its batch can take
            slots[dst] -= 1
            moves[count, 0] = plan_ids[i]
            moves[count, 1] = dst
            count += 1
            remember(s, plan_ids[i], src)
        if n_plan:
            is_source[src] = True
    return count


@kernel
def _wants_room(s, j, head, free, need):
    """Phasor._fragmented and the source test of defrag_actions for worker ``j`` with ``free``
    blocks, its head needing ``head`` (0: none) and stranded blocks judged against ``need``:
    Φ_S < θ_frag with blocks stranded (Alg. 1 line 8), and (reactive) its head waiting for KV."""
    k = s.tick_f
    cap = s.wi[j, W_CAP]
    held_out = stranded(free, need)
    fragmented = phi_s(cap - free, held_out, cap) < k[K_THETA_FRAG] and held_out > 0
    return fragmented and (k[K_PROACTIVE] != 0.0 or head > free)


@kernel
def _plan_source(s, src, need, free, idx, ok, n_ok, room, plan_ids, plan_dst, plan_blocks, now):
    """Phasor._plan_source: :func:`plan_defrag_into` over ``src``'s running requests not
    about to end nor migrating already (each reserving its blocks now plus one of growth, and
    going only where its peak fits) and the destinations ``idx[ok[:n_ok]]`` with ``room`` (at
    least 0); each planned move's reserve is taken off its destination's ``room``. Returns the
    plan's length."""
    ids, blocks, left, contexts = _running(s, src, now)
    min_remaining = int(s.tick_f[K_MIN_REMAINING])
    keep = np.empty(len(ids), np.int64)
    n = 0
    for i in range(len(ids)):
        if left[i] >= min_remaining and s.ri[ids[i], R_INFLIGHT] < 0:
            keep[n] = i
            n += 1
    cand = np.empty(n, np.int64)
    cand_blocks = np.empty(n, np.int64)
    reserve = np.empty(n, np.int64)
    peak = np.empty(n, np.int64)  # a request moves only where it can grow to its end
    for a in range(n):
        i = keep[a]
        cand[a] = ids[i]
        cand_blocks[a] = blocks[i]
        grown = blocks_of(s, contexts[i]) + 1
        reserve[a] = grown if grown > blocks[i] else blocks[i]
        peak[a] = blocks_of(s, contexts[i] + left[i] - 1)
    dsts = np.empty(n_ok, np.int64)
    room_0 = np.empty(n_ok, np.int64)
    caps = np.empty(n_ok, np.int64)
    reserving = np.empty(n_ok, np.int64)  # a worker that reserves takes the whole peak
    for y in range(n_ok):
        dsts[y] = idx[ok[y]]
        room_0[y] = room[y] if room[y] > 0 else 0
        caps[y] = s.wi[dsts[y], W_CAP]
        reserving[y] = s.wi[dsts[y], W_RESERVE]
    count = plan_defrag_into(
        need, free, cand, cand_blocks, reserve, peak, n, dsts, room_0, caps, reserving, n_ok,
        int(s.tick_f[K_MAX_MOVES]), plan_ids, plan_dst, plan_blocks,
        np.empty(max(n_ok, 1), np.int64), np.empty(max(n, 1), np.int64),
    )  # fmt: skip
    for i in range(count):
        for a in range(n):
            if cand[a] == plan_ids[i]:
                for y in range(n_ok):
                    if dsts[y] == plan_dst[i]:
                        room[y] -= peak[a] if reserving[y] else reserve[a]
                        break
                break
    return count


# =============================================================================================
# Macro: the flow of Mixed-pool members
# =============================================================================================
@kernel
def _flow(s, now):
    """Phasor.flow_actions: at most one member moves, judged on the mean Φ_T of the prefill
    workers and the mean Φ_S of the decode workers; the move ``(worker, role, pool)`` (-1s:
    none), its records (``_moved_at``, ``_draining``) updated now."""
    wi, wf, k = s.wi, s.wf, s.tick_f
    members, roles, homes = s.tick_wi[PT_MEMBERS], s.tick_wi[PT_ROLES], s.tick_wi[PT_HOMES]
    moved_at = s.tick_wf[PT_MOVED_AT]
    n_members = 0
    for w in range(wi.shape[0]):
        if wi[w, W_MEMBER]:
            members[n_members] = w
            roles[n_members] = wi[w, W_IS_DECODE]
            homes[n_members] = wi[w, W_HOME_DECODE]
            moved_at[n_members] = wf[w, V_MOVED_AT]
            n_members += 1
    n_p, n_d = s.g[G_N_PREFILL], s.g[G_N_DECODE]
    if n_p == 0 or n_d == 0:
        return -1, -1, -1
    phi = s.tick_wf[PT_PHI]
    for i in range(n_p):
        phi[i] = temporal_phi(s, s.prefill_idx[i], now)
    mean_p = pairwise_sum(phi, 0, n_p) / n_p
    need = reference_need(s)  # the view's reference request, the same for every worker
    for i in range(n_d):
        j = s.decode_idx[i]
        phi[i] = spatial_phi(wi[j, W_CAP], kv_used(s, j, now), need)
    mean_d = pairwise_sum(phi, 0, n_d) / n_d
    member, to_role, to_pool = flow_decision(
        mean_p, mean_d, roles, homes, moved_at, n_members, now, n_p, n_d,
        k[K_THETA_FLOW], k[K_COOL], k[K_RELEASE] != 0.0,
    )  # fmt: skip
    if member < 0:
        return -1, -1, -1
    w = members[member]
    wf[w, V_MOVED_AT] = now  # T_cool runs from every move
    if wi[w, W_IS_DECODE] == ROLE_DECODE and to_role == ROLE_PREFILL:
        wi[w, W_DRAINING] = 1
    elif to_role != ROLE_PREFILL:
        wi[w, W_DRAINING] = 0
    return w, to_role, to_pool


# =============================================================================================
# The policy's record of its migrations
# =============================================================================================
@kernel
def remember(s, rid, src):
    """``_inflight[rid] = src`` (a new key goes last)."""
    if s.ri[rid, R_INFLIGHT] < 0:
        s.inflight[s.g[G_N_INFLIGHT]] = rid
        s.g[G_N_INFLIGHT] += 1
    s.ri[rid, R_INFLIGHT] = src


@kernel
def forget_finished_migrations(s):
    """Phasor._forget_finished_migrations: drop the records whose request no longer runs on
    its source (moved or done), keeping the others' order."""
    ri = s.ri
    kept = 0
    for i in range(s.g[G_N_INFLIGHT]):
        rid = s.inflight[i]
        src = ri[rid, R_INFLIGHT]
        if ri[rid, R_ADMIT_SEQ] >= 0 and ri[rid, R_DECODE_TARGET] == src:
            s.inflight[kept] = rid
            kept += 1
        else:
            ri[rid, R_INFLIGHT] = -1
    s.g[G_N_INFLIGHT] = kept


# =============================================================================================
# The evacuation of promoted members
# =============================================================================================
@kernel
def _evacuation(s, now, moves, n_planned):
    """Phasor.evacuation_actions: the running decodes of the draining members go to decode
    workers with room (largest first, each where the most room is left after its growth
    reserve, its whole peak on a worker that reserves, at most ``max_moves`` per member);
    appended to ``moves`` after the ``n_planned`` already planned this tick (their destinations
    take none). Returns the new count."""
    wi, k = s.wi, s.tick_f
    n_d = s.g[G_N_DECODE]
    idx = np.empty(n_d, np.int64)
    m = 0
    for i in range(n_d):
        j = s.decode_idx[i]
        if outstanding_flop(s, j, now) <= 0 and takes_decode(s, j) and not wi[j, W_DRAINING]:
            idx[m] = j
            m += 1
    if m == 0:
        return n_planned
    forget_finished_migrations(s)
    room = np.empty(m, np.int64)
    slots = np.empty(m, np.int64)
    for x in range(m):
        j = idx[x]
        room[x] = effective_free(s, j, now) - (wi[j, W_BATCH_N] + wi[j, W_B])
        free_slots = wi[j, W_MAX_RUNNING] - wi[j, W_SLOTS_HELD] - wi[j, W_B]
        slots[x] = free_slots if free_slots > 0 else 0
        for i in range(n_planned):
            if moves[i, 1] == j:  # a defragmentation destination: skipped until the next Δt
                slots[x] = 0
    max_moves = int(k[K_MAX_MOVES])
    min_remaining = int(k[K_MIN_REMAINING])
    count = n_planned
    for src in range(wi.shape[0]):
        if not wi[src, W_DRAINING]:
            continue
        ids, blocks, left, contexts = _running(s, src, now)
        order = _largest_first(blocks)
        sent = 0
        for i in order[: max_moves * 4]:
            rid = ids[i]
            if s.ri[rid, R_INFLIGHT] >= 0 or left[i] < min_remaining:
                continue
            peak = blocks_of(s, contexts[i] + left[i] - 1)
            holds = False  # a destination where it can grow to its end
            for x in range(m):
                holds = holds or wi[idx[x], W_CAP] >= peak
            if not holds:
                continue
            grown = blocks_of(s, contexts[i]) + 1
            reserve = grown if grown > blocks[i] else blocks[i]
            best, best_room = -1, -1
            for x in range(m):  # argmax of room left where it fits (else -1), first on ties
                need = peak if wi[idx[x], W_RESERVE] else reserve  # a reserving worker: peak
                fits = room[x] >= need and slots[x] >= 1 and wi[idx[x], W_CAP] >= peak
                r = room[x] - need if fits else -1
                if best < 0 or r > best_room:
                    best, best_room = x, r
            if best_room < 0:
                break  # no destination fits (one that fits has room left >= 0)
            room[best] -= peak if wi[idx[best], W_RESERVE] else reserve
            slots[best] -= 1
            moves[count, 0] = rid
            moves[count, 1] = idx[best]
            count += 1
            remember(s, rid, src)
            sent += 1
            if sent >= max_moves:
                break
    return count


@kernel
def _running(s, w, now):
    """ClusterView.running_requests(w): ids, KV blocks, remaining tokens and context tokens of
    ``w``'s running decodes, in admission order."""
    ri = s.ri
    b = s.wi[w, W_B]
    m = counter_at(s, w, now)
    ids = np.empty(b, np.int64)
    blocks = np.empty(b, np.int64)
    left = np.empty(b, np.int64)
    contexts = np.empty(b, np.int64)
    rid = s.wi[w, W_RUN_HEAD]
    for i in range(b):
        o = ri[rid, R_KV_OFFSET]
        ids[i] = rid
        contexts[i] = o + m
        blocks[i] = blocks_for(s, w, rid, o + m)
        left[i] = ri[rid, R_INPUT] + ri[rid, R_OUTPUT] - o - m  # finish counter − m
        rid = ri[rid, R_RUN_NEXT]
    return ids, blocks, left, contexts


@kernel
def _largest_first(blocks):
    """``np.argsort(-blocks, kind="stable")``: positions by blocks descending, ties in order."""
    return np.argsort(-blocks, kind="mergesort")
