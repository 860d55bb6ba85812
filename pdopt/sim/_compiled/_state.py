"""A compiled run's state: one ``State`` tuple of arrays and run constants, and its layout.

Per-request state is one int64 and one float64 row per request (columns ``R_*`` and ``F_*``),
per-worker state one int64 and one float64 row per worker (``W_*`` and ``V_*``), run counters one
int64 array (``G_*``); queues and the running batch are linked lists threaded through the request
rows. Every compiled function takes the ``State`` (plus scalars) and changes its arrays in place;
the tuple itself never changes during a run. The event loop receives it as this tuple and passes
it on by reference (:func:`pdopt.sim._compiled._jit.by_reference`: numba would pass a tuple by
value, every array of it, at every call), as a view that nothing counts
(:class:`pdopt.sim._compiled._jit.StateView`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

# -- request columns (int64) ------------------------------------------------------------------
R_INPUT, R_OUTPUT, R_GENERATED, R_PREFILL_WORKER, R_DECODE_WORKER, R_DECODE_TARGET = range(6)
R_PREFILL_TOKENS, R_STATUS, R_PREEMPTIONS, R_KV_OFFSET, R_ADMIT_SEQ = range(6, 11)
R_QUEUE_NEXT, R_RUN_PREV, R_RUN_NEXT, R_OOM_FLAGGED = range(11, 15)
R_DONE, R_CHUNK = range(15, 17)  # a chunked prompt: tokens prefilled so far, this iteration's
# a migration in progress (pdopt.sim._compiled._migration; R_MIG_PHASE -1: none): its phase
# (MigrationPhase), source and destination, copies issued, the context its last snapshot copied,
# blocks held on the destination and (stop-and-copy) on the source, the boundary it leaves its
# source at (departing), when it entered its phase (orders the departures and joins of one
# boundary), its pending copy's heap slot, its stop_dirty_blocks and max_precopy_stages;
# completed migrations of the request (the table's ``migrations``)
R_MIG_PHASE, R_MIG_SRC, R_MIG_DST, R_MIG_STAGES, R_MIG_COPIED, R_MIG_HELD = range(17, 23)
R_MIG_SRC_HELD, R_MIG_DEPART_AT, R_MIG_ORDER, R_MIG_EVPOS, R_MIG_STOP_DIRTY = range(23, 28)
R_MIG_MAX_STAGES, R_MIGRATIONS = range(28, 30)
R_INFLIGHT = 30  # Phasor's record of a migration it issued: the source (-1: none)
# Arrow (pdopt.sim._compiled._arrow): the prefill worker its routing recorded (``_src``; -1: none
# or already read by its decode routing)
R_ASRC = 31
# client timeouts (Engine.on_abort): its client gave up while it decodes (DecodeSide.aborting: it
# leaves at its worker's next boundary) or while its chunked prompt's chunk is in flight
# (PrefillSide.aborted: dropped when the iteration ends); 0 else
R_ABORTING = 32
N_R = 33
# -- request columns (float64) ----------------------------------------------------------------
F_ARRIVAL, F_PREFILL_START, F_PREFILL_END, F_FIRST_TOKEN, F_TRANSFER_START = range(5)
F_TRANSFER_END, F_READY, F_DECODE_START, F_FINISH, F_PREFILL_FLOP, F_THINK = range(5, 11)
# F_THINK: closed loop, the think time before this request is sent; a migration's stop-and-copy
# start and bytes so far, and the table's migration_downtime_s and migrated_bytes
F_MIG_STOP, F_MIG_BYTES, F_MIG_DOWNTIME, F_MIGRATED_BYTES = range(11, 15)
N_F = 15
# -- worker columns (int64) -------------------------------------------------------------------
W_IS_DECODE, W_CAP, W_MAX_SIZE, W_MAX_TOKENS, W_MAX_RUNNING = range(5)
W_PQ_HEAD, W_PQ_TAIL, W_PQ_LEN, W_BATCH_N, W_INFLIGHT = range(5, 10)
W_DQ_HEAD, W_DQ_TAIL, W_DQ_LEN, W_B, W_S, W_N_SEG, W_U_SEG = range(10, 17)
W_NEXT_N, W_EVENT_POS, W_RUN_HEAD, W_RUN_TAIL, W_HEAP_N = range(17, 22)
W_ACCEPTING = 22  # the decode side admits (DecodeSide.accepting)
# a mixed worker (pdopt.sim._mixed; 0 elsewhere): its schedule, step and shared KV
W_MIXED, W_HYBRID, W_CHUNK_TOKENS, W_ITER_BUDGET, W_STEP, W_STALLED = range(23, 29)
W_PROMPTS, W_CHUNK_N, W_COUNTED, W_FITTED = range(29, 33)
# pool moves (pdopt.sim._compiled._pools): the worker's pool (an index into the run's pool
# labels, POOL_LABELS first), a Splitwise Mixed-pool member's home role (1: decode) and
# membership, and how many prompts were routed to it (its history, a ring: State.hist)
W_POOL, W_HOME_DECODE, W_MEMBER, W_HIST_N = range(33, 37)
# Phasor (pdopt.sim._compiled._phasor): a member promoted from decode to prefill that still
# drains decode work (the policy's ``_draining``)
W_DRAINING = 37
# migrations (pdopt.sim._compiled._migration): KV blocks held outside the running batch
# (KvBlocks.held) and running-batch slots promised to migrations copying in
W_HELD, W_SLOTS_HELD = 38, 39
# the admission queue's KV need: Σ kv_blocks(input + generated) over its requests (Phasor's
# effective free KV in O(1))
W_DQ_NEED = 40
# Arrow: its pool (A_* codes, pdopt.sim._compiled._arrow), relabelled since its last tick
# (``_dirty``); its (and EcoServe's) last snapshot of the worker's running requests: the
# admission sequence number then (the requests admitted before it that still run were in it; 0:
# no snapshot), the iteration counter then, and how many of its requests stopped running since
# (preempted, departed or finished; State.snap_out)
W_APOOL, W_DIRTY, W_SNAP_SEQ, W_SNAP_M, W_SNAP_OUT = range(41, 46)
# a mixed worker's next boundary, decided at a boundary but placed by its next step: the
# sequence number taken for it (-1: none; pdopt.sim._compiled._decode.defer_boundary)
W_DEFER_SEQ = 46
# prefix caching: the worker's LRU ring of unreferenced cached blocks (State.lru: its head and
# tail positions, counted from the run's start, and the blocks listed), and its counters (prompt
# tokens served, lookups, evictions)
W_LRU_HEAD, W_LRU_TAIL, W_LRU_N, W_HIT_TOKENS, W_LOOKUPS, W_EVICTIONS = range(47, 53)
# and its cached set's version (bumped when a key is added or dropped), and its last leading
# count: the request (-1: none), the version then, the count
W_CACHE_VER, W_MEMO_RID, W_MEMO_VER, W_MEMO_N = range(53, 57)
W_USED = 57  # see V_USED_SINCE
W_PHASE = 58  # a mixed worker's phase (SetPhase; PH_* codes)
W_SEG_SERIAL = 59  # counts the changes to its decode segment or running set (forget_used)
# kv_allocation "reserve_output" (DecodeSide.reserve_output; 0: "on_demand"): a request admitted
# to decode holds kv_blocks(input + output − 1) until it leaves (_decode.blocks_for)
W_RESERVE = 60
W_ABORTING = 61  # running requests marked R_ABORTING since its last boundary (DecodeSide.aborting)
N_W = 62
PH_BOTH, PH_PREFILL, PH_DECODE = 0, 1, 2
PHASE_NAMES = ("both", "prefill", "decode")  # by the PH_* codes
# -- worker columns (float64) -----------------------------------------------------------------
V_ALPHA, V_BETA_PM, V_P_PEAK, V_INTERCEPT, V_QUEUED_FLOP, V_BATCH_FLOP = range(6)
V_BATCH_START, V_BATCH_END, V_PREFILL_BUSY, V_D0, V_D1, V_D2 = range(6, 12)
V_T_SEG, V_A_SEG, V_HALF_D2B, V_DECODE_BUSY, V_BUSY_SINCE = range(12, 17)
V_IDLE_W, V_MAX_W, V_LAST_BUSY, V_D3, V_EXPERTS, V_EXPERTS_PER_TOKEN = range(17, 23)
V_STALL_SINCE = 23  # a mixed worker's stalled decodes: since when (-1.0: not stalled)
V_H0, V_H1, V_H2, V_H3, V_H4, V_H5 = range(24, 30)  # a fitted HybridModel (W_FITTED)
V_MOVED_AT = 30  # Phasor: when a Mixed-pool member last moved, seconds (NaN: never)
# Arrow: the observed token interval, since when it is over the TPOT SLO and since when the
# worker idles (-1.0: not), its last flip (-inf: never) and its last snapshot's time, seconds
V_INTERVAL, V_OVER_SINCE, V_IDLE_SINCE, V_FLIPPED_AT, V_SNAP_T = range(31, 36)
# the running requests' KV blocks W_USED hold over [V_USED_SINCE, V_USED_UNTIL) (an empty span:
# unknown; pdopt.sim._compiled._decode.used_blocks_at)
V_USED_SINCE, V_USED_UNTIL = 36, 37
N_V = 38
# -- run counters (int64) ---------------------------------------------------------------------
G_HEAP_N, G_SEQ, G_DONE, G_STOPPED, G_NEXT_RID, G_RR_P, G_RR_D, G_ADMIT_SEQ, G_ERROR = range(9)
G_ADMITTED, G_TS_N = range(9, 11)
G_N_PREFILL, G_N_DECODE = range(11, 13)  # workers in prefill_idx and decode_idx (pool moves)
G_N_MIGS, G_MIG_ORDER = range(13, 15)  # migrations in progress (in State.migs); phase counter
G_N_INFLIGHT = 15  # Phasor's records of the migrations it issued (in State.inflight)
# prefix cache entries: the free list's head (-1: empty), and how many were ever used
G_ENT_FREE, G_ENT_TOP = 16, 17
G_LOG_N = 18  # event-log entries in State.logt/logi
G_HIDX_N = 19  # entries in the prefix cache's index (State.hidx; it doubles past an eighth full)
# EcoServe (pdopt.sim._compiled._ecoserve): its macro instances (State.emac rows), its records of
# decodes' first tokens (State.erec), the sweeps run so far, the activation entries' free list
# (State.eact; -1: empty) and the stamp of the last C2 check's activation (E_STAMP)
G_E_MACROS, G_E_RECORDS, G_E_SWEEP, G_E_FREE, G_E_STAMP = range(20, 25)
# control ticks run with nothing scheduled but work held back by phases
# (Colocated.phase_blocked's count)
G_BLOCKED_TICKS = 25
# EcoServe's mitosis: the next macro instance's uid, standby instances (State.estb), and the ring
# of finished requests' TPOT checks (State.efin: its head and rows)
G_E_NEXT_UID, G_E_STANDBY, G_E_FIN_HEAD, G_E_FIN_N = range(26, 30)
# and its pool labels: standby's, and macro<0>'s (macro<k>'s is this plus k)
G_E_STANDBY_LABEL, G_E_MACRO0 = 30, 31
# while a prompt is routed among the prefill workers that hold it (prefill_idx narrowed to them,
# _routing.route_prefill), its KV blocks; else 0
G_PROMPT_NEED = 32
# client timeouts: requests a boundary dropped whose cached blocks and migrations the engine
# releases after it (Engine._dropped: from the first with a migration on), in lists[d][L_DROP]
G_DROP_N = 33
INDEX_SLOTS_PER_ENTRY = 8  # the prefix cache's index has at least this many slots per entry
# the prefix cache's index slot: key, worker << 32 | entry (16 bytes: a slot never straddles two
# CPU cache lines); an entry: key, references, LRU position, free list's next (32 bytes, 64-byte
# aligned)
INDEX_COLUMNS, ENTRY_COLUMNS = 2, 4
N_G = 34
P_W, P_N, P_CACHED = range(3)  # State.pins' columns
# -- time-series rows: int64 and float64 parts (TIMESERIES_COLUMNS order within each) ---------
T_WORKER, T_QUEUE_LEN, T_RUNNING, T_KV_USED, T_KV_FREE, T_KV_STRANDED = range(6)
U_T, U_QUEUED_FLOP, U_BUSY_FRAC, U_POWER = range(4)

RECENT_PEAKS = 256  # admitted peak footprints kept for the stranded-block reference (a ring)
# Event-log entries (now, kind, worker, rid, a, b), worded by pdopt.sim._compiled._io:
LOG_REJECTION, LOG_PREEMPTION, LOG_FALSE_OOM, LOG_POOL_MOVE = 0, 1, 2, 3
LOG_MIG_START, LOG_MIG_END, LOG_MIG_DOWNTIME, LOG_MIG_CANCEL = 4, 5, 6, 7
LOG_PHASE = 8  # a phase change: a, b the old and new PH_* codes
LOG_ABORT = 9  # a client timeout (Engine.on_abort): a the request's state then (AB_*)
# the states of an aborted request (Engine._withdraw's), worded as ABORT_STATES
AB_QUEUED, AB_PREFILL, AB_TRANSFER, AB_ADMISSION, AB_DECODING, AB_MIGRATING = range(6)
ABORT_STATES = (
    "queued for prefill",
    "in prefill",
    "in KV transfer",
    "waiting for decode admission",
    "decoding",
    "migrating",
)
# a migration_cancel entry's reason (its ``a`` packs ``reason + CANCEL_PACK · extra``, ``b`` the
# destination's free blocks, for CANCEL_NO_ROOM)
CANCEL_FINISHED, CANCEL_PREEMPTED, CANCEL_DST_LEFT, CANCEL_NO_ROOM = range(4)
CANCEL_CLIENT = 4  # its client gave up (Migrations.abort)
CANCEL_PACK = 8
# Worker roles as the compiled engine codes them (a pool move's log entry, a time-series row's
# layout); the pool labels every run starts with, so a MoveWorker's pool ``str(role)`` or
# ``"mixed"`` is its role's code:
ROLE_PREFILL, ROLE_DECODE, ROLE_MIXED = 0, 1, 2
# a tick's SetPhase action in State.acts (rows worker, pool, role): this in the role's place, the
# phase (PH_*) in the pool's
ACT_SET_PHASE = 3
# Arrow's pools follow (pdopt.sim._compiled._arrow: label ARROW_POOL0 + its A_* code)
POOL_LABELS = ("prefill", "decode", "mixed", "P", "D", "P->D", "D->P")
ARROW_POOL0 = 3
# Tick rules: the policies' on_tick twins (pdopt.sim._compiled._pools); 0: none acts on a tick
TICK_NONE, TICK_SPLITWISE, TICK_PHASOR, TICK_ARROW, TICK_ECOSERVE = 0, 1, 2, 3, 4
# tick_f: a tick rule's parameters and state. Splitwise: thresholds, delta_t, the prompts its
# routing history remembers per worker, next action time. Phasor: delta_t and next action time
# at the same places, T_TTFT_SLO (its routing's Φ_T too), θ_flow, T_cool, and its flags
# (1.0: on) release_balanced and mixed_pool (PhasorSettings, Phasor.compiled_tick)
K_PREFILL_THRESHOLD, K_DECODE_THRESHOLD, K_DELTA_T, K_HISTORY, K_NEXT_ACT = range(5)
K_TTFT_SLO, K_THETA_FLOW, K_COOL, K_RELEASE, K_MIXED_POOL = range(5, 10)
# Phasor's meso loop and evacuation: defrag, evacuate and proactive flags, θ_frag,
# min_remaining_tokens, max_moves
K_DEFRAG, K_EVACUATE, K_PROACTIVE, K_THETA_FRAG, K_MIN_REMAINING, K_MAX_MOVES = range(10, 16)
# Phasor's per-tick scratch rows (State.tick_wi, tick_wf): the Mixed pool's members, their roles
# and home roles, the decode workers wanting room; the members' last moves and the pools' Φ
PT_MEMBERS, PT_ROLES, PT_HOMES, PT_WANTING = range(4)
PT_MOVED_AT, PT_PHI = range(2)
# Arrow (after K_TTFT_SLO, in Phasor's places): its TPOT SLO, overload_patience_s,
# idle_patience_s, min_flip_interval_s, decode_low_frac, flags slo_aware, elastic, colocated
# (1.0: on), and whether its instances were made mixed (``_converted``)
K_TPOT_SLO, K_OVER_PATIENCE, K_IDLE_PATIENCE, K_MIN_FLIP, K_LOW_FRAC = range(6, 11)
K_SLO_AWARE, K_ELASTIC, K_COLOCATED, K_CONVERTED = range(11, 15)
# EcoServe (after its TTFT and TPOT SLOs, Arrow's places): whether its first tick ran
# (``_started``), its next sweep and its last miss, seconds, and its phase rule
K_E_STARTED, K_E_NEXT_SWEEP, K_E_LAST_MISS = range(7, 10)
K_E_ACTIVATION = 10  # 1.0: phases="activation" (prefill phases, held prompts); 0.0: "batch"
# its mitosis (1.0: on), refill="missing" (1.0) or "paper", n_lower, n_upper, scale_idle_s and
# migration_s
K_E_MITOSIS, K_E_REFILL_MISSING, K_E_N_LOWER, K_E_N_UPPER, K_E_SCALE_IDLE = range(11, 16)
K_E_MIGRATION = 16
# the share of late finishes that grows a macro instance (BEHIND_FRAC) and the sweeps' interval
# (SWEEP_S), seconds: the policy's constants
K_E_BEHIND, K_E_SWEEP = 17, 18
# its ablation constraints=False (0.0) and named departures (1.0: on) saved_tpot="min",
# saved_tpot_margin and c2_remaining
K_E_CONSTRAINTS, K_E_MIN_SAVED, K_E_MARGIN, K_E_C2_REMAINING = range(19, 23)
# and its InterSchedule: rolling (1.0: on; 0.0 the ablation) and pdopt's scan (1.0: on)
K_E_ROLLING, K_E_SCAN = 23, 24
# pdopt's earlier rules (1.0: on): phases="ticks" (the tick-bounded prefill phases, base phase
# "decode"), check="request" (the per-request CheckConstraints) and prefill_slots (0: no cap);
# and the policy's last control tick (``_last_tick_s``), seconds
K_E_TICKS, K_E_CHECK_REQUEST, K_E_PREFILL_SLOTS, K_E_LAST_TICK = range(25, 29)
# pdopt's reading hold="deadline" (1.0; it acts under phases="activation" only)
K_E_HOLD_DEADLINE = 29
N_K = 30
# -- EcoServe's records (pdopt.sim._compiled._ecoserve; minimal arrays under other policies) ----
# per request (State.eri): the prefill worker its routing recorded (``_src``; -1: none), its
# prompt's KV blocks then (``_blocks``; -1: none), those its decode routing recorded
# (``_decode_blocks``; -1: none, nor a first-token record), the context at its first token
# (``_first_token``'s), the sweep that last saw it nowhere (-2: none), its place in State.erec,
# the stamp of the last activation it was found in, and its neighbours in its prefill worker's
# list of routed prompts (``_queued``); the worker holding it (``_held``: -1 none) and its
# neighbours in that worker's list
E_SRC, E_BLOCKS, E_DBLOCKS, E_FT_CTX, E_GONE, E_REC_POS, E_STAMP, E_Q_PREV, E_Q_NEXT = range(9)
E_HELD_W, E_H_PREV, E_H_NEXT = range(9, 12)
# and, routed to prefill and to decode after it (``_pending``), its prefill tokens then (-1: none)
E_PENDING = 12
N_E = 13
# State.erf: the time of its first token, seconds, and its value in the activation last stamped
E_FT_T, E_SVAL = 0, 1
# per worker (State.ewi): its macro instance (``macro_of``: a row of State.emac; -1: none), its
# routed prompts' list (head, count), its activation's (head, tail; State.eact entries), the
# policy's phase of it (PH_*), its held prompts' list (head) and a scratch stamp (the running
# requests it saw at the last tick, ``_seen[w]``, are its snapshot: W_SNAP_SEQ)
EW_MACRO, EW_Q_HEAD, EW_Q_N, EW_ACT_HEAD, EW_ACT_TAIL, EW_PHASE, EW_H_HEAD = range(7)
EW_MARK = 7
# a version of its held and activation lists (bumped at each change), and what a prefill phase's
# last C2 check saw (:func:`pdopt.sim._compiled._ecoserve._c2_still_met`): that version, the
# decode side's W_SEG_SERIAL and iteration counter, its admission queue's head, tail and length,
# whether a bound was kept (1), and the held prompts' oldest arrival's version
EW_VER, EW_C2_VER, EW_C2_SERIAL, EW_C2_M, EW_C2_DQH, EW_C2_DQT, EW_C2_DQN = range(8, 15)
EW_C2_KEPT, EW_OLD_VER = 15, 16
N_EW = 17
# State.ewf: the end of its last migration between macro instances, and since when it idles
# (``_idle_since``), seconds; the last C2 check's time, its lower bound on the saved TPOT then
# and the magnitudes' sum; the held prompts' oldest arrival (at EW_OLD_VER)
EW_READY_AT, EW_IDLE_SINCE, EW_C2_T, EW_C2_LO, EW_C2_SIZE, EW_OLDEST = range(6)
N_EWF = 6
# per macro instance (State.emac, in the policy's list order): its pool label, InterSchedule
# cursor, misses since the last tick, size (its members: State.emem's row) and uid (its pool is
# ``macro<uid>``), and the requests it finished since it last changed, how many and how many
# late (``_failing``'s counts, kept as State.efin gains and drops its entries); State.emacf: when
# an instance last joined or left it, seconds
M_LABEL, M_CURSOR, M_MISSES, M_SIZE, M_UID, M_FIN_N, M_FIN_LATE = range(7)
N_M = 7
# State.efin's columns: a tick's finished requests of one macro instance (``_finished``'s
# entries of that tick and uid): the time, the uid, how many, how many late
FIN_T, FIN_UID, FIN_N, FIN_LATE = range(4)
A_RID, A_NEXT = 0, 1  # State.eact's columns: an activation entry's request and next entry
# Errors the Python engine raises with a full message (the caller reruns there):
ERR_NO_DECODE_WORKER = 1  # a request's peak KV fits no decode worker
ERR_PREFILL_CAPACITY = 2  # a (re-)prefill's KV exceeds the chosen prefill worker's capacity
ERR_STUCK = 3  # requests wait but nothing is scheduled (an internal error in either engine)
# A state the compiled engine does not reproduce (the caller reruns the run on the Python engine,
# which runs it; never expected, a guard of the colocated scheduler's invariants, _mixed):
ERR_UNSUPPORTED = 4
ERR_POLICY = 5  # a policy twin's action the engine refuses (PolicyDecisionError there)

Ints = npt.NDArray[np.int64]
Ints32 = npt.NDArray[np.int32]
Floats = npt.NDArray[np.float64]


class State(NamedTuple):
    """Everything a compiled run reads and writes, built by :func:`pdopt.sim._compiled._io.pack`.

    Shapes: ``n`` requests, ``w`` workers, ``bt`` tokens per KV block, ``r`` the largest
    ``max_running`` + 1, ``p`` the largest prefill ``max_batch_size``.
    """

    ri: Ints  # (n, N_R) request columns
    rf: Floats  # (n, N_F) request columns, NaN until set
    wi: Ints  # (w, N_W) worker columns
    wf: Floats  # (w, N_V) worker columns
    cnt: Ints  # (w, bt): running requests per growth phase (pdopt.sim._closed_form)
    fin: Ints  # (w, r, 3): each decode worker's finish heap, rows (finish counter, seq, rid)
    batches: Ints  # (w, p): each prefill worker's running batch
    link_bw: Floats  # (w, w) bytes/s
    link_lat: Floats  # (w, w) seconds
    link_free: Floats  # (w, w): when each link is next free, seconds
    decode_idx: Ints  # (w,) decode workers' indices, the first g[G_N_DECODE] in order
    prefill_idx: Ints  # (w,) prefill workers' indices, the first g[G_N_PREFILL] in order
    # the event heap: ≤ 1 arrival or transfer per request (and, with client timeouts, its
    # abort), 1 tick, 1 batch and 1 boundary per worker are pending at once
    ev_t: Floats  # (n + 2w + 2,) times, seconds (2n + 2w + 2 with client timeouts)
    ev_i: Ints  # (n + 2w + 2, 3) rows (seq, Event, arg) (as ev_t)
    g: Ints  # (N_G,) run counters
    # (2, 6, r) scratch: a boundary's finished, preempted, admitted, departed, joined and
    # dropped requests (rows _decode.L_*); [1] for a worker woken inside another's boundary
    lists: Ints
    completed: Ints  # (p,) scratch: prompts a mixed worker's step completed
    offsets: Ints  # (r,) scratch: a worker's running requests' KV offsets (sliding window)
    peaks: Ints  # (2, RECENT_PEAKS): the ring of admitted peak blocks, and its values sorted
    migs: Ints  # (n,) the requests with a migration in progress, the first g[G_N_MIGS]
    inflight: Ints  # (n,) Phasor's ``_inflight`` (its keys in insertion order; R_INFLIGHT the
    # values), the first g[G_N_INFLIGHT]
    bt: int  # tokens per KV block
    max_kv: int  # the largest worker's KV, tokens
    min_cap: int  # the smallest worker's KV, blocks
    p_code: int  # prefill routing code (pdopt.sim._compiled._routing)
    d_code: int  # decode routing code
    clients: int  # closed loop: clients (think times in column F_THINK); 0: open loop
    timeseries: bool  # run control ticks and record a time-series row per worker per tick
    ticks: int  # ticks to allocate time-series rows for (they grow when the run lasts longer)
    kv_bytes: float  # KV bytes per token
    kv_window: int  # sliding-window tokens (0: every layer full attention)
    kv_sliding_layers: int  # layers with the sliding window (0: none; KV blocks: blocks_of)
    kv_layers: int  # all layers (when kv_window > 0)
    tick_s: float  # control tick, seconds
    requeue_front: bool  # a preempted request rejoins a prefill queue at its head (ClusterSpec)
    timeout_s: float  # client_timeout_s (Engine.on_abort; 0.0: clients wait)
    t_code: int  # the policy's tick rule (TICK_*): it acts on every control tick
    tick_f: Floats  # (N_K,) the tick rule's parameters and state
    hist: Ints  # (w, history) Splitwise: each worker's last prompts routed (a ring; (w, 1) else)
    # Mooncake's routing twin (pdopt.sim._compiled._mooncake; zeros under the other policies):
    tpot_s: float  # the TPOT SLO its decode choice protects, seconds
    ttft: Floats  # (w, 3): each worker's TTFT predictor, ``a·l·l + b·l + c`` seconds
    wire: Floats  # (w, w): the policy's own mirror of when each link's wire is next free
    # Arrow's and EcoServe's ticks (pdopt.sim._compiled._arrow, _ecoserve; (1, 3) and (1, 1, 2)
    # under the other policies):
    acts: Ints  # (a, 3): one tick's actions, rows (worker, pool, role); Phasor's (request,
    # destination, -) of its migrations
    snap_out: Ints  # (w, r, 2): requests of each worker's last snapshot that stopped running
    # since, rows (request, its context tokens in the snapshot)
    # prefix caching (pdopt.sim._compiled._prefix; ptoks 0: none, the arrays then minimal)
    ptoks: int  # tokens per prefix block (0: no prefix cache in the run)
    pblocks: int  # KV blocks one prefix block takes (PrefixCache.engine_blocks_per_block)
    pkeys: Ints  # (k,) each request's chained block keys (the workload's), CSR by poff
    poff: Ints  # (n + 1,)
    hidx: Ints  # (h, 2) the cached blocks' index: key, worker << 32 | entry (-1: empty) per slot;
    # h a power of two, doubled before an entry more would fill it past an eighth (the live entries,
    # not the pool, size it); a grown index is the StructRef's field, seen by compiled code only
    ent: Ints  # (e, 4) entries: key, references, LRU position (-1: off the list), the free list's
    # next; 64-byte aligned (_io.aligned_zeros), so that an entry is one CPU cache line
    # (n, 3) per request (1 row without a cache): the worker whose cached blocks it references
    # (-1: none), how many of its leading keys, and the prompt tokens its last prefill skipped
    # (the table's ``cached_tokens``); columns P_*
    pins: Ints
    pent: Ints32  # (k,) the entry each referenced key is held by (beside pkeys; -1: none)
    found: Ints  # (w, k) each worker's last walk's entries (k: the most keys of one request)
    lru: Ints32  # (w, c) each worker's LRU ring of entries (c a power of two; W_LRU_HEAD to
    # W_LRU_TAIL, positions counted from the run's start; -1: struck out); doubled when compacting
    # one leaves it over half full, a grown one the StructRef's field, seen by compiled code only
    # the event log (pdopt.sim._compiled._heap.put_log; replaced by longer arrays as it grows, so
    # only compiled code, through the StateRef, and run_events' return see all of it): each
    # entry's time, then its kind, worker, rid, a, b (LOG_*)
    logt: Floats  # (m,)
    logi: Ints  # (m, 5)
    wlist: Ints  # (w,) scratch: a list of workers (Arrow's monitors)
    route_idx: Ints  # (w,) scratch: prefill_idx, kept while a prompt is routed (G_PROMPT_NEED)
    tick_wi: Ints  # (4, w) scratch: Phasor's tick, rows PT_* (so a tick allocates nothing)
    tick_wf: Floats  # (2, w)
    # EcoServe (pdopt.sim._compiled._ecoserve; one row each under the other policies):
    eri: Ints  # (n, N_E) per-request records, columns E_*
    erf: Floats  # (n, 2) per-request first-token times and stamped values
    ewi: Ints  # (w, N_EW) per-worker records, columns EW_*
    ewf: Floats  # (w, 2) per-worker times
    emac: Ints  # (w, N_M) the macro instances, columns M_*, the first g[G_E_MACROS]
    emem: Ints  # (w, w) each macro instance's members in order (emac's M_SIZE of them)
    eact: Ints  # (e, 2) activation entries (request, next; A_*), a free list of those unused
    eactf: Floats  # (e,) each entry's predicted prefill time, seconds
    erec: Ints  # (n,) the requests with first-token records, the first g[G_E_RECORDS]
    emacf: Floats  # (w, 1) each macro instance's changed_s
    estb: Ints  # (w,) the standby instances in order, the first g[G_E_STANDBY]
    efin: Floats  # (f, 4) a ring of finished requests' checks, rows FIN_*; doubled when full
    epart: Floats  # (64,) scratch: math.fsum's partial sums
    esc: Floats  # (w,) scratch: a macro instance's members' waits, in member order
