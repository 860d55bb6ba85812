"""Prefix caching (issue 35): a worker reuses the KV of prompt blocks it has already computed.

Semantics (DESIGN.md "KV and prefix cache", vLLM's automatic prefix caching):

* A prompt's full blocks are identified by *chained* keys
  (:meth:`pdopt.workload.PrefixBlocks.chained_keys`): block ``j``'s key names it and every
  block before it, so a hit is always a leading run of blocks and a block whose predecessor
  misses never hits.
* When a worker starts a prompt, its leading cached blocks are *hits*: their prefill compute is
  skipped (the chunks start after them; attention still reads them), not their KV occupancy
  (the request reserves its whole prompt, as without a cache). At least one token is computed,
  as vLLM recomputes the last token of a fully cached prompt.
* Blocks are reference counted: a running request holds one reference on each of its prompt's
  blocks (the hits from its start, the rest from the end of its prefill) until it leaves the
  worker (finished, preempted, its KV sent to a decode worker, or its prefill restarted).
* An unreferenced block stays cached in free KV space until that space is needed: before each
  lookup the least recently used unreferenced blocks are evicted until they fit in the worker's
  free blocks (vLLM reallocates its free blocks least recently used first, so the cached blocks
  that survive are the most recently freed ones, as many as stay free).

One :class:`PrefixCache` per worker, held by the worker's KV blocks
(:class:`pdopt.sim._kv.KvBlocks`, through which the engine, :mod:`pdopt.sim._engine`, looks up,
pins and unpins: the cache knows keys and references, the KV blocks the space they take). Without
prefix blocks in the workload, or with ``ClusterSpec.prefix_caching`` off, no cache exists and
runs are exactly those without one.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import numpy.typing as npt


class PrefixCache:
    """Cached prompt blocks of one worker, by chained key (see the module docstring).

    ``engine_blocks_per_block`` is how many KV blocks of the engine one prefix block holds
    (``ceil(prefix block tokens / engine block tokens)``), to compare cached blocks with the
    worker's free KV blocks.
    """

    __slots__ = ("engine_blocks_per_block", "evictions", "hit_tokens", "lookups", "lru", "refs")

    def __init__(self, engine_blocks_per_block: int) -> None:
        self.engine_blocks_per_block = engine_blocks_per_block
        self.refs: dict[int, int] = {}  # every cached block: key -> references held
        self.lru: OrderedDict[int, None] = OrderedDict()  # unreferenced ones, least recent first
        self.evictions = 0
        self.hit_tokens = 0
        self.lookups = 0

    def __len__(self) -> int:
        return len(self.refs)

    def match(self, keys: npt.NDArray[np.int64], free_blocks: int) -> int:
        """Leading blocks of ``keys`` cached now; then the least recently used unreferenced
        blocks that ``free_blocks`` cannot hold are evicted, the hits excepted (no reference is
        taken: :meth:`pin` does that for the blocks used).

        ``free_blocks`` is what stays free once the request's whole prompt is allocated (its
        hits among it: reused, not new); the other cached blocks must fit there, the hits kept,
        as in vLLM, which looks a prompt's blocks up first and then takes its new blocks from
        the least recently freed."""
        n = self.peek(keys)
        if not self.lru:
            return n
        hits = keys[:n].tolist()
        lru = self.lru
        kept = [k for k in hits if k in lru]
        for key in kept:  # the hits are not evicted to make room for their own prompt
            del lru[key]
        self.evict_to(free_blocks)
        for key in kept:
            lru[key] = None
        return n

    def peek(self, keys: npt.NDArray[np.int64]) -> int:
        """Leading blocks of ``keys`` cached now, changing nothing (what a router may ask)."""
        refs = self.refs
        n = 0
        for key in keys.tolist():
            if key not in refs:
                break
            n += 1
        return n

    def evict_to(self, free_blocks: int) -> None:
        """Evict least recently used unreferenced blocks until the rest fit ``free_blocks``."""
        lru = self.lru
        keep = max(free_blocks, 0) // self.engine_blocks_per_block
        while len(lru) > keep:
            key, _ = lru.popitem(last=False)
            del self.refs[key]
            self.evictions += 1

    def pin(self, keys: npt.NDArray[np.int64]) -> None:
        """Take one reference on each of ``keys`` (cached or new: a prompt's blocks become
        cached when its prefill computes them); each becomes the most recently used."""
        refs, lru = self.refs, self.lru
        for key in keys.tolist():
            held = refs.get(key, 0)
            if held == 0:
                lru.pop(key, None)
            refs[key] = held + 1

    def unpin(self, keys: npt.NDArray[np.int64]) -> None:
        """Drop one reference on each of ``keys``; a block left unreferenced stays cached as the
        most recently used (later blocks of a prompt are freed after earlier ones, as vLLM
        frees a request's blocks in reverse so its prefix outlives its tail)."""
        refs, lru = self.refs, self.lru
        for key in reversed(keys.tolist()):
            held = refs[key] - 1
            refs[key] = held
            if held == 0:
                lru[key] = None

    def check(self) -> None:
        """Invariants (tests): references positive or listed unreferenced, exactly once."""
        unreferenced = {k for k, held in self.refs.items() if held == 0}
        assert all(held >= 0 for held in self.refs.values())
        assert unreferenced == set(self.lru), "the LRU list is the unreferenced blocks"
