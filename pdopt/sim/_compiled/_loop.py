"""The compiled engine's event loop and its event handlers (:mod:`pdopt.sim._engine`'s and
:mod:`pdopt.sim._control`'s, for the runs the compiled engine takes).

Events are popped in ``(time, seq)`` order; their kinds are :class:`pdopt.sim._enums.Event`'s.
The handlers append the event log's entries to the State (:func:`pdopt.sim._compiled._heap.
put_log`); the loop returns them.
"""

from __future__ import annotations

import numpy as np

from pdopt.sim._compiled._arrow import arrow_tick
from pdopt.sim._compiled._decode import (
    L_ADM,
    L_DEP,
    L_DROP,
    L_FIN,
    L_JOIN,
    L_PRE,
    abort_running,
    advance_boundary,
    blocks_for,
    boundary,
    counter_at,
    defer_boundary,
    enqueue_decode,
    forget_used,
    schedule_boundary,
    tighten,
    visit_at,
    withdraw_decode,
)
from pdopt.sim._compiled._ecoserve import eco_tick
from pdopt.sim._compiled._heap import put_log, remove_event, schedule
from pdopt.sim._compiled._jit import (
    blocks_of,
    by_reference,
    first_boundary_after,
    keep,
    kernel,
    next_tick,
    view_of,
)
from pdopt.sim._compiled._migration import (
    copy,
    decode_free,
    dirty_blocks,
    drop,
    record,
    takes_decode,
)
from pdopt.sim._compiled._mixed import abort_decode, next_step, poke, settle_accepting, unstall
from pdopt.sim._compiled._phasor_tick import phasor_tick
from pdopt.sim._compiled._pools import (
    POOL_PACK,
    assign,
    move_worker,
    reroute_decode,
    splitwise_tick,
)
from pdopt.sim._compiled._prefill import (
    batch_index,
    chunk_in_flight,
    drop_chunked,
    end_batch,
    enqueue_prefill,
    finish_chunks,
    start_prefill,
    transfer,
    withdraw_prefill,
)
from pdopt.sim._compiled._prefix import cache_prompt, release_prefix
from pdopt.sim._compiled._routing import route_decode, route_prefill
from pdopt.sim._compiled._state import (
    AB_ADMISSION,
    AB_DECODING,
    AB_MIGRATING,
    AB_PREFILL,
    AB_QUEUED,
    AB_TRANSFER,
    ACT_SET_PHASE,
    CANCEL_CLIENT,
    CANCEL_DST_LEFT,
    CANCEL_FINISHED,
    CANCEL_NO_ROOM,
    CANCEL_PACK,
    CANCEL_PREEMPTED,
    ERR_NO_DECODE_WORKER,
    ERR_POLICY,
    ERR_STUCK,
    ERR_UNSUPPORTED,
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_TOKEN,
    F_MIG_STOP,
    F_PREFILL_END,
    F_THINK,
    G_BLOCKED_TICKS,
    G_DONE,
    G_DROP_N,
    G_ERROR,
    G_HEAP_N,
    G_LOG_N,
    G_MIG_ORDER,
    G_N_MIGS,
    G_NEXT_RID,
    G_STOPPED,
    G_TS_N,
    K_NEXT_ACT,
    LOG_ABORT,
    LOG_MIG_CANCEL,
    LOG_PHASE,
    LOG_POOL_MOVE,
    LOG_PREEMPTION,
    LOG_REJECTION,
    PH_BOTH,
    PH_PREFILL,
    R_ABORTING,
    R_DECODE_TARGET,
    R_GENERATED,
    R_INPUT,
    R_KV_OFFSET,
    R_MIG_COPIED,
    R_MIG_DEPART_AT,
    R_MIG_DST,
    R_MIG_EVPOS,
    R_MIG_HELD,
    R_MIG_MAX_STAGES,
    R_MIG_ORDER,
    R_MIG_PHASE,
    R_MIG_SRC,
    R_MIG_SRC_HELD,
    R_MIG_STAGES,
    R_MIG_STOP_DIRTY,
    R_OUTPUT,
    R_PREEMPTIONS,
    R_PREFILL_TOKENS,
    R_STATUS,
    ROLE_MIXED,
    TICK_ARROW,
    TICK_ECOSERVE,
    TICK_NONE,
    TICK_PHASOR,
    TICK_SPLITWISE,
    V_A_SEG,
    V_HALF_D2B,
    V_T_SEG,
    W_ACCEPTING,
    W_B,
    W_BATCH_N,
    W_CHUNK_N,
    W_DQ_LEN,
    W_HELD,
    W_HYBRID,
    W_INFLIGHT,
    W_IS_DECODE,
    W_MIXED,
    W_N_SEG,
    W_NEXT_N,
    W_PHASE,
    W_POOL,
    W_PQ_LEN,
    W_PROMPTS,
    W_SLOTS_HELD,
    W_STALLED,
    W_STEP,
)
from pdopt.sim._compiled._tick import log_false_oom, record_admitted, sample, tick_checks
from pdopt.sim._enums import Event, MigrationPhase, Status, Step
from pdopt.sim._mixed import MAX_BLOCKED_TICKS


@kernel
def run_events(state):
    """Run ``state`` (a :class:`~pdopt.sim._compiled._state.State`) to the end (or to an error,
    ``state.g[G_ERROR]``), passed on by reference (:func:`pdopt.sim._compiled._jit.by_reference`).

    Returns
    -------
    log_t, log_i : ndarray
        The event log: each entry's time (float64), and its kind (``LOG_*``), worker, rid, a
        and b (int64, one row per entry), worded by :mod:`pdopt.sim._compiled._io`.
    now : float
        The time of the last event, seconds.
    ts_i, ts_f : ndarray
        The time series: int64 and float64 columns (``T_*``, ``U_*``), one row per column.
    """
    ref = by_reference(state)
    s = view_of(ref)  # what every call gets, counted nothing; ref is kept to the end
    n_req, n_workers = s.ri.shape[0], s.wi.shape[0]
    ev_t, ev_i, g, wi = s.ev_t, s.ev_i, s.g, s.wi
    ts_rows = s.ticks * n_workers if s.timeseries else 0  # column-major: one row per column
    ts_i = np.empty((6, ts_rows), np.int64)
    ts_f = np.empty((4, ts_rows), np.float64)
    now = 0.0
    _start(s)
    if n_req and (s.timeseries or s.t_code != TICK_NONE):
        schedule(s, s.tick_s, Event.TICK, 1)
    while g[G_HEAP_N] > 0 and g[G_STOPPED] == 0:
        now = ev_t[0]
        kind, arg = ev_i[0, 1], ev_i[0, 2]
        remove_event(s, 0)
        if kind == Event.ARRIVAL:
            need = _on_arrival(s, arg, now)
            if need >= 0:
                put_log(s, now, LOG_REJECTION, -1, arg, need, 0)
        elif kind == Event.PREFILL_DONE:
            if wi[arg, W_MIXED]:  # a mixed worker's prefill step: the step end settles it
                _on_mixed_prefill_done(s, arg, now)
                if g[G_ERROR] == 0:
                    _visit_mixed(s, arg, wi[arg, W_N_SEG], now)
            elif _on_prefill_done(s, arg, now):  # a worker moved to decode admits now
                _wake_decode(s, arg, now)
        elif kind == Event.DECODE:  # only a worker's pending boundary event is ever queued
            j, n = arg, wi[arg, W_NEXT_N]
            if wi[j, W_MIXED]:
                _visit_mixed(s, j, n, now)
                continue
            n_pre, blocked = _process_boundary(s, j, n, now)
            if n_pre or blocked >= 0:
                _log_boundary(s, j, s.lists[0], n_pre, blocked, now)
        elif kind == Event.MIGRATION:  # Migrations.on_copy_done (a cancelled copy is gone)
            if s.ri[arg, R_MIG_PHASE] == MigrationPhase.PRECOPY:
                _precopy_done(s, arg, now)
            else:
                _takeover(s, arg, now)
        elif kind == Event.TRANSFER_DONE:  # Engine.on_transfer_done
            if s.ri[arg, R_STATUS] == Status.ABORTED:  # its client left while the KV was in flight
                release_prefix(s, arg)
                continue
            j = s.ri[arg, R_DECODE_TARGET]
            if not (wi[j, W_IS_DECODE] or wi[j, W_MIXED]):
                # moved to the prefill pool while the KV was in flight: route it on from there
                reroute_decode(s, arg, j, now)
                continue
            j = enqueue_decode(s, arg, now)
            if wi[j, W_DQ_LEN] > 1:
                continue
            if wi[j, W_MIXED]:  # Engine.wake_decode
                _poke_top(s, j, now)
                continue
            _wake_decode(s, j, now)
        elif kind == Event.ABORT:
            _on_abort(s, arg, now)
        else:  # TICK number ``arg``
            settled = tick_checks(s, now)
            if s.timeseries:
                ts_i, ts_f = _sample(s, ts_i, ts_f, now)
            due = phasor_tick(s, now) if s.t_code == TICK_PHASOR else _policy_tick(s, now)
            if g[G_DONE] < n_req and g[G_STOPPED] == 0:
                if g[G_HEAP_N] == 0 and not _phase_blocked(s):
                    g[G_ERROR] = ERR_STUCK
                    break
                if g[G_STOPPED]:
                    break
                nxt = arg + 1
                # Control.on_tick: the ticks before the next event, at once. A policy that acts
                # on ticks is skipped too while it is not due (its rule returns at once), up to
                # the tick where it is: nothing changes meanwhile (NOTE: the Python engine runs
                # those ticks; they log and change nothing, so the results are the same)
                if settled and not due:
                    nxt = next_tick(arg, ev_t[0], s.tick_s)
                    if s.t_code != TICK_NONE:
                        nxt = min(nxt, _due_tick(s, arg))
                    for k in range(arg + 1, nxt if s.timeseries else 0):
                        ts_i, ts_f = _sample(s, ts_i, ts_f, k * s.tick_s)
                schedule(s, nxt * s.tick_s, Event.TICK, nxt)
    n_log = g[G_LOG_N]
    out = s.logt[:n_log], s.logi[:n_log], now, ts_i[:, : g[G_TS_N]], ts_f[:, : g[G_TS_N]]
    keep(ref)
    return out


@kernel
def _policy_tick(s, now):
    """The policy's on_tick at ``now`` under tick rule ``s.t_code`` (its actions applied);
    False when it was not due (it returned at once)."""
    if s.t_code == TICK_SPLITWISE:
        return splitwise_tick(s, now)
    if s.t_code == TICK_ARROW or s.t_code == TICK_ECOSERVE:
        # decided on the tick's state, then applied in its order
        n = arrow_tick(s, now) if s.t_code == TICK_ARROW else eco_tick(s, now)
        for i in range(n if s.g[G_ERROR] == 0 else 0):
            w, pool, role = s.acts[i, 0], s.acts[i, 1], s.acts[i, 2]
            if role == ROLE_MIXED:
                _to_mixed(s, w, pool, now)
            elif role == ACT_SET_PHASE:
                set_phase(s, w, pool, now)
            else:
                move_worker(s, w, role, pool, now)
            if s.g[G_ERROR]:
                break
        return True
    return False


@kernel
def _to_mixed(s, w, pool, now):
    """Control.move_worker to the mixed role (a relabel when already mixed), then
    Colocated.move: the prompts of a running batch now share the worker's one cache; a batch
    in flight ends as a prefill step, a decode segment runs on as a decode step, an idle worker
    settles now (its boundary and next step). A prefill or decode worker has no chunked
    prompts, so no step in flight is a hybrid iteration."""
    wi = s.wi
    old = ROLE_MIXED if wi[w, W_MIXED] else wi[w, W_IS_DECODE]
    put_log(s, now, LOG_POOL_MOVE, w, -1, old, ROLE_MIXED + POOL_PACK * pool)
    if wi[w, W_MIXED]:
        wi[w, W_POOL] = pool
        return
    prompts = 0  # PrefillSide.batch_blocks: reserved in KvBlocks whatever the role
    for i in range(wi[w, W_BATCH_N]):
        prompts += blocks_of(s, s.ri[s.batches[w, i], R_PREFILL_TOKENS])
    wi[w, W_MIXED] = 1
    wi[w, W_PHASE] = PH_BOTH
    assign(s, w, 0, pool)
    wi[w, W_PROMPTS] = prompts
    if wi[w, W_INFLIGHT]:
        wi[w, W_ACCEPTING] = 0  # no admission while a prefill step runs
        wi[w, W_STEP] = Step.PREFILL
        return
    wi[w, W_ACCEPTING] = 1
    decoding = wi[w, W_B] > 0 and not wi[w, W_STALLED]
    wi[w, W_STEP] = Step.DECODE if decoding else Step.IDLE
    _poke_top(s, w, now)


@kernel
def _poke_top(s, j, now):
    """Colocated.poke of mixed worker ``j`` outside the request path: an idle worker settles
    here (Colocated.settle: its boundary, then its next step), any other is poked."""
    if s.wi[j, W_STEP] == Step.IDLE:
        unstall(s, j, now)
        s.wi[j, W_ACCEPTING] = settle_accepting(s, j)
        _visit_mixed(s, j, s.wi[j, W_N_SEG], now)
    else:
        poke(s, j, now)


@kernel
def set_phase(s, w, phase, now):
    """Colocated.set_phase: mixed worker ``w`` takes ``phase`` (PH_*; logged when it changes);
    a decode step admits from now on unless the phase is "prefill"; then it is poked."""
    wi = s.wi
    if not wi[w, W_MIXED]:  # PolicyDecisionError there: only mixed workers have phases
        s.g[G_ERROR] = ERR_POLICY
        s.g[G_STOPPED] = 1
        return
    old = wi[w, W_PHASE]
    if old == phase:
        return
    wi[w, W_PHASE] = phase
    put_log(s, now, LOG_PHASE, w, -1, old, phase)
    if wi[w, W_STEP] == Step.DECODE:
        wi[w, W_ACCEPTING] = phase != PH_PREFILL
    _poke_top(s, w, now)


@kernel
def _phase_blocked(s):
    """Colocated.phase_blocked, asked when nothing is scheduled: whether a mixed worker's phase
    may hold back the work left (the run then ticks on, up to MAX_BLOCKED_TICKS in a row; past
    them it stops with ERR_POLICY, where the Python engine raises)."""
    wi = s.wi
    for w in range(wi.shape[0]):
        if wi[w, W_MIXED] and wi[w, W_PHASE] != PH_BOTH:
            s.g[G_BLOCKED_TICKS] += 1
            if s.g[G_BLOCKED_TICKS] > MAX_BLOCKED_TICKS:
                s.g[G_ERROR] = ERR_POLICY
                s.g[G_STOPPED] = 1
            return True
    s.g[G_BLOCKED_TICKS] = 0
    return False


@kernel
def _due_tick(s, k):
    """The first tick after tick ``k`` at which the tick rule is due: its time ``i · tick_s``
    at or past the rule's next action time less the rules' 1e-9 s tolerance."""
    t = s.tick_f[K_NEXT_ACT]
    i = max(k + 1, int((t - 1e-9) / s.tick_s))
    while i > k + 1 and (i - 1) * s.tick_s + 1e-9 >= t:
        i -= 1
    while i * s.tick_s + 1e-9 < t:
        i += 1
    return i


@kernel
def _sample(s, ts_i, ts_f, now):
    """Append one time-series row per worker at ``now`` (growing the columns when full)."""
    row, n_workers = s.g[G_TS_N], s.wi.shape[0]
    if row + n_workers > ts_i.shape[1]:
        ts_i, ts_f = _grown(ts_i), _grown(ts_f)
    sample(s, ts_i, ts_f, row, now)
    s.g[G_TS_N] = row + n_workers
    return ts_i, ts_f


@kernel
def _grown(a):
    # NOTE: a quarter more, not twice: the old and new columns coexist while copying, so the
    # peak is 2.25x the columns instead of 3x (issue 38: 1M requests with the time series in
    # 1.5 GB); the start's estimate (_io._expected_ticks) makes growing rare in open loops.
    # The columns start at >= 64 rows per worker, so a quarter holds a tick's rows.
    out = np.empty((a.shape[0], a.shape[1] + a.shape[1] // 4 + 64), a.dtype)
    out[:, : a.shape[1]] = a
    return out


# =============================================================================================
# The driver: arrivals, and the end of a request (pdopt.sim._drivers, Control)
# =============================================================================================
@kernel
def _start(s):
    """The first arrival (open loop) or every client's first request at its start time in the
    table (closed loop; Arrivals.start)."""
    n_req = s.rf.shape[0]
    if s.clients == 0:
        if n_req:
            schedule(s, s.rf[0, F_ARRIVAL], Event.ARRIVAL, 0)
        s.g[G_NEXT_RID] = 1
        return
    first = min(n_req, s.clients)
    for rid in range(first):
        schedule(s, s.rf[rid, F_ARRIVAL], Event.ARRIVAL, rid)
    s.g[G_NEXT_RID] = first


@kernel
def _on_arrival(s, rid, now):
    """Schedule the next arrival (open loop); reject a request no worker's KV holds (returns
    its KV tokens), else route it (returns -1)."""
    nxt = s.g[G_NEXT_RID]
    if s.clients == 0 and nxt < s.ri.shape[0]:
        s.g[G_NEXT_RID] = nxt + 1
        schedule(s, s.rf[nxt, F_ARRIVAL], Event.ARRIVAL, nxt)
    inp, out = s.ri[rid, R_INPUT], s.ri[rid, R_OUTPUT]
    need = inp + out - 1 if out > 1 else inp
    if blocks_of(s, need) > s.max_kv // s.bt:
        s.ri[rid, R_STATUS] = Status.REJECTED
        _ended(s, now)
        return need
    if s.timeout_s > 0.0:  # its client gives up then (Engine.on_abort)
        schedule(s, now + s.timeout_s, Event.ABORT, rid)
    _to_prefill(s, rid, now, False)
    return -1


@kernel
def _ended(s, now):
    """A request ended: in a closed loop its client sends the next request after its think time
    (Control.request_ended); the run stops once every request has ended."""
    g, rf = s.g, s.rf
    g[G_DONE] += 1
    nxt = g[G_NEXT_RID]
    if s.clients > 0 and nxt < rf.shape[0]:
        at = now + rf[nxt, F_THINK]
        g[G_NEXT_RID] = nxt + 1
        rf[nxt, F_ARRIVAL] = at
        schedule(s, at, Event.ARRIVAL, nxt)
    if g[G_DONE] == rf.shape[0]:
        g[G_STOPPED] = 1


@kernel
def _finish(s, rid, now):
    """Engine.finish: ``rid`` emitted its last token; its cached blocks' references go
    (unless its client gave up before: it ended then, and only leaves here)."""
    release_prefix(s, rid)
    if s.ri[rid, R_STATUS] == Status.ABORTED:
        return
    s.ri[rid, R_STATUS] = Status.FINISHED
    s.rf[rid, F_FINISH] = now
    _ended(s, now)


@kernel
def _on_abort(s, rid, now):
    """Engine.on_abort: ``rid``'s client timed out; unless it ended, it ends now, aborted, and
    releases what it holds (:func:`_withdraw`); logged with its state."""
    if s.ri[rid, R_STATUS] != Status.PENDING:
        return
    s.ri[rid, R_STATUS] = Status.ABORTED
    s.rf[rid, F_FINISH] = now
    w, state = _withdraw(s, rid, now)
    if s.g[G_ERROR]:
        return
    put_log(s, now, LOG_ABORT, w, rid, state, 0)
    _ended(s, now)


@kernel
def _withdraw(s, rid, now):
    """Engine._withdraw: take aborted ``rid`` out of where it is (or mark it to leave at the
    end of the step in flight); its worker (-1 in a KV transfer) and its state (AB_*)."""
    ri, wi = s.ri, s.wi
    if ri[rid, R_MIG_PHASE] >= 0 and _abort_migration(s, rid, now):
        return ri[rid, R_DECODE_TARGET], AB_MIGRATING
    j = ri[rid, R_DECODE_TARGET]
    if j >= 0:
        if abort_running(s, j, rid):
            if wi[j, W_MIXED]:
                abort_decode(s, j, now)
            else:
                advance_boundary(s, j, now)
            return j, AB_DECODING
        head = withdraw_decode(s, j, rid)
        if head >= 0:
            release_prefix(s, rid)
            if head == 1 and wi[j, W_DQ_LEN] > 0:  # Engine.wake_decode
                if wi[j, W_MIXED]:
                    _poke_top(s, j, now)
                else:
                    _wake_decode(s, j, now)
            return j, AB_ADMISSION
    for w in range(wi.shape[0]):
        i = batch_index(s, w, rid)
        if i >= 0:
            if wi[w, W_MIXED] and wi[w, W_HYBRID]:  # a chunked prompt started
                if chunk_in_flight(s, w, i):
                    ri[rid, R_ABORTING] = 1  # dropped when the iteration in flight ends
                else:
                    drop_chunked(s, w, i)
                    release_prefix(s, rid)
                    _poke_top(s, w, now)  # the freed blocks may start the next one
            # a whole batch's prompt: dropped when the batch ends (_prefill_completed)
            return w, AB_PREFILL
        head = withdraw_prefill(s, w, rid)
        if head >= 0:
            if head == 1 and wi[w, W_PQ_LEN] > 0:  # the next one may fit where the head did not
                if wi[w, W_MIXED]:
                    _poke_top(s, w, now)
                elif wi[w, W_BATCH_N] == 0 and wi[w, W_B] == 0:
                    start_prefill(s, w, now)
            return w, AB_QUEUED
    return -1, AB_TRANSFER  # dropped when it lands (Engine.on_transfer_done)


@kernel
def _abort_migration(s, rid, now):
    """Migrations.abort: ``rid``'s client gave up during its migration. Still running on its
    source (pre-copy, or waiting to depart), the migration is cancelled (False: it leaves the
    source's batch at its next boundary); else it runs nowhere (True): the source's hold
    (stop-and-copy), the destination's hold and slot are freed at once and its copy in flight
    removed from the heap (the Python engine ignores its end)."""
    ri, wi = s.ri, s.wi
    phase = ri[rid, R_MIG_PHASE]
    if phase == MigrationPhase.PRECOPY or phase == MigrationPhase.DEPARTING:
        _cancel(s, rid, CANCEL_CLIENT, 0, 0, now)
        return False
    src, dst = ri[rid, R_MIG_SRC], ri[rid, R_MIG_DST]
    drop(s, rid)
    if ri[rid, R_MIG_EVPOS] >= 0:
        remove_event(s, ri[rid, R_MIG_EVPOS])
    if phase == MigrationPhase.STOPCOPY:
        wi[src, W_HELD] -= ri[rid, R_MIG_SRC_HELD]
        if wi[src, W_DQ_LEN] > 0:
            _wake_from_migration(s, src, now)  # the freed blocks may admit the head
        _release_prefill(s, src, now)
    wi[dst, W_HELD] -= ri[rid, R_MIG_HELD]
    wi[dst, W_SLOTS_HELD] -= 1
    put_log(s, now, LOG_MIG_CANCEL, src, rid, CANCEL_CLIENT, 0)
    if wi[dst, W_DQ_LEN] > 0 and wi[dst, W_ACCEPTING]:
        _wake_from_migration(s, dst, now)
    _release_prefill(s, dst, now)
    return True


@kernel
def _to_prefill(s, rid, now, front):
    """Engine.route_prefill: route ``rid``, queue it (at the head when ``front``) and start a
    batch on an idle worker, or poke a mixed one."""
    w = route_prefill(s, rid, now)
    enqueue_prefill(s, rid, w, now, front)
    if s.wi[w, W_MIXED] and s.g[G_ERROR] == 0:
        poke(s, w, now)


# =============================================================================================
# A prefill batch ends; a decode worker's boundary
# =============================================================================================
@kernel
def _on_prefill_done(s, w, now):
    """First tokens of worker ``w``'s batch; finish or send each on; start the next batch, or
    (a worker moved to decode) admit decode work: True when its admission queue then waits
    (the caller wakes it, Engine.wake_decode)."""
    wi = s.wi
    _prefill_completed(s, w, s.batches[w], end_batch(s, w), now)
    if s.g[G_ERROR]:
        return False
    if wi[w, W_PQ_LEN] > 0 and wi[w, W_B] == 0:
        start_prefill(s, w, now)
    elif wi[w, W_IS_DECODE]:
        wi[w, W_ACCEPTING] = 1
        return wi[w, W_DQ_LEN] > 0
    return False


@kernel
def _wake_decode(s, j, now):
    """Engine.wake_decode of non-mixed worker ``j`` (a new request heads its admission queue):
    when it accepts, admit at its next boundary, or now when idle."""
    wi = s.wi
    if not wi[j, W_ACCEPTING]:
        return
    if wi[j, W_B] > 0:  # the new head waits for a boundary
        advance_boundary(s, j, now)
        return
    s.wf[j, V_T_SEG] = now  # an idle worker admits it now
    forget_used(s, j)
    n_pre, blocked = _process_boundary(s, j, wi[j, W_N_SEG], now)
    if n_pre or blocked >= 0:
        _log_boundary(s, j, s.lists[0], n_pre, blocked, now)


@kernel
def _on_mixed_prefill_done(s, w, now):
    """Engine.on_prefill_done of mixed worker ``w``, up to its settle's boundary: close the
    step (a batch, or a chunk-only iteration), emit the first tokens of the prompts it
    completed, end a stall and open admission."""
    s.wi[w, W_STEP] = Step.BUSY  # Colocated.busy: arrivals wait for the next step
    if s.wi[w, W_CHUNK_N] > 0:
        _prefill_completed(s, w, s.completed, finish_chunks(s, w), now)
    else:
        _prefill_completed(s, w, s.batches[w], end_batch(s, w), now)
    unstall(s, w, now)
    s.wi[w, W_ACCEPTING] = settle_accepting(s, w)


@kernel
def _prefill_completed(s, w, ids, count, now):
    """Engine.prefill_completed: the first token of prompts ``ids[:count]`` prefilled on ``w``
    (the end of the step that finished them); each finishes or goes to its decode worker."""
    ri, rf = s.ri, s.rf
    for i in range(count):
        rid = ids[i]
        if s.ptoks:
            cache_prompt(s, w, rid)
        if ri[rid, R_STATUS] == Status.ABORTED:  # its client left during the step: drop it
            release_prefix(s, rid)  # its computed blocks stay cached, as in vLLM
            continue
        gen = ri[rid, R_GENERATED] + 1
        ri[rid, R_GENERATED] = gen
        if rf[rid, F_PREFILL_END] != rf[rid, F_PREFILL_END]:
            rf[rid, F_PREFILL_END] = now
            rf[rid, F_FIRST_TOKEN] = now
        if gen >= ri[rid, R_OUTPUT]:
            _finish(s, rid, now)
            continue
        j = route_decode(s, rid, w, now)
        if j < 0:
            s.g[G_ERROR] = ERR_NO_DECODE_WORKER
            s.g[G_STOPPED] = 1
            return
        transfer(s, rid, w, j, now)


@kernel
def _process_boundary(s, j, n, now):
    """Engine.process_boundary for decode worker ``j``: the boundary, the next one scheduled,
    the migrations' bookkeeping (Migrations.after_boundary), then its admitted, finished and
    preempted requests; (preempted count, blocked head), the ids in ``s.lists[0]``."""
    out = s.lists[0]
    n_fin, n_pre, n_adm, n_dep, n_join, blocked = _boundary_start(s, j, n, now, out)
    if s.g[G_ERROR]:
        return 0, -1
    if s.g[G_N_MIGS] > 0:
        _after_boundary(s, j, out, n_fin, n_pre, n_dep, n_join, now)
    _boundary_end(s, j, out, n_fin, n_pre, n_adm, now)
    return n_pre, blocked


@kernel
def _boundary_start(s, j, n, now, out):
    """The first part of Engine.process_boundary: a mixed worker's hybrid iteration ends (its
    completed prompts' first tokens), then the boundary (ids in ``out``), the requests it
    dropped released (Engine._dropped: their cached blocks, their migrations cancelled) and the
    next boundary scheduled; the boundary's counts and blocked head."""
    counts = _boundary_only(s, j, n, now, out)
    if s.g[G_ERROR]:
        return counts
    dropped = s.g[G_DROP_N]
    if dropped:
        s.g[G_DROP_N] = 0
        for i in range(dropped):
            rid = out[L_DROP, i]
            release_prefix(s, rid)
            if s.ri[rid, R_MIG_PHASE] >= 0:  # Migrations.abort of a pre-copy or departure
                _cancel(s, rid, CANCEL_CLIENT, 0, 0, now)
    _schedule_next(s, j)
    return counts


@kernel
def _idle_boundary_start(s, j, n, now, out):
    """:func:`_boundary_start` of an idle worker (nothing runs, so nothing is dropped): the
    one a migration's handler wakes, which must not cancel another migration (no recursion)."""
    counts = _boundary_only(s, j, n, now, out)
    if s.g[G_DROP_N]:  # never: an idle worker runs nothing
        s.g[G_ERROR] = ERR_UNSUPPORTED
        s.g[G_STOPPED] = 1
    if s.g[G_ERROR] == 0:
        _schedule_next(s, j)
    return counts


@kernel
def _boundary_only(s, j, n, now, out):
    """A mixed worker's hybrid iteration ends (its completed prompts' first tokens), then the
    boundary (ids in ``out``); its counts and blocked head."""
    if s.wi[j, W_MIXED]:
        s.wi[j, W_STEP] = Step.BUSY  # Colocated.busy: arrivals wait for the next step
        if s.wi[j, W_CHUNK_N] > 0:
            _prefill_completed(s, j, s.completed, finish_chunks(s, j), now)
            if s.g[G_ERROR]:
                return 0, 0, 0, 0, 0, -1
    return boundary(s, j, n, now, out)


@kernel
def _schedule_next(s, j):
    """Schedule worker ``j``'s next boundary after one (Engine.schedule_decode); a mixed
    worker's is deferred: its next step (_visit_mixed) places the boundary, or a hybrid
    iteration or a stall replaces it (two heap operations saved per iteration)."""
    if s.wi[j, W_MIXED]:
        defer_boundary(s, j)
    else:
        schedule_boundary(s, j)


@kernel
def _boundary_end(s, j, out, n_fin, n_pre, n_adm, now):
    """The last part of Engine.process_boundary: the admitted requests' decode starts, the
    finished ones end, the preempted ones go back to prefill; a worker moved to the prefill
    pool starts prefill once drained."""
    ri = s.ri
    record_admitted(s, out[L_ADM], n_adm, now)
    for i in range(n_fin):
        _finish(s, out[L_FIN, i], now)
    for i in range(n_pre):
        rid = out[L_PRE, i]
        release_prefix(s, rid)
        ri[rid, R_PREEMPTIONS] += 1
        _to_prefill(s, rid, now, s.requeue_front)
    wi = s.wi
    if s.g[G_ERROR] == 0 and wi[j, W_B] == 0 and not (wi[j, W_IS_DECODE] or wi[j, W_MIXED]):
        # moved to the prefill pool: drained now, it starts prefill
        wi[j, W_ACCEPTING] = 0
        if wi[j, W_PQ_LEN] > 0 and wi[j, W_BATCH_N] == 0:
            start_prefill(s, j, now)


@kernel
def _visit_mixed(s, j, n, now):
    """Engine.process_boundary of mixed worker ``j`` at boundary ``n``: the boundary and its
    log entries, then the worker's next step (Colocated.next_step)."""
    n_pre, blocked = _process_boundary(s, j, n, now)
    if n_pre or blocked >= 0:
        _log_boundary(s, j, s.lists[0], n_pre, blocked, now)
    if s.g[G_ERROR] == 0:
        next_step(s, j, now)


@kernel
def _log_boundary(s, j, out, n_pre, blocked, now):
    """Log a boundary's preemptions (re-prefill changes no logged value; ids in ``out``), then
    check its blocked head for a false OOM, in the Python engine's order."""
    for i in range(n_pre):
        rid = out[L_PRE, i]
        put_log(s, now, LOG_PREEMPTION, j, rid, s.ri[rid, R_GENERATED], 0)
    if blocked >= 0:
        log_false_oom(s, blocked, now)


# =============================================================================================
# Migrations: the handlers that may wake a worker (pdopt.sim._migration.Migrations)
# =============================================================================================
@kernel
def _after_boundary(s, j, out, n_fin, n_pre, n_dep, n_join, now):
    """Migrations.after_boundary of worker ``j``: cancel the migrations of requests that
    finished or were preempted at the boundary, start the stop-and-copies of those that
    departed, complete those that joined."""
    ri = s.ri
    for i in range(n_fin):
        if ri[out[L_FIN, i], R_MIG_PHASE] >= 0:
            _cancel(s, out[L_FIN, i], CANCEL_FINISHED, 0, 0, now)
    for i in range(n_pre):
        if ri[out[L_PRE, i], R_MIG_PHASE] >= 0:
            _cancel(s, out[L_PRE, i], CANCEL_PREEMPTED, 0, 0, now)
    for i in range(n_dep):
        _stop_copy(s, out[L_DEP, i], now)
    for i in range(n_join):
        _joined(s, out[L_JOIN, i], now)


@kernel
def _wake_from_migration(s, j, now):
    """Engine.wake_decode of worker ``j`` from a migration's handler: admit at its next
    boundary, or now when idle.

    NOTE: a copy of :func:`_wake_decode`'s path that cannot recurse: an idle worker's boundary
    finishes, preempts and departs nothing (its batch is empty), so it needs only the joins of
    Migrations.after_boundary, never a cancel (which wakes). numba compiles no recursion here,
    and its cache does not reload one. Its ids go in ``s.lists[1]``: the caller may be
    iterating over ``s.lists[0]``."""
    wi = s.wi
    if wi[j, W_MIXED]:  # Colocated.poke: no compiled run migrates to or from a mixed worker
        s.g[G_ERROR] = ERR_UNSUPPORTED
        s.g[G_STOPPED] = 1
        return
    if not wi[j, W_ACCEPTING]:
        return
    if wi[j, W_B] > 0:
        advance_boundary(s, j, now)
        return
    s.wf[j, V_T_SEG] = now
    forget_used(s, j)
    out = s.lists[1]
    n_fin, n_pre, n_adm, n_dep, n_join, blocked = _idle_boundary_start(
        s, j, wi[j, W_N_SEG], now, out
    )
    if n_fin or n_pre or n_dep:
        s.g[G_ERROR] = ERR_UNSUPPORTED
        s.g[G_STOPPED] = 1
        return
    for i in range(n_join):
        _joined(s, out[L_JOIN, i], now)
    _boundary_end(s, j, out, n_fin, n_pre, n_adm, now)
    if blocked >= 0:
        _log_boundary(s, j, out, 0, blocked, now)


@kernel
def _cancel(s, rid, reason, extra, free, now):
    """Migrations._cancel: end ``rid``'s migration while it still runs on its source (or just
    ended there): the destination's hold and slot released, its pending copy dropped."""
    ri, wi = s.ri, s.wi
    src, dst = ri[rid, R_MIG_SRC], ri[rid, R_MIG_DST]
    drop(s, rid)
    wi[dst, W_HELD] -= ri[rid, R_MIG_HELD]
    wi[dst, W_SLOTS_HELD] -= 1
    if ri[rid, R_MIG_EVPOS] >= 0:
        remove_event(s, ri[rid, R_MIG_EVPOS])
    put_log(s, now, LOG_MIG_CANCEL, src, rid, reason + CANCEL_PACK * extra, free)
    if wi[dst, W_DQ_LEN] > 0 and wi[dst, W_ACCEPTING]:
        _wake_from_migration(s, dst, now)
    _release_prefill(s, dst, now)


@kernel
def _hold(s, rid, context, now):
    """Migrations._hold: grow the destination's hold to ``context`` tokens' blocks; cancel and
    return False without room."""
    ri = s.ri
    dst = ri[rid, R_MIG_DST]
    need = blocks_for(s, dst, rid, context)
    extra = need - ri[rid, R_MIG_HELD]
    if extra <= 0:
        return True
    free = decode_free(s, dst, now)
    if extra > free:
        _cancel(s, rid, CANCEL_NO_ROOM, extra, free, now)
        return False
    s.wi[dst, W_HELD] += extra
    ri[rid, R_MIG_HELD] = need
    tighten(s, dst)
    return True


@kernel
def _precopy_done(s, rid, now):
    """Migrations._precopy_done: another pre-copy stage while more than ``stop_dirty_blocks``
    are dirty (and stages remain), else leave the source at its next boundary."""
    ri, wi, wf = s.ri, s.wi, s.wf
    src, dst = ri[rid, R_MIG_SRC], ri[rid, R_MIG_DST]
    if not takes_decode(s, dst):
        _cancel(s, rid, CANCEL_DST_LEFT, 0, 0, now)
        return
    offset = ri[rid, R_KV_OFFSET]
    context = offset + counter_at(s, src, now)
    dirty = dirty_blocks(s, ri[rid, R_MIG_COPIED], context)
    if dirty > ri[rid, R_MIG_STOP_DIRTY] and ri[rid, R_MIG_STAGES] < ri[rid, R_MIG_MAX_STAGES]:
        if _hold(s, rid, context, now):
            copy(s, rid, dirty, context, now)
        return
    n = wi[src, W_N_SEG] + first_boundary_after(
        wf[src, V_T_SEG], wf[src, V_A_SEG], wf[src, V_HALF_D2B], now
    )
    if not _hold(s, rid, offset + n, now):
        return
    ri[rid, R_MIG_PHASE] = MigrationPhase.DEPARTING
    ri[rid, R_MIG_DEPART_AT] = n
    _phase_order(s, rid)
    if n < wi[src, W_NEXT_N]:
        visit_at(s, src, n)


@kernel
def _phase_order(s, rid):
    """Number ``rid``'s migration's entry into its phase (departures and joins of one boundary
    follow it)."""
    s.ri[rid, R_MIG_ORDER] = s.g[G_MIG_ORDER]
    s.g[G_MIG_ORDER] += 1


@kernel
def _stop_copy(s, rid, now):
    """Migrations._stop_copy: ``rid`` left its source at this boundary; copy its last dirty
    blocks (the downtime starts)."""
    ri = s.ri
    context = ri[rid, R_INPUT] + ri[rid, R_GENERATED]
    ri[rid, R_MIG_PHASE] = MigrationPhase.STOPCOPY
    s.rf[rid, F_MIG_STOP] = now
    ri[rid, R_MIG_SRC_HELD] = blocks_for(s, ri[rid, R_MIG_SRC], rid, context)
    copy(s, rid, dirty_blocks(s, ri[rid, R_MIG_COPIED], context), context, now)


@kernel
def _takeover(s, rid, now):
    """Migrations._takeover: the stop-and-copy ended; the source's hold is freed and ``rid``
    joins its destination at its next boundary, or (the destination left the decode pool)
    its KV is routed on from there."""
    ri, wi = s.ri, s.wi
    src, dst = ri[rid, R_MIG_SRC], ri[rid, R_MIG_DST]
    wi[src, W_HELD] -= ri[rid, R_MIG_SRC_HELD]
    if wi[src, W_DQ_LEN] > 0:
        _wake_from_migration(s, src, now)  # the freed blocks may admit the head
    _release_prefill(s, src, now)
    if takes_decode(s, dst):
        ri[rid, R_MIG_PHASE] = MigrationPhase.JOINING
        _phase_order(s, rid)
        _wake_from_migration(s, dst, now)  # joins at its next boundary (now when idle)
        return
    drop(s, rid)
    wi[dst, W_HELD] -= ri[rid, R_MIG_HELD]
    wi[dst, W_SLOTS_HELD] -= 1
    ri[rid, R_PREFILL_TOKENS] = ri[rid, R_INPUT] + ri[rid, R_GENERATED]
    record(s, rid, now, 1)
    if reroute_decode(s, rid, dst, now):
        _release_prefill(s, dst, now)


@kernel
def _joined(s, rid, now):
    """Migrations._joined: ``rid`` runs on its destination now."""
    s.ri[rid, R_DECODE_TARGET] = s.ri[rid, R_MIG_DST]
    record(s, rid, now, 0)
    drop(s, rid)


@kernel
def _release_prefill(s, w, now):
    """Migrations._release_prefill: start ``w``'s prefill head if it was waiting for the KV a
    migration held there (a prefill worker, idle)."""
    wi = s.wi
    if (
        not (wi[w, W_IS_DECODE] or wi[w, W_MIXED])
        and wi[w, W_PQ_LEN] > 0
        and wi[w, W_BATCH_N] == 0
        and wi[w, W_B] == 0
    ):
        start_prefill(s, w, now)
