"""Sliding-window KV: how many tokens of a context a model's KV cache holds, per layer averaged.

The one owner of that formula as plain scalar arithmetic:
:meth:`pdopt.model_spec.SlidingWindow.held_tokens` evaluates it, and both simulation engines
(the Python engine through that method, the compiled one by compiling this very function in
:mod:`pdopt.sim._compiled`) price a P→D transfer with it.
"""

from __future__ import annotations


def window_held_tokens(
    context_tokens: float, window_tokens: int, sliding_layers: int, num_layers: int
) -> float:
    """Context tokens as tokens held in every layer: ``(F·L + S·min(L, W)) / N``, ``F = N − S``
    full-attention layers, ``S`` sliding layers keeping the last ``W`` tokens, ``L`` the context.

    Plain arithmetic on scalars, so numba compiles it unchanged (same float order in both
    engines).

    Examples
    --------
    >>> window_held_tokens(8192, 128, 18, 36)  # gpt-oss-120b
    4160.0
    """
    full = num_layers - sliding_layers
    kept = context_tokens if context_tokens < window_tokens else window_tokens
    return (full * context_tokens + sliding_layers * kept) / num_layers
