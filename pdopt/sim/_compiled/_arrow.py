"""Arrow's routing and control tick, compiled (:class:`pdopt.policies.arrow.Arrow`: Alg. 1 and
2 routing, Alg. 3 and 4 instance moves, the §5.5 monitor).

The policy's own records are the engine's state: its pool per worker (``_pool``) is
``W_APOOL`` (the ``A_*`` codes; the engine's pool label of code ``a`` is ``ARROW_POOL0 + a``),
``_dirty`` is ``W_DIRTY``, ``_interval_s``, ``_over_since``, ``_idle_since`` and ``_flipped_at``
are ``V_INTERVAL``, ``V_OVER_SINCE``, ``V_IDLE_SINCE`` and ``V_FLIPPED_AT``, ``_src`` is
``R_ASRC`` (read and cleared by the decode routing, as the policy pops it) and ``_converted`` is
``K_CONVERTED``. A worker's last snapshot of running requests (``_snap``) is kept as its time,
iteration counter and admission sequence number (``V_SNAP_T``, ``W_SNAP_M``, ``W_SNAP_SEQ``),
which give the policy's ``Δt / max(Δcontext)`` over exactly the requests in both snapshots
(:func:`_observe_intervals`).

Every expression is written in the policy's order (numba compiles without fast-math): the
predicted TTFT ``wait + (a·l·l + b·l + c)`` with ``wait = queued_prefill_flop / P_peak``
(WorkerModels.predicted_ttft_s), Max Running Tokens ``min(KV tokens, max(slack, 0) / d2)`` with
``slack = tpot − d0 − d1·B − d3·cover(B)`` (DecodeModel.context_budget_tokens), the token
interval's fallback τ(B, C) (:func:`pdopt.sim._compiled._decode.iteration_s`). The sums of
running tokens are sums of whole-block token counts, exact in any order; each ``min`` by
``(value, worker)`` and ``argmin`` is the first minimum in index order.

The tick decides on the state at the tick, as the policy does (the engine applies nothing
before ``on_tick`` returns), and writes its ``MoveWorker`` actions to ``State.acts`` in the
policy's order; the event loop applies them (:mod:`pdopt.sim._compiled._loop`).
"""

from __future__ import annotations

import numpy as np

from pdopt.sim._compiled._decode import counter_at, expert_s, iteration_s, kv_free, kv_used
from pdopt.sim._compiled._jit import kernel
from pdopt.sim._compiled._prefill import (
    holds_prompt,
    outstanding_flop,
    predicted_ttft_s,
    prefill_wait_s,
    request_kv_blocks,
)
from pdopt.sim._compiled._state import (
    ARROW_POOL0,
    G_ADMIT_SEQ,
    G_N_DECODE,
    G_N_PREFILL,
    K_COLOCATED,
    K_CONVERTED,
    K_ELASTIC,
    K_IDLE_PATIENCE,
    K_LOW_FRAC,
    K_MIN_FLIP,
    K_OVER_PATIENCE,
    K_SLO_AWARE,
    K_TPOT_SLO,
    K_TTFT_SLO,
    R_ADMIT_SEQ,
    R_ASRC,
    R_DECODE_TARGET,
    R_GENERATED,
    R_INPUT,
    R_KV_OFFSET,
    ROLE_DECODE,
    ROLE_MIXED,
    ROLE_PREFILL,
    V_D0,
    V_D1,
    V_D2,
    V_D3,
    V_FLIPPED_AT,
    V_IDLE_SINCE,
    V_INTERVAL,
    V_OVER_SINCE,
    V_SNAP_T,
    W_APOOL,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_DIRTY,
    W_DQ_LEN,
    W_IS_DECODE,
    W_MIXED,
    W_POOL,
    W_RUN_HEAD,
    W_S,
    W_SNAP_M,
    W_SNAP_OUT,
    W_SNAP_SEQ,
)

A_P, A_D, A_P2D, A_D2P = 0, 1, 2, 3
"""The policy's pools ``P``, ``D``, ``P->D``, ``D->P`` (:data:`ARROW_POOLS`)."""
ARROW_POOLS = ("P", "D", "P->D", "D->P")
# pool sets as bit masks over the A_* codes
_P, _D, _P2D, _D2P = 1 << A_P, 1 << A_D, 1 << A_P2D, 1 << A_D2P


@kernel
def _in(s, w, mask):
    return (mask >> s.wi[w, W_APOOL]) & 1


@kernel
def _count(s, mask):
    """len(Arrow._in(*pools))."""
    n = 0
    for w in range(s.wi.shape[0]):
        n += _in(s, w, mask)
    return n


@kernel
def _tokens(s, w, now):
    """decode_load's running tokens of worker ``w`` (KV blocks in use × block tokens; exact)."""
    return float(kv_used(s, w, now) * s.bt)


@kernel
def _batch(s, w):
    """decode_load's batch of worker ``w``: running (prefill batch and decodes) plus waiting."""
    wi = s.wi
    return float(wi[w, W_BATCH_N] + wi[w, W_B] + wi[w, W_DQ_LEN])


@kernel
def _max_running_tokens(s, w, batch):
    """WorkerModels.max_running_tokens(w, batch, tpot): the largest context total within the
    TPOT SLO (DecodeModel.context_budget_tokens), capped by the KV capacity in tokens."""
    wf = s.wf
    slack = s.tick_f[K_TPOT_SLO] - wf[w, V_D0] - wf[w, V_D1] * batch
    if wf[w, V_D3] > 0.0:
        slack -= expert_s(s, w, batch)
    if wf[w, V_D2] <= 0:
        budget = np.inf if slack >= 0 else 0.0
    else:
        budget = (slack if slack > 0.0 else 0.0) / wf[w, V_D2]
    capacity = float(s.wi[w, W_CAP] * s.bt)
    return budget if budget < capacity else capacity


@kernel
def _mrt_total(s, mask):
    """Arrow._mrt_total over the workers of ``mask``: Σ Max Running Tokens at batch + 1."""
    total = 0.0
    for w in range(s.wi.shape[0]):
        if _in(s, w, mask):
            total += _max_running_tokens(s, w, _batch(s, w) + 1.0)
    return total


@kernel
def _tokens_sum(s, mask, now):
    total = 0.0
    for w in range(s.wi.shape[0]):
        if _in(s, w, mask):
            total += _tokens(s, w, now)
    return total


@kernel
def _may_flip(s, w, now):
    return now - s.wf[w, V_FLIPPED_AT] >= s.tick_f[K_MIN_FLIP]


@kernel
def _move(s, w, pool, now):
    """Arrow._move: relabel ``w`` now; the engine gets the MoveWorker at the next tick."""
    s.wi[w, W_APOOL] = pool
    s.wf[w, V_FLIPPED_AT] = now
    s.wf[w, V_IDLE_SINCE] = -1.0
    s.wf[w, V_OVER_SINCE] = -1.0
    s.wi[w, W_DIRTY] = 1


# =============================================================================================
# Alg. 3 / 4: instance moves
# =============================================================================================
@kernel
def _move_decode_to_prefill(s, now):
    """Alg. 3 (Arrow._move_decode_to_prefill): if D ∪ P→D keeps another instance, the P→D one
    with the fewest running tokens, else the D one, moves toward prefill; it, or -1."""
    if _count(s, _D | _P2D) <= 1:
        return -1
    w = _least_flippable(s, _P2D, _D, now, False)
    if w >= 0:
        busy = s.wi[w, W_B] > 0 or s.wi[w, W_DQ_LEN] > 0
        _move(s, w, A_D2P if busy else A_P, now)
    return w


@kernel
def _move_prefill_to_decode(s, now):
    """Alg. 4 (Arrow._move_prefill_to_decode): if P ∪ D→P keeps another instance, the D→P one
    with the least prefill wait, else the P one, moves toward decode; it, or -1."""
    if _count(s, _P | _D2P) <= 1:
        return -1
    w = _least_flippable(s, _D2P, _P, now, True)
    if w >= 0:
        _move(s, w, A_P2D if outstanding_flop(s, w, now) > 0.0 else A_D, now)
    return w


@kernel
def _least_flippable(s, first, second, now, by_wait):
    """The worker of pools ``first`` that may flip with the least prefill wait (``by_wait``)
    or running tokens, else of pools ``second``; ties: the lowest index; -1 when none."""
    best, best_value = -1, 0.0
    for mask in (first, second):
        for w in range(s.wi.shape[0]):
            if _in(s, w, mask) and _may_flip(s, w, now):
                value = prefill_wait_s(s, w, now) if by_wait else _tokens(s, w, now)
                if best < 0 or value < best_value:
                    best, best_value = w, value
        if best >= 0:
            return best
    return -1


# =============================================================================================
# Alg. 1: prefill routing
# =============================================================================================
@kernel
def arrow_prefill(s, rid, now):
    """Arrow.route_prefill: Alg. 1 (see the policy); records the choice in ``R_ASRC``."""
    w = _choose_prefill(s, rid, now)
    s.ri[rid, R_ASRC] = w
    return w


@kernel
def _least_ttft(s, now, length, mask, every):
    """The prefill worker (engine role) of pools ``mask`` (any when ``every``) with the least
    predicted TTFT, and that TTFT; (-1, 0.0) when there is none."""
    best, best_ttft = -1, 0.0
    for i in range(s.g[G_N_PREFILL]):
        w = s.prefill_idx[i]
        if not (every or _in(s, w, mask)):
            continue
        t = predicted_ttft_s(s, w, now, length)
        if best < 0 or t < best_ttft:
            best, best_ttft = w, t
    return best, best_ttft


@kernel
def _choose_prefill(s, rid, now):
    k = s.tick_f
    length = float(s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED])  # RequestInfo.prefill_tokens
    first, ttft = _least_ttft(s, now, length, _P, False)
    if first < 0:
        first, ttft = _least_ttft(s, now, length, _P | _D2P, False)
    if first < 0:
        first, ttft = _least_ttft(s, now, length, 0, True)
    if k[K_SLO_AWARE] == 0.0 or ttft <= k[K_TTFT_SLO]:
        return first
    second, ttft = _least_ttft(s, now, length, _D2P, False)
    if second >= 0 and ttft <= k[K_TTFT_SLO]:
        return second
    if k[K_ELASTIC] != 0.0 and _decode_is_low(s, now):
        third = _move_decode_to_prefill(s, now)
        if third >= 0 and s.wi[third, W_MIXED] and holds_prompt(s, third):
            return third  # stateless instance: it takes the prefill at once
    return first


@kernel
def _decode_is_low(s, now):
    """Arrow._decode_is_low: running tokens of D ∪ P→D below ``decode_low_frac`` of their Max
    Running Tokens, none over the TPOT SLO (and at least two of them)."""
    k = s.tick_f
    mask = _D | _P2D
    if _count(s, mask) < 2:
        return False
    limit = _mrt_total(s, mask)
    for w in range(s.wi.shape[0]):
        if _in(s, w, mask) and s.wf[w, V_INTERVAL] > k[K_TPOT_SLO]:
            return False
    return _tokens_sum(s, mask, now) < k[K_LOW_FRAC] * limit


# =============================================================================================
# Alg. 2: decode routing
# =============================================================================================
@kernel
def decode_holds(s, w, peak):
    """``w`` is a decode worker (engine role) holding the request's peak KV (_feasible_decode)."""
    wi = s.wi
    decodes = wi[w, W_IS_DECODE] or wi[w, W_MIXED]
    return decodes and (peak <= s.min_cap or wi[w, W_CAP] >= peak)


@kernel
def _fewest_tokens(s, now, peak, mask, every):
    """The allowed worker of pools ``mask`` (any when ``every``) with the fewest running tokens
    (ties: the lowest index), and its tokens; (-1, 0.0) when there is none."""
    best, best_tokens = -1, 0.0
    for i in range(s.g[G_N_DECODE]):
        w = s.decode_idx[i]
        if not ((every or _in(s, w, mask)) and decode_holds(s, w, peak)):
            continue
        t = _tokens(s, w, now)
        if best < 0 or t < best_tokens:
            best, best_tokens = w, t
    return best, best_tokens


@kernel
def arrow_decode(s, rid, now, peak):
    """Arrow.route_decode: Alg. 2 (see the policy); at least one decode worker holds ``peak``."""
    k = s.tick_f
    src = s.ri[rid, R_ASRC]
    s.ri[rid, R_ASRC] = -1
    if src >= 0 and decode_holds(s, src, peak) and _in(s, src, _D | _P2D):
        return src
    if k[K_SLO_AWARE] == 0.0:
        w, _ = _fewest_tokens(s, now, peak, _D, False)
        if w < 0:
            w, _ = _fewest_tokens(s, now, peak, 0, True)
        return w
    t1, tokens1 = _fewest_tokens(s, now, peak, _D, False)
    t2, tokens2 = _fewest_tokens(s, now, peak, _P2D, False)
    need = request_kv_blocks(s, rid)
    if t1 >= 0 and _decode_ok(s, t1, need, now):
        return t1
    if t2 >= 0 and _decode_ok(s, t2, need, now):
        return t2
    if k[K_ELASTIC] != 0.0:
        third = _move_prefill_to_decode(s, now)
        if third >= 0 and decode_holds(s, third, peak):
            return third
    if t1 >= 0 and t2 >= 0:
        return t2 if tokens2 < tokens1 or (tokens2 == tokens1 and t2 < t1) else t1
    if t1 >= 0:
        return t1
    if t2 >= 0:
        return t2
    w, _ = _fewest_tokens(s, now, peak, 0, True)
    return w


@kernel
def _decode_ok(s, w, need, now):
    """Arrow._decode_ok: running tokens within Max Running Tokens, KV free for the request and
    the recent token interval within the TPOT SLO."""
    mrt = _max_running_tokens(s, w, _batch(s, w) + 1.0)
    return (
        _tokens(s, w, now) <= mrt
        and kv_free(s, w, now) >= need
        and s.wf[w, V_INTERVAL] <= s.tick_f[K_TPOT_SLO]
    )


# =============================================================================================
# The monitor (Arrow.on_tick)
# =============================================================================================
@kernel
def arrow_tick(s, now):
    """Arrow.on_tick at ``now``: its decisions, and its MoveWorker actions in ``s.acts[:n]``
    (rows: worker, pool label, ``ROLE_*``) in the policy's order; returns ``n``."""
    k = s.tick_f
    _observe_intervals(s, now)
    n = _finish_transitions(s, now)
    if k[K_COLOCATED] != 0.0 and k[K_CONVERTED] == 0.0:
        k[K_CONVERTED] = 1.0
        for w in range(s.wi.shape[0]):
            if not s.wi[w, W_MIXED] or s.wi[w, W_POOL] != ARROW_POOL0 + s.wi[w, W_APOOL]:
                n = _act(s, n, w, ROLE_MIXED)
    if k[K_ELASTIC] != 0.0:
        _monitor_decode(s, now)
        _monitor_idle_prefill(s, now)
    for w in range(s.wi.shape[0]):
        if s.wi[w, W_DIRTY]:
            prefill = s.wi[w, W_APOOL] in (A_P, A_D2P)
            n = _act(s, n, w, _role(s, w, ROLE_PREFILL if prefill else ROLE_DECODE))
            s.wi[w, W_DIRTY] = 0
    return n


@kernel
def _act(s, n, w, role):
    """Append MoveWorker(w, its pool, role) to the tick's actions."""
    s.acts[n, 0] = w
    s.acts[n, 1] = ARROW_POOL0 + s.wi[w, W_APOOL]
    s.acts[n, 2] = role
    return n + 1


@kernel
def _role(s, w, role):
    """Arrow._role for worker ``w`` (its role as the tick's view has it): mixed for every pool
    once the instances were made mixed, and before that for an instance mixed already."""
    k = s.tick_f
    mixed = k[K_CONVERTED] != 0.0 or s.wi[w, W_MIXED]
    return ROLE_MIXED if k[K_COLOCATED] != 0.0 and mixed else role


@kernel
def _observe_intervals(s, now):
    """Arrow._observe_intervals: per decode worker (engine role), Δt / Δcontext of the requests
    running at this tick and at its last snapshot; τ(B, C) when none spans both; 0 when idle.

    NOTE: in work proportional to what changed, not to the running batch. The requests in both
    snapshots are those admitted before the last one that still run (they ran every iteration
    since: their Δcontext is the iteration counter's; when any does, the oldest running request
    does) and those preempted from it since that run here again (``_decode._left_snapshot``
    lists every request of the snapshot that stopped running, with its context then; a finished
    one never runs again, so it is skipped)."""
    ri, wi, wf = s.ri, s.wi, s.wf
    for i in range(s.g[G_N_DECODE]):
        w = s.decode_idx[i]
        m = counter_at(s, w, now)
        step, common = 0, False
        head = wi[w, W_RUN_HEAD]
        if head >= 0 and ri[head, R_ADMIT_SEQ] < wi[w, W_SNAP_SEQ]:
            step, common = m - wi[w, W_SNAP_M], True
        for x in range(wi[w, W_SNAP_OUT]):
            rid = s.snap_out[w, x, 0]
            if ri[rid, R_ADMIT_SEQ] >= 0 and ri[rid, R_DECODE_TARGET] == w:  # back here
                d = ri[rid, R_KV_OFFSET] + m - s.snap_out[w, x, 1]
                if not common or d > step:
                    step = d
                common = True
        b = wi[w, W_B]
        then = wf[w, V_SNAP_T]
        if common and now > then:
            wf[w, V_INTERVAL] = (now - then) / (step if step > 1 else 1)
        elif b:
            context = wi[w, W_S] + b * m  # Σ (offset + counter) over the running requests
            wf[w, V_INTERVAL] = iteration_s(s, w, float(b), float(context))
        else:
            wf[w, V_INTERVAL] = 0.0
        wi[w, W_SNAP_SEQ] = s.g[G_ADMIT_SEQ]  # the next admission's number
        wi[w, W_SNAP_M] = m
        wi[w, W_SNAP_OUT] = 0
        wf[w, V_SNAP_T] = now


@kernel
def _finish_transitions(s, now):
    """Arrow._finish_transitions: P→D workers with no prefill work left become D, D→P workers
    with no running decode P (their MoveWorker actions first in the tick's list)."""
    n = 0
    for w in range(s.wi.shape[0]):
        pool = s.wi[w, W_APOOL]
        if pool == A_P2D and outstanding_flop(s, w, now) <= 0.0:
            s.wi[w, W_APOOL] = A_D
            n = _act(s, n, w, _role(s, w, ROLE_DECODE))
        elif pool == A_D2P and s.wi[w, W_B] == 0:
            s.wi[w, W_APOOL] = A_P
            n = _act(s, n, w, _role(s, w, ROLE_PREFILL))
    return n


@kernel
def _monitor_decode(s, now):
    """Arrow._monitor_decode: a D ∪ P→D worker over the TPOT SLO for ``overload_patience_s``
    triggers Alg. 4 (the workers are those of the pools at its start)."""
    k, wf = s.tick_f, s.wf
    n_w = s.wi.shape[0]
    watched = s.wlist
    m = 0
    for w in range(n_w):
        if _in(s, w, _D | _P2D):
            watched[m] = w
            m += 1
    for x in range(m):
        w = watched[x]
        if wf[w, V_INTERVAL] <= k[K_TPOT_SLO]:
            wf[w, V_OVER_SINCE] = -1.0
            continue
        if wf[w, V_OVER_SINCE] < 0:
            wf[w, V_OVER_SINCE] = now
        if now - wf[w, V_OVER_SINCE] >= k[K_OVER_PATIENCE]:
            _move_prefill_to_decode(s, now)
            wf[w, V_OVER_SINCE] = now


@kernel
def _monitor_idle_prefill(s, now):
    """Arrow._monitor_idle_prefill: a P worker idle for ``idle_patience_s`` while decode is
    loaded joins decode."""
    k, wf = s.tick_f, s.wf
    n_w = s.wi.shape[0]
    loaded = -1  # decode's load at the start, evaluated when first needed (1: loaded)
    watched = s.wlist
    m = 0
    for w in range(n_w):
        if _in(s, w, _P):
            watched[m] = w
            m += 1
    for x in range(m):
        w = watched[x]
        if outstanding_flop(s, w, now) > 0.0:
            wf[w, V_IDLE_SINCE] = -1.0
            continue
        if wf[w, V_IDLE_SINCE] < 0:
            wf[w, V_IDLE_SINCE] = now
        if now - wf[w, V_IDLE_SINCE] < k[K_IDLE_PATIENCE]:
            continue
        if loaded < 0:  # NOTE: before this loop's first move (a move needs it), so on the
            # pools at its start, where the policy computes it (it changes no state)
            limit = _mrt_total(s, _D | _P2D)
            loaded = int(_tokens_sum(s, _D | _P2D, now) >= (1.0 - k[K_LOW_FRAC]) * limit)
        if loaded and _count(s, _P | _D2P) > 1 and _may_flip(s, w, now):
            _move(s, w, A_D, now)
