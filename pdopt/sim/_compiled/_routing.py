"""Routing: the compiled twins of the built-in policies (:mod:`pdopt.policies._baselines`).

A policy names its twin in ``PolicyTraits.compiled_routing`` (a prefill and a decode routing
name); the twin must pick exactly the worker the policy's hooks would, ties included. A policy
that acts on ticks also names its ``on_tick`` twin with a ``compiled_tick()`` method
(:mod:`pdopt.sim._compiled._pools`).
"""

from __future__ import annotations

from pdopt.sim._compiled._arrow import arrow_decode, arrow_prefill
from pdopt.sim._compiled._decode import kv_free, used_blocks_at
from pdopt.sim._compiled._ecoserve import eco_decode, eco_prefill
from pdopt.sim._compiled._jit import blocks_of, kernel
from pdopt.sim._compiled._mooncake import mooncake_decode, mooncake_prefill
from pdopt.sim._compiled._phasor import phasor_decode, phasor_prefill
from pdopt.sim._compiled._prefill import outstanding_flop, prefill_wait_s, work_flop
from pdopt.sim._compiled._prefix import cached_tokens
from pdopt.sim._compiled._state import (
    G_N_DECODE,
    G_N_PREFILL,
    G_PROMPT_NEED,
    G_RR_D,
    G_RR_P,
    R_GENERATED,
    R_INPUT,
    R_OUTPUT,
    R_PREFILL_TOKENS,
    TICK_ARROW,
    TICK_ECOSERVE,
    TICK_NONE,
    TICK_PHASOR,
    TICK_SPLITWISE,
    V_ALPHA,
    V_BETA_PM,
    V_P_PEAK,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_DQ_LEN,
    W_HIST_N,
    W_IS_DECODE,
    W_MIXED,
    W_PQ_LEN,
    W_PROMPTS,
    W_U_SEG,
)
from pdopt.sim._policy import PolicyTraits

PREFILL_ROUTING = {
    "round_robin": 0,
    "least_loaded": 1,
    "least_outstanding": 2,
    "most_free_kv": 3,
    "min_load_tokens": 4,
    "splitwise": 5,
    "mooncake": 6,
    "mooncake_ttft": 7,
    "phasor": 8,
    "phasor_queue": 9,
    "arrow": 10,
    "prefix_affinity": 11,
    "kv_aware": 12,
    "ecoserve": 13,
}
"""Prefill routing codes: round robin, least queued work (FLOP), fewest outstanding requests
(queued, running and waiting for decode), most free KV blocks, least queued work over the
worker's peak FLOP/s (seconds, :class:`pdopt.policies._baselines.MinLoadTokens`), and
Splitwise's join-shortest-queue (fewest queued plus running requests), which also remembers the
prompt in the worker's routing history (:mod:`pdopt.sim._compiled._pools`); Mooncake's (the
worker whose KV would reach a decode worker first) and its ``transfer_aware=False`` ablation
(the least predicted TTFT), :mod:`pdopt.sim._compiled._mooncake`; Phasor's largest Φ_T and its
``phi_routing=False`` ablation (fewest queued plus running requests),
:mod:`pdopt.sim._compiled._phasor`; Arrow's Alg. 1 (:mod:`pdopt.sim._compiled._arrow`); the
cache-aware rules (:mod:`pdopt.policies._cache_routing`): the most cached prompt tokens (ties:
least queued work, then lowest index) and the earliest finish of the prompt's uncached work;
EcoServe's Alg. 1 over its macro instances (:mod:`pdopt.sim._compiled._ecoserve`)."""
DECODE_ROUTING = {
    "round_robin": 0,
    "least_loaded": 1,
    "most_free_kv": 2,
    "origin": 3,
    "min_load_tokens": 4,
    "mooncake": 5,
    "mooncake_load": 6,
    "phasor_free_kv": 7,
    "phasor_phi_s": 8,
    "arrow": 9,
    "ecoserve": 10,
}
"""Decode routing codes: round robin, fewest running plus waiting, most free KV blocks, the
colocated policies' rule (:mod:`pdopt.policies.colocated`): the worker that prefilled the
request when it decodes and holds the request's peak KV, else the most free KV blocks; and
fewest running tokens (KV blocks in use × block tokens, MinLoadTokens); Mooncake's (within the
TPOT SLO, the earliest arrival of the KV) and its ablation (within the SLO, the least loaded);
Phasor's (the most free KV net of the requests waiting there, or the largest Φ_S); Arrow's Alg. 2;
EcoServe's (where it was prefilled, else the most free KV in its macro instance, else anywhere).
"""

ROUTING_PARAMS = {PREFILL_ROUTING["mooncake"], PREFILL_ROUTING["mooncake_ttft"]}
"""Prefill routing codes whose twin takes parameters from ``policy.compiled_params()`` (read
after the policy's ``start``: Mooncake's TPOT SLO, then each worker's TTFT predictor's ``a, b,
c``)."""


TICK_RULES = {
    "splitwise": TICK_SPLITWISE,
    "phasor": TICK_PHASOR,
    "arrow": TICK_ARROW,
    "ecoserve": TICK_ECOSERVE,
}
"""Tick rules: the policies' ``on_tick`` twins (:mod:`pdopt.sim._compiled._pools`)."""

Codes = tuple[int, int, int, tuple[float, ...]]
"""A compiled run's policy: prefill and decode routing codes, tick rule (``TICK_*``) and the
tick rule's parameters, or (a routing twin in :data:`ROUTING_PARAMS`, which never acts on
ticks) the routing twin's."""


def routing_codes(traits: PolicyTraits, policy: object = None) -> Codes | None:
    """The codes of a policy's compiled twin, or None when it has none: ``traits.compiled_routing``
    names its routing; a policy that wants ticks also names its tick rule and parameters with
    ``policy.compiled_tick()`` (``(name, params)`` or None)."""
    names = traits.compiled_routing
    if names is None:
        return None
    tick = TICK_NONE
    params: tuple[float, ...] = ()
    if traits.wants_ticks:
        rule = compiled_tick(policy)
        if rule is None:
            return None
        tick, params = TICK_RULES[rule[0]], tuple(float(x) for x in rule[1])
    prefill = PREFILL_ROUTING[names[0]]
    if prefill in ROUTING_PARAMS:
        hook = getattr(policy, "compiled_params", None)
        params = tuple(float(x) for x in hook()) if callable(hook) else ()
    return prefill, DECODE_ROUTING[names[1]], tick, params


def compiled_tick(policy: object) -> tuple[str, tuple[float, ...]] | None:
    """``policy.compiled_tick()``: the name and parameters of its ``on_tick``'s compiled twin,
    or None (a policy without the method has none)."""
    hook = getattr(policy, "compiled_tick", None)
    rule = hook() if callable(hook) else None
    return rule if rule is not None and rule[0] in TICK_RULES else None


@kernel
def route_prefill(s, rid, now):
    """The prefill worker for ``rid`` under routing code ``s.p_code``, chosen among the prefill
    workers whose KV capacity holds its prompt (the prompt plus the tokens generated before a
    preemption) when only some of them do (ClusterView.prefill_workers during a
    ``route_prefill`` call): ``prefill_idx`` is narrowed to them for the call, in order, and
    their need kept in ``G_PROMPT_NEED`` for the rules that read roles instead."""
    need = blocks_of(s, s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED])
    if need <= s.min_cap:
        return _route_prefill(s, rid, now)
    wi, idx, kept = s.wi, s.prefill_idx, s.route_idx
    n = s.g[G_N_PREFILL]
    held = 0
    for i in range(n):
        w = idx[i]
        kept[i] = w
        if wi[w, W_CAP] >= need:
            idx[held] = w  # behind the reads: a worker moves forward only
            held += 1
    if held == 0 or held == n:  # none holds it (the engine refuses the choice) or all do:
        return _route_prefill(s, rid, now)  # idx as it was (nothing written, or each in place)
    s.g[G_N_PREFILL] = held
    s.g[G_PROMPT_NEED] = need
    w = _route_prefill(s, rid, now)
    for i in range(n):
        idx[i] = kept[i]
    s.g[G_N_PREFILL] = n
    s.g[G_PROMPT_NEED] = 0
    return w


@kernel
def _route_prefill(s, rid, now):
    """The prefill worker for ``rid`` under routing code ``s.p_code``, among the first
    ``g[G_N_PREFILL]`` of ``prefill_idx``."""
    prefill_idx, wi, code = s.prefill_idx, s.wi, s.p_code
    n_prefill = s.g[G_N_PREFILL]
    if code == 0:  # round robin
        s.g[G_RR_P] += 1
        return prefill_idx[(s.g[G_RR_P] - 1) % n_prefill]
    if code == 6 or code == 7:  # Mooncake, transfer-aware or not
        return mooncake_prefill(s, rid, now, code == 6)
    if code == 8 or code == 9:  # Phasor, by Φ_T or by queue length
        return phasor_prefill(s, now, code == 8)
    if code == 10:
        return arrow_prefill(s, rid, now)
    if code == 11 or code == 12:
        return _cache_aware(s, rid, now, code == 12)
    if code == 13:
        return eco_prefill(s, rid, now)
    best = prefill_idx[0]
    best_load = 0.0
    for i in range(n_prefill):
        w = prefill_idx[i]
        if code == 1:  # least queued prefill work
            load = outstanding_flop(s, w, now)
        elif code == 4:  # least queued work in seconds at peak (MinLoadTokens, same division)
            load = prefill_wait_s(s, w, now)
        elif code == 2:  # fewest outstanding requests: queued, running, waiting for decode
            load = float(wi[w, W_PQ_LEN] + wi[w, W_BATCH_N] + wi[w, W_B] + wi[w, W_DQ_LEN])
        elif code == 5:  # Splitwise: fewest queued plus running (prefill batch and decodes)
            load = float(wi[w, W_PQ_LEN] + wi[w, W_BATCH_N] + wi[w, W_B])
        else:  # most free KV blocks (argmax as a negated load): only a running batch holds KV
            used = wi[w, W_U_SEG]
            for k in range(wi[w, W_BATCH_N]):
                used += blocks_of(s, s.ri[s.batches[w, k], R_PREFILL_TOKENS])
            free = wi[w, W_CAP] - used
            load = -float(free if free > 0 else 0)
        if i == 0 or load < best_load:
            best, best_load = w, load
    if code == 5:  # Splitwise.route_prefill: the prompt joins the worker's history
        remember_prompt(s, best, s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED])
    return best


@kernel
def _cache_aware(s, rid, now, by_finish):
    """cache_aware_worker (pdopt.policies._cache_routing): with ``by_finish`` (``kv_aware``) the
    worker where the prompt's uncached work, after its queued work, finishes first (its first
    on ties); else (``prefix_affinity``) the one caching most of the prompt, then the least
    queued work, then the lowest index."""
    prefill_idx = s.prefill_idx
    tokens = s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED]
    best, best_cached, best_load = -1, 0, 0.0
    for i in range(s.g[G_N_PREFILL]):
        w = prefill_idx[i]
        queued = outstanding_flop(s, w, now)
        if by_finish and best >= 0 and _finishes_after(s, w, queued, best_load):
            continue  # no walk of its cache: it cannot be chosen, whatever it caches
        cached = cached_tokens(s, w, rid)
        if by_finish:
            left = work_flop(s, w, tokens) - work_flop(s, w, cached)
            load = (queued + left) / s.wf[w, V_P_PEAK]
            if best < 0 or load < best_load:
                best, best_load = w, load
        elif (
            best < 0
            or cached > best_cached
            or (
                cached == best_cached and (queued < best_load or (queued == best_load and w < best))
            )
        ):
            best, best_cached, best_load = w, cached, queued
    return best


@kernel
def _finishes_after(s, w, queued, load):
    """Whether ``w``'s ``queued`` work alone ends no earlier than ``load`` (seconds of work):
    then no cached prefix makes it the strictly first to finish, as its uncached work is never
    negative where the prefill's work grows with its tokens (``alpha``, ``beta·P_m`` >= 0)."""
    wf = s.wf
    return wf[w, V_ALPHA] >= 0.0 and wf[w, V_BETA_PM] >= 0.0 and queued / wf[w, V_P_PEAK] >= load


@kernel
def remember_prompt(s, w, tokens):
    """Append ``tokens`` to worker ``w``'s routing history (Splitwise's ``_routed[w]``, a deque
    with a maxlen: the ring keeps the last ``hist.shape[1]``)."""
    n = s.wi[w, W_HIST_N]
    s.hist[w, n % s.hist.shape[1]] = tokens
    s.wi[w, W_HIST_N] = n + 1


@kernel
def route_decode(s, rid, src, now):
    """The decode worker for ``rid``, prefilled on ``src``, under routing code ``s.d_code``, or
    -1 when no decode worker holds its peak KV."""
    decode_idx, wi, code, min_cap = s.decode_idx, s.wi, s.d_code, s.min_cap
    peak = blocks_of(s, s.ri[rid, R_INPUT] + s.ri[rid, R_OUTPUT] - 1)
    n_decode = s.g[G_N_DECODE]
    n_ok = 0
    for i in range(n_decode):
        if peak <= min_cap or wi[decode_idx[i], W_CAP] >= peak:
            n_ok += 1
    if n_ok == 0:
        return -1
    decodes_here = wi[src, W_IS_DECODE] or wi[src, W_MIXED]
    if code == 3 and decodes_here and (peak <= min_cap or wi[src, W_CAP] >= peak):
        return src  # it stays where it was prefilled
    if code == 5 or code == 6:  # Mooncake, transfer-aware or not
        return mooncake_decode(s, rid, src, now, peak, code == 5)
    if code == 7 or code == 8:  # Phasor, by effective free KV or by Φ_S
        return phasor_decode(s, rid, now, peak, code == 8)
    if code == 9:
        return arrow_decode(s, rid, now, peak)
    if code == 10:
        return eco_decode(s, rid, now, peak)
    pick = 0
    if code == 0:  # round robin over the feasible workers
        s.g[G_RR_D] += 1
        pick = (s.g[G_RR_D] - 1) % n_ok
    best, best_load, k = -1, 0, 0
    for i in range(n_decode):
        j = decode_idx[i]
        if not (peak <= min_cap or wi[j, W_CAP] >= peak):
            continue
        if code == 0:
            if k == pick:
                return j
            k += 1
            continue
        # code 1: fewest running plus waiting; 4: fewest running tokens; else most free KV
        # blocks, as a negated load (argmin, ties: lowest index)
        if code == 1:
            load = wi[j, W_BATCH_N] + wi[j, W_B] + wi[j, W_DQ_LEN]
        elif code == 4:
            load = running_tokens(s, j, now)
        else:
            load = -kv_free(s, j, now)
        if best < 0 or load < best_load:
            best, best_load = j, load
    return best


@kernel
def running_tokens(s, j, now):
    """MinLoadTokens' decode load of worker ``j`` at ``now``: ClusterView.kv_used_blocks (the
    running decodes' blocks plus the prompts in prefill, KvBlocks.in_use; no migration holds
    here) × block tokens.

    NOTE: the policy compares ``float(blocks) * block_tokens``; both are integers far below
    2**53, so the float products are exact and compare as these integer ones do (ties too)."""
    return (used_blocks_at(s, j, now) + s.wi[j, W_PROMPTS]) * s.bt
