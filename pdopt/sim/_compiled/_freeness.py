"""Phasor's pure decision rules, compiled (:mod:`pdopt.freeness`'s ``flow_control``,
``plan_defrag``, ``stranded_blocks`` and ``spatial_freeness``; Phasor Eq. 3, Alg. 1).

The Python functions are the reference: each twin here returns exactly what its Python function
returns (the same element on every tie, the same float expressions in the same order), so that
the compiled engine runs Phasor's control loop bit-identically to the request-level policy.
Strings become codes: a role is ``ROLE_PREFILL`` (0), ``ROLE_DECODE`` (1) or ``ROLE_MIXED``
(2), a pool ``POOL_LABELS.index(label)`` (0 prefill, 1 decode, 2 mixed). The twins allocate
nothing per call: ``plan_defrag_into`` works in scratch arrays its caller owns.
"""

from __future__ import annotations

import math

from pdopt.sim._compiled._jit import kernel
from pdopt.sim._compiled._state import POOL_LABELS, ROLE_DECODE, ROLE_PREFILL

POOL_MIXED = POOL_LABELS.index("mixed")  # where a member goes home to
NOT_STARVED = -1
"""``_starved``'s answer when neither pool is starved (starved_pool's ``""``)."""


# =============================================================================================
# Φ_S (pdopt.freeness._phi)
# =============================================================================================
@kernel
def stranded(free, need):
    """Free KV blocks stranded on a decode worker, H_frag: ``free mod need``, 0 where
    ``need <= 0`` (:func:`pdopt.freeness.stranded_blocks` for one worker; ``free >= 0``)."""
    if need > 0:
        return free % need
    return 0


@kernel
def spatial_phi(used, stranded, cap):
    """Φ_S = 1 − (N_used + H_frag) / M_total of one decode worker, in blocks (Phasor Eq. 3;
    :func:`pdopt.freeness.spatial_freeness`, which converts its inputs to float64 before the
    sum)."""
    return 1.0 - (float(used) + float(stranded)) / float(cap)


# =============================================================================================
# Macro flow control (pdopt.freeness._flow)
# =============================================================================================
@kernel
def _starved(p, d, theta):
    """:func:`pdopt.freeness.starved_pool`: ``ROLE_PREFILL``, ``ROLE_DECODE`` or
    ``NOT_STARVED``; with both starved (negative means) the smaller Φ, prefill on a tie."""
    p_starved = p < theta * d
    d_starved = d < theta * p
    if p_starved and d_starved:
        return ROLE_PREFILL if p <= d else ROLE_DECODE
    if p_starved:
        return ROLE_PREFILL
    if d_starved:
        return ROLE_DECODE
    return NOT_STARVED


@kernel
def _cooled(moved_at, now, cool_s):
    """``_flow._cooled``: never moved (NaN), or moved at least T_cool ago."""
    return math.isnan(moved_at) or now - moved_at >= cool_s


@kernel
def _pool_size(role, n_prefill, n_decode):
    """Workers serving ``role`` (``pool_sizes[role]``); -1 for the Mixed role, which
    ``pool_sizes`` does not hold."""
    if role == ROLE_PREFILL:
        return n_prefill
    if role == ROLE_DECODE:
        return n_decode
    return -1


@kernel
def _promotion(starved, roles, homes, moved_at, n_members, now, cool_s, n_prefill, n_decode):
    """``_flow._promotion``: the first member (at home first, then away; lowest index first)
    not serving ``starved``, cooled, and not its pool's last worker; ``(member, to_role,
    to_pool)``."""
    for second in range(2):  # 0: members at home, 1: members away
        away = second == 1
        for i in range(n_members):
            role = roles[i]
            if (role != homes[i]) != away:
                continue
            if role == starved or not _cooled(moved_at[i], now, cool_s):
                continue
            size = _pool_size(role, n_prefill, n_decode)
            if size >= 0 and size < 2:
                continue
            if homes[i] == starved:
                return i, starved, POOL_MIXED
            return i, starved, starved  # a pool's code is its role's
    return -1, -1, -1


@kernel
def _release(mean_p, mean_d, roles, homes, moved_at, n_members, now, theta, cool_s, n_p, n_d):
    """``_flow._release``: the first cooled promoted member whose pools stay unstarved without
    it, projected with their load kept (``_mean_without`` / ``_mean_with``, same expressions);
    ``(member, home, POOL_MIXED)``."""
    for i in range(n_members):
        if not _cooled(moved_at[i], now, cool_s):
            continue
        role, home = roles[i], homes[i]
        size = _pool_size(role, n_p, n_d)
        if role == home or size < 2:  # size -1: the Mixed role, not in pool_sizes
            continue
        projected_p, projected_d = mean_p, mean_d
        without = 1.0 - size * (1.0 - (mean_p if role == ROLE_PREFILL else mean_d)) / (size - 1)
        if role == ROLE_PREFILL:
            projected_p = without
        else:
            projected_d = without
        home_size = _pool_size(home, n_p, n_d)
        if home_size > 0:
            if home == ROLE_PREFILL:
                projected_p = 1.0 - home_size * (1.0 - mean_p) / (home_size + 1)
            else:
                projected_d = 1.0 - home_size * (1.0 - mean_d) / (home_size + 1)
        if _starved(projected_p, projected_d, theta) == NOT_STARVED:
            return i, home, POOL_MIXED
    return -1, -1, -1


@kernel
def flow_decision(
    mean_p,
    mean_d,
    roles,
    homes,
    moved_at,
    n_members,
    now,
    n_prefill,
    n_decode,
    theta_flow,
    cool_s,
    release,
):
    """:func:`pdopt.freeness.flow_control` (Phasor Alg. 1 lines 12–17): at most one Mixed-pool
    move this tick, ``(member, to_role, to_pool)``, all -1 when nothing moves.

    ``mean_p``, ``mean_d`` are Φ_T and Φ_S averaged over the prefill and decode pools (finite);
    ``roles``, ``homes`` (int64, role codes) and ``moved_at`` (float64 seconds, NaN: never
    moved) describe the members, their first ``n_members`` entries read; ``n_prefill``,
    ``n_decode`` count the workers now serving each role; ``theta_flow`` > 0, ``cool_s`` >= 0
    seconds (T_cool). ``to_pool`` is a pool code (``POOL_MIXED`` on a return). Arguments are
    not validated: the caller passes what flow_control would accept.
    """
    starved = _starved(mean_p, mean_d, theta_flow)
    if starved != NOT_STARVED:
        return _promotion(
            starved, roles, homes, moved_at, n_members, now, cool_s, n_prefill, n_decode
        )
    if not release:
        return -1, -1, -1
    return _release(
        mean_p,
        mean_d,
        roles,
        homes,
        moved_at,
        n_members,
        now,
        theta_flow,
        cool_s,
        n_prefill,
        n_decode,
    )


# =============================================================================================
# Defragmentation plan (pdopt.freeness._defrag)
# =============================================================================================
@kernel
def _best_fit(free, cap, res, m, reserve, peak):
    """``_defrag._best_fit`` over ``free[:m]``: the destination left with the least room after
    the request's need there (``peak`` where ``res``, the worker reserving, else ``reserve``),
    among those whose capacity ``cap`` holds ``peak``, the lowest index on a tie; -1 if none
    fits."""
    best, best_room = -1, -1
    for j in range(m):
        room = free[j] - (peak if res[j] else reserve)
        if room >= 0 and (best < 0 or room < best_room) and cap[j] >= peak:
            best, best_room = j, room
    return best


@kernel
def _fits_somewhere(free, cap, res, m, reserve, peak):
    """``_Limits.fits_somewhere`` for one request: a destination of ``free[:m]`` has its need
    free (``peak`` where it reserves, else ``reserve``) and a capacity that holds ``peak``."""
    for j in range(m):  # noqa: SIM110 (numba compiles no generator)
        if free[j] >= (peak if res[j] else reserve) and cap[j] >= peak:
            return True
    return False


@kernel
def _single_move(deficit, blocks, reserve, peak, n, free, cap, res, m):
    """``_defrag._single_move``'s request: the smallest by (blocks, reserve, index) with
    ``blocks >= deficit`` that fits a destination; -1 if none."""
    best = -1
    for i in range(n):
        if blocks[i] < deficit or not _fits_somewhere(free, cap, res, m, reserve[i], peak[i]):
            continue
        if best < 0 or (blocks[i], reserve[i]) < (blocks[best], reserve[best]):
            best = i  # i rises: an equal key keeps the lower index
    return best


@kernel
def _largest_first(blocks, reserve, peak, n, free, cap, res, m, order):
    """The requests ``_defrag._greedy_moves`` tries, in its order (blocks descending, index
    ascending), written to ``order``; returns how many and their blocks' sum.

    NOTE: an insertion sort, stable over rising indices: a source runs tens of requests, and
    it allocates nothing.
    """
    count, total = 0, 0
    for i in range(n):
        if blocks[i] <= 0 or not _fits_somewhere(free, cap, res, m, reserve[i], peak[i]):
            continue
        total += blocks[i]
        k = count
        while k > 0 and blocks[order[k - 1]] < blocks[i]:
            order[k] = order[k - 1]
            k -= 1
        order[k] = i
        count += 1
    return count, total


@kernel
def _drop_covered(deficit, covered, blocks, count, pick, to):
    """``_greedy_moves``' last pass over the ``count`` chosen moves (request ``pick[k]`` to
    destination ``to[k]``): smallest by (blocks, index) first, drop each move the others still
    cover (``covered`` updated as moves drop); a dropped move's ``to`` becomes -1.

    NOTE: kept though it cannot fire after the largest-first greedy (it stops at the first
    move that covers the deficit, the smallest so far, so every move is needed): it mirrors the
    Python, which keeps it should the order change. Tested against that loop directly.
    """
    last_b, last_i = -1, -1
    for _ in range(count):
        nxt = -1  # the next chosen move by (blocks, index) after (last_b, last_i)
        for k in range(count):
            key = (blocks[pick[k]], pick[k])
            if key > (last_b, last_i) and (nxt < 0 or key < (blocks[pick[nxt]], pick[nxt])):
                nxt = k
        last_b, last_i = blocks[pick[nxt]], pick[nxt]
        if covered - last_b >= deficit:
            to[nxt] = -1
            covered -= last_b


@kernel
def plan_defrag_into(
    need,
    src_free,
    ids,
    blocks,
    reserve,
    peak,
    n,
    dst,
    dst_free,
    cap,
    res,
    m,
    max_moves,
    out_ids,
    out_dst,
    out_blocks,
    free,
    order,
):
    """:func:`pdopt.freeness.plan_defrag` (Phasor §"Meso"): the moves freeing ``need −
    src_free`` KV blocks on the source, written in its order to ``out_ids`` (request id),
    ``out_dst`` (destination worker) and ``out_blocks`` (the request's blocks); returns how
    many (0: nothing needed, or the deficit cannot be covered).

    Candidates are ``ids[:n]``, ``blocks[:n]``, ``reserve[:n]`` (``reserve >= blocks >= 0``)
    and ``peak[:n]`` (their ``peak_blocks``), destinations ``dst[:m]`` with ``dst_free[:m]``
    free blocks, capacity ``cap[:m]`` (``dst_capacity_blocks``; a request goes only where its
    peak fits) and ``res[:m]`` (``dst_reserve_output``, 1: a request needs its whole peak free
    there), ``max_moves`` >= 1; all int64.
    The out arrays hold at least ``max_moves`` entries; ``free`` (>= ``m`` entries) and
    ``order`` (>= ``n``) are int64 scratch. ``dst_free`` is left as it is, as plan_defrag
    leaves its argument.
    """
    deficit = need - src_free
    if deficit <= 0 or n == 0 or m == 0:
        return 0
    for j in range(m):
        free[j] = dst_free[j]
    i = _single_move(deficit, blocks, reserve, peak, n, free, cap, res, m)
    if i >= 0:
        out_ids[0] = ids[i]
        out_dst[0] = dst[_best_fit(free, cap, res, m, reserve[i], peak[i])]
        out_blocks[0] = blocks[i]
        return 1
    tried, total = _largest_first(blocks, reserve, peak, n, free, cap, res, m, order)
    if total < deficit:
        return 0  # even every request that fits somewhere alone cannot cover the deficit
    # the chosen moves: candidate index in out_ids, destination index in out_dst, until mapped
    count, covered = 0, 0
    for k in range(tried):
        if covered >= deficit or count == max_moves:
            break
        i = order[k]
        j = _best_fit(free, cap, res, m, reserve[i], peak[i])
        if j < 0:
            continue
        free[j] -= peak[i] if res[j] else reserve[i]
        out_ids[count] = i
        out_dst[count] = j
        count += 1
        covered += blocks[i]
    if covered < deficit:
        return 0
    _drop_covered(deficit, covered, blocks, count, out_ids, out_dst)
    kept = 0
    for k in range(count):  # compact in chosen order, indices mapped to ids and workers
        if out_dst[k] < 0:
            continue
        i, j = out_ids[k], out_dst[k]
        out_ids[kept] = ids[i]
        out_dst[kept] = dst[j]
        out_blocks[kept] = blocks[i]
        kept += 1
    return kept
