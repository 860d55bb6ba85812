"""Mixed (colocated) workers, compiled: :class:`pdopt.sim._mixed.Colocated`'s scheduling of one
worker's steps, in its phase (``W_PHASE``: ``"both"`` unless a policy's SetPhase changed it;
:func:`pdopt.sim._compiled._loop.set_phase`).

A mixed worker's prefill side (queue, running batch or chunked prompts, ``W_PROMPTS`` blocks
reserved) and decode side share one KV cache: the decode side may hold its capacity less the
prompts (:func:`pdopt.sim._compiled._decode.decode_limit`). At every step end the scheduler
chooses the next step (:func:`next_step`): a hybrid iteration (decodes plus prefill chunks, one
fused pass priced by :func:`hybrid_time`), a whole prefill batch with the decodes stalled
(``prefill_first``), a decode segment, or idle. ``W_STEP`` holds the step
(:class:`pdopt.sim._enums.Step`).

The functions here never route a request, so the request path
(:mod:`pdopt.sim._compiled._loop`) can poke a worker from inside a boundary without recursion:
a poked idle worker's boundary finishes and preempts nothing (its batch is empty; decodes
stalled by a phase took their finishes and preemptions at the boundary they stalled at;
:func:`_settle_idle` checks it and stops the run with ``ERR_UNSUPPORTED`` otherwise, which reruns
it on the Python engine), so only its admissions and a false OOM need handling there.
"""

from __future__ import annotations

from pdopt.costmodel import _hybrid
from pdopt.sim._compiled._decode import (
    L_ADM,
    boundary,
    forget_used,
    place_deferred,
    schedule_boundary,
    time_at,
)
from pdopt.sim._compiled._heap import remove_event, schedule
from pdopt.sim._compiled._jit import (
    blocks_of,
    expert_coverage,
    first_boundary_after,
    jit_leaves,
    kernel,
)
from pdopt.sim._compiled._prefill import start_batch, start_chunks
from pdopt.sim._compiled._state import (
    ERR_UNSUPPORTED,
    G_DROP_N,
    G_ERROR,
    G_STOPPED,
    PH_BOTH,
    PH_DECODE,
    PH_PREFILL,
    R_CHUNK,
    R_DONE,
    R_PREFILL_TOKENS,
    V_A_SEG,
    V_BATCH_END,
    V_BATCH_FLOP,
    V_BETA_PM,
    V_D0,
    V_D1,
    V_D2,
    V_D3,
    V_EXPERTS,
    V_EXPERTS_PER_TOKEN,
    V_H0,
    V_H1,
    V_H2,
    V_H3,
    V_H4,
    V_H5,
    V_HALF_D2B,
    V_INTERCEPT,
    V_P_PEAK,
    V_PREFILL_BUSY,
    V_STALL_SINCE,
    V_T_SEG,
    W_ACCEPTING,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_CHUNK_N,
    W_CHUNK_TOKENS,
    W_COUNTED,
    W_DEFER_SEQ,
    W_DQ_LEN,
    W_EVENT_POS,
    W_FITTED,
    W_HYBRID,
    W_ITER_BUDGET,
    W_MAX_RUNNING,
    W_MAX_SIZE,
    W_N_SEG,
    W_NEXT_N,
    W_PHASE,
    W_PQ_HEAD,
    W_PQ_LEN,
    W_PROMPTS,
    W_S,
    W_STALLED,
    W_STEP,
    W_U_SEG,
)
from pdopt.sim._compiled._tick import log_false_oom, record_admitted
from pdopt.sim._enums import Event, Step

# The one owner of the fused pass's rule, compiled from its own source (as the closed forms).
(fused_iteration_s,) = jit_leaves(_hybrid, ("fused_iteration_s",))

# A stalled decode side keeps its segment start but never reaches its next boundary
# (pdopt.sim._mixed._FROZEN_S).
_FROZEN_S = 1e300


@kernel
def poke(s, w, now):
    """Colocated.poke: something arrived for mixed worker ``w`` (a prefill, or a decode from
    elsewhere that an idle worker would wait for): an idle worker settles now, a decoding one
    visits its first boundary from ``now`` on; a step in flight decides at its end."""
    wi, wf = s.wi, s.wf
    step = wi[w, W_STEP]
    if step == Step.IDLE:
        _settle_idle(s, w, now)
    elif step == Step.DECODE:
        phase = wi[w, W_PHASE]
        if not (
            phase == PH_PREFILL
            or (wi[w, W_PQ_LEN] > 0 and phase != PH_DECODE)
            or (wi[w, W_DQ_LEN] > 0 and wi[w, W_ACCEPTING])
        ):
            return
        n = wi[w, W_N_SEG] + first_boundary_after(
            wf[w, V_T_SEG], wf[w, V_A_SEG], wf[w, V_HALF_D2B], now
        )
        if n < wi[w, W_NEXT_N] or wi[w, W_NEXT_N] < 0:
            _reschedule(s, w, n)


@kernel
def abort_decode(s, w, now):
    """Colocated.abort_decode: a running decode of mixed worker ``w`` was aborted
    (:func:`pdopt.sim._compiled._decode.abort_running`): see that a boundary of ``w`` is
    visited to drop it. A stalled side's next boundary is the end of the step in flight (or
    ``now`` when idle: it settles); a decoding one's, its next iteration boundary; a hybrid
    iteration's end is one."""
    wi, wf = s.wi, s.wf
    step = wi[w, W_STEP]
    if wi[w, W_STALLED]:
        if step == Step.IDLE:
            _settle_idle(s, w, now)
        return
    if step == Step.DECODE:
        n = wi[w, W_N_SEG] + first_boundary_after(
            wf[w, V_T_SEG], wf[w, V_A_SEG], wf[w, V_HALF_D2B], now
        )
        if n < wi[w, W_NEXT_N] or wi[w, W_NEXT_N] < 0:
            _reschedule(s, w, n)


@kernel
def _reschedule(s, w, n):
    """Make boundary ``n`` worker ``w``'s one pending boundary event (the Python engine leaves
    the one it supersedes stale in its heap; here it is removed)."""
    if s.wi[w, W_EVENT_POS] >= 0:
        remove_event(s, s.wi[w, W_EVENT_POS])
    s.wi[w, W_NEXT_N] = n
    schedule(s, time_at(s, w, n), Event.DECODE, w)


@kernel
def unstall(s, w, now):
    """Colocated._unstall: end a stall; the stalled time leaves the prefill side's busy time
    (the decode side counted it)."""
    if not s.wi[w, W_STALLED]:
        return
    wf = s.wf
    wf[w, V_PREFILL_BUSY] -= now - wf[w, V_STALL_SINCE]
    wf[w, V_STALL_SINCE] = -1.0
    s.wi[w, W_STALLED] = 0


@kernel
def _stall(s, w, now):
    """Colocated._stall: freeze the decode side at its current boundary (no admission)."""
    wi, wf = s.wi, s.wf
    wi[w, W_ACCEPTING] = 0
    if wi[w, W_B] == 0 or wi[w, W_STALLED]:
        return
    if wi[w, W_EVENT_POS] >= 0:
        remove_event(s, wi[w, W_EVENT_POS])
    wi[w, W_NEXT_N] = -1
    wf[w, V_A_SEG] = _FROZEN_S
    wf[w, V_HALF_D2B] = 0.0
    forget_used(s, w)
    wf[w, V_STALL_SINCE] = now
    wi[w, W_STALLED] = 1


@kernel
def settle_accepting(s, w):
    """Whether mixed worker ``w`` admits decodes once settled (Colocated.settle): not in phase
    "prefill"."""
    return s.wi[w, W_PHASE] != PH_PREFILL


@kernel
def _settle_idle(s, w, now):
    """Colocated.settle of an idle worker poked from inside the request path (Engine
    .process_boundary at its boundary ``now``, then its next step): its stalled decodes restart
    there and requests waiting admitted (unless in phase "prefill"); nothing finishes or is
    preempted (checked)."""
    wi = s.wi
    unstall(s, w, now)
    wi[w, W_ACCEPTING] = settle_accepting(s, w)
    wi[w, W_STEP] = Step.BUSY
    if wi[w, W_CHUNK_N]:
        s.g[G_ERROR] = ERR_UNSUPPORTED
        s.g[G_STOPPED] = 1
        return
    out = s.lists[1]
    n_fin, n_pre, n_adm, n_dep, n_join, blocked = boundary(s, w, wi[w, W_N_SEG], now, out)
    if n_fin or n_pre or n_dep or n_join or s.g[G_DROP_N]:  # G_DROP_N: no mixed worker migrates
        s.g[G_ERROR] = ERR_UNSUPPORTED
        s.g[G_STOPPED] = 1
        return
    schedule_boundary(s, w)
    record_admitted(s, out[L_ADM], n_adm, now)
    if blocked >= 0:
        log_false_oom(s, blocked, now)
    next_step(s, w, now)


@kernel
def seats(s, w):
    """Colocated._seats: prompts ``w`` may start under vLLM's ``max_num_seqs``: its running
    decodes, the prefilled prompts waiting for their decode slot and the prompts in prefill
    count as sequences (never negative)."""
    wi = s.wi
    free = wi[w, W_MAX_RUNNING] - wi[w, W_B] - wi[w, W_DQ_LEN] - wi[w, W_BATCH_N]
    return free if free > 0 else 0


@kernel
def next_step(s, w, now):
    """Colocated.next_step: ``w`` is at a decode boundary with nothing in flight; choose its
    next step (in phase "prefill" no decode step unless the waiting prefill does not fit; in
    phase "decode" no prefill step)."""
    wi = s.wi
    b = wi[w, W_B]
    phase = wi[w, W_PHASE]
    deferred = wi[w, W_DEFER_SEQ]  # the boundary defer_boundary decided (-1: none)
    wi[w, W_DEFER_SEQ] = -1
    if phase != PH_DECODE and (wi[w, W_PQ_LEN] > 0 or wi[w, W_BATCH_N] > 0):
        free = wi[w, W_CAP] - wi[w, W_U_SEG] - wi[w, W_PROMPTS]  # KvBlocks.prompt_room
        room = seats(s, w)
        head = wi[w, W_PQ_HEAD]
        if wi[w, W_HYBRID]:
            with_decode = phase == PH_BOTH and b > 0
            budget = wi[w, W_CHUNK_TOKENS]
            if with_decode and wi[w, W_ITER_BUDGET]:
                budget -= b  # Sarathi-Serve: the decode tokens share the iteration budget
            head_fits = (
                wi[w, W_PQ_LEN] > 0
                and room > 0
                and blocks_of(s, s.ri[head, R_PREFILL_TOKENS]) <= free
            )
            if budget > 0 and (wi[w, W_BATCH_N] > 0 or head_fits):
                _start_hybrid(s, w, now, free, budget, room, with_decode)
                return
        elif room > 0 and blocks_of(s, s.ri[head, R_PREFILL_TOKENS]) <= free:
            _stall(s, w, now)
            cap = wi[w, W_MAX_SIZE]  # PrefillSide.start_batch: min(max_batch_size, seats)
            end = start_batch(s, w, now, free, cap if cap < room else room)
            schedule(s, end, Event.PREFILL_DONE, w)
            wi[w, W_STEP] = Step.PREFILL
            return
        if b > 0:  # the prefill waiting does not fit: decode to free KV (or a full budget)
            _decode_on(s, w, deferred)
            return
    if b > 0 and phase != PH_PREFILL:
        _decode_on(s, w, deferred)
        return
    _stall(s, w, now)
    wi[w, W_STEP] = Step.IDLE


@kernel
def _decode_on(s, w, deferred):
    """The next step is a decode segment: the boundary its last boundary decided stands."""
    if deferred >= 0:
        place_deferred(s, w, deferred)
    s.wi[w, W_STEP] = Step.DECODE


@kernel
def _start_hybrid(s, w, now, free, budget, room, with_decode):
    """Colocated._start_hybrid: one iteration of chunks (``budget`` prefill tokens, ``room`` new
    prompts at most), fused with the running decodes when ``with_decode``."""
    wi, wf = s.wi, s.wf
    if not with_decode:
        _stall(s, w, now)
    start_chunks(s, w, now, budget, free, room)
    b = wi[w, W_B] if with_decode else 0
    step_s = hybrid_time(s, w, b, wi[w, W_S] + wi[w, W_B] * wi[w, W_N_SEG])
    if with_decode:
        # the decodes' iteration as one fused pass with the chunks: a one-iteration segment
        wi[w, W_COUNTED] = 0  # the decode side counts the whole iteration as busy
        wf[w, V_A_SEG] = step_s
        forget_used(s, w)
        n = wi[w, W_N_SEG] + 1
        end = time_at(s, w, n)
        _reschedule(s, w, n)
        wi[w, W_STEP] = Step.HYBRID
    else:
        wi[w, W_COUNTED] = 1
        end = now + step_s
        schedule(s, end, Event.PREFILL_DONE, w)
        wi[w, W_STEP] = Step.PREFILL
    wf[w, V_BATCH_END] = end


@kernel
def hybrid_time(s, w, b, context):
    """CostModel.hybrid_iteration_time_s of worker ``w``'s chunks in flight (``s.batches[w]``'s
    first ``W_CHUNK_N``, their tokens ``R_CHUNK``, done ``R_DONE``) with ``b`` decodes of
    ``context`` tokens, seconds; every expression in that method's order (the fused rule is
    :func:`pdopt.costmodel._hybrid.fused_iteration_s` compiled; with a fitted
    :class:`~pdopt.costmodel.HybridModel`, its ``iteration_time_s``).

    NOTE: the chunks' work is the step's ``V_BATCH_FLOP``: PrefillSide.start_chunks sums the
    same chunk works in the same order from 0.0 as the method does.
    """
    ri, wf = s.ri, s.wf
    batch = s.batches[w]
    work = wf[w, V_BATCH_FLOP]
    p_peak, intercept = wf[w, V_P_PEAK], wf[w, V_INTERCEPT]
    if b <= 0:
        return intercept + work / p_peak
    if s.wi[w, W_FITTED]:  # HybridModel.iteration_time_s
        attention = 0.0
        tokens = b
        for i in range(s.wi[w, W_CHUNK_N]):
            rid = batch[i]
            c, d = ri[rid, R_CHUNK], ri[rid, R_DONE]
            attention += wf[w, V_H4] * (c * (2 * d + c))
            tokens += c
        decode_pass = wf[w, V_H0] + wf[w, V_H1] * b
        chunk_pass = wf[w, V_H5] + wf[w, V_H3] * tokens
        decode_attention = wf[w, V_H2] * context
        separate = decode_pass + chunk_pass + decode_attention + attention
        return fused_iteration_s(decode_pass, chunk_pass, decode_attention, attention, separate)
    # DecodeModel.iteration_time_s(b, context): the linear form, then the MoE expert term
    decode_s = wf[w, V_D0] + wf[w, V_D1] * float(b) + wf[w, V_D2] * float(context)
    d3 = wf[w, V_D3]
    if d3 > 0.0:
        decode_s = decode_s + d3 * expert_coverage(
            float(b), wf[w, V_EXPERTS], wf[w, V_EXPERTS_PER_TOKEN]
        )
    decode_attention_s = wf[w, V_D2] * context
    linear_flop_per_token = wf[w, V_BETA_PM]
    chunk_tokens = 0
    for i in range(s.wi[w, W_CHUNK_N]):
        chunk_tokens += ri[batch[i], R_CHUNK]
    iteration_tokens = chunk_tokens + b
    return fused_iteration_s(
        decode_s - decode_attention_s,
        intercept + linear_flop_per_token * iteration_tokens / p_peak,
        decode_attention_s,
        (work - linear_flop_per_token * chunk_tokens) / p_peak,
        decode_s + intercept + work / p_peak,
    )
