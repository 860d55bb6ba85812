"""KV blocks of a request's context: the one rule the cluster, both engines' Python paths and
the planner count blocks by (moved here from :mod:`pdopt.sim._closed_form`, which re-exports
it, so that :class:`pdopt.cluster.ClusterSpec` counts blocks without importing the simulator)."""

from __future__ import annotations

import math

from pdopt.model_spec._window import window_held_tokens


def kv_blocks(tokens: int, bt: int, window: int, sliding: int, layers: int) -> int:
    """KV blocks a request holding ``tokens`` context tokens uses: ``ceil(E / bt)``.

    Parameters
    ----------
    tokens : int
        Context tokens ``L`` (prompt + generated).
    bt : int
        Tokens per block.
    window, sliding, layers : int
        The sliding window ``W`` (tokens), the ``S`` layers that use it, all ``N`` layers;
        ``sliding = 0`` for a model whose every layer is full attention.

    Returns
    -------
    int
        ``ceil(L / bt)`` without a window (integer arithmetic: dense runs are unchanged), else
        ``ceil(E(L) / bt)`` with ``E(L) = window_held_tokens(L, W, S, N) = (F·L + S·min(L, W))
        / N`` the footprint in full-token equivalents (bytes held / ``kv_bytes_per_token``),
        so ``E(L) = L`` up to the window.

    Examples
    --------
    >>> kv_blocks(8192, 16, 128, 18, 36)  # gpt-oss-120b: 4160 equivalents
    260
    >>> kv_blocks(8192, 16, 0, 0, 1)
    512
    """
    if sliding == 0:
        return (tokens + bt - 1) // bt
    return math.ceil(window_held_tokens(tokens, window, sliding, layers) / bt)
