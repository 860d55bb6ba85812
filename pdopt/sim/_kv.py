"""The KV blocks of one worker: one owner for capacity, use, reservations and cached blocks.

DESIGN.md "KV and prefix cache": one component per worker owns its KV blocks and nothing else
writes them. A worker's ``capacity`` blocks are, at every event, exactly one of:

* **used** by the decode side's running batch. The decode side advances its batch in closed form
  (:mod:`pdopt.sim._decode`), so this component holds the count at the batch's last iteration
  boundary (``used``, committed by :meth:`commit_used`); the blocks the batch has grown since are
  the decode side's closed form (:meth:`pdopt.sim._decode.DecodeSide.used_blocks`), and it visits
  the boundary where that growth would not fit, so ``used`` plus the growth never exceeds what
  the decode side may hold (:attr:`decode_limit`).
* **held** outside the running batch for a migration (:mod:`pdopt.sim._migration`): reserved on a
  destination for KV being copied in, or kept on a source during a stop-and-copy.
* **prompts**: reserved by the prompts in the prefill side's running batch, or the chunked prompts
  it has started (whole prompts, from their first chunk; :mod:`pdopt.sim._prefill`).
* **free**: the rest. Free blocks may still hold the KV of cached prompt blocks nobody references
  (``cached``, :mod:`pdopt.sim._prefix_cache`): they are reused least recently used first, so
  a lookup first evicts the unreferenced cached blocks that the free blocks it is given cannot
  hold (:meth:`match`). Referenced cached blocks are blocks of the prompts or running requests
  that hold them (a hit skips compute, not occupancy), so they count once, there.

A mixed worker's phases share one cache: while :meth:`share_prompts` says so, the decode side
may hold ``capacity − held − prompts`` (:attr:`decode_limit`), else ``capacity − held`` (a
prefill worker's decode side runs only with no prompt reserved, and the reverse).

Every count is written through a method here (asserting it stays within ``[0, capacity]``); the
decode and prefill sides, the migrations, the colocated scheduler and the engine ask through
them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pdopt.sim._prefix_cache import PrefixCache


class KvBlocks:
    """Capacity, use, reservations and cached blocks of one worker's KV (module docstring).

    ``cache`` is the worker's prefix cache (None without prefix caching; one of its blocks takes
    :attr:`pdopt.sim._prefix_cache.PrefixCache.engine_blocks_per_block` KV blocks).

    Examples
    --------
    >>> kv = KvBlocks(100)
    >>> kv.reserve_prompts(30); kv.commit_used(50); kv.reserve(10)
    >>> kv.free_blocks(), kv.decode_limit
    (10, 90)
    >>> kv.share_prompts(True); kv.decode_limit
    60
    """

    __slots__ = (
        "cache",
        "capacity",
        "decode_limit",
        "held",
        "prompts",
        "shared",
        "used",
    )

    def __init__(self, capacity: int, cache: PrefixCache | None = None) -> None:
        self.capacity = capacity
        self.cache = cache
        self.used = 0  # the decode batch's blocks at its last boundary (growth: closed form)
        self.held = 0  # migrations: reserved for KV copied in, or held during a stop-and-copy
        self.prompts = 0  # prompts in prefill (running batch, chunked prompts started)
        self.shared = False  # prompts count against the decode side (a mixed worker)
        self.decode_limit = capacity  # what the decode batch may hold: capacity − held (− prompts)

    def _limit(self) -> None:
        held = self.held
        assert 0 <= held <= self.capacity and 0 <= self.prompts <= self.capacity, (held, self)
        prompts = self.prompts if self.shared else 0
        self.decode_limit = self.capacity - held - prompts

    # -- the decode side -------------------------------------------------------------------------
    def commit_used(self, blocks: int) -> None:
        """The running decode batch holds ``blocks`` at the boundary just processed."""
        assert 0 <= blocks <= self.capacity, (blocks, self.capacity)
        self.used = blocks

    # -- migrations ------------------------------------------------------------------------------
    def reserve(self, blocks: int) -> None:
        """Hold ``blocks`` more outside the running batch: KV being copied in (the caller checked
        they are free), or a departing request's blocks (they leave the batch's use at the
        boundary the decode side is processing)."""
        self.held += blocks
        self._limit()

    def release(self, blocks: int) -> None:
        """Free ``blocks`` held by :meth:`reserve` (a copy in cancelled or joined the batch, a
        stop-and-copy ended)."""
        self.held -= blocks
        self._limit()

    # -- the prefill side ------------------------------------------------------------------------
    def reserve_prompts(self, blocks: int) -> None:
        """Prompts of ``blocks`` start their prefill (their KV is reserved until it ends)."""
        self.prompts += blocks
        if self.shared:
            self._limit()

    def release_prompts(self, blocks: int) -> None:
        """Prompts of ``blocks`` finished their prefill or were put back in the queue."""
        self.prompts -= blocks
        if self.shared:
            self._limit()
        else:
            assert self.prompts >= 0, self.prompts

    def share_prompts(self, shared: bool) -> None:
        """Whether the prompts count against the decode side (the worker is mixed: one cache)."""
        self.shared = shared
        self._limit()

    # -- what others read ------------------------------------------------------------------------
    def in_use(self, decode_used: int) -> int:
        """Blocks not free while the running batch holds ``decode_used`` (its boundary count
        plus growth since): the batch, the migrations' holds and the prompts in prefill."""
        return decode_used + self.held + self.prompts

    def decode_capacity(self) -> int:
        """The decode side's capacity: the worker's, less the prompts while they share it."""
        return self.capacity - self.prompts if self.shared else self.capacity

    def free_blocks(self) -> int:
        """Blocks free at the decode batch's last boundary (cached unreferenced ones included)."""
        return self.capacity - self.used - self.held - self.prompts

    def prompt_room(self) -> int:
        """Blocks a mixed worker's new prompts may take: capacity less the decode batch and the
        prompts already in prefill.

        NOTE: blocks held for migrations are not subtracted (the colocated scheduler always
        counted so; kept for identical results). A mixed worker that is a migration's destination
        may then start prompts into blocks held for the copy; the decode side preempts at its
        next boundary to make room."""
        return self.capacity - self.used - self.prompts

    def cached_blocks(self) -> int:
        """KV blocks of cached prompt blocks nobody references (0 without a cache): they sit in
        free space until a lookup evicts them."""
        cache = self.cache
        return 0 if cache is None else len(cache.lru) * cache.engine_blocks_per_block

    # -- the prefix cache ------------------------------------------------------------------------
    def match(self, keys: npt.NDArray[np.int64], free_blocks: int) -> int:
        """Leading cached blocks of ``keys`` after evicting, least recently used first, the
        unreferenced cached blocks that ``free_blocks`` free KV blocks cannot hold."""
        cache = self.cache
        assert cache is not None
        return cache.match(keys, free_blocks)

    def peek(self, keys: npt.NDArray[np.int64]) -> int:
        """Leading cached blocks of ``keys`` now, changing nothing (0 without a cache)."""
        cache = self.cache
        return 0 if cache is None else cache.peek(keys)

    def pin(self, keys: npt.NDArray[np.int64]) -> None:
        """A prompt on this worker references ``keys`` (cached hits, or blocks its prefill has
        just computed, which become cached); they are its prompt's or its decode's blocks."""
        assert self.cache is not None
        self.cache.pin(keys)

    def unpin(self, keys: npt.NDArray[np.int64]) -> None:
        """A request leaves this worker: its references on ``keys`` go; unreferenced blocks
        stay cached in free space (most recently used) until a lookup evicts them."""
        assert self.cache is not None
        self.cache.unpin(keys)

    def __repr__(self) -> str:
        return (
            f"KvBlocks(capacity={self.capacity}, used={self.used}, held={self.held}, "
            f"prompts={self.prompts}, shared={self.shared}, cached={self.cached_blocks()})"
        )
