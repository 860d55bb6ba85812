"""The decode side's closed forms: one source for both engines.

A decode worker advances its running batch in closed form between the boundaries where something
happens (:mod:`pdopt.sim._decode` states the model). With ``B`` requests running, their contexts
summing to ``C = s + B·m`` during iteration ``m``, one iteration takes ``τ(B, C) = d0 + d1·B +
d2·C + d3·cover(B)`` (DESIGN.md "Cost model"; the MoE term is constant while B is), so
boundary ``n_seg + k`` of the segment that started at boundary ``n_seg``, time ``t_seg``, falls at

    ``t(k) = t_seg + k·a_seg + (d2·B/2)·k(k − 1)``,   ``a_seg = τ(B, s + B·n_seg)``.

A request holding ``L`` context tokens uses :func:`kv_blocks` KV blocks: ``ceil(L / bt)``
without a sliding window, else ``ceil(E(L) / bt)`` with ``E(L) = (F·L + S·min(L, W)) / N`` its
footprint in full-token equivalents (bytes held / bytes per token held in every layer,
:func:`pdopt.model_spec._window.window_held_tokens`): full-attention layers hold every token,
sliding ones the last ``W`` (vLLM's hybrid KV-cache manager frees the blocks that leave the
window). Without a window, growth is counted per phase: ``cnt[p]`` running requests gain a block
at every counter ``m`` with ``m mod block_tokens == p``. With one, growth is no longer periodic
in ``bt`` (past the window a request gains ``F/N`` of a token per token), so it is summed over
the running requests' offsets (:func:`window_growth`, ``O(B)`` per call).

:func:`next_tick` is the control tick's: the first tick at or after the next event.

These are plain functions of scalars and one sequence of phase counts. The Python engine
(:class:`pdopt.sim._decode.DecodeSide`) calls them as they are; the compiled engine
(:mod:`pdopt.sim._compiled`) compiles the very same functions with numba when it is imported.
So every expression here is evaluated in the same floating-point order by both engines, which is
what keeps their results bit-identical. This module imports nothing from numba, and its
functions call only each other, :func:`pdopt.model_spec.expert_coverage` (the one owner of the
MoE coverage; the compiled engine compiles it too and rebinds all these calls to the compiled
versions), ``math`` and builtins. The compiled engine also compiles
:func:`pdopt.model_spec._window.window_held_tokens` from here (the KV a sliding-window model's
transfer moves, and every KV block count of :func:`kv_blocks`), which the Python engine
reaches through :meth:`pdopt.model_spec.SlidingWindow.held_tokens` for transfers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pdopt.cluster._blocks import kv_blocks as kv_blocks
from pdopt.model_spec import expert_coverage
from pdopt.model_spec._window import window_held_tokens

NEVER = 1 << 62  # a boundary counter no run reaches: "no growth failure"
_GALLOP_LIMIT = 1 << 40  # counters searched for a growth failure before giving up (NEVER)


def kv_full_blocks(tokens: int, bt: int, window: int, sliding: int, layers: int) -> int:
    """KV blocks a request holding ``tokens`` context tokens has filled completely: ``floor(E /
    bt)`` with :func:`kv_blocks`' ``E`` (``tokens // bt`` without a window); what a migration's
    snapshot leaves clean (:func:`pdopt.sim._migration.dirty_blocks`)."""
    if sliding == 0:
        return tokens // bt
    return math.floor(window_held_tokens(tokens, window, sliding, layers) / bt)


def segment_slopes(
    d0: float,
    d1: float,
    d2: float,
    d3: float,
    experts: float,
    experts_per_token: float,
    b: int,
    s: int,
    n: int,
) -> tuple[float, float]:
    """``(a_seg, half_d2b)`` of a segment starting at boundary ``n``.

    Parameters
    ----------
    d0, d1, d2, d3 : float
        Decode iteration cost ``τ(B, C) = d0 + d1·B + d2·C + d3·cover(B)``
        (:class:`pdopt.costmodel.DecodeModel`): seconds, seconds per request, seconds per context
        token, seconds per expected distinct expert; ``d3 = 0`` for a dense model.
    experts, experts_per_token : float
        ``E`` and ``k`` of ``cover(B)`` (:func:`pdopt.model_spec.expert_coverage`); unused when
        ``d3 = 0``.
    b : int
        Running requests ``B``.
    s : int
        Σ kv_offset of the running requests: their context during iteration ``m`` is ``s + b·m``.
    n : int
        The segment's first boundary.

    Returns
    -------
    tuple of float
        ``a_seg = τ(b, s + b·n)`` (the first iteration's seconds) and ``half_d2b = d2·b/2``
        (half the growth of an iteration's time per iteration), seconds. The expert term depends
        on ``B`` only, fixed within a segment, so it joins ``a_seg`` and not the growth.
    """
    a_seg = d0 + d1 * b + d2 * (s + b * n)
    if d3 > 0.0:  # dense models add nothing, so their times stay those of the linear form
        a_seg += d3 * expert_coverage(float(b), experts, experts_per_token)
    return a_seg, 0.5 * d2 * b


def boundary_time(t_seg: float, a_seg: float, half_d2b: float, k: int) -> float:
    """Time of boundary ``n_seg + k``: ``t_seg + k·a_seg + half_d2b·k(k − 1)``, seconds."""
    return t_seg + k * a_seg + half_d2b * (k * (k - 1))


def boundaries_before(t_seg: float, a_seg: float, half_d2b: float, t: float) -> int:
    """Largest ``k >= 0`` with ``boundary_time(k) <= t``.

    The root of the quadratic ``half_d2b·k² + (a_seg − half_d2b)·k = t − t_seg`` (linear when
    ``half_d2b == 0``), truncated, then fixed up by stepping ``k`` until the inequality holds
    exactly for the rounded boundary times.
    """
    dt = t - t_seg
    if dt <= 0:
        return 0
    if half_d2b > 0:
        lin = a_seg - half_d2b
        k = int((-lin + math.sqrt(lin * lin + 4.0 * half_d2b * dt)) / (2.0 * half_d2b))
    else:
        k = int(dt / a_seg)
    while k > 0 and boundary_time(t_seg, a_seg, half_d2b, k) > t:
        k -= 1
    while boundary_time(t_seg, a_seg, half_d2b, k + 1) <= t:
        k += 1
    return k


def first_boundary_after(t_seg: float, a_seg: float, half_d2b: float, t: float) -> int:
    """Smallest ``k >= 1`` with ``boundary_time(k) >= t``: the segment's first boundary at or
    after ``t``, counted from the segment's start."""
    k = boundaries_before(t_seg, a_seg, half_d2b, t)
    if k > 0 and boundary_time(t_seg, a_seg, half_d2b, k) == t:
        return k
    return k + 1


def growth(cnt: Sequence[int], b: int, bt: int, m1: int, m2: int) -> int:
    """Blocks ``b`` running requests with phase counts ``cnt`` gain at boundaries ``m1..m2``
    inclusive (``bt`` tokens per block): ``b`` per full period of ``bt`` counters, plus the
    phases of the remainder."""
    length = m2 - m1 + 1
    if length <= 0:
        return 0
    full, rem = divmod(length, bt)
    total = full * b
    phase = m1 % bt  # NOTE: stepped, not taken mod bt each time (an integer division is slow)
    for _ in range(rem):
        total += cnt[phase]
        phase += 1
        if phase == bt:
            phase = 0
    return total


def first_growth_failure(cnt: Sequence[int], b: int, bt: int, n: int, free: int) -> int:
    """Smallest boundary ``m > n`` where the growth since ``n`` exceeds ``free`` blocks (``b >
    0``): whole periods of ``b`` blocks are skipped, then counters are stepped one by one."""
    periods = free // b
    acc = periods * b
    m = n + periods * bt
    phase = m % bt
    while True:
        m += 1
        phase += 1
        if phase == bt:
            phase = 0
        acc += cnt[phase]
        if acc > free:
            return m


def window_growth(
    offsets: Sequence[int],
    b: int,
    bt: int,
    window: int,
    sliding: int,
    layers: int,
    m1: int,
    m2: int,
) -> int:
    """Blocks ``b`` running requests gain at boundaries ``m1..m2`` inclusive with a sliding
    window: ``Σ kv_blocks(o + m2) − kv_blocks(o + m1 − 1)`` over their offsets ``o`` (the first
    ``b`` of ``offsets``; a request's context during iteration ``m`` is ``o + m``)."""
    if m2 < m1:
        return 0
    total = 0
    for i in range(b):
        o = offsets[i]
        total += kv_blocks(o + m2, bt, window, sliding, layers)
        total -= kv_blocks(o + m1 - 1, bt, window, sliding, layers)
    return total


def window_first_growth_failure(
    offsets: Sequence[int],
    b: int,
    bt: int,
    window: int,
    sliding: int,
    layers: int,
    n: int,
    free: int,
) -> int:
    """Smallest boundary ``m > n`` where :func:`window_growth` since ``n`` exceeds ``free``
    blocks, or :data:`NEVER` (no full-attention layer: the blocks stop growing past the window).

    The growth is non-decreasing in ``m``: galloping doubles the span until it fails, then a
    bisection finds the first failing boundary."""
    lo = n  # growth over n+1..lo fits
    step = 1
    while True:
        hi = lo + step
        if window_growth(offsets, b, bt, window, sliding, layers, n + 1, hi) > free:
            break
        lo = hi
        step *= 2
        if step > _GALLOP_LIMIT:
            return NEVER
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if window_growth(offsets, b, bt, window, sliding, layers, n + 1, mid) > free:
            hi = mid
        else:
            lo = mid
    return hi


def used_blocks(
    cnt: Sequence[int],
    b: int,
    bt: int,
    n_seg: int,
    u_seg: int,
    t_seg: float,
    a_seg: float,
    half_d2b: float,
    t: float,
) -> int:
    """KV blocks the running requests hold at time ``t`` inside the segment that started at
    boundary ``n_seg`` holding ``u_seg`` blocks: ``u_seg`` plus the growth at the boundaries
    passed by ``t``."""
    if b == 0:
        return u_seg
    k = boundaries_before(t_seg, a_seg, half_d2b, t)
    return used_after(cnt, b, bt, n_seg, u_seg, k)


def used_after(cnt: Sequence[int], b: int, bt: int, n_seg: int, u_seg: int, k: int) -> int:
    """KV blocks the running requests hold once the segment has passed ``k`` boundaries."""
    return u_seg + growth(cnt, b, bt, n_seg + 1, n_seg + k)


def used_blocks_span(
    cnt: Sequence[int],
    b: int,
    bt: int,
    n_seg: int,
    u_seg: int,
    t_seg: float,
    a_seg: float,
    half_d2b: float,
    t: float,
) -> tuple[int, float, float]:
    """:func:`used_blocks` at ``t``, and the times ``[since, until)`` it holds over while the
    segment lasts: those of the boundaries around ``t`` (boundary times never decrease with
    ``k``, in floating point too, so :func:`boundaries_before` is the same over the span)."""
    if b == 0:
        return u_seg, -math.inf, math.inf
    k, since, until = boundary_span(t_seg, a_seg, half_d2b, t)
    return used_after(cnt, b, bt, n_seg, u_seg, k), since, until


def boundary_span(
    t_seg: float, a_seg: float, half_d2b: float, t: float
) -> tuple[int, float, float]:
    """``k = boundaries_before(t)`` and the times ``[since, until)`` over which it is the same:
    those of the boundaries around ``t`` (boundary times never decrease with ``k``, in floating
    point too)."""
    k = boundaries_before(t_seg, a_seg, half_d2b, t)
    since = boundary_time(t_seg, a_seg, half_d2b, k) if k > 0 else -math.inf
    if k > 0 and since <= t_seg:  # boundary k rounds onto the segment's start, where
        since = t  # boundaries_before answers 0: the span starts at t instead
    return k, since, boundary_time(t_seg, a_seg, half_d2b, k + 1)


def window_used_blocks(
    offsets: Sequence[int],
    b: int,
    bt: int,
    window: int,
    sliding: int,
    layers: int,
    n_seg: int,
    u_seg: int,
    t_seg: float,
    a_seg: float,
    half_d2b: float,
    t: float,
) -> int:
    """:func:`used_blocks` with a sliding window: the growth is :func:`window_growth`."""
    if b == 0:
        return u_seg
    k = boundaries_before(t_seg, a_seg, half_d2b, t)
    return u_seg + window_growth(offsets, b, bt, window, sliding, layers, n_seg + 1, n_seg + k)


def window_used_blocks_span(
    offsets: Sequence[int],
    b: int,
    bt: int,
    window: int,
    sliding: int,
    layers: int,
    n_seg: int,
    u_seg: int,
    t_seg: float,
    a_seg: float,
    half_d2b: float,
    t: float,
) -> tuple[int, float, float]:
    """:func:`window_used_blocks` at ``t`` and the times it holds over (as
    :func:`used_blocks_span`)."""
    if b == 0:
        return u_seg, -math.inf, math.inf
    k, since, until = boundary_span(t_seg, a_seg, half_d2b, t)
    growth_k = window_growth(offsets, b, bt, window, sliding, layers, n_seg + 1, n_seg + k)
    return u_seg + growth_k, since, until


def next_tick(k: int, t_next: float, tick_s: float) -> int:
    """Smallest tick number ``m > k`` with ``m·tick_s >= t_next``: the ticks between ``k`` and
    ``m`` fall before the next event at ``t_next`` (seconds), exactly in the float tick times
    ``m·tick_s`` (the ceiling's estimate is fixed up by stepping)."""
    m = max(k + 1, math.ceil(t_next / tick_s))
    while m - 1 > k and (m - 1) * tick_s >= t_next:
        m -= 1
    while m * tick_s < t_next:
        m += 1
    return m
