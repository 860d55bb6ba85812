"""EcoServe's routing and control tick, compiled (:class:`pdopt.policies.ecoserve.EcoServe`:
Alg. 1 InterSchedule over macro instances, Alg. 2 CheckConstraints, the decode routing and the
tick's bookkeeping, its prefill phases, mitosis), for every configuration of the policy:
``phases="activation"`` (the default: prefill phases set by SetPhase, the activation's prompts
held until the phase ends;
:func:`_activation_phases`) with ``hold="prefilled"`` (the default) or pdopt's reading
``hold="deadline"`` (:func:`_phase_over`, :func:`_held_late`), ``phases="batch"`` (phase "both"
throughout) or pdopt's earlier ``phases="ticks"`` (tick-bounded prefill phases from the base
phase "decode", with or without ``prefill_slots``; :func:`_tick_phases`), mitosis on or off
(:func:`_scale`: standby instances joining, splits, removals back to standby, merges), with or
without ``constraints`` and rolling activation, Alg. 1 or pdopt's ``scan`` InterSchedule
(:func:`_inter_schedule`), Alg. 2's CheckConstraints (C2 as written or with the named
departures ``saved_tpot="min"``, ``saved_tpot_margin`` and ``c2_remaining``) or pdopt's
earlier per-request ``check="request"`` (:func:`_check_request`), on a cluster that starts all
mixed or as prefill and decode workers (routed by role until the first tick makes the
instances mixed).

The policy's records are State arrays (its dictionaries keyed by request id are columns of
``State.eri``/``erf``; each worker's dictionaries are linked lists through them):

* ``_src`` is ``E_SRC``; ``_queued[w]`` is the list of requests whose ``_src`` is ``w`` (the
  policy adds and pops them together), ``_blocks`` is ``E_BLOCKS``; ``_pending[w]`` is the
  requests of ``_queued[w]`` with an ``E_PENDING`` (their prefill tokens; the policy adds and
  pops them with ``_queued``);
* ``_last_tick_s`` is ``tick_f[K_E_LAST_TICK]``;
* ``_first_token`` and ``_decode_blocks`` have one key set (both set by the decode routing,
  both dropped by the sweep): ``E_FT_T``/``E_FT_CTX`` and ``E_DBLOCKS`` (-1: no record), the
  requests holding one listed in ``State.erec`` for the sweep;
* ``_activation[w]`` is a list of ``State.eact`` entries (request, predicted prefill seconds);
* ``_held[w]`` is the list of requests whose ``E_HELD_W`` is ``w`` (their value, the arrival,
  is ``F_ARRIVAL``): a request is held only at its first routing, so by one worker at most;
* ``_instances.phase`` is ``EW_PHASE`` (the engine's phase, ``W_PHASE``, follows it through the
  tick's SetPhase actions);
* ``_gone`` is ``E_GONE``: the sweep that last saw the request nowhere (a request unseen at
  this sweep and the last is in ``unseen & _gone``);
* the macro instances are ``State.emac`` rows in the policy's list order (``macros.remove``
  moves the later rows up), their members rows of ``State.emem``, ``macro_of`` is
  ``EW_MACRO``; a macro instance's pool ``macro<uid>`` is label ``G_E_MACRO0 + uid``, and pool
  names order as strings (:func:`uid_before`); ``standby`` is ``State.estb``; ``_seen[w]`` is
  ``w``'s snapshot (:func:`_observe_finished`); ``_finished`` is ``State.efin``, one row per
  tick and macro instance (its entries of a tick share their time, so they are kept and dropped
  together, and ``_failing`` counts them alike);

Iteration order: the policy reads none of these dictionaries in order under these settings
(``math.fsum`` is correctly rounded, so order-free; the rest are lookups, counts and pops), so
the lists keep no order. Every expression is written in the policy's order (numba compiles
without fast-math): the predicted prefill ``a·l·l + b·l + c`` with ``l`` the prompt's tokens
(TtftModel.predict), the predicted TTFT ``wait + own`` with ``wait = queued_prefill_flop /
P_peak``, the saved TPOT ``(decoded + 1)·TPOT − (now − t0)``, the mean ``fsum(saved) / n``
(:func:`fsum_add`, :func:`fsum_value`: CPython's ``math.fsum``), numpy's mean of the members'
waits in member order (:func:`pdopt.sim._compiled._phasor.pairwise_sum`). Ties break as the
policy's ``sorted``, ``argmin`` and ``argmax`` do: the first in their order (``tick_phases``'
sort by ``(oldest_s, w)``: a selection of the least pairs, keys unique).
"""

from __future__ import annotations

import numpy as np

from pdopt.sim._compiled._arrow import decode_holds
from pdopt.sim._compiled._decode import counter_at, iteration_s, kv_free
from pdopt.sim._compiled._jit import kernel
from pdopt.sim._compiled._phasor import pairwise_sum
from pdopt.sim._compiled._prefill import (
    holds_prompt,
    outstanding_flop,
    predicted_prefill_s,
    predicted_ttft_s,
    prefill_wait_s,
    request_kv_blocks,
)
from pdopt.sim._compiled._state import (
    A_NEXT,
    A_RID,
    ACT_SET_PHASE,
    E_BLOCKS,
    E_DBLOCKS,
    E_FT_CTX,
    E_FT_T,
    E_GONE,
    E_H_NEXT,
    E_H_PREV,
    E_HELD_W,
    E_PENDING,
    E_Q_NEXT,
    E_Q_PREV,
    E_REC_POS,
    E_SRC,
    E_STAMP,
    E_SVAL,
    ERR_UNSUPPORTED,
    EW_ACT_HEAD,
    EW_ACT_TAIL,
    EW_C2_DQH,
    EW_C2_DQN,
    EW_C2_DQT,
    EW_C2_KEPT,
    EW_C2_LO,
    EW_C2_M,
    EW_C2_SERIAL,
    EW_C2_SIZE,
    EW_C2_T,
    EW_C2_VER,
    EW_H_HEAD,
    EW_IDLE_SINCE,
    EW_MACRO,
    EW_MARK,
    EW_OLD_VER,
    EW_OLDEST,
    EW_PHASE,
    EW_Q_HEAD,
    EW_Q_N,
    EW_READY_AT,
    EW_VER,
    F_ARRIVAL,
    FIN_LATE,
    FIN_N,
    FIN_T,
    FIN_UID,
    G_ADMIT_SEQ,
    G_E_FIN_HEAD,
    G_E_FIN_N,
    G_E_FREE,
    G_E_MACRO0,
    G_E_MACROS,
    G_E_NEXT_UID,
    G_E_RECORDS,
    G_E_STAMP,
    G_E_STANDBY,
    G_E_STANDBY_LABEL,
    G_E_SWEEP,
    G_ERROR,
    G_N_DECODE,
    G_STOPPED,
    K_E_ACTIVATION,
    K_E_BEHIND,
    K_E_C2_REMAINING,
    K_E_CHECK_REQUEST,
    K_E_CONSTRAINTS,
    K_E_HOLD_DEADLINE,
    K_E_LAST_MISS,
    K_E_LAST_TICK,
    K_E_MARGIN,
    K_E_MIGRATION,
    K_E_MIN_SAVED,
    K_E_MITOSIS,
    K_E_N_LOWER,
    K_E_N_UPPER,
    K_E_NEXT_SWEEP,
    K_E_PREFILL_SLOTS,
    K_E_REFILL_MISSING,
    K_E_ROLLING,
    K_E_SCALE_IDLE,
    K_E_SCAN,
    K_E_STARTED,
    K_E_SWEEP,
    K_E_TICKS,
    K_TPOT_SLO,
    K_TTFT_SLO,
    M_CURSOR,
    M_FIN_LATE,
    M_FIN_N,
    M_LABEL,
    M_MISSES,
    M_SIZE,
    M_UID,
    PH_BOTH,
    PH_DECODE,
    PH_PREFILL,
    R_ADMIT_SEQ,
    R_DECODE_TARGET,
    R_GENERATED,
    R_INPUT,
    R_KV_OFFSET,
    R_OUTPUT,
    R_PREEMPTIONS,
    R_QUEUE_NEXT,
    R_RUN_NEXT,
    ROLE_MIXED,
    ROLE_PREFILL,
    W_B,
    W_BATCH_N,
    W_DQ_HEAD,
    W_DQ_LEN,
    W_DQ_TAIL,
    W_IS_DECODE,
    W_MAX_RUNNING,
    W_MAX_SIZE,
    W_MAX_TOKENS,
    W_MIXED,
    W_POOL,
    W_PQ_HEAD,
    W_PQ_LEN,
    W_RUN_HEAD,
    W_S,
    W_SEG_SERIAL,
    W_SLOTS_HELD,
    W_SNAP_M,
    W_SNAP_OUT,
    W_SNAP_SEQ,
)


@kernel
def _unsupported(s):
    """Hand the run back to the Python engine (a state this twin does not reproduce)."""
    s.g[G_ERROR] = ERR_UNSUPPORTED
    s.g[G_STOPPED] = 1


# =============================================================================================
# math.fsum (CPython's msum: exact partial sums, then one correctly rounded result)
# =============================================================================================
@kernel
def fsum_add(p, n, x):
    """Add ``x`` to the ``n`` partial sums ``p[:n]`` (kept non-overlapping, increasing in
    magnitude); returns their new count, or -1 where ``math.fsum`` would not give a finite
    sum of finite values (a non-finite ``x`` or an overflow) or ``p`` is full."""
    i = 0
    for j in range(n):
        y = p[j]
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        yr = hi - x
        lo = y - yr
        if lo != 0.0:
            p[i] = lo
            i += 1
        x = hi
    if x != 0.0:
        if not np.isfinite(x) or i >= p.shape[0]:
            return -1
        p[i] = x
        i += 1
    return i


@kernel
def fsum_value(p, n):
    """``math.fsum`` of the values added to the partial sums ``p[:n]``: their exact sum,
    correctly rounded (half-even across partials, as CPython's)."""
    if n == 0:
        return 0.0
    n -= 1
    hi = p[n]
    lo = 0.0
    while n > 0:
        x = hi
        n -= 1
        y = p[n]
        hi = x + y
        yr = hi - x
        lo = y - yr
        if lo != 0.0:
            break
    if n > 0 and ((lo < 0.0 and p[n - 1] < 0.0) or (lo > 0.0 and p[n - 1] > 0.0)):
        y = lo * 2.0
        x = hi + y
        yr = x - hi
        if y == yr:
            hi = x
    return hi


# =============================================================================================
# Per-request quantities the policy reads off RequestInfo and its models
# =============================================================================================
@kernel
def _tokens(s, rid):
    """RequestInfo.prefill_tokens of ``rid``, as the predictors take it (a float)."""
    return float(s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED])


@kernel
def _prefill_s(s, w, rid):
    """EcoServe._prefill_s: the TTFT predictor of ``w`` at the prompt's tokens, seconds."""
    return predicted_prefill_s(s, w, _tokens(s, rid))


@kernel
def _eligible(s, w, now):
    """``w`` takes requests: a prefill worker (:func:`_prefill_worker`) done with its last
    migration (MacroInstances.ready)."""
    return _prefill_worker(s, w) and now >= s.ewf[w, EW_READY_AT]


@kernel
def _prefill_worker(s, w):
    """``w`` is in ClusterView.prefill_workers: not a decode worker, and, while a prompt is
    routed, one that holds it (:func:`pdopt.sim._compiled._prefill.holds_prompt`)."""
    wi = s.wi
    return (wi[w, W_MIXED] or not wi[w, W_IS_DECODE]) and holds_prompt(s, w)


@kernel
def _has_prefill(s, w, now):
    """EcoServe._has_prefill: prompts queued on ``w`` or prefill work outstanding."""
    return s.wi[w, W_PQ_LEN] > 0 or outstanding_flop(s, w, now) > 0.0


@kernel
def _slots_full(s, w):
    """EcoServe._slots_full: ``w``'s running slots (``running_slots_free``) all taken, the
    requests waiting there for decode admission counted."""
    wi = s.wi
    free = wi[w, W_MAX_RUNNING] - wi[w, W_SLOTS_HELD] - wi[w, W_B]
    return (free if free > 0 else 0) - wi[w, W_DQ_LEN] <= 0


@kernel
def _in_prefill(s, w, now):
    """EcoServe._in_prefill: in a prefill phase, or prompts to prefill."""
    return s.ewi[w, EW_PHASE] == PH_PREFILL or _has_prefill(s, w, now)


@kernel
def _miss(s, m, now):
    """MacroInstances.miss of macro instance ``m``."""
    s.emac[m, M_MISSES] += 1
    s.tick_f[K_E_LAST_MISS] = now


# =============================================================================================
# The policy's per-worker lists: routed prompts (_queued) and the activation
# =============================================================================================
@kernel
def _link(s, w, rid, head, prev, nxt):
    """Put ``rid`` at the head of ``w``'s list: head column ``head`` of State.ewi, neighbour
    columns ``prev``, ``nxt`` of State.eri."""
    e, ew = s.eri, s.ewi
    first = ew[w, head]
    e[rid, prev] = -1
    e[rid, nxt] = first
    if first >= 0:
        e[first, prev] = rid
    ew[w, head] = rid


@kernel
def _unlink(s, w, rid, head, prev, nxt):
    """Take ``rid`` out of ``w``'s list (see :func:`_link`)."""
    e = s.eri
    before, after = e[rid, prev], e[rid, nxt]
    if before >= 0:
        e[before, nxt] = after
    else:
        s.ewi[w, head] = after
    if after >= 0:
        e[after, prev] = before


@kernel
def _queue_add(s, w, rid):
    """``_queued[w][rid] = arrival`` (its order is never read)."""
    _link(s, w, rid, EW_Q_HEAD, E_Q_PREV, E_Q_NEXT)
    s.ewi[w, EW_Q_N] += 1


@kernel
def _queue_remove(s, w, rid):
    """``_queued[w].pop(rid)``."""
    _unlink(s, w, rid, EW_Q_HEAD, E_Q_PREV, E_Q_NEXT)
    s.ewi[w, EW_Q_N] -= 1


@kernel
def _hold(s, w, rid):
    """``_held[w][rid] = arrival``."""
    _link(s, w, rid, EW_H_HEAD, E_H_PREV, E_H_NEXT)
    s.eri[rid, E_HELD_W] = w
    s.ewi[w, EW_VER] += 1


@kernel
def _unhold(s, w, rid):
    """``_held[w].pop(rid, None)``."""
    if s.eri[rid, E_HELD_W] != w:
        return
    _unlink(s, w, rid, EW_H_HEAD, E_H_PREV, E_H_NEXT)
    s.eri[rid, E_HELD_W] = -1
    s.ewi[w, EW_VER] += 1


@kernel
def _act_put(s, w, rid, value):
    """``_activation[w][rid] = value``: a request routed before (preempted since) may hold an
    entry of ``w``'s activation already, whose value is replaced."""
    ew = s.ewi
    act = s.eact
    if s.ri[rid, R_PREEMPTIONS] > 0:
        ent = ew[w, EW_ACT_HEAD]
        while ent >= 0:
            if act[ent, A_RID] == rid:
                s.eactf[ent] = value
                return
            ent = act[ent, A_NEXT]
    ent = s.g[G_E_FREE]
    if ent < 0:
        _grow_activations(s)
        act = s.eact
        ent = s.g[G_E_FREE]
    s.g[G_E_FREE] = act[ent, A_NEXT]
    act[ent, A_RID] = rid
    act[ent, A_NEXT] = -1
    s.eactf[ent] = value
    tail = ew[w, EW_ACT_TAIL]
    if tail >= 0:
        act[tail, A_NEXT] = ent
    else:
        ew[w, EW_ACT_HEAD] = ent
    ew[w, EW_ACT_TAIL] = ent
    ew[w, EW_VER] += 1


@kernel
def _grow_activations(s):
    """Twice the activation entries, the new ones on the free list (the live entries are at
    most the routings since each worker's activation last started)."""
    old, oldf = s.eact, s.eactf
    e = old.shape[0]
    s.eact = np.empty((2 * e, 2), np.int64)
    s.eactf = np.empty(2 * e, np.float64)
    act, actf = s.eact, s.eactf
    act[:e] = old
    actf[:e] = oldf
    for ent in range(e, 2 * e):
        act[ent, A_RID] = -1
        act[ent, A_NEXT] = ent + 1 if ent + 1 < 2 * e else s.g[G_E_FREE]
    s.g[G_E_FREE] = e


@kernel
def _activate(s, w):
    """EcoServe._activate: a new activation of ``w`` (its entries back on the free list)."""
    ew = s.ewi
    head = ew[w, EW_ACT_HEAD]
    if head < 0:
        return
    s.eact[ew[w, EW_ACT_TAIL], A_NEXT] = s.g[G_E_FREE]
    s.g[G_E_FREE] = head
    ew[w, EW_ACT_HEAD] = -1
    ew[w, EW_ACT_TAIL] = -1
    ew[w, EW_VER] += 1


# =============================================================================================
# Prefill routing (EcoServe.route_prefill, _dispatch, _alg1, _fallback)
# =============================================================================================
@kernel
def eco_prefill(s, rid, now):
    """EcoServe.route_prefill: the worker ``_dispatch`` picks, with the policy's records."""
    w = _dispatch(s, rid, now)
    e = s.eri
    if e[rid, E_SRC] >= 0:  # never: a prompt routed twice without reaching decode routing
        _unsupported(s)
        return w
    e[rid, E_SRC] = w
    _queue_add(s, w, rid)
    ri = s.ri
    decodes = ri[rid, R_OUTPUT] > ri[rid, R_GENERATED] + 1
    # a request preempted by recompute decoded before: not held again
    if decodes and s.tick_f[K_E_ACTIVATION] != 0.0 and ri[rid, R_PREEMPTIONS] == 0:
        if e[rid, E_HELD_W] >= 0:  # never: it is held at its first routing only
            _unsupported(s)
            return w
        _hold(s, w, rid)
    # _pending[w][rid]: its prefill tokens (it is in _queued[w] while it has the entry)
    e[rid, E_PENDING] = ri[rid, R_INPUT] + ri[rid, R_GENERATED] if decodes else -1
    e[rid, E_BLOCKS] = request_kv_blocks(s, rid)
    _act_put(s, w, rid, _prefill_s(s, w, rid))
    return w


@kernel
def _meanprefill_wait_s(s, m, now):
    """``np.mean(wait[macros[m].members])``: the members' waits copied in member order, summed
    as numpy sums a contiguous array."""
    size = s.emac[m, M_SIZE]
    if size == 0:  # never: a macro instance left empty is removed (numpy: NaN)
        return np.nan
    for k in range(size):
        s.esc[k] = prefill_wait_s(s, s.emem[m, k], now)
    return pairwise_sum(s.esc, 0, size) / size


@kernel
def _dispatch(s, rid, now):
    """EcoServe._dispatch: the macro instances in order of their mean outstanding prefill time
    (ties: the lowest index); with ``rolling`` and not ``scan``, Alg. 1 in the first with a
    member taking requests, else :func:`_inter_schedule` in each in turn until one takes the
    request; with none, a miss of the first in that order and :func:`_fallback`."""
    k = s.tick_f
    if k[K_E_ROLLING] != 0.0 and k[K_E_SCAN] == 0.0:
        best, best_mean, first, first_mean = -1, 0.0, -1, 0.0
        for m in range(s.g[G_E_MACROS]):
            mean = _meanprefill_wait_s(s, m, now)
            if first < 0 or mean < first_mean:
                first, first_mean = m, mean
            if (best < 0 or mean < best_mean) and _takes_requests(s, m, now):
                best, best_mean = m, mean
        if best >= 0:
            return _alg1(s, best, rid, now)
    else:
        n_macros = s.g[G_E_MACROS]
        means = np.empty(n_macros, np.float64)
        for m in range(n_macros):
            means[m] = _meanprefill_wait_s(s, m, now)
        first, last, last_mean = -1, -1, 0.0
        for _ in range(n_macros):  # the next in (mean, index) order after the last tried
            nxt, nxt_mean = -1, 0.0
            for m in range(n_macros):
                after = last < 0 or means[m] > last_mean or (means[m] == last_mean and m > last)
                if after and (nxt < 0 or means[m] < nxt_mean):
                    nxt, nxt_mean = m, means[m]
            if nxt < 0:  # never: a mean is NaN only for an empty macro instance, removed
                _unsupported(s)
                break
            if first < 0:
                first = nxt
            w = _inter_schedule(s, nxt, rid, now)
            if w >= 0:
                return w
            if s.g[G_ERROR]:
                break  # the run is handed back; any worker will do meanwhile
            last, last_mean = nxt, nxt_mean
    if first >= 0:
        _miss(s, first, now)
    return _fallback(s, rid, now)


@kernel
def _inter_schedule(s, m, rid, now):
    """EcoServe._inter_schedule: with ``scan``, the cursor's member while CheckConstraints holds,
    else the next one it holds for (one it would move to checked as a fresh activation, which
    starts when it takes the request); with ``rolling=False``, the least predicted TTFT (ties:
    member order) among the members meeting the constraints, each checked as fresh unless in
    prefill; -1 when none."""
    emac, emem = s.emac, s.emem
    size = emac[m, M_SIZE]
    if size == 0:  # never: a macro instance left empty is removed
        return -1
    if s.tick_f[K_E_ROLLING] == 0.0:
        best, best_ttft = -1, 0.0
        for i in range(size):
            w = emem[m, i]
            if not (_eligible(s, w, now) and _check(s, w, rid, now, not _in_prefill(s, w, now))):
                continue
            t = predicted_ttft_s(s, w, now, _tokens(s, rid))
            if best < 0 or t < best_ttft:
                best, best_ttft = w, t
        if best >= 0 and not _in_prefill(s, best, now):
            _activate(s, best)
        return best
    cur = emac[m, M_CURSOR] % size
    for k in range(size):
        i = (emac[m, M_CURSOR] + k) % size
        w = emem[m, i]
        # a move onto an instance still in prefill keeps its activation (line 299)
        fresh = i != cur and not _in_prefill(s, w, now)
        if _eligible(s, w, now) and _check(s, w, rid, now, fresh):
            if fresh:
                _activate(s, w)
            emac[m, M_CURSOR] = i
            return w
    return -1


@kernel
def _takes_requests(s, m, now):
    """Whether a member of macro instance ``m`` takes requests (:func:`_eligible`)."""
    for k in range(s.emac[m, M_SIZE]):  # noqa: SIM110 (numba compiles no generator in any())
        if _eligible(s, s.emem[m, k], now):
            return True
    return False


@kernel
def _alg1(s, m, rid, now):
    """EcoServe._alg1: the cursor's instance if CheckConstraints holds there, else the next
    member taking requests, unconditionally (a miss when it fails too, or is the same)."""
    emac, emem = s.emac, s.emem
    size = emac[m, M_SIZE]
    cur = emac[m, M_CURSOR] % size
    prev = emem[m, cur]
    if _eligible(s, prev, now) and _check(s, prev, rid, now):
        return prev
    i = cur
    for k in range(1, size + 1):
        if _eligible(s, emem[m, (cur + k) % size], now):
            i = (cur + k) % size
            break
    nxt = emem[m, i]
    if nxt != prev:
        emac[m, M_CURSOR] = i
        if not _in_prefill(s, nxt, now):  # _move_onto: a new activation unless in prefill
            _activate(s, nxt)
        if _check(s, nxt, rid, now):
            return nxt
    _miss(s, m, now)
    return nxt


@kernel
def _fallback(s, rid, now):
    """EcoServe._fallback: the least predicted TTFT (ties: the lowest index) among the macro
    instances' members taking requests, else all members that are prefill workers, else all
    prefill workers."""
    for rule in range(3):
        best, best_ttft = -1, 0.0
        for w in range(s.wi.shape[0]):
            prefill = _prefill_worker(s, w)
            member = s.ewi[w, EW_MACRO] >= 0
            if rule == 0:
                ok = member and _eligible(s, w, now)
            elif rule == 1:
                ok = member and prefill
            else:
                ok = prefill
            if not ok:
                continue
            t = predicted_ttft_s(s, w, now, _tokens(s, rid))
            if best < 0 or t < best_ttft:
                best, best_ttft = w, t
        if best >= 0:
            return best
    return -1


# =============================================================================================
# CheckConstraints (EcoServe._check_activation, Alg. 2)
# =============================================================================================
@kernel
def _check(s, w, rid, now, fresh=False):
    """C1: ``t_total`` (the activation's predicted prefill, plus the request's) within the
    TTFT SLO (``hold="deadline"``: and the phase's end within the oldest held prompt's,
    :func:`_held_late`, unless ``fresh``); C2: the saved TPOT of ``w``'s decodes outside the
    activation (none: met) at least ``t_total`` (``c2_remaining``: the prefill still to run,
    its wait plus the request's); C3: :func:`_kv_fits`. ``constraints=False``: always met.
    ``fresh``: as if ``w``'s activation started now (empty). ``check="request"``:
    :func:`_check_request` instead (``fresh`` unused)."""
    k = s.tick_f
    if k[K_E_CONSTRAINTS] == 0.0:
        return True
    if k[K_E_CHECK_REQUEST] != 0.0:
        return _check_request(s, w, rid, now)
    stamp, n = _not_decoding(s, w, True, fresh)
    if n < 0:
        _unsupported(s)
        return False
    t_total = fsum_value(s.epart, n) + _prefill_s(s, w, rid)
    if t_total > s.tick_f[K_TTFT_SLO] or (not fresh and _held_late(s, w, rid, now)):
        return False
    count, saved = _saved_tpot(s, w, stamp, now)
    if count < 0:
        _unsupported(s)
        return False
    if count > 0:
        need = t_total
        if k[K_E_C2_REMAINING] != 0.0:  # _c2_need_s
            need = predicted_ttft_s(s, w, now, _tokens(s, rid))
        if saved < need:
            return False
    return _kv_fits(s, w, rid, now)


@kernel
def _held_late(s, w, rid, now):
    """held_late (``phases="activation"``, ``hold="deadline"``; else never): ``w``'s prefill
    phase, ending a tick after its outstanding prefill work and ``rid``'s, would end past its
    oldest held prompt's TTFT SLO."""
    k = s.tick_f
    if k[K_E_ACTIVATION] == 0.0 or k[K_E_HOLD_DEADLINE] == 0.0 or s.ewi[w, EW_H_HEAD] < 0:
        return False
    work_s = prefill_wait_s(s, w, now) + _prefill_s(s, w, rid)
    end_s = now + work_s + s.tick_s
    return end_s > _oldest_held(s, w) + k[K_TTFT_SLO]


@kernel
def _not_decoding(s, w, total, fresh=False):
    """Stamp the requests C2 leaves out of ``w``'s saved TPOT (not_decoding): its activation's
    (``phases="batch"``), or its held ones and its activation's not yet prefilled (no first
    token recorded); with ``total``, ``math.fsum``'s partial sums of the activation's values in
    ``s.epart``; ``fresh``: an empty activation. Returns (the stamp, the partials' count: -1
    where fsum gives no finite sum)."""
    s.g[G_E_STAMP] += 1
    stamp = s.g[G_E_STAMP]
    act, actf, e, part = s.eact, s.eactf, s.eri, s.epart
    held = s.tick_f[K_E_ACTIVATION] != 0.0
    n = 0
    ent = -1 if fresh else s.ewi[w, EW_ACT_HEAD]
    while ent >= 0:
        rid = act[ent, A_RID]
        if not held or e[rid, E_DBLOCKS] < 0:
            e[rid, E_STAMP] = stamp
        if total:
            n = fsum_add(part, n, actf[ent])
            if n < 0:
                return stamp, n
        ent = act[ent, A_NEXT]
    if held:
        rid = s.ewi[w, EW_H_HEAD]
        while rid >= 0:
            e[rid, E_STAMP] = stamp
            rid = e[rid, E_H_NEXT]
    return stamp, n


@kernel
def _saved_tpot(s, w, stamp, now):
    """saved_tpot_s of ``w``'s running and waiting decodes not stamped ``stamp``: (how many,
    their mean by ``math.fsum``, or their minimum with ``saved_tpot="min"``, less the coming
    decode iteration with ``saved_tpot_margin``), (0, 0.0) when none, (-1, 0.0) where fsum
    would not give a finite sum."""
    count, agg, _ = _saved_tpot_sized(s, w, stamp, now)
    return count, agg


@kernel
def _saved_tpot_sized(s, w, stamp, now):
    """:func:`_saved_tpot`, and the values' magnitudes summed."""
    k = s.tick_f
    mean = k[K_E_MIN_SAVED] == 0.0  # the minimum takes no fsum (nor its overflow)
    count, n, _, size, least = _saved_walk(s, w, stamp, now, mean)
    if n < 0:
        return -1, 0.0, size
    if count == 0:
        return 0, 0.0, size
    agg = fsum_value(s.epart, n) / count if mean else least
    if k[K_E_MARGIN] != 0.0:
        agg = agg - _decode_iteration_s(s, w, now)
    return count, agg, size


@kernel
def _saved_below(s, w, stamp, now, limit):
    """(count, ``saved < limit``, a lower bound on ``saved``, the values' magnitudes summed) for
    :func:`_saved_tpot`'s (count, saved), ``limit`` seconds (the plain sum decides only for a
    positive one); count -1 where it gives -1. The
    bound is ``inf`` with no decode and ``-inf`` where none is kept (``saved_tpot_margin``).

    NOTE: a control tick asks this of every instance in a prefill phase; the mean's
    ``math.fsum`` was a third of EcoServe's tick. The plain sum ``S`` of the values is within
    ``E = count · Σ|v| · 2^-51`` of their exact sum ``R`` (recursive summation's bound
    ``γ_{count-1} Σ|v|`` with ``u = 2^-53``, four times over). With
    ``slack = E + 2^-49 (|S| + |count · limit|)``, ``S − slack >= count · limit`` puts ``R``
    at least ``13u`` (relative) above ``count · limit``, so the correctly rounded ``fsum`` and
    its division by ``count`` stay at or above ``limit``; ``S + slack <= count · limit`` puts
    them below it. In between (or with the minimum or the margin, or a value that is not
    finite) the exact value decides. ``(S − slack) / count``, less ``2^-50`` of itself for its
    own rounding, is at most the mean: the bound kept."""
    k = s.tick_f
    mean = k[K_E_MIN_SAVED] == 0.0
    margin = k[K_E_MARGIN] != 0.0
    if mean and not margin and limit > 0.0:
        count, _, plain, size, _ = _saved_walk(s, w, stamp, now, False)
        if count == 0:
            return 0, False, np.inf, 0.0
        below = mean_below(plain, size, count, limit)
        if below >= 0:
            lo = (plain - _slack(plain, size, count, limit)) / count
            return count, below == 1, lo - 2.0**-50 * abs(lo), size
    count, saved, size = _saved_tpot_sized(s, w, stamp, now)
    if count == 0:
        return 0, False, np.inf, 0.0
    lo = -np.inf if margin or count < 0 else saved - 2.0**-50 * abs(saved)
    return count, count > 0 and saved < limit, lo, size


@kernel
def _slack(plain, size, count, limit):
    """How far from the exact sum :func:`mean_below` allows a plain sum to be (see
    :func:`_saved_below`)."""
    return count * size * 2.0**-51 + 2.0**-49 * (abs(plain) + abs(count * limit))


@kernel
def mean_below(plain, size, count, limit):
    """Whether ``fsum(v) / count < limit`` (1) or not (0) for ``count`` >= 1 values ``v`` with
    plain sum ``plain`` (summed in order) and ``size = Σ|v|``, ``limit`` > 0; -1 where the
    plain sum cannot tell (see :func:`_saved_below`)."""
    bar = count * limit
    slack = _slack(plain, size, count, limit)
    if not (np.isfinite(plain) and np.isfinite(slack)):
        return -1
    if plain - slack >= bar:
        return 0
    if plain + slack <= bar:
        return 1
    return -1


@kernel
def _saved_walk(s, w, stamp, now, exact):
    """The saved TPOT of each of ``w``'s running and waiting decodes not stamped ``stamp``:
    (how many; with ``exact``, ``math.fsum``'s partials in ``s.epart`` and their count (-1: no
    finite sum); their plain sum, the sum of their magnitudes and their minimum)."""
    ri, e, part = s.ri, s.eri, s.epart
    tpot = s.tick_f[K_TPOT_SLO]
    n, count, least, plain, size = 0, 0, 0.0, 0.0, 0.0
    m = counter_at(s, w, now)
    rid = s.wi[w, W_RUN_HEAD]
    waiting = False  # the running decodes, then those waiting for admission
    left = s.wi[w, W_DQ_LEN]
    while n >= 0:
        if not waiting and rid < 0:
            waiting, rid = True, s.wi[w, W_DQ_HEAD]
        if waiting:
            if left == 0:
                break
            left -= 1
        if e[rid, E_STAMP] != stamp:
            value = _saved(s, rid, -1 if waiting else ri[rid, R_KV_OFFSET] + m, tpot, now)
            if exact:
                n = fsum_add(part, n, value)
            plain += value
            size += abs(value)
            if count == 0 or value < least:
                least = value
            count += 1
        rid = ri[rid, R_QUEUE_NEXT] if waiting else ri[rid, R_RUN_NEXT]
    return count, n, plain, size, least


@kernel
def _all_saved_tpot(s, w, now):
    """EcoServe._saved_tpot_s: :func:`_saved_tpot` of all ``w``'s decodes (a stamp none
    holds)."""
    s.g[G_E_STAMP] += 1
    return _saved_tpot(s, w, s.g[G_E_STAMP], now)


@kernel
def _decode_iteration_s(s, w, now):
    """decode_iteration_s: the predicted decode iteration of ``w`` with its running and
    waiting decodes (at least one), seconds."""
    b = s.wi[w, W_B]
    batch = b + s.wi[w, W_DQ_LEN]
    context = s.wi[w, W_S] + b * counter_at(s, w, now)  # Σ (offset + counter) over the running
    return iteration_s(s, w, float(batch if batch > 1 else 1), float(context))


@kernel
def _saved(s, rid, ctx, tpot, now):
    """One decode's saved TPOT ``(decoded + 1)·TPOT − (now − t0)``, its first token at ``t0``
    with context ``c0`` (none recorded: now and ``ctx``); ``ctx`` -1: waiting for admission."""
    t0, c0 = now, ctx
    if s.eri[rid, E_DBLOCKS] >= 0:
        t0, c0 = s.erf[rid, E_FT_T], s.eri[rid, E_FT_CTX]
    decoded = 0
    if ctx >= 0 and ctx - c0 > 0:
        decoded = ctx - c0
    return (decoded + 1) * tpot - (now - t0)


@kernel
def _kv_fits(s, w, rid, now):
    """EcoServe._kv_fits (C3): ``w``'s free blocks less those of the prompts waiting in its
    prefill queue and of the requests waiting for its decode admission hold the prompt."""
    ri, e, wi = s.ri, s.eri, s.wi
    need = 0
    r = wi[w, W_PQ_HEAD]
    for _ in range(wi[w, W_PQ_LEN]):
        if e[r, E_BLOCKS] > 0:
            need += e[r, E_BLOCKS]
        r = ri[r, R_QUEUE_NEXT]
    r = wi[w, W_DQ_HEAD]
    for _ in range(wi[w, W_DQ_LEN]):
        if e[r, E_DBLOCKS] > 0:
            need += e[r, E_DBLOCKS]
        r = ri[r, R_QUEUE_NEXT]
    return kv_free(s, w, now) - need >= request_kv_blocks(s, rid)


# =============================================================================================
# pdopt's earlier rules (pdopt.policies._ecoserve_earlier): check="request", phases="ticks"
# =============================================================================================
@kernel
def _check_request(s, w, rid, now):
    """check_request: the time until ``w`` can be in a prefill phase (:func:`_switch_s`) plus the
    request's predicted TTFT within the TTFT SLO; the saved TPOT of all ``w``'s decodes (none:
    met; with ``saved_tpot="min"`` and prompts pending on ``w`` that ``rid`` would not join in
    one batch, also a fresh decode's, TPOT SLO less the coming iteration) at least the stall the
    request causes (:func:`_stall_s`); C3 :func:`_kv_fits`."""
    k = s.tick_f
    prefill_s = predicted_ttft_s(s, w, now, _tokens(s, rid))
    if _switch_s(s, w, now) + prefill_s > k[K_TTFT_SLO]:
        return False
    count, saved = _all_saved_tpot(s, w, now)
    if count < 0:
        _unsupported(s)
        return False
    if k[K_E_MIN_SAVED] != 0.0 and _pending_any(s, w) and not _joins_batch(s, w, rid):
        # the prompts routed before ``rid`` decode, with nothing saved yet, while it prefills
        # in a later batch of the same phase
        fresh = k[K_TPOT_SLO] - _decode_iteration_s(s, w, now)
        if count == 0 or fresh < saved:  # min(saved, fresh): the first of equals
            saved = fresh
        count = 1
    if count > 0 and saved < _stall_s(s, w, now, prefill_s):
        return False
    return _kv_fits(s, w, rid, now)


@kernel
def _pending_any(s, w):
    """``bool(_pending[w])``: a prompt routed to ``w`` that will decode (they are in
    ``_queued[w]``)."""
    e = s.eri
    rid = s.ewi[w, EW_Q_HEAD]
    while rid >= 0:
        if e[rid, E_PENDING] >= 0:
            return True
        rid = e[rid, E_Q_NEXT]
    return False


@kernel
def _joins_batch(s, w, rid):
    """joins_batch: ``w`` is not in a prefill phase and its pending prompts and ``rid`` fit
    one batch (``max_batch_size`` prompts, ``max_batch_tokens`` tokens)."""
    if s.ewi[w, EW_PHASE] == PH_PREFILL:
        return False
    e = s.eri
    tokens, count = 0, 1
    r = s.ewi[w, EW_Q_HEAD]
    while r >= 0:
        if e[r, E_PENDING] >= 0:
            tokens += e[r, E_PENDING]
            count += 1
        r = e[r, E_Q_NEXT]
    if count > s.wi[w, W_MAX_SIZE]:
        return False
    tokens += s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED]
    return tokens <= s.wi[w, W_MAX_TOKENS]


@kernel
def _to_next_tick(s, now):
    """to_next_tick: seconds from ``now`` to the next control tick."""
    x = s.tick_f[K_E_LAST_TICK] + s.tick_s - now
    return x if x > 0.0 else 0.0


@kernel
def _switch_s(s, w, now):
    """switch_s: 0 in a prefill phase (or under another phase rule); else the next tick, or with
    ``prefill_slots`` of ``w``'s macro instance all in a prefill phase, the tick after the
    least outstanding prefill work among them (from the next tick, whole ticks)."""
    k = s.tick_f
    if s.ewi[w, EW_PHASE] == PH_PREFILL or k[K_E_TICKS] == 0.0:
        return 0.0
    wait = _to_next_tick(s, now)
    m = s.ewi[w, EW_MACRO]
    slots = int(k[K_E_PREFILL_SLOTS])
    if slots == 0 or m < 0:
        return wait
    busy, left = 0, 0.0
    for i in range(s.emac[m, M_SIZE]):
        v = s.emem[m, i]
        if s.ewi[v, EW_PHASE] == PH_PREFILL:
            x = prefill_wait_s(s, v, now)
            if busy == 0 or x < left:
                left = x
            busy += 1
    if busy < slots:
        return wait
    x = left - wait
    return wait + np.ceil((x if x > 0.0 else 0.0) / s.tick_s) * s.tick_s


@kernel
def _ticks_s(work_s, tick_s):
    """ticks_s: a prefill phase of ``work_s`` seconds started on a tick stalls decodes until the
    first tick after the work, seconds."""
    return np.ceil(work_s / tick_s - 1e-9) * tick_s


@kernel
def _stall_s(s, w, now, work_s):
    """stall_s: how long ``work_s`` seconds of prefill on ``w`` stall its decodes: to the first
    tick after it from the last tick in a prefill phase, else from the next tick's start
    (other phase rules: ``work_s``)."""
    if s.tick_f[K_E_TICKS] == 0.0:
        return work_s
    if s.ewi[w, EW_PHASE] != PH_PREFILL:
        return _ticks_s(work_s, s.tick_s)
    elapsed_s = now - s.tick_f[K_E_LAST_TICK]
    return _ticks_s(elapsed_s + work_s, s.tick_s) - elapsed_s


@kernel
def _oldest_s(s, w, now):
    """oldest_s: the arrival of the oldest prompt routed to ``w`` and not yet prefilled (its
    ``_queued`` list), ``now`` if none."""
    oldest, found = now, False
    rid = s.ewi[w, EW_Q_HEAD]
    while rid >= 0:
        t = s.rf[rid, F_ARRIVAL]
        if not found or t < oldest:
            oldest, found = t, True
        rid = s.eri[rid, E_Q_NEXT]
    return oldest


@kernel
def _may_prefill(s, w, now, work_s):
    """may_prefill: the saved TPOT of all ``w``'s decodes (none: yes) covers ``work_s`` seconds of
    prefill in whole ticks, or its oldest prompt would otherwise miss the TTFT SLO;
    ``constraints=False``: always."""
    k = s.tick_f
    if k[K_E_CONSTRAINTS] == 0.0:
        return True
    s.g[G_E_STAMP] += 1  # all w's decodes: a stamp none holds
    count, below, _, _ = _saved_below(s, w, s.g[G_E_STAMP], now, _ticks_s(work_s, s.tick_s))
    if count < 0:
        _unsupported(s)
        return False
    if count == 0 or not below:
        return True
    waited_s = now - _oldest_s(s, w, now)
    return waited_s + work_s + s.tick_s >= k[K_TTFT_SLO]


@kernel
def _prefills(s, w, now):
    """prefills: ``w`` has prefill work, a running slot for a prompt, and may prefill it."""
    return (
        _has_prefill(s, w, now)
        and not _slots_full(s, w)
        and _may_prefill(s, w, now, prefill_wait_s(s, w, now))
    )


@kernel
def _tick_phases(s, now, n):
    """tick_phases: per macro instance, each mixed member in a prefill phase goes on while it has
    prefill work it may prefill (:func:`_may_prefill`), else goes to "decode"; then the mixed
    members not in one, done migrating, with prefill work they may prefill enter one, oldest
    prompt first (ties: the lowest index), up to ``prefill_slots`` (0: all) in one at once.
    Appends the SetPhase actions from row ``n`` in the policy's order; returns the new count."""
    ew, wi, emem = s.ewi, s.wi, s.emem
    cap = int(s.tick_f[K_E_PREFILL_SLOTS])
    for m in range(s.g[G_E_MACROS]):
        size = s.emac[m, M_SIZE]
        busy, mixed = 0, 0
        for i in range(size):
            w = emem[m, i]
            if not wi[w, W_MIXED]:
                continue
            mixed += 1
            if ew[w, EW_PHASE] != PH_PREFILL:
                continue
            if _prefills(s, w, now):
                busy += 1
            else:
                ew[w, EW_PHASE] = PH_DECODE
                n = _set_phase(s, n, w, PH_DECODE)
        slots = cap if cap else mixed
        ready = 0  # s.wlist[:ready] the ready members, s.esc their oldest prompts' arrivals
        for i in range(size):
            w = emem[m, i]
            if (
                wi[w, W_MIXED]
                and ew[w, EW_PHASE] != PH_PREFILL
                and now >= s.ewf[w, EW_READY_AT]
                and _prefills(s, w, now)
            ):
                s.wlist[ready] = w
                s.esc[ready] = _oldest_s(s, w, now)
                ready += 1
        for j in range(min(ready, slots - busy)):  # the first of sorted(key=(oldest, w))
            best = j
            for i in range(j + 1, ready):
                if s.esc[i] < s.esc[best] or (
                    s.esc[i] == s.esc[best] and s.wlist[i] < s.wlist[best]
                ):
                    best = i
            w, t = s.wlist[best], s.esc[best]
            s.wlist[best], s.esc[best] = s.wlist[j], s.esc[j]
            s.wlist[j], s.esc[j] = w, t
            ew[w, EW_PHASE] = PH_PREFILL
            n = _set_phase(s, n, w, PH_PREFILL)
    return n


# =============================================================================================
# Decode routing (EcoServe.route_decode)
# =============================================================================================
@kernel
def eco_decode(s, rid, now, peak):
    """EcoServe.route_decode: its records (first token, decode blocks; a TTFT miss), then the
    worker that prefilled it when it is mixed and holds the peak KV, else the most free KV
    among its macro instance's members holding it (member order), else among all decode
    workers holding it (index order); at least one does."""
    e = s.eri
    src = e[rid, E_SRC]
    e[rid, E_SRC] = -1
    e[rid, E_PENDING] = -1  # _pending[src].pop (none where no _src: forgotten with it)
    if src >= 0:
        _queue_remove(s, src, rid)
    blocks = e[rid, E_BLOCKS]
    e[rid, E_BLOCKS] = -1
    first = e[rid, E_DBLOCKS] < 0  # no first-token record
    e[rid, E_DBLOCKS] = blocks if blocks >= 0 else request_kv_blocks(s, rid)
    if first:
        s.erf[rid, E_FT_T] = now
        e[rid, E_FT_CTX] = s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED]
        _record(s, rid)
    m = s.ewi[src, EW_MACRO] if src >= 0 else -1
    if first and m >= 0 and now - s.rf[rid, F_ARRIVAL] > s.tick_f[K_TTFT_SLO]:
        _miss(s, m, now)  # an observed TTFT miss
    if src >= 0 and decode_holds(s, src, peak) and s.wi[src, W_MIXED]:
        return src
    if src >= 0:
        _unhold(s, src, rid)  # it decodes elsewhere: nothing to hold on src
    best, best_free = -1, 0
    if m >= 0:
        for k in range(s.emac[m, M_SIZE]):
            j = s.emem[m, k]
            if decode_holds(s, j, peak):
                free = kv_free(s, j, now)
                if best < 0 or free > best_free:
                    best, best_free = j, free
    if best >= 0:
        return best
    for i in range(s.g[G_N_DECODE]):
        j = s.decode_idx[i]
        if decode_holds(s, j, peak):
            free = kv_free(s, j, now)
            if best < 0 or free > best_free:
                best, best_free = j, free
    return best


@kernel
def _record(s, rid):
    """``rid`` gets first-token records: list it for the sweep."""
    n = s.g[G_E_RECORDS]
    s.erec[n] = rid
    s.eri[rid, E_REC_POS] = n
    s.g[G_E_RECORDS] = n + 1


# =============================================================================================
# The control tick (EcoServe.on_tick)
# =============================================================================================
@kernel
def eco_tick(s, now):
    """EcoServe.on_tick at ``now``: its bookkeeping, mitosis and phases, and its actions in
    ``s.acts[:n]`` (rows: worker, pool label, ``ROLE_*`` for a MoveWorker; worker, phase,
    ``ACT_SET_PHASE`` for a SetPhase); returns ``n``. The SetPhase actions of an instance moving
    between macro instances are left out, and those of one joining one under phase rules other
    than "ticks": they set the phase the engine gives it already (the policy's phase and the
    engine's agree, a move to the mixed role resets both to "both", and a relabel keeps it);
    under ``phases="ticks"`` (base phase "decode") a joining instance's is kept."""
    k = s.tick_f
    k[K_E_LAST_TICK] = now
    n = 0
    if k[K_E_STARTED] == 0.0:
        n = _convert(s)
        k[K_E_STARTED] = 1.0
    elif k[K_E_MITOSIS] != 0.0:
        s.g[G_E_STAMP] += 1
        before = s.g[G_E_STAMP]
        for m in range(s.g[G_E_MACROS]):
            if s.emac[m, M_SIZE]:
                s.ewi[_cursor_worker(s, m), EW_MARK] = before
        _observe_finished(s, now)
        n = _scale(s, now, n)
        for m in range(s.g[G_E_MACROS]):  # a split or a removal moved a cursor onto w
            if s.emac[m, M_SIZE]:
                w = _cursor_worker(s, m)
                if s.ewi[w, EW_MARK] != before and not _in_prefill(s, w, now):
                    _activate(s, w)
    for m in range(s.g[G_E_MACROS]):
        s.emac[m, M_MISSES] = 0  # counted since this tick
    for w in range(s.wi.shape[0]):
        # nothing left to prefill, none in service (its prompts not yet routed to decode)
        if s.ewi[w, EW_Q_N] and not _has_prefill(s, w, now) and s.wi[w, W_BATCH_N] == 0:
            _forget_queued(s, w)
    if now >= k[K_E_NEXT_SWEEP]:
        _sweep(s, now)
    if k[K_E_TICKS] != 0.0:
        n = _tick_phases(s, now, n)
    elif k[K_E_ACTIVATION] != 0.0:
        n = _activation_phases(s, now, n)
    return n


@kernel
def _act(s, n, w, pool, role):
    """Append MoveWorker(w, pool label, role) to the tick's actions (a tick's actions are at
    most a few per worker: State.acts holds 8 per worker; more hands the run back)."""
    if n >= s.acts.shape[0]:
        _unsupported(s)
        return n
    s.acts[n, 0] = w
    s.acts[n, 1] = pool
    s.acts[n, 2] = role
    return n + 1


@kernel
def _convert(s):
    """MacroInstances.convert at the first tick: each member joins its macro instance (a
    MoveWorker when its pool or role differs; in the base phase, :func:`_base_phase`), each
    spare goes to standby as a prefill worker."""
    n = 0
    wi = s.wi
    for m in range(s.g[G_E_MACROS]):
        label = s.emac[m, M_LABEL]
        for k in range(s.emac[m, M_SIZE]):
            w = s.emem[m, k]
            if wi[w, W_POOL] != label or not wi[w, W_MIXED]:
                n = _act(s, n, w, label, ROLE_MIXED)
            n = _enter_base_phase(s, n, w)
    standby = s.g[G_E_STANDBY_LABEL]
    for i in range(s.g[G_E_STANDBY]):
        w = s.estb[i]
        if wi[w, W_POOL] != standby or wi[w, W_MIXED] or wi[w, W_IS_DECODE]:
            n = _act(s, n, w, standby, ROLE_PREFILL)
    return n


@kernel
def _forget_queued(s, w):
    """EcoServe._forget_queued: the prompts still listed on ``w`` lose ``_src``, ``_blocks``,
    ``_pending`` and their hold."""
    e = s.eri
    rid = s.ewi[w, EW_Q_HEAD]
    while rid >= 0:
        e[rid, E_SRC] = -1
        e[rid, E_BLOCKS] = -1
        e[rid, E_PENDING] = -1
        _unhold(s, w, rid)
        rid = e[rid, E_Q_NEXT]
    s.ewi[w, EW_Q_HEAD] = -1
    s.ewi[w, EW_Q_N] = 0


@kernel
def _sweep(s, now):
    """EcoServe._sweep: the records of requests seen nowhere (not routed to prefill, neither
    running nor waiting for admission on any worker) at this sweep and the last go."""
    s.tick_f[K_E_NEXT_SWEEP] = now + s.tick_f[K_E_SWEEP]
    sweep = s.g[G_E_SWEEP]
    s.g[G_E_SWEEP] = sweep + 1
    s.g[G_E_STAMP] += 1
    live = s.g[G_E_STAMP]
    ri, e, wi = s.ri, s.eri, s.wi
    for w in range(wi.shape[0]):
        rid = wi[w, W_RUN_HEAD]
        while rid >= 0:
            e[rid, E_STAMP] = live
            rid = ri[rid, R_RUN_NEXT]
        rid = wi[w, W_DQ_HEAD]
        for _ in range(wi[w, W_DQ_LEN]):
            e[rid, E_STAMP] = live
            rid = ri[rid, R_QUEUE_NEXT]
    rec = s.erec
    for i in range(s.g[G_E_RECORDS] - 1, -1, -1):
        rid = rec[i]
        if e[rid, E_SRC] >= 0 or e[rid, E_STAMP] == live:
            continue
        if e[rid, E_GONE] == sweep - 1:  # unseen at the last sweep too
            e[rid, E_DBLOCKS] = -1
            last = s.g[G_E_RECORDS] - 1
            rec[i] = rec[last]
            e[rec[i], E_REC_POS] = i
            s.g[G_E_RECORDS] = last
        e[rid, E_GONE] = sweep


# =============================================================================================
# Prefill phases (pdopt.policies._ecoserve_activation, phases="activation")
# =============================================================================================
@kernel
def _activation_phases(s, now, n):
    """activation_phases: each member (mixed, in a macro instance) whose activation has a
    prompt to prefill and no decode waiting for admission enters a prefill phase; one in it
    leaves it when :func:`_phase_over` says so (to "both", or, prompts still to prefill, to a
    decode stretch) and releases its held prompts. Appends its SetPhase actions to ``s.acts``
    from row ``n``; returns the new count."""
    ew, wi = s.ewi, s.wi
    for w in range(wi.shape[0]):
        if ew[w, EW_MACRO] < 0 or not wi[w, W_MIXED]:
            continue
        busy = _has_prefill(s, w, now)
        phase = ew[w, EW_PHASE]
        if phase == PH_PREFILL:
            if _phase_over(s, w, now, busy):
                ew[w, EW_PHASE] = PH_DECODE if busy else PH_BOTH
                n = _set_phase(s, n, w, ew[w, EW_PHASE])
                _release(s, w, now)
            continue
        _keep_held_routed(s, w)  # prompts prefilled before a phase could start already decode
        if phase == PH_DECODE and wi[w, W_DQ_LEN] and wi[w, W_BATCH_N] + wi[w, W_B]:
            continue  # a forced end's decode stretch: held prompts still wait for admission
        start = (
            busy
            and ew[w, EW_ACT_HEAD] >= 0
            and now >= s.ewf[w, EW_READY_AT]
            and wi[w, W_DQ_LEN] == 0  # the last phase's prompts all decode
        )
        new = PH_PREFILL if start else PH_BOTH
        if new != phase:
            ew[w, EW_PHASE] = new
            n = _set_phase(s, n, w, new)
    return n


@kernel
def _set_phase(s, n, w, phase):
    """Append SetPhase(w, phase) to the tick's actions."""
    return _act(s, n, w, phase, ACT_SET_PHASE)


@kernel
def _keep_held_routed(s, w):
    """``_held[w]`` keeps the requests still routed to ``w`` (``_src``), not yet prefilled."""
    e = s.eri
    rid = s.ewi[w, EW_H_HEAD]
    while rid >= 0:
        nxt = e[rid, E_H_NEXT]
        if e[rid, E_SRC] != w:
            _unhold(s, w, rid)
        rid = nxt


@kernel
def _phase_over(s, w, now, busy):
    """phase_over: ``w``'s prefill phase ends with no prompt left to prefill (``hold="deadline"``:
    then only when the cursor is not on it, it holds no prompt or it has existed decodes), when
    its held prompts fill its running slots, when another tick would take its oldest held prompt
    past the TTFT SLO, or when the saved TPOT of its existed decodes (C2's aggregate,
    :func:`_existed_saved_tpot`) is below a tick (computed where first read: the policy's
    value is the same, unused before)."""
    if not busy:
        if s.tick_f[K_E_HOLD_DEADLINE] == 0.0 or s.ewi[w, EW_H_HEAD] < 0:
            return True
        if not _on_cursor(s, w):
            return True
        count, _ = _existed_saved_tpot(s, w, now)
        if count != 0:  # -1: handed back
            return True
    elif _slots_full(s, w):
        return True
    if now + s.tick_s >= _oldest_held(s, w) + s.tick_f[K_TTFT_SLO] - 1e-9:
        return True
    if not busy:
        return False  # no existed decode
    if _c2_still_met(s, w, now):
        return False
    stamp, _ = _not_decoding(s, w, False)
    count, below, lo, size = _saved_below(s, w, stamp, now, s.tick_s)
    if count < 0:
        _unsupported(s)
        return False
    _c2_keep(s, w, now, lo, size)
    return below


@kernel
def _existed_saved_tpot(s, w, now):
    """:func:`_saved_tpot` of ``w``'s decodes outside its activation's not decoding ones
    (not_decoding: its existed decodes); (-1, 0.0), the run handed back, where fsum gives no
    finite sum."""
    stamp, _ = _not_decoding(s, w, False)
    count, saved = _saved_tpot(s, w, stamp, now)
    if count < 0:
        _unsupported(s)
    return count, saved


@kernel
def _on_cursor(s, w):
    """``w in p._cursors()`` under ``rolling`` (else never): the instance under its macro
    instance's InterSchedule cursor."""
    m = s.ewi[w, EW_MACRO]
    if s.tick_f[K_E_ROLLING] == 0.0 or m < 0 or s.emac[m, M_SIZE] == 0:
        return False
    return _cursor_worker(s, m) == w


@kernel
def _oldest_held(s, w):
    """The oldest arrival among ``w``'s held prompts (inf: none), walked again only when its
    held list changed (EW_VER)."""
    ew = s.ewi
    if ew[w, EW_OLD_VER] != ew[w, EW_VER] or ew[w, EW_OLD_VER] == 0:
        oldest = np.inf
        rid = ew[w, EW_H_HEAD]
        while rid >= 0:
            if s.rf[rid, F_ARRIVAL] < oldest:
                oldest = s.rf[rid, F_ARRIVAL]
            rid = s.eri[rid, E_H_NEXT]
        s.ewf[w, EW_OLDEST] = oldest
        ew[w, EW_OLD_VER] = ew[w, EW_VER]
    return s.ewf[w, EW_OLDEST]


@kernel
def _c2_keep(s, w, now, lo, size):
    """Keep what this C2 check saw of ``w`` (its decodes, held and activation lists) and ``lo``,
    a lower bound on the saved TPOT at ``now`` (-inf: none kept)."""
    ew, wi = s.ewi, s.wi
    ew[w, EW_C2_KEPT] = 1 if lo > -np.inf else 0
    ew[w, EW_C2_VER] = ew[w, EW_VER]
    ew[w, EW_C2_SERIAL] = wi[w, W_SEG_SERIAL]
    ew[w, EW_C2_M] = counter_at(s, w, now)
    ew[w, EW_C2_DQH] = wi[w, W_DQ_HEAD]
    ew[w, EW_C2_DQT] = wi[w, W_DQ_TAIL]
    ew[w, EW_C2_DQN] = wi[w, W_DQ_LEN]
    s.ewf[w, EW_C2_T] = now
    s.ewf[w, EW_C2_LO] = lo
    s.ewf[w, EW_C2_SIZE] = size


@kernel
def _c2_still_met(s, w, now):
    """Whether C2 is still met for ``w`` without walking its decodes: nothing it counts changed
    since the last check (the same decodes at the same iteration, the same held and activation
    lists), so each saved TPOT fell by the time since at most (a decode's by exactly that, one
    with no first token recorded not at all), and the bound kept then, less that time and the
    rounding of each value (``2^-48`` of the times and magnitudes involved), is still at least
    a tick. (A held request preempted and decoding elsewhere may get a later first token from
    its release meanwhile: that only raises its saved TPOT, so the bound holds.) NOTE: a
    control tick asked this of every instance in a prefill phase, walking each one's decodes;
    now the walk happens when they changed."""
    ew, wi = s.ewi, s.wi
    if not ew[w, EW_C2_KEPT]:
        return False
    if (
        ew[w, EW_C2_VER] != ew[w, EW_VER]
        or ew[w, EW_C2_SERIAL] != wi[w, W_SEG_SERIAL]
        or ew[w, EW_C2_DQH] != wi[w, W_DQ_HEAD]
        or ew[w, EW_C2_DQT] != wi[w, W_DQ_TAIL]
        or ew[w, EW_C2_DQN] != wi[w, W_DQ_LEN]
        or ew[w, EW_C2_M] != counter_at(s, w, now)
    ):
        return False
    t1 = s.ewf[w, EW_C2_T]
    rounding = 2.0**-48 * (abs(t1) + abs(now) + s.ewf[w, EW_C2_SIZE])
    return s.ewf[w, EW_C2_LO] - (now - t1) - rounding >= s.tick_s


@kernel
def _decode_start_s(s, w, now):
    """decode_start_s: when the phase after ``w``'s prefill phase admits its held prompts: now,
    or with a batch in service, its predicted end (the outstanding work less that of the
    activation's prompts queued behind it, each less the predictor's intercept)."""
    if s.wi[w, W_BATCH_N] == 0:
        return now
    t0 = s.ttft[w, 2]
    s.g[G_E_STAMP] += 1
    stamp = s.g[G_E_STAMP]
    act, e = s.eact, s.eri
    ent = s.ewi[w, EW_ACT_HEAD]
    while ent >= 0:  # _activation[w].get: its requests' values
        rid = act[ent, A_RID]
        e[rid, E_STAMP] = stamp
        s.erf[rid, E_SVAL] = s.eactf[ent]
        ent = act[ent, A_NEXT]
    n = 0
    rid = s.wi[w, W_PQ_HEAD]
    for _ in range(s.wi[w, W_PQ_LEN]):
        value = s.erf[rid, E_SVAL] if e[rid, E_STAMP] == stamp else t0
        x = value - t0
        n = fsum_add(s.epart, n, x if x > 0.0 else 0.0)
        if n < 0:
            _unsupported(s)
            return now
        rid = s.ri[rid, R_QUEUE_NEXT]
    left = prefill_wait_s(s, w, now) - fsum_value(s.epart, n)
    return now + (left if left > 0.0 else 0.0)


@kernel
def _release(s, w, now):
    """release: ``w``'s held prompts already prefilled begin decoding at
    :func:`_decode_start_s` (their first token moved there; one past its TTFT SLO then is a
    miss), those still to prefill stay held; a new activation starts with the prompts still
    routed to ``w``."""
    e, erf = s.eri, s.erf
    m = s.ewi[w, EW_MACRO]
    start_s = _decode_start_s(s, w, now)
    rid = s.ewi[w, EW_H_HEAD]
    while rid >= 0:
        nxt = e[rid, E_H_NEXT]
        if e[rid, E_SRC] != w:
            if e[rid, E_DBLOCKS] >= 0:
                erf[rid, E_FT_T] = start_s
            if m >= 0 and start_s - s.rf[rid, F_ARRIVAL] > s.tick_f[K_TTFT_SLO]:
                _miss(s, m, now)
            _unhold(s, w, rid)
        rid = nxt
    _keep_activation_routed(s, w)


@kernel
def _keep_activation_routed(s, w):
    """``_activate(w)`` then ``_activation[w].update(carried)``: the entries of requests still
    routed to ``w`` stay (in their order), the others go back to the free list."""
    act, e, ew = s.eact, s.eri, s.ewi
    ent = ew[w, EW_ACT_HEAD]
    head, tail = -1, -1
    while ent >= 0:
        nxt = act[ent, A_NEXT]
        if e[act[ent, A_RID], E_SRC] == w:
            if tail >= 0:
                act[tail, A_NEXT] = ent
            else:
                head = ent
            tail = ent
        else:
            act[ent, A_NEXT] = s.g[G_E_FREE]
            s.g[G_E_FREE] = ent
        ent = nxt
    if tail >= 0:
        act[tail, A_NEXT] = -1
    ew[w, EW_ACT_HEAD] = head
    ew[w, EW_ACT_TAIL] = tail
    ew[w, EW_VER] += 1


# =============================================================================================
# Mitosis (pdopt.policies._ecoserve_macros.MacroInstances: observe_finished, scale)
# =============================================================================================
@kernel
def _cursor_worker(s, m):
    """The instance under macro instance ``m``'s cursor (it has members)."""
    return s.emem[m, s.emac[m, M_CURSOR] % s.emac[m, M_SIZE]]


@kernel
def _observe_finished(s, now):
    """observe_finished: per member of each macro instance, the requests that left its running
    batch since the last tick were finished; their TPOT against the SLO is kept per macro
    instance and tick (one ``State.efin`` row: the policy's entries of that tick and uid) for
    ``scale_idle_s``. With no standby instance, the snapshots are forgotten instead.

    NOTE: in work proportional to what changed, not to the running batches. ``_seen[w]`` is
    ``w``'s snapshot (W_SNAP_SEQ, W_SNAP_M: the requests admitted before it that still run, with
    the context they had then); the engine lists those of them that stopped running since
    (finished, preempted, departed; :func:`pdopt.sim._compiled._decode._left_snapshot`) in
    ``State.snap_out``. ``_seen[w].keys() - cur.keys()`` is that list less the requests running
    on ``w`` again (preempted and admitted back since)."""
    wi, ri = s.wi, s.ri
    if s.g[G_E_STANDBY] == 0:
        for w in range(wi.shape[0]):
            wi[w, W_SNAP_SEQ] = 0  # nobody is in an empty snapshot
            wi[w, W_SNAP_OUT] = 0
        return
    tpot = s.tick_f[K_TPOT_SLO]
    for m in range(s.g[G_E_MACROS]):
        n_fin, n_late = 0, 0
        for k in range(s.emac[m, M_SIZE]):
            w = s.emem[m, k]
            for x in range(wi[w, W_SNAP_OUT]):
                rid, ctx = s.snap_out[w, x, 0], s.snap_out[w, x, 1]
                if ri[rid, R_ADMIT_SEQ] >= 0 and ri[rid, R_DECODE_TARGET] == w:
                    continue  # running here again
                t0, c0 = now, ctx
                if s.eri[rid, E_DBLOCKS] >= 0:
                    t0, c0 = s.erf[rid, E_FT_T], s.eri[rid, E_FT_CTX]
                tokens = ctx - c0 + 1
                n_fin += 1
                if (now - t0) > tokens * tpot + s.tick_s:
                    n_late += 1
            wi[w, W_SNAP_SEQ] = s.g[G_ADMIT_SEQ]  # the next admission's number
            wi[w, W_SNAP_M] = counter_at(s, w, now)
            wi[w, W_SNAP_OUT] = 0
        if n_fin:
            _finished(s, now, s.emac[m, M_UID], n_fin, n_late)
    cutoff = now - s.tick_f[K_E_SCALE_IDLE]
    while s.g[G_E_FIN_N] > 0 and s.efin[s.g[G_E_FIN_HEAD], FIN_T] < cutoff:
        _count_finished(s, s.g[G_E_FIN_HEAD], -1)
        s.g[G_E_FIN_HEAD] = (s.g[G_E_FIN_HEAD] + 1) % s.efin.shape[0]
        s.g[G_E_FIN_N] -= 1


@kernel
def _count_finished(s, row, sign):
    """Add (``sign`` 1) or take off (-1) the requests of ring entry ``row`` in its macro
    instance's counts (:func:`_failing`'s), if the instance is still listed and the entry is
    later than its last change (an earlier one was never counted: :func:`_changed` zeroes the
    counts)."""
    fin = s.efin
    uid = int(fin[row, FIN_UID])
    for m in range(s.g[G_E_MACROS]):
        if s.emac[m, M_UID] == uid:
            if fin[row, FIN_T] > s.emacf[m, 0]:
                s.emac[m, M_FIN_N] += sign * int(fin[row, FIN_N])
                s.emac[m, M_FIN_LATE] += sign * int(fin[row, FIN_LATE])
            return


@kernel
def _changed(s, m, now):
    """Macro instance ``m`` changed at ``now`` (an instance joined or left it): ``_failing``
    counts what it finishes from now on (every ring entry so far is at ``now`` or before)."""
    s.emacf[m, 0] = now
    s.emac[m, M_FIN_N] = 0
    s.emac[m, M_FIN_LATE] = 0


@kernel
def _finished(s, now, uid, n_fin, n_late):
    """Append a tick's finished requests of macro instance ``uid`` to the ring (doubled when
    full)."""
    size = s.efin.shape[0]
    if s.g[G_E_FIN_N] == size:
        old, head = s.efin, s.g[G_E_FIN_HEAD]
        s.efin = np.empty((2 * size, 4), np.float64)
        fin = s.efin
        for i in range(size):
            fin[i] = old[(head + i) % size]
        s.g[G_E_FIN_HEAD] = 0
        size *= 2
    fin = s.efin
    row = (s.g[G_E_FIN_HEAD] + s.g[G_E_FIN_N]) % size
    fin[row, FIN_T] = now
    fin[row, FIN_UID] = uid
    fin[row, FIN_N] = n_fin
    fin[row, FIN_LATE] = n_late
    s.g[G_E_FIN_N] += 1
    _count_finished(s, row, 1)


@kernel
def _failing(s, m):
    """_failing: more than BEHIND_FRAC of the requests macro instance ``m`` finished since it
    last changed (at least 10 of them) missed the TPOT SLO: the ring's entries of its uid later
    than its last change, counted as they come and go (:func:`_count_finished`)."""
    n, late = s.emac[m, M_FIN_N], s.emac[m, M_FIN_LATE]
    return n >= 10 and late > s.tick_f[K_E_BEHIND] * n


@kernel
def _scale(s, now, n):
    """scale: one standby instance for each macro instance (of those at the start) that missed
    or is failing joins the oldest macro instance below ``n_upper`` (else the newest;
    ``refill="missing"``: the one that missed), which splits past ``n_upper``; then an idle
    instance may go back to standby (:func:`_scale_down`)."""
    k = s.tick_f
    for m in range(s.g[G_E_MACROS]):
        if s.emac[m, M_MISSES] == 0 and s.g[G_E_STANDBY] and _failing(s, m):
            _miss(s, m, now)
        if s.emac[m, M_MISSES] and s.g[G_E_STANDBY]:
            target = m if k[K_E_REFILL_MISSING] != 0.0 else _refill_target(s)
            w = _standby_pop(s)
            size = s.emac[target, M_SIZE]
            s.emem[target, size] = w
            s.emac[target, M_SIZE] = size + 1
            _changed(s, m, now)
            _changed(s, target, now)
            n = _join(s, w, target, now, n)
            if size + 1 > k[K_E_N_UPPER]:
                n = _split(s, target, now, n)
    _index(s)
    return _scale_down(s, now, n)


@kernel
def _refill_target(s):
    """_refill_target: the oldest macro instance below ``n_upper``, else the newest."""
    for m in range(s.g[G_E_MACROS]):
        if s.emac[m, M_SIZE] < s.tick_f[K_E_N_UPPER]:
            return m
    return s.g[G_E_MACROS] - 1


@kernel
def _standby_pop(s):
    """``standby.pop(0)``."""
    w = s.estb[0]
    count = s.g[G_E_STANDBY] - 1
    for i in range(count):
        s.estb[i] = s.estb[i + 1]
    s.g[G_E_STANDBY] = count
    return w


@kernel
def _join(s, w, m, now, n):
    """_join with a migration: ``w`` serves macro instance ``m`` in the base phase, taking no
    request for ``migration_s``; a MoveWorker when its pool or role differs."""
    s.ewf[w, EW_READY_AT] = now + s.tick_f[K_E_MIGRATION]
    label = s.emac[m, M_LABEL]
    if s.wi[w, W_POOL] != label or not s.wi[w, W_MIXED]:
        n = _act(s, n, w, label, ROLE_MIXED)
    return _enter_base_phase(s, n, w)


@kernel
def _enter_base_phase(s, n, w):
    """``phase[w] = base_phase`` and its SetPhase (MacroInstances._join): "decode" under
    ``phases="ticks"`` (its SetPhase appended), else "both" (its SetPhase left out: the engine's
    phase of a worker that joins is "both" already)."""
    if s.tick_f[K_E_TICKS] != 0.0:
        s.ewi[w, EW_PHASE] = PH_DECODE
        return _set_phase(s, n, w, PH_DECODE)
    s.ewi[w, EW_PHASE] = PH_BOTH
    return n


@kernel
def _split(s, m, now, n):
    """_split: a new macro instance of ``m``'s last ``n_lower`` members (the cursor's instance
    keeps the cursor: the new one's if it left with them, and ``m`` goes on with its first)."""
    lower = int(s.tick_f[K_E_N_LOWER])
    o = s.g[G_E_MACROS]
    s.g[G_E_MACROS] = o + 1
    uid = s.g[G_E_NEXT_UID]
    s.g[G_E_NEXT_UID] = uid + 1
    emac = s.emac
    emac[o, M_LABEL] = s.g[G_E_MACRO0] + uid
    emac[o, M_UID] = uid
    emac[o, M_CURSOR] = 0
    emac[o, M_MISSES] = 0
    emac[o, M_SIZE] = lower
    keep = emac[m, M_SIZE] - lower
    for i in range(lower):
        s.emem[o, i] = s.emem[m, keep + i]
    emac[m, M_SIZE] = keep
    _changed(s, o, now)
    _changed(s, m, now)
    cur = emac[m, M_CURSOR] % (keep + lower)
    if cur >= keep:
        emac[o, M_CURSOR] = cur - keep
        emac[m, M_CURSOR] = 0
    return _move_all(s, o, 0, lower, o, now, n)


@kernel
def _move_all(s, src, first, count, dst, now, n):
    """_move_all: members ``first`` to ``first + count`` of macro instance ``src`` move to
    ``dst``'s scheduler (migrations; a MoveWorker each)."""
    label = s.emac[dst, M_LABEL]
    for i in range(first, first + count):
        w = s.emem[src, i]
        s.ewf[w, EW_READY_AT] = now + s.tick_f[K_E_MIGRATION]
        n = _act(s, n, w, label, ROLE_MIXED)
    return n


@kernel
def _index(s):
    """_index: each worker's macro instance from the list."""
    for w in range(s.ewi.shape[0]):
        s.ewi[w, EW_MACRO] = -1
    for m in range(s.g[G_E_MACROS]):
        for k in range(s.emac[m, M_SIZE]):
            s.ewi[s.emem[m, k], EW_MACRO] = m


@kernel
def _busy(s, w):
    """``w`` runs, or has queued, prefill or decode work (_scale_down's ``idle``, negated)."""
    wi = s.wi
    return wi[w, W_BATCH_N] + wi[w, W_B] > 0 or wi[w, W_PQ_LEN] > 0 or wi[w, W_DQ_LEN] > 0


@kernel
def _scale_down(s, now, n):
    """_scale_down: with no miss for ``scale_idle_s``, the last member idle now and that long of
    the macro instance :func:`_shrinkable` picks goes back to standby (a MoveWorker to the prefill
    role), then the two smallest macro instances may merge."""
    wi, k = s.wi, s.tick_f
    for w in range(wi.shape[0]):
        if _busy(s, w):
            s.ewf[w, EW_IDLE_SINCE] = now
    count, total = 0, 0
    for m in range(s.g[G_E_MACROS]):
        if s.emac[m, M_SIZE]:
            count += 1
            total += s.emac[m, M_SIZE]
    if count == 0 or total <= 1:
        return n
    idle_s = k[K_E_SCALE_IDLE]
    if now - k[K_E_LAST_MISS] < idle_s:
        return n
    src = _shrinkable(s, count)
    gone = -1
    for i in range(s.emac[src, M_SIZE]):
        w = s.emem[src, i]
        if not _busy(s, w) and now - s.ewf[w, EW_IDLE_SINCE] >= idle_s:
            gone = w  # idle now, too: with scale_idle_s=0 a busy member has idled "0 s" too
    if gone < 0:
        return n
    _remove(s, src, gone)
    _changed(s, src, now)
    s.estb[s.g[G_E_STANDBY]] = gone
    s.g[G_E_STANDBY] += 1
    s.ewi[gone, EW_PHASE] = PH_BOTH
    n = _act(s, n, gone, s.g[G_E_STANDBY_LABEL], ROLE_PREFILL)
    if s.emac[src, M_SIZE] == 0:
        _drop_macro(s, src)
    n = _merge(s, now, n)
    _index(s)
    return n


@kernel
def _before(s, a, b):
    """Whether macro instance ``a`` sorts before ``b`` by (size, pool name): pools
    ``macro<uid>`` compare as strings ("macro10" < "macro2")."""
    size_a, size_b = s.emac[a, M_SIZE], s.emac[b, M_SIZE]
    if size_a != size_b:
        return size_a < size_b
    return uid_before(s.emac[a, M_UID], s.emac[b, M_UID])


@kernel
def uid_before(a, b):
    """``str(a) < str(b)`` for non-negative integers: their digits compared left to right,
    a proper prefix first."""
    da, db = _digits(a), _digits(b)
    x, y = a, b
    for _ in range(db - da):
        x *= 10
    for _ in range(da - db):
        y *= 10
    if x != y:
        return x < y
    return da < db


@kernel
def _digits(x):
    d = 1
    while x >= 10:
        x //= 10
        d += 1
    return d


@kernel
def _shrinkable(s, count):
    """_shrinkable over the ``count`` macro instances with members: the smallest while above
    ``n_lower`` (or the only one), else the largest."""
    small, large = -1, -1
    for m in range(s.g[G_E_MACROS]):
        if s.emac[m, M_SIZE] == 0:
            continue
        if small < 0 or _before(s, m, small):
            small = m
        if large < 0 or _before(s, large, m):
            large = m
    if s.emac[small, M_SIZE] > s.tick_f[K_E_N_LOWER] or count == 1:
        return small
    return large


@kernel
def _remove(s, m, w):
    """_remove: ``w`` leaves macro instance ``m``; the cursor stays on its instance, or moves
    to the member that followed ``w``."""
    size = s.emac[m, M_SIZE]
    i = 0
    while s.emem[m, i] != w:
        i += 1
    cur = s.emac[m, M_CURSOR] % size
    for j in range(i, size - 1):
        s.emem[m, j] = s.emem[m, j + 1]
    size -= 1
    s.emac[m, M_SIZE] = size
    if size:
        s.emac[m, M_CURSOR] = cur - 1 if i < cur else cur % size
    else:
        s.emac[m, M_CURSOR] = 0


@kernel
def _drop_macro(s, m):
    """``macros.remove``: the rows after ``m`` move up one."""
    last = s.g[G_E_MACROS] - 1
    for i in range(m, last):
        s.emac[i] = s.emac[i + 1]
        s.emacf[i] = s.emacf[i + 1]
        s.emem[i] = s.emem[i + 1]
    s.g[G_E_MACROS] = last


@kernel
def _merge(s, now, n):
    """_merge: the two smallest macro instances (by size, then pool name) merge, the smaller
    into the other, once together they are below ``n_upper``."""
    if s.g[G_E_MACROS] < 2:
        return n
    small, into = -1, -1
    for m in range(s.g[G_E_MACROS]):
        if small < 0 or _before(s, m, small):
            small, into = m, small
        elif into < 0 or _before(s, m, into):
            into = m
    size_small, size_into = s.emac[small, M_SIZE], s.emac[into, M_SIZE]
    if size_small + size_into >= s.tick_f[K_E_N_UPPER]:
        return n
    n = _move_all(s, small, 0, size_small, into, now, n)
    for i in range(size_small):
        s.emem[into, size_into + i] = s.emem[small, i]
    s.emac[into, M_SIZE] = size_into + size_small
    _changed(s, into, now)
    s.emac[small, M_SIZE] = 0
    _drop_macro(s, small)
    return n
