"""Mooncake's routing twin (:class:`pdopt.policies.mooncake.Mooncake`): transfer-aware routing
over the cluster's links, with the policy's own mirror of the links' wire times (``State.wire``).

Every expression is written in the policy's order (numba compiles without fast-math):

* the predicted TTFT of a prompt of ``l`` tokens on worker ``w``: ``now + (wait + own)`` with
  ``wait = queued_prefill_flop / P_peak`` (WorkerModels.prefill_wait_s) and ``own = a·l·l + b·l
  + c`` (TtftModel.predict, the coefficients the policy's own predictors carry, passed by
  ``Mooncake.compiled_params``);
* the arrival of KV made ready at ``ready`` on ``src`` at ``dst``: ``max(ready, wire) + latency
  + bytes / bw`` (Mooncake._arrival_s), ``ready`` itself when ``src == dst``;
* the decode iteration with the request added: τ(B + 1, C + l)
  (:func:`pdopt.sim._compiled._decode.iteration_s`, DecodeModel.iteration_time_s of one B: an
  MoE decode's expert term a float power, the C library's ``pow`` in both).

The policy's reductions are order-free: ``min`` over arrivals and first-minimum ``argmin`` are
exact whatever the order, and ``np.lexsort((load, arrive))[0]`` is the first worker (in index
order) with the least arrival, then the least load.
"""

from __future__ import annotations

from pdopt.sim._compiled._decode import iteration_s, used_blocks_at
from pdopt.sim._compiled._jit import blocks_of, kernel, window_held_tokens
from pdopt.sim._compiled._prefill import predicted_ttft_s, request_kv_blocks
from pdopt.sim._compiled._state import (
    G_N_DECODE,
    G_N_PREFILL,
    R_GENERATED,
    R_INPUT,
    R_OUTPUT,
    R_PREFILL_TOKENS,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_DQ_LEN,
)


@kernel
def kv_bytes_of(s, tokens):
    """Mooncake._kv_bytes_of: bytes a transfer of ``tokens`` prompt tokens moves (the sliding
    layers send their window only; ``SlidingWindow.held_tokens`` of a float)."""
    if s.kv_window > 0:
        held = window_held_tokens(float(tokens), s.kv_window, s.kv_sliding_layers, s.kv_layers)
        return held * s.kv_bytes
    return float(tokens * s.kv_bytes)


@kernel
def arrival(s, src, dst, ready, n_bytes):
    """Mooncake._arrival_s for one destination."""
    if dst == src:
        return ready
    wire = n_bytes / s.link_bw[src, dst]
    free = s.wire[src, dst]
    start = ready if ready > free else free
    return start + s.link_lat[src, dst] + wire


@kernel
def mooncake_prefill(s, rid, now, aware):
    """Mooncake.route_prefill: the prefill worker whose KV would reach a decode worker first
    (``aware``), else the least predicted TTFT; ties: the lowest index."""
    tokens = s.ri[rid, R_INPUT] + s.ri[rid, R_GENERATED]  # RequestInfo.prefill_tokens
    length = float(tokens)
    n_bytes = kv_bytes_of(s, tokens)
    to_decode = aware and s.ri[rid, R_OUTPUT] > 1
    best, best_score = s.prefill_idx[0], 0.0
    for i in range(s.g[G_N_PREFILL]):
        w = s.prefill_idx[i]
        ready = now + predicted_ttft_s(s, w, now, length)
        score = ready
        if to_decode:
            for k in range(s.g[G_N_DECODE]):
                end = arrival(s, w, s.decode_idx[k], ready, n_bytes)
                if k == 0 or end < score:
                    score = end
        if i == 0 or score < best_score:
            best, best_score = w, score
    return best


@kernel
def mooncake_decode(s, rid, src, now, peak, aware):
    """Mooncake.route_decode among the decode workers holding ``peak`` blocks: those whose KV
    fits and whose iteration with the request stays within the TPOT SLO, else all of them; the
    earliest arrival, ties the least loaded (``aware``), else the least loaded; ties: the lowest
    index. The KV then goes on the policy's mirror of the link (Mooncake._put_on_wire)."""
    ri, wi = s.ri, s.wi
    gen = ri[rid, R_GENERATED]
    tokens = ri[rid, R_INPUT] + gen  # RequestInfo.prefill_tokens (the token just emitted counted)
    need = request_kv_blocks(s, rid)
    n_bytes = kv_bytes_of(s, tokens - 1)  # what the engine sends: the prefill's KV
    any_ok = False
    best, best_arrive, best_load = -1, 0.0, 0.0
    for strict in (True, False):  # the workers within the SLO, else every feasible one
        if not strict and any_ok:
            break
        for i in range(s.g[G_N_DECODE]):
            d = s.decode_idx[i]
            if not (peak <= s.min_cap or wi[d, W_CAP] >= peak):
                continue
            load = float(wi[d, W_BATCH_N] + wi[d, W_B] + wi[d, W_DQ_LEN])  # decode_load's batch
            if strict:
                used = used_blocks_at(s, d, now)  # ClusterView.kv_used_blocks, kv_free_blocks
                for k in range(wi[d, W_BATCH_N]):
                    used += blocks_of(s, ri[s.batches[d, k], R_PREFILL_TOKENS])
                free = wi[d, W_CAP] - used
                if (free if free > 0 else 0) < need:
                    continue
                b = load + 1
                c = float(used) * s.bt + tokens
                if iteration_s(s, d, b, c) > s.tpot_s:
                    continue
                any_ok = True
            arrive = arrival(s, src, d, now, n_bytes) if aware else 0.0
            if best < 0 or arrive < best_arrive or (arrive == best_arrive and load < best_load):
                best, best_arrive, best_load = d, arrive, load
    if best >= 0 and best != src:
        free = s.wire[src, best]
        start = now if now > free else free
        s.wire[src, best] = start + n_bytes / s.link_bw[src, best]
    return best
