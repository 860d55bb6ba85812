"""Phasor's Virtual Freeness and routing, compiled (:class:`pdopt.policies.phasor.Phasor`'s
``route_prefill``, ``route_decode``, ``temporal_phi`` and ``spatial_phi``; its tick rule is
:mod:`pdopt.sim._compiled._phasor_tick`).

Each function evaluates the policy's numpy expression element by element in the same order,
so every Φ is the same double and every argmax (first maximum) picks the same worker; a pool's
mean Φ is numpy's pairwise sum (:func:`pairwise_sum`) over its workers in index order, divided
by their count, as ``ndarray.mean`` computes it.

The policy's own records are the engine's state here: a waiting request's recorded KV need
(``_kv_need``, its ``RequestInfo.kv_blocks`` when it was routed to decode) is
``kv_blocks(input + generated)``, which does not change while it waits; a draining member
(``_draining``) is flagged ``W_DRAINING``.
"""

from __future__ import annotations

import functools

from pdopt.sim._compiled._decode import iteration_s, kv_free
from pdopt.sim._compiled._jit import blocks_of, boundaries_before, kernel
from pdopt.sim._compiled._prefill import outstanding_flop
from pdopt.sim._compiled._state import (
    G_N_DECODE,
    G_N_PREFILL,
    K_TTFT_SLO,
    R_GENERATED,
    R_INPUT,
    V_A_SEG,
    V_HALF_D2B,
    V_P_PEAK,
    V_T_SEG,
    W_B,
    W_BATCH_N,
    W_CAP,
    W_DQ_NEED,
    W_DRAINING,
    W_HEAP_N,
    W_N_SEG,
    W_PQ_LEN,
    W_S,
)

EPS = 1e-9
"""The policy's ``_EPS``: a tie-break weight and the Δt clock's tolerance."""


# =============================================================================================
# Φ_T: the prefill side
# =============================================================================================
@kernel
def temporal_phi(s, w, now):
    """Phasor.temporal_phi of worker ``w``: ``1 − work / (P_peak · T_TTFT_SLO)``, the work
    being its outstanding prefill FLOP plus, for a draining member, its drain time at P_peak."""
    wf = s.wf
    work = outstanding_flop(s, w, now)
    if s.wi[w, W_DRAINING]:
        work += drain_s(s, w, now) * wf[w, V_P_PEAK]
    return 1.0 - work / (wf[w, V_P_PEAK] * s.tick_f[K_TTFT_SLO])


@kernel
def drain_s(s, w, now):
    """Phasor._drain_s: seconds until ``w``'s running decodes have all finished (the longest
    remaining output at the current iteration time τ(B, C)); a member with none left stops
    draining."""
    wi, wf = s.wi, s.wf
    b = wi[w, W_B]
    if b == 0:
        wi[w, W_DRAINING] = 0
        return 0.0
    m = wi[w, W_N_SEG] + boundaries_before(wf[w, V_T_SEG], wf[w, V_A_SEG], wf[w, V_HALF_D2B], now)
    context = wi[w, W_S] + b * m  # Σ (offset + m) over the running requests
    tau = iteration_s(s, w, float(b), float(context))
    last = 0
    heap = s.fin[w]
    for i in range(wi[w, W_HEAP_N]):  # every running request's finish counter
        last = heap[i, 0] if heap[i, 0] > last else last
    return float(last - m) * tau


@kernel
def phasor_prefill(s, now, by_phi):
    """Phasor.route_prefill: the prefill worker with the largest Φ_T (``by_phi``), else the
    fewest queued plus running requests; the first on ties."""
    wi = s.wi
    best, best_score = -1, 0.0
    for i in range(s.g[G_N_PREFILL]):
        w = s.prefill_idx[i]
        if by_phi:
            score = temporal_phi(s, w, now)
        else:  # a negated load: argmin as argmax
            score = -float(wi[w, W_PQ_LEN] + wi[w, W_BATCH_N] + wi[w, W_B])
        if best < 0 or score > best_score:
            best, best_score = w, score
    return best


# =============================================================================================
# Φ_S: the decode side
# =============================================================================================
@kernel
def effective_free(s, j, now):
    """Phasor._effective_free of worker ``j``: its free KV blocks less what its waiting
    requests will take (``W_DQ_NEED``, kept by the admission queue)."""
    return kv_free(s, j, now) - s.wi[j, W_DQ_NEED]


@kernel
def phasor_decode(s, rid, now, peak, by_phi_s):
    """Phasor.route_decode among the decode workers that hold ``peak`` blocks: the most
    effective free KV, or (``by_phi_s``) the largest Φ_S with stranded blocks judged against
    this request, ties to more free KV; the first on ties. -1 when none holds it."""
    wi = s.wi
    need = blocks_of(s, s.ri[rid, R_INPUT] + max(s.ri[rid, R_GENERATED], 1))
    best, best_score = -1, 0.0
    for i in range(s.g[G_N_DECODE]):
        j = s.decode_idx[i]
        cap = wi[j, W_CAP]
        if not (peak <= s.min_cap or cap >= peak):
            continue
        free = effective_free(s, j, now)
        if by_phi_s:
            kept = free if free > 0 else 0
            stranded = kept % need if need > 0 else 0
            phi = 1.0 - (float(cap - kept) + float(stranded)) / float(cap)
            score = phi + float(free) / float(cap) * EPS
        else:
            score = float(free)
        if best < 0 or score > best_score:
            best, best_score = j, score
    return best


@kernel
def spatial_phi(cap, used, need):
    """Phasor.spatial_phi of a worker with ``cap`` KV blocks, ``used`` of them in use:
    ``1 − (used + stranded) / capacity``, stranded judged against the view's reference
    request's ``need`` blocks (:func:`pdopt.sim._compiled._tick.reference_need`)."""
    free = cap - used if cap > used else 0
    stranded = free % need if need > 0 else 0
    return 1.0 - float(used + stranded) / float(cap)


# =============================================================================================
# numpy's mean
# =============================================================================================
PAIRWISE_LEVELS = 5
"""How deep numpy's halving is written out in :func:`pairwise_sum` (NOTE: numba's cache does
not reload a self-recursive function correctly: a loaded one crashed)."""


def _halvings(n: int) -> int:
    """How many times numpy halves ``n`` values on the deepest path of its pairwise sum."""
    if n <= 128:
        return 0
    half = n // 2 - (n // 2) % 8
    return 1 + max(_halvings(half), _halvings(n - half))


@functools.cache
def max_pool() -> int:
    """The largest pool size up to which every size's mean Φ :func:`pairwise_sum` reproduces
    (a larger cluster keeps Phasor on the Python engine)."""
    n = 128
    while _halvings(n + 1) <= PAIRWISE_LEVELS:
        n += 1
    return n


@kernel
def pairwise_sum(a, start, n):
    """``a[start:start + n].sum()`` as numpy adds a contiguous float64 array (``n`` at most
    :func:`max_pool`): it halves (the first half a multiple of 8) above 128 values and sums
    each part of at most 128 with :func:`_block_sum`."""
    if n <= 128:
        return _block_sum(a, start, n)
    half = _half(n)
    return _level4(a, start, half) + _level4(a, start + half, n - half)


@kernel
def _half(n):
    half = n // 2
    return half - half % 8


@kernel
def _level4(a, start, n):
    if n <= 128:
        return _block_sum(a, start, n)
    half = _half(n)
    return _level3(a, start, half) + _level3(a, start + half, n - half)


@kernel
def _level3(a, start, n):
    if n <= 128:
        return _block_sum(a, start, n)
    half = _half(n)
    return _level2(a, start, half) + _level2(a, start + half, n - half)


@kernel
def _level2(a, start, n):
    if n <= 128:
        return _block_sum(a, start, n)
    half = _half(n)
    return _level1(a, start, half) + _level1(a, start + half, n - half)


@kernel
def _level1(a, start, n):
    if n <= 128:
        return _block_sum(a, start, n)
    half = _half(n)
    return _block_sum(a, start, half) + _block_sum(a, start + half, n - half)


@kernel
def _block_sum(a, start, n):
    """numpy's pairwise sum of at most 128 values: a plain loop below 8, else eight
    interleaved partial sums combined as a tree, then the tail."""
    if n < 8:
        total = 0.0
        for i in range(start, start + n):
            total += a[i]
        return total
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = start + 8
    end = start + n
    while i < end - n % 8:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < end:
        total += a[i]
        i += 1
    return total
