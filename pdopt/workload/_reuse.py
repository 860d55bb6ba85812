"""How much of a workload's prompts a prefix cache could serve: the reusable fraction with an
unbounded cache and the LRU hit-rate curve against cache size, from one pass.

The model (a trace-level bound: no concurrency, one cache shared by all requests): requests come
in arrival order; request ``i`` hits the leading blocks of its prompt that are in the cache (a
block counts only with every block before it, :meth:`PrefixBlocks.chained_keys`); then all its
blocks are used, its block 0 last, as vLLM frees a request's blocks tail first so that the tail
is evicted first. The cache keeps the ``C`` most recently used blocks (LRU).

One pass computes every block's *stack distance* (Mattson et al. 1970): its depth in the LRU
stack when its request arrives, 0 if never seen. A block hits in a cache of ``C`` blocks exactly
when ``1 <= depth <= C`` (LRU inclusion), so the hit count for every ``C`` is a cumulative
histogram. Depths come from a Fenwick tree over last-use times: depth = the number of blocks whose
last use is at or after this block's, O(log n) per use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pdopt._validation import param_error
from pdopt.workload._prefix import PrefixBlocks, jit_with_helpers, number_keys
from pdopt.workload._workload import IntArray, Workload


@dataclass(frozen=True, slots=True)
class ReuseStats:
    """A workload's prefix reuse.

    Attributes
    ----------
    summary : pandas.Series
        ``requests``, ``block_tokens``, ``blocks`` (listed), ``distinct_blocks`` (the cache
        size, in blocks, that holds every reusable block), ``prompt_tokens``,
        ``listed_token_fraction`` (prompt tokens in listed blocks), ``reusable_token_fraction``
        (prompt tokens in leading blocks seen earlier in the trace: an unbounded cache's token
        hit rate), ``request_hit_fraction`` (requests reusing at least one block) and
        ``reusable_tokens_mean`` (per request).
    curve : pandas.DataFrame
        One row per cache size: ``cache_blocks``, ``cache_tokens``, ``token_hit_rate`` (hit
        tokens over all prompt tokens) and ``request_hit_rate`` (requests hitting >= 1 block),
        for an LRU cache of that many blocks.
    """

    summary: pd.Series
    curve: pd.DataFrame


def stack_distances(blocks: PrefixBlocks) -> IntArray:
    """Each block's LRU stack distance when its request arrives (module docstring); 0 for a
    block never seen before. Shape ``(len(blocks.hashes),)``.

    Examples
    --------
    >>> b = PrefixBlocks.from_lists([[1, 2], [1, 2], [3], [1]], block_tokens=16)
    >>> stack_distances(b).tolist()
    [0, 0, 1, 2, 0, 2]
    """
    return _distances_and_distinct(blocks)[0]


def _distances_and_distinct(blocks: PrefixBlocks) -> tuple[IntArray, int]:
    dense, distinct = number_keys(blocks.chained_keys())
    depth = jit_with_helpers(_distances_py)(dense, blocks.offsets)
    return np.asarray(depth, dtype=np.int64), distinct


def _distances_py(dense: IntArray, offsets: IntArray) -> IntArray:
    """The Fenwick-tree pass (plain Python, compiled by numba on first use)."""
    total = dense.shape[0]
    tree = np.zeros(total + 1, dtype=np.int64)  # 1-based; position t + 1 marks use time t
    last = np.full(int(dense.max()) + 1 if total else 1, -1, dtype=np.int64)
    depth = np.zeros(total, dtype=np.int64)
    now = 0
    marked = 0
    for r in range(offsets.shape[0] - 1):
        for j in range(offsets[r], offsets[r + 1]):
            t = last[dense[j]]
            if t >= 0:
                before = 0  # marks at times < t
                i = t
                while i > 0:
                    before += tree[i]
                    i -= i & -i
                depth[j] = marked - before
        for j in range(offsets[r + 1] - 1, offsets[r] - 1, -1):  # tail first, block 0 last
            t = last[dense[j]]
            if t >= 0:
                i = t + 1
                while i <= total:
                    tree[i] -= 1
                    i += i & -i
                marked -= 1
            i = now + 1
            while i <= total:
                tree[i] += 1
                i += i & -i
            marked += 1
            last[dense[j]] = now
            now += 1
    return depth


def reuse_stats(workload: Workload, cache_blocks: Sequence[int] | None = None) -> ReuseStats:
    """Prefix reuse of ``workload`` (which needs :attr:`Workload.prefix_blocks`).

    Parameters
    ----------
    workload : Workload
        Requests with prefix blocks, in arrival order.
    cache_blocks : sequence of int, optional
        Cache sizes in blocks for the curve (each >= 1); default: 1, 2, 4, ... up to the first
        power of two holding every distinct block.

    Examples
    --------
    >>> from pdopt.workload import PrefixBlocks, Workload
    >>> w = Workload([0.0, 1.0, 2.0], [32, 40, 16], [1, 1, 1],
    ...              prefix_blocks=PrefixBlocks.from_lists([[1, 2], [1, 2], [3]], 16))
    >>> s = reuse_stats(w, cache_blocks=[1, 2])
    >>> round(float(s.summary["reusable_token_fraction"]), 4)  # 32 of 88 prompt tokens
    0.3636
    >>> s.curve["token_hit_rate"].round(4).tolist()
    [0.1818, 0.3636]
    """
    blocks = workload.prefix_blocks
    if blocks is None:
        raise param_error(
            "workload",
            "reuse_stats",
            "a workload with prefix_blocks (a trace with block hashes, or a reuse generator)",
            workload.name,
        )
    depth, distinct = _distances_and_distinct(blocks)
    sizes = _sizes(cache_blocks, distinct)
    bt = blocks.block_tokens
    prompt_tokens = int(workload.input_tokens.sum())
    seen = depth > 0
    counts = blocks.counts()
    has = counts > 0
    first_depth = np.zeros(len(workload), dtype=np.int64)
    first_depth[has] = depth[blocks.offsets[:-1][has]]
    # A request's block 0 has its smallest depth, so it hits iff block 0 does.
    ordered = np.sort(depth[seen])
    first_ordered = np.sort(first_depth[first_depth > 0])
    hits = np.searchsorted(ordered, sizes, side="right")
    request_hits = np.searchsorted(first_ordered, sizes, side="right")
    n = len(workload)
    per = max(prompt_tokens, 1)
    summary = pd.Series(
        {
            "requests": float(n),
            "block_tokens": float(bt),
            "blocks": float(len(blocks.hashes)),
            "distinct_blocks": float(distinct),
            "prompt_tokens": float(prompt_tokens),
            "listed_token_fraction": bt * len(blocks.hashes) / per,
            "reusable_token_fraction": bt * int(seen.sum()) / per,
            "request_hit_fraction": int((first_depth > 0).sum()) / n if n else float("nan"),
            "reusable_tokens_mean": bt * int(seen.sum()) / n if n else float("nan"),
        },
        name=workload.name,
    )
    curve = pd.DataFrame(
        {
            "cache_blocks": sizes,
            "cache_tokens": sizes * bt,
            "token_hit_rate": bt * hits / per,
            "request_hit_rate": request_hits / n if n else np.full(len(sizes), np.nan),
        }
    )
    return ReuseStats(summary, curve)


def _sizes(cache_blocks: Sequence[int] | None, distinct: int) -> IntArray:
    if cache_blocks is None:
        top = max(1, int(np.ceil(np.log2(max(distinct, 1)))))
        return np.asarray([2**k for k in range(top + 1)], dtype=np.int64)
    sizes = np.asarray(list(cache_blocks))
    if sizes.ndim != 1 or not sizes.size or sizes.dtype.kind not in "iu" or sizes.min() < 1:
        raise param_error(
            "cache_blocks", "reuse_stats", "a non-empty list of ints >= 1", cache_blocks
        )
    return np.asarray(sizes, dtype=np.int64)
