"""Pool moves and the policies' tick rules, compiled (:mod:`pdopt.sim._control`'s ``move_worker``
and :class:`pdopt.policies.disagg.Splitwise`'s ``on_tick``).

A worker's role is ``W_IS_DECODE`` (every worker of a run that moves workers is prefill or
decode); ``prefill_idx`` and ``decode_idx`` hold the current prefill and decode workers in index
order (ClusterView.prefill_workers / decode_workers), their counts in ``g``. A move follows
Control.move_worker:

* prefill → decode: the queued prompts are routed again (the worker is no longer eligible), its
  running batch finishes; it admits decode work once that batch has ended
  (``_on_prefill_done`` in :mod:`pdopt.sim._compiled._loop`).
* decode → prefill: it admits no more decode work; its admission queue is routed again, the KV
  leaving over the link from it; its running requests drain, and its first prefill batch
  starts at the boundary that leaves it idle (``_process_boundary``).
* mixed → prefill, idle only (EcoServe's standby): it leaves the mixed role with nothing to
  requeue, drain or restart.

Splitwise's rule (its module docstring): every ``delta_t_s``, the pending prompt tokens per
prefill worker (the last ``queued + running`` prompts of each worker's routing history, a ring
as long as the policy's deque) and the context tokens waiting for decode
admission per decode worker (a waiting request's ``input + generated``: the prompt tokens the
policy recorded when it routed it to decode, which do not change while it waits) against their
thresholds; one Mixed-pool member moves to the pool that is over, or home once both are below
half. The expressions are the policy's, in its order.
"""

from __future__ import annotations

from pdopt.sim._compiled._heap import put_log
from pdopt.sim._compiled._jit import kernel
from pdopt.sim._compiled._mixed import poke
from pdopt.sim._compiled._prefill import enqueue_prefill, start_prefill, transfer
from pdopt.sim._compiled._routing import route_decode, route_prefill
from pdopt.sim._compiled._state import (
    ERR_NO_DECODE_WORKER,
    ERR_UNSUPPORTED,
    G_ERROR,
    G_N_DECODE,
    G_N_PREFILL,
    G_STOPPED,
    K_DECODE_THRESHOLD,
    K_DELTA_T,
    K_NEXT_ACT,
    K_PREFILL_THRESHOLD,
    LOG_POOL_MOVE,
    PH_BOTH,
    POOL_LABELS,
    R_GENERATED,
    R_INPUT,
    R_QUEUE_NEXT,
    ROLE_DECODE,
    ROLE_MIXED,
    ROLE_PREFILL,
    V_QUEUED_FLOP,
    W_ACCEPTING,
    W_B,
    W_BATCH_N,
    W_CHUNK_N,
    W_DQ_HEAD,
    W_DQ_LEN,
    W_DQ_NEED,
    W_DQ_TAIL,
    W_HELD,
    W_HIST_N,
    W_HOME_DECODE,
    W_IS_DECODE,
    W_MEMBER,
    W_MIXED,
    W_PHASE,
    W_POOL,
    W_PQ_HEAD,
    W_PQ_LEN,
    W_PQ_TAIL,
    W_PROMPTS,
    W_STEP,
)
from pdopt.sim._enums import Step

POOL_MIXED = POOL_LABELS.index("mixed")  # the pool a Splitwise member goes home to
POOL_PACK = 4
"""A pool move's log entry carries ``new role + POOL_PACK · pool`` (unpacked by _io)."""


# =============================================================================================
# MoveWorker (Control.move_worker)
# =============================================================================================
@kernel
def move_worker(s, w, decode, pool, now):
    """Apply ``MoveWorker(w, pool, role)`` (role decode when ``decode``, else prefill; ``pool``
    an index into the run's pool labels) at ``now``; logged as the Python engine does. A mixed
    worker leaves its role only idle, for the prefill role (EcoServe's standby;
    :func:`_idle_mixed_to_prefill`); any other such move (Colocated.move: a step in flight, its
    chunked prompts requeued) is not reproduced: the run stops with ERR_UNSUPPORTED and reruns
    on the Python engine."""
    if s.wi[w, W_MIXED]:
        if decode or not _idle_mixed(s, w):
            s.g[G_ERROR] = ERR_UNSUPPORTED
            s.g[G_STOPPED] = 1
            return
        put_log(s, now, LOG_POOL_MOVE, w, -1, ROLE_MIXED, POOL_PACK * pool)
        _idle_mixed_to_prefill(s, w, pool)
        return
    old = s.wi[w, W_IS_DECODE]
    put_log(s, now, LOG_POOL_MOVE, w, -1, old, decode + POOL_PACK * pool)
    assign(s, w, decode, pool)
    if old == decode:
        return
    if decode:
        _prefill_to_decode(s, w, now)
    else:
        _decode_to_prefill(s, w, now)


@kernel
def _idle_mixed(s, w):
    """Mixed worker ``w`` idles: no step, nothing queued, prefilling or decoding."""
    wi = s.wi
    return (
        wi[w, W_STEP] == Step.IDLE
        and wi[w, W_PQ_LEN] == 0
        and wi[w, W_BATCH_N] == 0
        and wi[w, W_CHUNK_N] == 0
        and wi[w, W_B] == 0
        and wi[w, W_DQ_LEN] == 0
        and wi[w, W_PROMPTS] == 0
        and wi[w, W_HELD] == 0
    )


@kernel
def _idle_mixed_to_prefill(s, w, pool):
    """Colocated.move of an idle mixed worker to the prefill role (its phase back to "both",
    Colocated.leave: no step; nothing to requeue or restart), then Control._decode_to_prefill
    (no admission; nothing waits, nothing to start)."""
    wi = s.wi
    wi[w, W_MIXED] = 0
    wi[w, W_PHASE] = PH_BOTH
    wi[w, W_STEP] = Step.NONE
    wi[w, W_ACCEPTING] = 0
    assign(s, w, 0, pool)


@kernel
def assign(s, w, decode, pool):
    """Engine.assign: worker ``w``'s new role and pool; the role indices follow."""
    wi = s.wi
    wi[w, W_IS_DECODE] = decode
    wi[w, W_POOL] = pool
    n_p, n_d = 0, 0
    for x in range(wi.shape[0]):
        if wi[x, W_MIXED] or wi[x, W_IS_DECODE]:
            s.decode_idx[n_d] = x
            n_d += 1
        if wi[x, W_MIXED] or not wi[x, W_IS_DECODE]:
            s.prefill_idx[n_p] = x
            n_p += 1
    s.g[G_N_PREFILL] = n_p
    s.g[G_N_DECODE] = n_d


@kernel
def _prefill_to_decode(s, w, now):
    """Control._prefill_to_decode: route the queued prompts again; admit decode work now when
    no batch runs (else when it ends)."""
    ri, wi = s.ri, s.wi
    rid, count = wi[w, W_PQ_HEAD], wi[w, W_PQ_LEN]
    wi[w, W_PQ_LEN] = 0
    wi[w, W_PQ_HEAD] = -1
    wi[w, W_PQ_TAIL] = -1
    s.wf[w, V_QUEUED_FLOP] = 0.0
    for _ in range(count):
        nxt = ri[rid, R_QUEUE_NEXT]  # read first: the new queue rewrites it
        dst = route_prefill(s, rid, now)
        enqueue_prefill(s, rid, dst, now, False)
        if s.g[G_ERROR]:
            return
        if wi[dst, W_MIXED]:
            poke(s, dst, now)
        rid = nxt
    if wi[w, W_BATCH_N] == 0:
        wi[w, W_ACCEPTING] = 1


@kernel
def _decode_to_prefill(s, w, now):
    """Control._decode_to_prefill: admit no more; route the admission queue again (its KV
    leaves from ``w``); start prefill when nothing runs."""
    ri, wi = s.ri, s.wi
    wi[w, W_ACCEPTING] = 0
    rid, count = wi[w, W_DQ_HEAD], wi[w, W_DQ_LEN]
    wi[w, W_DQ_LEN] = 0
    wi[w, W_DQ_NEED] = 0
    wi[w, W_DQ_HEAD] = -1
    wi[w, W_DQ_TAIL] = -1
    for _ in range(count):
        nxt = ri[rid, R_QUEUE_NEXT]
        if not reroute_decode(s, rid, w, now):
            return
        rid = nxt
    if wi[w, W_B] == 0 and wi[w, W_PQ_LEN] > 0 and wi[w, W_BATCH_N] == 0:
        start_prefill(s, w, now)


@kernel
def reroute_decode(s, rid, src, now):
    """Engine.route_decode of ``rid`` from ``src``: a decode worker, the KV sent there; False
    (the run stops) when none holds its peak KV."""
    j = route_decode(s, rid, src, now)
    if j < 0:
        s.g[G_ERROR] = ERR_NO_DECODE_WORKER
        s.g[G_STOPPED] = 1
        return False
    transfer(s, rid, src, j, now)
    return True


# =============================================================================================
# Splitwise's on_tick
# =============================================================================================
@kernel
def splitwise_tick(s, now):
    """Splitwise.on_tick: at most one member moves (module docstring); False when it was not
    due."""
    wi, k = s.wi, s.tick_f
    n_w = wi.shape[0]
    members = False
    for w in range(n_w):
        members = members or wi[w, W_MEMBER] == 1
    if not members or now + 1e-9 < k[K_NEXT_ACT]:
        return False
    k[K_NEXT_ACT] = now + k[K_DELTA_T]
    over_p = _pending_prefill(s) / k[K_PREFILL_THRESHOLD]
    over_d = _pending_decode(s) / k[K_DECODE_THRESHOLD]
    most = over_d if over_d > over_p else over_p
    n_role_p, n_role_d = s.g[G_N_PREFILL], s.g[G_N_DECODE]
    if most > 1.0:
        target = ROLE_PREFILL if over_p >= over_d else ROLE_DECODE
        for w in range(n_w):
            role = wi[w, W_IS_DECODE]
            n_role = n_role_d if role == ROLE_DECODE else n_role_p
            if wi[w, W_MEMBER] and role != target and n_role >= 2:
                move_worker(s, w, target, target, now)  # pool str(target)
                return True
        return True
    if most < 0.5:
        for w in range(n_w):
            role = wi[w, W_IS_DECODE]
            n_role = n_role_d if role == ROLE_DECODE else n_role_p
            home = wi[w, W_HOME_DECODE]
            if wi[w, W_MEMBER] and role != home and n_role >= 2:
                move_worker(s, w, home, POOL_MIXED, now)
                return True
    return True


@kernel
def _pending_prefill(s):
    """Splitwise.pending_prefill_tokens: per prefill worker, its last ``queued + running``
    prompts routed (at most those it remembers), summed; over the prefill workers."""
    wi = s.wi
    total = 0
    n_p = s.g[G_N_PREFILL]
    for i in range(n_p):
        w = s.prefill_idx[i]
        n, size = wi[w, W_HIST_N], s.hist.shape[1]
        held = n if n < size else size
        k = wi[w, W_PQ_LEN] + wi[w, W_BATCH_N] + wi[w, W_B]
        k = k if k < held else held
        for q in range(k):
            total += s.hist[w, (n - 1 - q) % size]
    return total / n_p


@kernel
def _pending_decode(s):
    """Splitwise.pending_decode_tokens: the context tokens waiting for decode admission, over
    the decode workers (0.0 without one)."""
    ri, wi = s.ri, s.wi
    n_d = s.g[G_N_DECODE]
    if n_d == 0:
        return 0.0
    total = 0
    for i in range(n_d):
        j = s.decode_idx[i]
        rid = wi[j, W_DQ_HEAD]
        for _ in range(wi[j, W_DQ_LEN]):
            total += ri[rid, R_INPUT] + ri[rid, R_GENERATED]
            rid = ri[rid, R_QUEUE_NEXT]
    return total / n_d
