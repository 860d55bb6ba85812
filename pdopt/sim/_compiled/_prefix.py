"""Prefix caching, compiled: :class:`pdopt.sim._prefix_cache.PrefixCache` and the engine's
lookups, pins and releases of it (:class:`pdopt.sim._engine.Engine`), one rule each.

Each worker caches prompt blocks by chained key (``s.pkeys``, the workload's 64-bit keys as
they are, CSR by ``s.poff``: numbering them densely cost more than the whole simulation's cache
work). The cached blocks of every worker share one pool of entries (``s.ent`` rows: key, worker,
references, LRU neighbours) found through one open-addressing index on (key, worker) (``s.hidx``
rows: key, worker, entry, -1 for an empty slot; linear probing, deletion by backward shift so no
tombstone is left). A worker's unreferenced entries form its LRU list
(``W_LRU_HEAD``/``W_LRU_TAIL``, least recent first), as the reference's OrderedDict.

A lookup walks the prompt's keys until one is not cached, so its cost follows the prompt's
blocks. Two walks are saved where the reference's result is known: each worker remembers its
last leading count (request, count, and the version of its cached set then: ``W_MEMO_*``,
``W_CACHE_VER``, bumped when a key is added or dropped), which a router's peek and the queueing
and batching that follow it share; and a batch's second lookup of a prompt, which the reference
makes with the same free blocks right after its first, is the first's result
(:func:`prefix_take`; the repeated match evicts nothing and leaves the LRU order as it was).

A request's references (the reference's ``pinned``) are its ``s.pins`` row: the worker (-1:
none) and the leading keys it holds there (a run without a cache has one row and never reads
it).

NOTE: the pool is sized when the run is packed (:func:`pdopt.sim._compiled._io.cache_entries`);
a run that needs more entries hands itself back (``ERR_UNSUPPORTED``) and the Python engine
runs it, so results never depend on the size. The index starts small and doubles with the
entries cached at once (:func:`_grow_index`), so that it stays within the CPU's caches.
"""

from __future__ import annotations

import numpy as np

from pdopt.sim._compiled._jit import kernel
from pdopt.sim._compiled._state import (
    ERR_UNSUPPORTED,
    G_ENT_FREE,
    G_ENT_TOP,
    G_ERROR,
    G_HIDX_N,
    G_STOPPED,
    P_CACHED,
    P_N,
    P_W,
    R_GENERATED,
    R_INPUT,
    W_CACHE_VER,
    W_EVICTIONS,
    W_HIT_TOKENS,
    W_LOOKUPS,
    W_LRU_HEAD,
    W_LRU_N,
    W_LRU_TAIL,
    W_MEMO_N,
    W_MEMO_RID,
    W_MEMO_VER,
)

E_KEY, E_W, E_REFS, E_PREV, E_NEXT = range(5)  # an entry's columns (E_NEXT: the free list too)
H_KEY, H_W, H_ENT = range(3)  # an index slot's columns (H_ENT -1: empty)
_KEPT = -1  # E_REFS of a hit set aside while a lookup evicts (PrefixCache.match)
_MIX = 0x5851F42D4C957F2D  # odd, with mixed bits (multiplicative hashing)


# =============================================================================================
# What the engine asks (Engine.prefix_hit, cached_tokens, cache_prompt, release_prefix)
# =============================================================================================
@kernel
def cached_tokens(s, w, rid):
    """Engine.cached_tokens: prompt tokens of ``rid`` cached on ``w`` now, changing nothing."""
    if s.ptoks == 0:
        return 0
    return _hit_tokens(s, rid, _leading(s, w, rid))


@kernel
def prefix_hit(s, w, rid, free_blocks):
    """Engine.prefix_hit with ``pin``: prompt tokens of ``rid`` cached on ``w`` after the
    lookup's eviction (PrefixCache.match with ``free_blocks``); ``rid`` takes a reference on
    them and they count as its hit (0 without a cache). Without ``pin``:
    :func:`prefix_blocks`."""
    if s.ptoks == 0:
        return 0
    n = _match(s, w, rid, free_blocks)
    hit = _hit_tokens(s, rid, n)
    prefix_take(s, w, rid, n, hit)
    return hit


@kernel
def prefix_blocks(s, w, rid, free_blocks):
    """The leading cached blocks of ``rid`` on ``w`` after the lookup's eviction (Engine.
    prefix_hit without ``pin``, in blocks; 0 without a cache)."""
    if s.ptoks == 0:
        return 0
    return _match(s, w, rid, free_blocks)


@kernel
def prefix_take(s, w, rid, n, hit):
    """The rest of Engine.prefix_hit with ``pin`` once its lookup found ``n`` blocks serving
    ``hit`` tokens: ``rid`` references them and they count as its hit."""
    if s.ptoks == 0:
        return
    pins, wi = s.pins, s.wi
    release_prefix(s, rid)
    _pin(s, w, rid, 0, n)
    pins[rid, P_W] = w
    pins[rid, P_N] = n
    pins[rid, P_CACHED] = hit
    wi[w, W_LOOKUPS] += 1
    wi[w, W_HIT_TOKENS] += hit


@kernel
def hit_tokens(s, rid, blocks):
    """Engine._hit_tokens (0 without a cache)."""
    return 0 if s.ptoks == 0 else _hit_tokens(s, rid, blocks)


@kernel
def cache_prompt(s, w, rid):
    """Engine.cache_prompt: ``rid``'s prefill ended on ``w``; it references all its prompt's
    blocks there (they are cached now)."""
    pins = s.pins
    if pins[rid, P_W] < 0:
        return
    n_keys = s.poff[rid + 1] - s.poff[rid]
    _pin(s, w, rid, pins[rid, P_N], n_keys)
    pins[rid, P_W] = w
    pins[rid, P_N] = n_keys


@kernel
def release_prefix(s, rid):
    """Engine.release_prefix: ``rid`` leaves the worker whose blocks it references."""
    if s.ptoks == 0:
        return
    pins = s.pins
    w = pins[rid, P_W]
    if w < 0:
        return
    pins[rid, P_W] = -1
    _unpin(s, w, rid, pins[rid, P_N])


@kernel
def _hit_tokens(s, rid, blocks):
    """Engine._hit_tokens: what ``blocks`` leading blocks serve of ``rid``'s coming prefill,
    all but its last token at most."""
    ri = s.ri
    most = ri[rid, R_INPUT] + ri[rid, R_GENERATED] - 1
    tokens = blocks * s.ptoks
    return tokens if tokens < most else most


# =============================================================================================
# One worker's cache (PrefixCache)
# =============================================================================================
@kernel
def _leading(s, w, rid):
    """PrefixCache.peek: how many of ``rid``'s leading keys ``w`` caches (remembered until
    ``w``'s cached set changes)."""
    wi = s.wi
    if wi[w, W_MEMO_RID] == rid and wi[w, W_MEMO_VER] == wi[w, W_CACHE_VER]:
        return wi[w, W_MEMO_N]
    n = 0
    for k in range(s.poff[rid], s.poff[rid + 1]):
        if _find(s, s.pkeys[k], w) < 0:
            break
        n += 1
    wi[w, W_MEMO_RID] = rid
    wi[w, W_MEMO_VER] = wi[w, W_CACHE_VER]
    wi[w, W_MEMO_N] = n
    return n


@kernel
def _match(s, w, rid, free_blocks):
    """PrefixCache.match: the leading cached keys; then the least recently used unreferenced
    blocks ``free_blocks`` cannot hold are evicted, the hits set aside (and put back as the
    most recently used, in prompt order)."""
    n = _leading(s, w, rid)
    if s.wi[w, W_LRU_N] == 0:
        return n
    ent, found, first = s.ent, s.found, s.poff[rid]
    for i in range(n):
        e = _find(s, s.pkeys[first + i], w)
        found[i] = e  # entries stay put while others are evicted
        if ent[e, E_REFS] == 0:
            _lru_remove(s, w, e)
            ent[e, E_REFS] = _KEPT
    _evict_to(s, w, free_blocks)
    for i in range(n):
        e = found[i]
        if ent[e, E_REFS] == _KEPT:
            ent[e, E_REFS] = 0
            _lru_append(s, w, e)
    return n


@kernel
def _evict_to(s, w, free_blocks):
    """PrefixCache.evict_to: evict least recently used unreferenced blocks until the rest fit
    ``free_blocks`` KV blocks."""
    wi = s.wi
    keep = (free_blocks if free_blocks > 0 else 0) // s.pblocks
    while wi[w, W_LRU_N] > keep:
        e = wi[w, W_LRU_HEAD]
        _lru_remove(s, w, e)
        _drop(s, e)
        wi[w, W_EVICTIONS] += 1


@kernel
def _pin(s, w, rid, first, last):
    """PrefixCache.pin of ``rid``'s keys ``first`` to ``last`` (exclusive) on ``w``: one
    reference each (a key not cached is added); a referenced key leaves the LRU list."""
    ent, base = s.ent, s.poff[rid]
    for k in range(base + first, base + last):
        e = _find(s, s.pkeys[k], w)
        if e < 0:
            e = _add(s, s.pkeys[k], w)
            if e < 0:
                return
        elif ent[e, E_REFS] == 0:
            _lru_remove(s, w, e)
        ent[e, E_REFS] += 1


@kernel
def _unpin(s, w, rid, n):
    """PrefixCache.unpin of ``rid``'s first ``n`` keys on ``w``, last first: a key left
    unreferenced becomes the most recently used."""
    ent, base = s.ent, s.poff[rid]
    for k in range(base + n - 1, base - 1, -1):
        e = _find(s, s.pkeys[k], w)
        if e < 0:  # only after a failed _add (the run is stopping)
            continue
        ent[e, E_REFS] -= 1
        if ent[e, E_REFS] == 0:
            _lru_append(s, w, e)


# -- the LRU lists ------------------------------------------------------------------------------
@kernel
def _lru_append(s, w, e):
    """Entry ``e`` becomes ``w``'s most recently used unreferenced block."""
    ent, wi = s.ent, s.wi
    tail = wi[w, W_LRU_TAIL]
    ent[e, E_PREV] = tail
    ent[e, E_NEXT] = -1
    if tail >= 0:
        ent[tail, E_NEXT] = e
    else:
        wi[w, W_LRU_HEAD] = e
    wi[w, W_LRU_TAIL] = e
    wi[w, W_LRU_N] += 1


@kernel
def _lru_remove(s, w, e):
    """Entry ``e`` leaves ``w``'s LRU list."""
    ent, wi = s.ent, s.wi
    prev, nxt = ent[e, E_PREV], ent[e, E_NEXT]
    if prev >= 0:
        ent[prev, E_NEXT] = nxt
    else:
        wi[w, W_LRU_HEAD] = nxt
    if nxt >= 0:
        ent[nxt, E_PREV] = prev
    else:
        wi[w, W_LRU_TAIL] = prev
    wi[w, W_LRU_N] -= 1


# -- the index ----------------------------------------------------------------------------------
@kernel
def _home(s, key, w):
    """The index slot (``key``, ``w``) probes first: bits 32 and up of ``(key ^ w) · _MIX``,
    which depend on all of the low bits (tables of up to 2**32 slots; the keys are hashes
    already, the multiplication spreads one key's workers apart)."""
    return (((key ^ w) * _MIX) >> 32) & (s.hidx.shape[0] - 1)


@kernel
def _find(s, key, w):
    """The entry of ``key`` on worker ``w`` (-1: not cached)."""
    hidx = s.hidx
    mask = hidx.shape[0] - 1
    i = _home(s, key, w)
    while True:
        e = hidx[i, H_ENT]
        if e < 0:
            return -1
        if hidx[i, H_KEY] == key and hidx[i, H_W] == w:
            return e
        i = (i + 1) & mask


@kernel
def _add(s, key, w):
    """A new entry for ``key`` on ``w``, unreferenced and in no list; -1 when the pool is used
    up (the run stops and hands itself back to the Python engine)."""
    g, ent = s.g, s.ent
    e = g[G_ENT_FREE]
    if e >= 0:
        g[G_ENT_FREE] = ent[e, E_NEXT]
    elif g[G_ENT_TOP] < ent.shape[0]:
        e = g[G_ENT_TOP]
        g[G_ENT_TOP] = e + 1
    else:
        g[G_ERROR] = ERR_UNSUPPORTED
        g[G_STOPPED] = 1
        return -1
    ent[e, E_KEY] = key
    ent[e, E_W] = w
    ent[e, E_REFS] = 0
    ent[e, E_PREV] = -1
    ent[e, E_NEXT] = -1
    if 2 * (g[G_HIDX_N] + 1) > s.hidx.shape[0]:
        _grow_index(s)
    g[G_HIDX_N] += 1
    _place(s, key, w, e)
    s.wi[w, W_CACHE_VER] += 1
    return e


@kernel
def _place(s, key, w, e):
    """Entry ``e`` of (``key``, ``w``) takes the first free slot from its home."""
    hidx = s.hidx
    mask = hidx.shape[0] - 1
    i = _home(s, key, w)
    while hidx[i, H_ENT] >= 0:
        i = (i + 1) & mask
    hidx[i, H_KEY] = key
    hidx[i, H_W] = w
    hidx[i, H_ENT] = e


@kernel
def _drop(s, e):
    """Entry ``e`` (unreferenced, off its list) leaves the index and returns to the pool.

    Backward-shift deletion: each later slot of the probe run whose home is not cyclically in
    (hole, its slot] moves into the hole, so every entry stays reachable without tombstones."""
    hidx = s.hidx
    mask = hidx.shape[0] - 1
    w = s.ent[e, E_W]
    s.wi[w, W_CACHE_VER] += 1
    i = _home(s, s.ent[e, E_KEY], w)
    while hidx[i, H_ENT] != e:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        if hidx[j, H_ENT] < 0:
            break
        if ((j - _home(s, hidx[j, H_KEY], hidx[j, H_W])) & mask) < ((j - i) & mask):
            continue  # its home lies between the hole and it: it stays
        hidx[i, H_KEY] = hidx[j, H_KEY]
        hidx[i, H_W] = hidx[j, H_W]
        hidx[i, H_ENT] = hidx[j, H_ENT]
        i = j
    hidx[i, H_ENT] = -1
    s.g[G_HIDX_N] -= 1
    s.ent[e, E_NEXT] = s.g[G_ENT_FREE]
    s.g[G_ENT_FREE] = e


@kernel
def _grow_index(s):
    """Replace the index by one of twice the slots holding the same entries, each placed again
    (the State's fields are the reference's: compiled code reads them through ``s``).

    NOTE: the index grows with the entries cached at once rather than being sized for the pool
    (every block the workers' KV could hold): a sparse index spreads the live entries over
    memory the CPU caches cannot hold, and each lookup then misses them."""
    old = s.hidx
    s.hidx = np.full((2 * old.shape[0], 3), -1, np.int64)
    for j in range(old.shape[0]):
        if old[j, H_ENT] >= 0:
            _place(s, old[j, H_KEY], old[j, H_W], old[j, H_ENT])
