"""A compiled run's way in and out: the request table and cluster packed into a :class:`State`,
and the run's results back into the table, the event rows and the time-series frame."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from pdopt.freeness import stranded_blocks
from pdopt.sim._compiled._arrow import A_D, A_P
from pdopt.sim._compiled._loop import run_events
from pdopt.sim._compiled._migration import END_PACK
from pdopt.sim._compiled._pools import POOL_PACK
from pdopt.sim._compiled._routing import ROUTING_PARAMS, Codes
from pdopt.sim._compiled._state import (
    A_NEXT,
    A_RID,
    ABORT_STATES,
    CANCEL_CLIENT,
    CANCEL_DST_LEFT,
    CANCEL_FINISHED,
    CANCEL_NO_ROOM,
    CANCEL_PACK,
    CANCEL_PREEMPTED,
    E_BLOCKS,
    E_DBLOCKS,
    E_GONE,
    E_H_NEXT,
    E_H_PREV,
    E_HELD_W,
    E_PENDING,
    E_Q_NEXT,
    E_Q_PREV,
    E_SRC,
    ENTRY_COLUMNS,
    EW_ACT_HEAD,
    EW_ACT_TAIL,
    EW_H_HEAD,
    EW_MACRO,
    EW_Q_HEAD,
    F_ARRIVAL,
    F_DECODE_START,
    F_FINISH,
    F_FIRST_TOKEN,
    F_MIG_DOWNTIME,
    F_MIGRATED_BYTES,
    F_PREFILL_END,
    F_PREFILL_FLOP,
    F_PREFILL_START,
    F_READY,
    F_THINK,
    F_TRANSFER_END,
    F_TRANSFER_START,
    G_ADMIT_SEQ,
    G_DONE,
    G_E_MACRO0,
    G_E_MACROS,
    G_E_NEXT_UID,
    G_E_STANDBY,
    G_E_STANDBY_LABEL,
    G_ENT_FREE,
    G_ERROR,
    G_N_DECODE,
    G_N_PREFILL,
    INDEX_COLUMNS,
    INDEX_SLOTS_PER_ENTRY,
    K_COLOCATED,
    K_COOL,
    K_DECODE_THRESHOLD,
    K_DEFRAG,
    K_DELTA_T,
    K_E_ACTIVATION,
    K_E_BEHIND,
    K_E_C2_REMAINING,
    K_E_CHECK_REQUEST,
    K_E_CONSTRAINTS,
    K_E_HOLD_DEADLINE,
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
    K_E_SWEEP,
    K_E_TICKS,
    K_ELASTIC,
    K_EVACUATE,
    K_HISTORY,
    K_IDLE_PATIENCE,
    K_LOW_FRAC,
    K_MAX_MOVES,
    K_MIN_FLIP,
    K_MIN_REMAINING,
    K_MIXED_POOL,
    K_NEXT_ACT,
    K_OVER_PATIENCE,
    K_PREFILL_THRESHOLD,
    K_PROACTIVE,
    K_RELEASE,
    K_SLO_AWARE,
    K_THETA_FLOW,
    K_THETA_FRAG,
    K_TPOT_SLO,
    K_TTFT_SLO,
    LOG_ABORT,
    LOG_FALSE_OOM,
    LOG_MIG_CANCEL,
    LOG_MIG_DOWNTIME,
    LOG_MIG_END,
    LOG_MIG_START,
    LOG_PHASE,
    LOG_POOL_MOVE,
    LOG_PREEMPTION,
    M_LABEL,
    M_SIZE,
    M_UID,
    N_E,
    N_EW,
    N_EWF,
    N_F,
    N_G,
    N_K,
    N_M,
    N_R,
    N_V,
    N_W,
    P_CACHED,
    PHASE_NAMES,
    POOL_LABELS,
    R_ADMIT_SEQ,
    R_ASRC,
    R_DECODE_TARGET,
    R_DECODE_WORKER,
    R_GENERATED,
    R_INFLIGHT,
    R_INPUT,
    R_KV_OFFSET,
    R_MIG_DEPART_AT,
    R_MIG_EVPOS,
    R_MIG_PHASE,
    R_MIGRATIONS,
    R_OUTPUT,
    R_PREEMPTIONS,
    R_PREFILL_TOKENS,
    R_PREFILL_WORKER,
    R_STATUS,
    RECENT_PEAKS,
    T_KV_FREE,
    T_KV_STRANDED,
    T_KV_USED,
    T_QUEUE_LEN,
    T_RUNNING,
    T_WORKER,
    TICK_ARROW,
    TICK_ECOSERVE,
    TICK_NONE,
    TICK_PHASOR,
    TICK_SPLITWISE,
    U_BUSY_FRAC,
    U_POWER,
    U_QUEUED_FLOP,
    U_T,
    V_ALPHA,
    V_BATCH_START,
    V_BETA_PM,
    V_BUSY_SINCE,
    V_D0,
    V_D1,
    V_D2,
    V_D3,
    V_DECODE_BUSY,
    V_EXPERTS,
    V_EXPERTS_PER_TOKEN,
    V_FLIPPED_AT,
    V_H0,
    V_H1,
    V_H2,
    V_H3,
    V_H4,
    V_H5,
    V_IDLE_SINCE,
    V_IDLE_W,
    V_INTERCEPT,
    V_MAX_W,
    V_MOVED_AT,
    V_OVER_SINCE,
    V_P_PEAK,
    V_PREFILL_BUSY,
    V_STALL_SINCE,
    W_ACCEPTING,
    W_APOOL,
    W_B,
    W_CAP,
    W_CHUNK_TOKENS,
    W_COUNTED,
    W_DEFER_SEQ,
    W_EVENT_POS,
    W_EVICTIONS,
    W_FITTED,
    W_HIT_TOKENS,
    W_HOME_DECODE,
    W_HYBRID,
    W_INFLIGHT,
    W_IS_DECODE,
    W_ITER_BUDGET,
    W_LOOKUPS,
    W_MAX_RUNNING,
    W_MAX_SIZE,
    W_MAX_TOKENS,
    W_MEMBER,
    W_MEMO_RID,
    W_MIXED,
    W_NEXT_N,
    W_POOL,
    W_RESERVE,
    W_RUN_HEAD,
    W_RUN_TAIL,
    W_STEP,
    State,
)
from pdopt.sim._compiled._tick import FALSE_OOM_PACK, ROLES
from pdopt.sim._enums import Step
from pdopt.sim._policy import PolicyTraits
from pdopt.sim._result import TIMESERIES_COLUMNS, EventRows, label_column

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
    "migrations": R_MIGRATIONS,
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
    "migration_downtime_s": F_MIG_DOWNTIME,
    "migrated_bytes": F_MIGRATED_BYTES,
}


@dataclass(frozen=True)
class CompiledOutcome:
    """What the engine's result needs from a compiled run, besides the request table."""

    now_s: float
    event_rows: EventRows
    busy_s: tuple[float, ...]
    timeseries: pd.DataFrame
    pools: list[str]  # each worker's pool at the end (pool moves change them)
    roles: list[str]  # each worker's role at the end
    # per worker: prompt tokens its prefix cache served, lookups, evictions (None: no cache)
    prefix_counters: tuple[list[int], list[int], list[int]] | None


def run(
    table: Any,
    cluster: Any,
    codes: Codes,
    tick_s: float,
    record_timeseries: bool,
    closed_loop: tuple[int, list[float]] | None = None,
    traits: PolicyTraits | None = None,
    client_timeout_s: float | None = None,
) -> CompiledOutcome | None:
    """Run ``table``'s requests on ``cluster``; fill the table in place.

    Open loop: the table's arrival times. ``closed_loop = (clients, think_s)``: client ``i``
    sends its first request at the table's ``arrival_s[i]``, and request ``i >= clients``
    ``think_s[i - clients]`` after a request ends (:class:`pdopt.sim.ClosedLoop`). ``codes``:
    the policy's routing codes and tick rule (:func:`pdopt.sim._compiled.routing_codes`). Returns
    None when the run stopped on an error (the table is then untouched): the caller reruns it on
    the Python engine, which raises the error with its full message. ``traits``: the policy's
    (its forced colocated schedule and chunk budget for mixed workers; None: the workers' own).
    ``client_timeout_s``: each client gives up that long after its request arrived
    (:meth:`pdopt.sim._engine.Engine.on_abort`; None: clients wait).
    """
    s = pack(
        table, cluster, codes, tick_s, record_timeseries, closed_loop, traits, client_timeout_s
    )
    log_t, log_i, now, ts_i, ts_f = run_events(s)
    if s.g[G_ERROR]:
        return None
    n = table.n
    # with client timeouts, the last request may end (aborted) while a step is in flight
    busy_end = client_timeout_s is None and (s.wi[:, W_INFLIGHT].any() or s.wi[:, W_B].any())
    if s.g[G_DONE] != n or busy_end:
        raise RuntimeError(
            f"pdopt.sim internal error (compiled engine): {n - s.g[G_DONE]} requests never "
            "ended; please report it with the inputs (engine='python' runs it meanwhile)"
        )
    _unpack(s, table)
    names = tuple(w.name for w in cluster.workers)
    pools = pool_labels(cluster.workers, codes[2] == TICK_ECOSERVE, int(s.g[G_E_NEXT_UID]))
    rows = _event_rows(log_t, log_i, names, pools, s.max_kv, s.bt, table, client_timeout_s)
    busy = tuple(_busy_until(s, w, float(now)) for w in range(len(names)))
    roles = [_ROLE_NAMES[2] if m else _ROLE_NAMES[d] for d, m in s.wi[:, [W_IS_DECODE, W_MIXED]]]
    counters = None
    if s.ptoks:
        hits, lookups, evictions = s.wi[:, [W_HIT_TOKENS, W_LOOKUPS, W_EVICTIONS]].T.tolist()
        counters = (hits, lookups, evictions)
    pools_now = [pools[p] for p in s.wi[:, W_POOL]]
    moved = s.t_code != TICK_NONE
    # NOTE: the State (~0.4 GB a million requests) goes before the time-series frame is built,
    # the run's peak (issue 38: 1.5 GB at a million requests with the time series)
    del s, log_t, log_i
    timeseries = _timeseries(ts_i, ts_f, cluster.workers, pools if moved else None)
    return CompiledOutcome(float(now), rows, busy, timeseries, pools_now, roles, counters)


def _busy_until(s: State, w: int, now: float) -> float:
    """Worker ``w``'s busy seconds up to ``now``, the end: PrefillSide.busy_until(now) +
    DecodeSide.busy_until(now), in their expression order (a step in flight at the end, a
    client timeout's, counted so far)."""
    wi, wf = s.wi, s.wf
    prefill = float(wf[w, V_PREFILL_BUSY])
    if wi[w, W_INFLIGHT] and wi[w, W_COUNTED]:
        prefill += now - float(wf[w, V_BATCH_START])
    if wf[w, V_STALL_SINCE] >= 0.0:
        prefill -= now - float(wf[w, V_STALL_SINCE])
    decode = float(wf[w, V_DECODE_BUSY]) + (now - float(wf[w, V_BUSY_SINCE]) if wi[w, W_B] else 0.0)
    return prefill + decode


_ROLE_NAMES = ("prefill", "decode", "mixed")  # by the ROLE_* codes
PHASOR_PARAMS = (
    K_DELTA_T, K_TTFT_SLO, K_THETA_FLOW, K_COOL, K_RELEASE, K_MIXED_POOL,
    K_DEFRAG, K_EVACUATE, K_PROACTIVE, K_THETA_FRAG, K_MIN_REMAINING, K_MAX_MOVES,
)  # fmt: skip
"""Where ``Phasor.compiled_tick``'s parameters go in ``tick_f``, in its order."""
ARROW_PARAMS = (
    K_TTFT_SLO, K_TPOT_SLO, K_OVER_PATIENCE, K_IDLE_PATIENCE, K_MIN_FLIP, K_LOW_FRAC,
    K_SLO_AWARE, K_ELASTIC, K_COLOCATED,
)  # fmt: skip
"""Where ``Arrow.compiled_tick``'s settings go in ``tick_f``, in its order (each worker's TTFT
predictor ``a, b, c`` follows them)."""


ECOSERVE_PARAMS = (
    K_TTFT_SLO, K_TPOT_SLO, K_E_ACTIVATION, K_E_MITOSIS, K_E_REFILL_MISSING, K_E_N_LOWER,
    K_E_N_UPPER, K_E_SCALE_IDLE, K_E_MIGRATION, K_E_BEHIND, K_E_SWEEP, K_E_CONSTRAINTS,
    K_E_MIN_SAVED, K_E_MARGIN, K_E_C2_REMAINING, K_E_ROLLING, K_E_SCAN, K_E_TICKS,
    K_E_CHECK_REQUEST, K_E_PREFILL_SLOTS, K_E_HOLD_DEADLINE,
)  # fmt: skip
"""Where ``EcoServe.compiled_tick``'s settings go in ``tick_f``, in its order (each worker's macro
instance and TTFT predictor ``a, b, c`` follow them)."""
STANDBY = "standby"  # EcoServe's pool of spare instances


def pool_labels(workers: Any, ecoserve: bool = False, macros: int = 0) -> list[str]:
    """The run's pool labels: POOL_LABELS (a MoveWorker's pools), then the workers' others;
    under EcoServe then ``standby`` (where no worker's pool names it) and ``macro<k>`` for every
    macro instance's uid ``k`` so far (at least ``macros`` of them, and every ``k`` a worker's
    pool names): label :func:`macro0` + ``k`` (a worker's pool ``macro<k>`` is packed as it)."""
    labels = list(POOL_LABELS)
    labels += sorted({w.pool for w in workers} - set(labels))
    if not ecoserve:
        return labels
    if STANDBY not in labels:
        labels.append(STANDBY)
    named = [_macro_uid(w.pool) for w in workers]
    count = max(macros, *(k + 1 for k in named))
    return labels + [f"macro{k}" for k in range(count)]


def macro0(workers: Any) -> int:
    """Under EcoServe, the label of pool ``macro0`` (``macro<k>``'s is this plus ``k``)."""
    base = pool_labels(workers)
    return len(base) + (STANDBY not in base)


def _macro_uid(pool: str) -> int:
    """``k`` of a pool named ``macro<k>`` as EcoServe names them (``k`` in decimal without
    leading zeros); -1 for any other name."""
    digits = pool.removeprefix("macro")
    if digits == pool or not digits.isdecimal() or str(int(digits)) != digits:
        return -1
    return int(digits)


def _pool_index(labels: list[str], pool: str, ecoserve: bool, first_macro: int) -> int:
    """The label a worker's spec pool is packed as (EcoServe's ``macro<k>``: its macro label)."""
    k = _macro_uid(pool) if ecoserve else -1
    return first_macro + k if k >= 0 else labels.index(pool)


def _macro_of(codes: Codes, n_workers: int) -> list[int] | None:
    """Under EcoServe's tick rule, each worker's macro instance at the start (-1: none), from
    ``EcoServe.compiled_tick``'s parameters; else None."""
    if codes[2] != TICK_ECOSERVE:
        return None
    start = len(ECOSERVE_PARAMS)
    return [int(m) for m in codes[3][start : start + n_workers]]


def pack(
    table: Any,
    cluster: Any,
    codes: Codes,
    tick_s: float,
    record_timeseries: bool,
    closed_loop: tuple[int, list[float]] | None,
    traits: PolicyTraits | None = None,
    client_timeout_s: float | None = None,
) -> State:
    """The initial state of a run (the arguments are :func:`run`'s)."""
    n, workers, bt = table.n, cluster.workers, cluster.block_tokens
    arrival = np.frombuffer(table.arrival_s, dtype=np.float64)
    ri = np.zeros((n, N_R), np.int64)
    ri[:, R_INPUT] = np.frombuffer(table.input_tokens, dtype=np.int64)
    ri[:, R_OUTPUT] = np.frombuffer(table.output_tokens, dtype=np.int64)
    ri[:, [R_PREFILL_WORKER, R_DECODE_WORKER, R_DECODE_TARGET]] = -1
    ri[:, [R_MIG_PHASE, R_MIG_DEPART_AT, R_MIG_EVPOS, R_INFLIGHT]] = -1
    rf = np.full((n, N_F), np.nan)
    rf[:, [F_MIG_DOWNTIME, F_MIGRATED_BYTES]] = 0.0
    rf[:, F_ARRIVAL] = arrival
    clients = 0
    if closed_loop is not None:
        clients, think = closed_loop
        rf[clients:, F_THINK] = np.asarray(think, dtype=np.float64)[: max(n - clients, 0)]
    wi, wf = _worker_rows(workers, traits or PolicyTraits())
    macro_of = _macro_of(codes, len(workers))
    ecoserve = macro_of is not None
    groups = 0 if macro_of is None else max(macro_of, default=-1) + 1
    pools = pool_labels(workers, ecoserve, groups)
    first_macro = macro0(workers)
    wi[:, W_POOL] = [_pool_index(pools, w.pool, ecoserve, first_macro) for w in workers]
    roles = [str(w.role) for w in workers]
    prefill_idx = [w for w, r in enumerate(roles) if r != "decode"]
    decode_idx = [w for w, r in enumerate(roles) if r != "prefill"]
    g = np.zeros(N_G, np.int64)
    g[G_N_PREFILL], g[G_N_DECODE] = len(prefill_idx), len(decode_idx)
    g[G_ENT_FREE] = -1
    g[G_E_MACROS] = g[G_E_NEXT_UID] = groups
    if ecoserve:
        g[G_E_MACRO0] = first_macro
        g[G_E_STANDBY_LABEL] = pools.index(STANDBY)
        g[G_E_STANDBY] = sum(m < 0 for m in macro_of or ())
    tick_f = np.zeros(N_K, np.float64)
    t_code = codes[2]
    history = 1
    if t_code == TICK_SPLITWISE:  # Splitwise.compiled_tick's parameters
        tick_f[[K_PREFILL_THRESHOLD, K_DECODE_THRESHOLD, K_DELTA_T, K_HISTORY]] = codes[3]
        history = int(tick_f[K_HISTORY])
    elif t_code == TICK_PHASOR:  # Phasor.compiled_tick's
        tick_f[list(PHASOR_PARAMS)] = codes[3]
    elif t_code == TICK_ARROW:  # Arrow.compiled_tick's settings (its predictors: _routing_params)
        tick_f[list(ARROW_PARAMS)] = codes[3][: len(ARROW_PARAMS)]
        wi[:, W_APOOL] = [A_D if r == "decode" else A_P for r in roles]
        wf[:, [V_OVER_SINCE, V_IDLE_SINCE]] = -1.0
        wf[:, V_FLIPPED_AT] = -np.inf
        ri[:, R_ASRC] = -1
    elif t_code == TICK_ECOSERVE:  # EcoServe.compiled_tick's settings (the rest: _ecoserve_fields)
        tick_f[list(ECOSERVE_PARAMS)] = codes[3][: len(ECOSERVE_PARAMS)]
        tick_f[K_E_NEXT_SWEEP] = tick_f[K_E_SWEEP]
    if t_code in (TICK_SPLITWISE, TICK_PHASOR):  # the Mixed pool's members and home roles
        tick_f[K_NEXT_ACT] = tick_f[K_DELTA_T]
        wi[:, W_MEMBER] = [w.pool == "mixed" for w in workers]
        wi[:, W_HOME_DECODE] = [r == "decode" for r in roles]
    pad = [0] * len(workers)  # the role indices' room for pool moves
    links = [[cluster.link_between(a.name, b.name) for b in workers] for a in workers]
    running = max(w.max_running for w in workers) + 1
    # an arrival or transfer per request, and an abort when clients time out
    events = (2 if client_timeout_s else 1) * n + 2 * len(workers) + 2
    window = cluster.sliding_window
    state = State(
        ri=ri,
        rf=rf,
        wi=wi,
        wf=wf,
        cnt=np.zeros((len(workers), bt), np.int64),
        fin=np.zeros((len(workers), running, 3), np.int64),
        batches=np.zeros((len(workers), max(w.max_batch_size for w in workers)), np.int64),
        link_bw=np.array([[x.bw_bytes_per_s for x in row] for row in links], np.float64),
        link_lat=np.array([[x.latency_s for x in row] for row in links], np.float64),
        link_free=np.zeros((len(workers), len(workers)), np.float64),
        # ClusterView.prefill_workers / decode_workers: a mixed worker is both
        decode_idx=np.array((decode_idx + pad)[: len(workers)], np.int64),
        prefill_idx=np.array((prefill_idx + pad)[: len(workers)], np.int64),
        ev_t=np.empty(events, np.float64),
        ev_i=np.empty((events, 3), np.int64),
        g=g,
        lists=np.empty((2, 6, running), np.int64),
        completed=np.empty(max(w.max_batch_size for w in workers), np.int64),
        offsets=np.empty(running, np.int64),
        peaks=np.zeros((2, RECENT_PEAKS), np.int64),
        migs=np.empty(n, np.int64),
        inflight=np.empty(n, np.int64),
        bt=bt,
        max_kv=max(w.kv_capacity_blocks * w.block_tokens for w in workers),
        min_cap=min(w.kv_capacity_blocks for w in workers),
        p_code=codes[0],
        d_code=codes[1],
        clients=clients,
        timeseries=bool(record_timeseries and n > 0),
        ticks=_expected_ticks(arrival, tick_s, closed_loop is None),
        kv_bytes=float(cluster.kv_bytes_per_token),
        kv_window=window.window_tokens if window is not None else 0,
        kv_sliding_layers=window.sliding_layers if window is not None else 0,
        kv_layers=window.num_layers if window is not None else 1,
        tick_s=float(tick_s),
        requeue_front=cluster.preempted_requeue == "front",
        timeout_s=float(client_timeout_s or 0.0),
        t_code=t_code,
        tick_f=tick_f,
        hist=np.zeros((len(workers), history), np.int64),
        **_routing_params(codes, len(workers)),
        acts=np.zeros((_action_rows(t_code, len(workers), tick_f), 3), np.int64),
        snap_out=np.zeros(
            (len(workers), running, 2) if t_code in (TICK_ARROW, TICK_ECOSERVE) else (1, 1, 2),
            np.int64,
        ),
        **_prefix_fields(table, cluster),
        logt=np.zeros(log_buffer(len(workers), running), np.float64),
        logi=np.zeros((log_buffer(len(workers), running), 5), np.int64),
        wlist=np.zeros(len(workers), np.int64),
        route_idx=np.zeros(len(workers), np.int64),
        tick_wi=np.zeros((4, len(workers)), np.int64),
        tick_wf=np.zeros((2, len(workers)), np.float64),
        **_ecoserve_fields(macro_of, first_macro, n),
    )
    # NOTE: numba types a read-only or strided array apart from a plain one, so a State holding
    # one (a workload's frozen offsets) would compile the engine again (minutes) instead of
    # loading it: every run's State has one numba type.
    plain: dict[str, Any] = {
        name: np.require(value, requirements=("C", "W"))
        for name, value in state._asdict().items()
        if isinstance(value, np.ndarray)
    }
    return state._replace(**plain)


def _action_rows(t_code: int, n_workers: int, tick_f: np.ndarray) -> int:
    """Rows of State.acts, one tick's actions: Arrow's are at most 3 per worker; EcoServe's
    (joins, splits, a removal and a merge, phases) a few per worker (more hand the run back);
    Phasor's migrations at most ``max_moves`` per source and per draining member."""
    if t_code == TICK_ARROW:
        return 3 * n_workers
    if t_code == TICK_PHASOR:
        return 2 * int(tick_f[K_MAX_MOVES]) * (n_workers + 1)
    return 8 * n_workers + 64 if t_code == TICK_ECOSERVE else 1


def log_buffer(n_workers: int, running: int) -> int:
    """The event log's first length, in entries (it doubles when full:
    pdopt.sim._compiled._heap.put_log): a boundary's preemptions (``running``) and a tick's
    false OOMs and pool moves (a few per worker) many times over."""
    return 8 * n_workers + 4 * running + 4096


FIRST_INDEX_ENTRIES = 2048
"""Entries the prefix cache's index holds at a run's start, at most ``1 / INDEX_SLOTS_PER_ENTRY``
full (it doubles when an entry more would fill it past that:
pdopt.sim._compiled._prefix._grow_index)."""


def cache_entries(cluster: Any, keys: int, per_block: int) -> int:
    """Prefix-cache entries a run's pool holds: a (worker, key) pair for each of the workload's
    ``keys`` block keys on every worker, at most four times the prefix blocks the workers' KV
    holds (cached blocks sit in KV, referenced ones in the prompts and decodes that hold them). A
    run needing more hands itself back to the Python engine (pdopt.sim._compiled._prefix)."""
    workers = cluster.workers
    bound = 4 * sum(w.kv_capacity_blocks // per_block + 1 for w in workers)
    # a request's references are kept as int32 entry numbers (State.pent)
    return int(max(1, min(len(workers) * keys, bound, np.iinfo(np.int32).max)))


def lru_ring(cluster: Any, per_block: int) -> int:
    """Records in each worker's LRU ring (State.lru) at a run's start: a power of two, at least
    twice the prefix blocks the largest worker's KV holds. Its unreferenced blocks can be more
    (prefix blocks smaller than KV blocks, a sliding window): the rings then double
    (pdopt.sim._compiled._prefix._grow_lru), so results never depend on the size."""
    most = max(int(w.kv_capacity_blocks) // per_block + 1 for w in cluster.workers)
    return 1 << (2 * most - 1).bit_length()


def aligned_zeros(rows: int, columns: int, align_bytes: int = 64) -> np.ndarray:
    """A C-ordered int64 ``(rows, columns)`` array of zeros starting on an ``align_bytes``
    boundary (numpy aligns to 16 bytes): with rows of 32 bytes, each lies in one CPU cache line
    (the prefix cache's entries, State.ent)."""
    words = rows * columns
    buf = np.zeros(words + align_bytes // 8, np.int64)
    skip = (-buf.ctypes.data % align_bytes) // 8
    return buf[skip : skip + words].reshape(rows, columns)


def _prefix_fields(table: Any, cluster: Any) -> dict[str, Any]:
    """The State fields of prefix caching (pdopt.sim._compiled._prefix): the requests' chained
    keys, an empty cache; minimal arrays when the run caches nothing (the cluster's prefix
    caching is off or the workload has no prefix blocks, as Engine)."""
    keys = table.prefix_keys
    if not cluster.prefix_caching or keys is None:
        one = np.zeros(1, np.int64)
        return {
            "ptoks": 0, "pblocks": 1, "pkeys": one, "poff": one,
            "hidx": np.full((1, INDEX_COLUMNS), -1, np.int64),
            "ent": aligned_zeros(1, ENTRY_COLUMNS),
            "pins": np.zeros((1, 3), np.int64), "pent": np.full(1, -1, np.int32),
            "found": np.zeros((1, 1), np.int64), "lru": np.zeros((1, 1), np.int32),
        }  # fmt: skip
    pkeys = np.require(keys, np.int64, ["C", "W"])  # one numba type for every run (warm's)
    per_block = -(-table.prefix_block_tokens // cluster.block_tokens)
    entries = cache_entries(cluster, len(pkeys), per_block)
    first = INDEX_SLOTS_PER_ENTRY * min(entries, FIRST_INDEX_ENTRIES)
    slots = 1 << (first - 1).bit_length()  # a power of two; doubles as needed
    return {
        "ptoks": int(table.prefix_block_tokens),
        "pblocks": per_block,
        "pkeys": pkeys,
        "poff": np.asarray(table.prefix_offsets, np.int64),
        "hidx": np.full((slots, INDEX_COLUMNS), -1, np.int64),
        "ent": aligned_zeros(entries, ENTRY_COLUMNS),
        "pins": np.repeat(np.array([[-1, 0, 0]], np.int64), table.n, axis=0),
        "pent": np.full(len(pkeys), -1, np.int32),
        "found": np.zeros(
            (len(cluster.workers), max(1, int(np.diff(table.prefix_offsets).max(initial=0)))),
            np.int64,
        ),
        "lru": np.zeros((len(cluster.workers), lru_ring(cluster, per_block)), np.int32),
    }


def _routing_params(codes: Codes, n_workers: int) -> dict[str, Any]:
    """The State fields of Mooncake's twin (:mod:`pdopt.sim._compiled._mooncake`): its TPOT SLO
    and TTFT predictors from ``codes``' parameters (``Mooncake.compiled_params``), and its
    mirror of the links, empty; zeros under the other policies."""
    tpot, ttft = 0.0, np.zeros((n_workers, 3), np.float64)
    if codes[0] in ROUTING_PARAMS:
        tpot = float(codes[3][0])
        ttft = np.array(codes[3][1:], np.float64).reshape(n_workers, 3)
    elif codes[2] == TICK_ARROW:  # its settings, then each worker's TTFT predictor
        tpot = float(codes[3][1])
        ttft = np.array(codes[3][len(ARROW_PARAMS) :], np.float64).reshape(n_workers, 3)
    elif codes[2] == TICK_ECOSERVE:  # its settings, each worker's macro instance and predictor
        tpot = float(codes[3][1])
        start = len(ECOSERVE_PARAMS) + n_workers
        ttft = np.array(codes[3][start:], np.float64).reshape(n_workers, 3)
    return {"tpot_s": tpot, "ttft": ttft, "wire": np.zeros((n_workers, n_workers), np.float64)}


def _ecoserve_fields(macro_of: list[int] | None, first_macro: int, n: int) -> dict[str, Any]:
    """The State fields of EcoServe's twin (:mod:`pdopt.sim._compiled._ecoserve`): its macro
    instances as ``MacroInstances.populate`` cut them (``macro_of``: each worker's, -1 for the
    standby ones; a macro instance's members in index order, uid its index), the standby
    instances in index order, no record yet, every activation entry free; one row each under
    the other policies (``macro_of`` None)."""
    n_workers = 1 if macro_of is None else len(macro_of)
    rows = 1 if macro_of is None else n
    eri = np.zeros((rows, N_E), np.int64)
    eri[:, [E_SRC, E_BLOCKS, E_DBLOCKS, E_Q_PREV, E_Q_NEXT, E_HELD_W, E_H_PREV, E_H_NEXT]] = -1
    eri[:, E_PENDING] = -1
    eri[:, E_GONE] = -2  # no sweep saw it nowhere
    ewi = np.zeros((n_workers, N_EW), np.int64)
    ewi[:, [EW_MACRO, EW_Q_HEAD, EW_ACT_HEAD, EW_ACT_TAIL, EW_H_HEAD]] = -1
    emac = np.zeros((n_workers, N_M), np.int64)
    emem = np.zeros((n_workers, n_workers), np.int64)
    standby = np.zeros(n_workers, np.int64)
    if macro_of is not None:
        ewi[:, EW_MACRO] = macro_of
        for m in range(max(macro_of, default=-1) + 1):
            members = [w for w, k in enumerate(macro_of) if k == m]
            emac[m, [M_SIZE, M_LABEL, M_UID]] = len(members), first_macro + m, m
            emem[m, : len(members)] = members
        spares = [w for w, k in enumerate(macro_of) if k < 0]
        standby[: len(spares)] = spares
    entries = rows + 64  # each routing adds at most one; they double when all are used
    eact = np.zeros((entries, 2), np.int64)
    eact[:, A_RID] = -1
    eact[:, A_NEXT] = np.arange(1, entries + 1)
    eact[-1, A_NEXT] = -1
    return {
        "eri": eri, "erf": np.full((rows, 2), np.nan), "ewi": ewi,
        "ewf": np.zeros((n_workers, N_EWF), np.float64), "emac": emac, "emem": emem,
        "eact": eact, "eactf": np.zeros(entries, np.float64),
        "erec": np.zeros(rows, np.int64), "epart": np.zeros(64, np.float64),
        "esc": np.zeros(n_workers, np.float64), "emacf": np.zeros((n_workers, 1), np.float64),
        "estb": standby, "efin": np.zeros((64, 4), np.float64),
    }  # fmt: skip


def _worker_rows(workers: Any, traits: PolicyTraits) -> tuple[np.ndarray, np.ndarray]:
    """The int64 and float64 worker rows of a run's start (a mixed worker's schedule as
    pdopt.sim._mixed.Colocated takes it: the policy's forced one, else the worker's)."""
    wi = np.zeros((len(workers), N_W), np.int64)
    wf = np.zeros((len(workers), N_V), np.float64)
    wi[:, [W_NEXT_N, W_EVENT_POS, W_RUN_HEAD, W_RUN_TAIL, W_DEFER_SEQ]] = -1
    wi[:, W_MEMO_RID] = -1
    wi[:, W_COUNTED] = 1
    wf[:, V_STALL_SINCE] = -1.0
    wf[:, V_MOVED_AT] = np.nan
    for w, spec in enumerate(workers):
        pre, dec = spec.cost.prefill, spec.cost.decode
        role = str(spec.role)
        wi[w, W_IS_DECODE] = int(role == "decode")
        wi[w, W_ACCEPTING] = int(role != "prefill")
        # every worker's schedule, as Colocated takes them (a worker moved to mixed runs it)
        schedule = traits.colocated_schedule or spec.colocated_schedule
        budget = traits.chunk_budget or spec.chunk_budget
        wi[w, W_HYBRID] = int(schedule == "hybrid")
        wi[w, W_CHUNK_TOKENS] = int(traits.chunk_tokens or spec.chunk_tokens)
        wi[w, W_ITER_BUDGET] = int(budget == "iteration")
        if role == "mixed":
            wi[w, W_MIXED] = 1
            wi[w, W_STEP] = Step.IDLE
        hybrid = spec.cost.hybrid
        if hybrid is not None:
            wi[w, W_FITTED] = 1
            wf[w, [V_H0, V_H1, V_H2, V_H3, V_H4, V_H5]] = (
                hybrid.h0_s,
                hybrid.h1_s_per_decode,
                hybrid.h2_s_per_context_token,
                hybrid.h3_s_per_chunk_token,
                hybrid.h4_s_per_token2,
                hybrid.h5_s,
            )
        wi[w, W_CAP] = spec.kv_capacity_blocks
        wi[w, W_MAX_SIZE] = spec.max_batch_size
        wi[w, W_MAX_TOKENS] = spec.max_batch_tokens
        wi[w, W_MAX_RUNNING] = spec.max_running
        wi[w, W_RESERVE] = int(spec.kv_allocation == "reserve_output")
        wf[w, V_ALPHA] = pre.alpha_flop_per_token2
        wf[w, V_BETA_PM] = pre.beta_flop_per_token * pre.p_m
        wf[w, V_P_PEAK] = pre.p_peak_flops
        wf[w, V_INTERCEPT] = pre.intercept_s
        wf[w, V_D0] = dec.d0_s
        wf[w, V_D1] = dec.d1_s_per_request
        wf[w, V_D2] = dec.d2_s_per_token
        wf[w, V_D3] = dec.d3_s_per_expert
        wf[w, V_EXPERTS] = dec.experts
        wf[w, V_EXPERTS_PER_TOKEN] = dec.experts_per_token
        wf[w, V_IDLE_W] = spec.idle_power_w
        wf[w, V_MAX_W] = spec.max_power_w
    return wi, wf


def _unpack(s: State, table: Any) -> None:
    """Copy the run's request columns into the table, as the Python engine leaves them."""
    for name, col in _TABLE_INTS.items():
        np.frombuffer(getattr(table, name), dtype=np.int64)[:] = s.ri[:, col]
    for name, col in _TABLE_FLOATS.items():
        np.frombuffer(getattr(table, name), dtype=np.float64)[:] = s.rf[:, col]
    table.next_admit_seq = int(s.g[G_ADMIT_SEQ])
    if s.ptoks:  # the prompt tokens each request's last prefill skipped
        np.frombuffer(table.cached_tokens, dtype=np.int64)[:] = s.pins[:, P_CACHED]


def _expected_ticks(arrival: np.ndarray, tick_s: float, open_loop: bool) -> int:
    """Ticks to allocate time-series rows for (they grow if the run lasts longer): an open
    loop lasts at least until its last arrival, then drains its last requests.

    NOTE: the drain margin (30 s of ticks, at most a quarter more) matters for memory: a run
    that outlasts the estimate by one tick grows the columns, which holds old and new at once
    (issue 38: at 100k requests the drain was ~5 s and the exact estimate grew them)."""
    last = float(arrival[-1]) if open_loop and len(arrival) else 0.0
    ticks = last / tick_s
    return int(min(ticks + min(30.0 / tick_s, 0.25 * ticks), 1e8)) + 64


def _timeseries(
    ts_i: np.ndarray, ts_f: np.ndarray, workers: Any, pools: list[str] | None
) -> pd.DataFrame:
    """The time-series frame, with the dtypes the Python engine's records give. ``pools``: the
    run's pool labels when workers may move (each row's worker column packs its layout, see
    _tick.sample); None: every row has its worker's own pool and role."""
    if not ts_i.shape[1]:
        return pd.DataFrame.from_records([], columns=list(TIMESERIES_COLUMNS))
    # the slot holds each row's reference need (as the Python engine's Control.sample); it
    # becomes the stranded blocks in place (NOTE: before the labels are built, so the peak
    # holds no separate stranded column; issue 38's 1.5 GB at 1M requests)
    stranded = ts_i[T_KV_STRANDED]
    stranded[:] = stranded_blocks(ts_i[T_KV_FREE], stranded)
    w = ts_i[T_WORKER]
    if pools is None:
        label = {
            "worker": label_column([x.name for x in workers], w),
            "pool": label_column([x.pool for x in workers], w),
            "role": label_column([str(x.role) for x in workers], w),
        }
    else:  # each row's worker and layout (_tick.sample packs them)
        layout, w = np.divmod(w, len(workers))
        pool, role = np.divmod(layout, ROLES)
        label = {
            "worker": label_column([x.name for x in workers], w),
            "pool": label_column(pools, pool),
            "role": label_column(list(_ROLE_NAMES), role),
        }
    columns = {
        "t_s": ts_f[U_T],
        **label,
        "queue_len": ts_i[T_QUEUE_LEN],
        "queued_prefill_flop": ts_f[U_QUEUED_FLOP],
        "running": ts_i[T_RUNNING],
        "kv_used_blocks": ts_i[T_KV_USED],
        "kv_free_blocks": ts_i[T_KV_FREE],
        "kv_stranded_blocks": stranded,
        "busy_frac": ts_f[U_BUSY_FRAC],
        "power_w": ts_f[U_POWER],
    }
    # NOTE: copy=False keeps each column as its own block instead of copying them into one
    # (the arrays belong to this frame alone); it halves the build of a 10^6-row frame.
    return pd.DataFrame({name: columns[name] for name in TIMESERIES_COLUMNS}, copy=False)


def _event_rows(
    log_t: np.ndarray,
    log_i: np.ndarray,
    names: tuple[str, ...],
    pools: list[str],
    max_kv: int,
    bt: int,
    table: Any,
    client_timeout_s: float | None = None,
) -> EventRows:
    """The event log's rows (``run_events``' ``log_t``, ``log_i``) as the columns of
    :data:`pdopt.sim.EVENT_COLUMNS`, worded exactly as the Python engine logs them, one kind at a
    time (an empty log: no rows, as the Python engine's). A migration's end is two entries: the
    second carries its downtime, which fills the row before it."""
    kind, worker, rid, a, b = log_i.T
    downtime = kind == LOG_MIG_DOWNTIME
    at = np.flatnonzero(~downtime)  # the entries that are rows
    if not len(at):
        return []
    down = _downtimes(log_t, downtime)
    detail = np.empty(len(kind), dtype=object)
    for code, word in _WORDERS.items():
        mine = at[kind[at] == code]
        texts = word(
            a[mine].tolist(), b[mine].tolist(), [down[i] for i in mine.tolist()], names, pools
        )
        detail[mine] = _objects(texts)
    aborted = at[kind[at] == LOG_ABORT]  # Engine.on_abort's reason, the request's too
    for i, r, x in zip(aborted.tolist(), rid[aborted].tolist(), a[aborted].tolist(), strict=True):
        detail[i] = table.reason[r] = (
            f"client timeout: no answer within {client_timeout_s:g} s ({ABORT_STATES[x]})"
        )
    rejected = at[~np.isin(kind[at], [*_WORDERS, LOG_ABORT])]  # the wording's last case
    largest = f"the largest worker's {max_kv} tokens ({max_kv // bt} blocks)"
    for i, r, x in zip(
        rejected.tolist(), rid[rejected].tolist(), a[rejected].tolist(), strict=True
    ):
        detail[i] = table.reason[r] = f"KV of {x} tokens exceeds {largest}"
    codes = kind[at]
    known = np.isin(codes, list(_KIND_NAMES))
    lookup = _objects(["rejection"] * (max(_KIND_NAMES) + 1))
    for code, name in _KIND_NAMES.items():
        lookup[code] = name
    kinds = np.full(len(at), "rejection", dtype=object)
    kinds[known] = lookup[codes[known]]
    return {
        "t_s": log_t[at],
        "kind": kinds,
        "worker": _objects([*names, ""])[worker[at]],  # worker -1: none
        "request_id": rid[at].copy(),
        "detail": detail[at],
    }


def _objects(texts: list[str]) -> np.ndarray:
    """``texts`` as a numpy object array (each item the str itself)."""
    out = np.empty(len(texts), dtype=object)
    out[:] = texts
    return out


def _downtimes(log_t: np.ndarray, downtime: np.ndarray) -> list[str]:
    """Per entry, the downtime a later entry gives it (the first downtime entry after it and
    before the next row), as the log words it; "" when none."""
    last_row = np.maximum.accumulate(np.where(downtime, -1, np.arange(len(downtime))))
    text = [""] * len(downtime)
    for row, t in zip(last_row[downtime].tolist(), log_t[downtime].tolist(), strict=True):
        if row >= 0 and not text[row]:
            text[row] = f"{t:.9g}"
    return text


_CANCEL_REASONS = {
    CANCEL_FINISHED: "request finished",
    CANCEL_PREEMPTED: "request preempted",
    CANCEL_DST_LEFT: "destination left the decode pool",
    CANCEL_CLIENT: "client timeout",
}
IntList = list[int]


def _preemptions(a: IntList, b: IntList, down: list[str], names: Any, pools: Any) -> list[str]:
    return [f"generated={x}" for x in a]


def _pool_moves(a: IntList, b: IntList, down: list[str], names: Any, pools: list[str]) -> list[str]:
    return [
        f"{_ROLE_NAMES[x]}->{_ROLE_NAMES[y % POOL_PACK]} pool={pools[y // POOL_PACK]}"
        for x, y in zip(a, b, strict=True)
    ]


def _migration_starts(a: IntList, b: IntList, down: list[str], names: Any, pools: Any) -> list[str]:
    return [f"dst={names[x]} blocks={y}" for x, y in zip(a, b, strict=True)]


def _migration_ends(a: IntList, b: IntList, down: list[str], names: Any, pools: Any) -> list[str]:
    n_bytes = np.array(b, np.int64).view(np.float64).tolist()  # the float's bits, as an int
    words = []
    for x, n, d in zip(a, n_bytes, down, strict=True):
        src, rest = x % END_PACK, x // END_PACK
        stages, rerouted = rest % END_PACK, rest // END_PACK
        detail = f"src={names[src]} bytes={n:.0f} stages={stages} downtime_s={d or '{downtime}'}"
        words.append(detail + (" rerouted" if rerouted else ""))
    return words


def _migration_cancels(
    a: IntList, b: IntList, down: list[str], names: Any, pools: Any
) -> list[str]:
    words = []
    for x, free in zip(a, b, strict=True):
        code, extra = x % CANCEL_PACK, x // CANCEL_PACK
        if code == CANCEL_NO_ROOM:
            words.append(f"destination has {free} free blocks, needs {extra} more")
        else:
            words.append(_CANCEL_REASONS[code])
    return words


def _false_ooms(a: IntList, b: IntList, down: list[str], names: Any, pools: Any) -> list[str]:
    return [
        f"need={x % FALSE_OOM_PACK} free={y} most_free={x // FALSE_OOM_PACK}"
        for x, y in zip(a, b, strict=True)
    ]


def _phases(a: IntList, b: IntList, down: list[str], names: Any, pools: Any) -> list[str]:
    return [f"{PHASE_NAMES[x]}->{PHASE_NAMES[y]}" for x, y in zip(a, b, strict=True)]


_WORDERS = {
    LOG_PHASE: _phases,
    LOG_PREEMPTION: _preemptions,
    LOG_POOL_MOVE: _pool_moves,
    LOG_MIG_START: _migration_starts,
    LOG_MIG_END: _migration_ends,
    LOG_MIG_CANCEL: _migration_cancels,
    LOG_FALSE_OOM: _false_ooms,
}
"""The wording of each kind's detail; any other kind is a rejection."""
_KIND_NAMES = {
    LOG_ABORT: "abort",
    LOG_PHASE: "phase",
    LOG_PREEMPTION: "preemption",
    LOG_POOL_MOVE: "pool_move",
    LOG_MIG_START: "migration_start",
    LOG_MIG_END: "migration_end",
    LOG_MIG_CANCEL: "migration_cancel",
    LOG_FALSE_OOM: "false_oom",
}
