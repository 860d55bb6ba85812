"""Prefix-cache block identities of a workload's prompts (:class:`PrefixBlocks`).

A prompt is cut into blocks of ``block_tokens`` tokens; block ``j`` covers tokens
``[j * block_tokens, (j + 1) * block_tokens)``. Only *full* blocks are listed, because engines
(vLLM, SGLang, Mooncake) hash and reuse full blocks only. Two requests may reuse each other's
block ``j`` only when their first ``j + 1`` blocks are all equal, which :meth:`PrefixBlocks.
chained_keys` encodes in one 64-bit key per block (the chained hash of DESIGN.md, "KV and prefix
cache").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_int_at_least, param_error
from pdopt.errors import InputError

IntArray = npt.NDArray[np.int64]
_U64 = npt.NDArray[np.uint64]

# splitmix64 constants (Steele, Lea & Flood 2014): a fast bijective 64-bit finaliser.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_CHAIN_SEED = np.uint64(0x5044_4F50_545F_4B56)  # "PDOPT_KV": the key before a prompt's block 0


def splitmix64(values: npt.ArrayLike) -> _U64:
    """The splitmix64 finaliser of each value (uint64 in, uint64 out, wrapping arithmetic).

    Deterministic on every machine (unlike Python's ``hash``), and a bijection, so distinct
    inputs give distinct outputs.
    """
    # NOTE: wrapping is the point; numpy warns about it on 0-d inputs (scalar arithmetic) only.
    with np.errstate(over="ignore"):
        return np.asarray(_splitmix64(np.asarray(values).astype(np.uint64)), dtype=np.uint64)


def _splitmix64(z: Any) -> Any:
    """splitmix64 of a uint64 array or scalar: one formula for numpy and for the compiled
    loops below (:func:`jit_with_helpers` registers it with numba)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def mix64(*parts: npt.ArrayLike) -> IntArray:
    """One int64 identity per element from several integer parts (broadcast), order-sensitive:
    ``splitmix64(... splitmix64(splitmix64(p0) ^ p1) ... ^ pk)``, viewed as int64."""
    key = splitmix64(np.asarray(parts[0]).astype(np.int64).view(np.uint64))
    for part in parts[1:]:
        key = splitmix64(key ^ np.asarray(part).astype(np.int64).view(np.uint64))
    return np.asarray(key.view(np.int64), dtype=np.int64)


@dataclass(frozen=True, slots=True)
class PrefixBlocks:
    """Each request's prompt as a list of full-block identities, in prompt order (CSR layout).

    Parameters
    ----------
    offsets : array of int, shape (n + 1,)
        ``offsets[0] = 0``, non-decreasing; request ``i``'s blocks are
        ``hashes[offsets[i]:offsets[i + 1]]``.
    hashes : array of int64, shape (offsets[-1],)
        Block identities: equal values mean equal token content of that block (the chained
        keys then decide reuse, since a block is reusable only with all blocks before it).
    block_tokens : int
        Tokens per block (16 for vLLM/SGLang engines; the Mooncake traces use 512).

    Examples
    --------
    >>> b = PrefixBlocks.from_lists([[7, 8], [7, 9], []], block_tokens=16)
    >>> b.of(1).tolist(), b.counts().tolist()
    ([7, 9], [2, 2, 0])
    >>> k = b.chained_keys()
    >>> bool(k[0] == k[2]), bool(k[1] == k[3])
    (True, False)
    """

    offsets: IntArray
    hashes: IntArray
    block_tokens: int

    def __post_init__(self) -> None:
        owner = "PrefixBlocks"
        check_int_at_least(self.block_tokens, 1, "block_tokens", owner)
        offsets = _int64_array(self.offsets, "offsets", owner)
        hashes = _int64_array(self.hashes, "hashes", owner)
        if len(offsets) == 0 or offsets[0] != 0:
            raise param_error("offsets", owner, "non-empty and starting at 0", self.offsets)
        if np.any(np.diff(offsets) < 0):
            raise param_error("offsets", owner, "non-decreasing", self.offsets)
        if offsets[-1] != len(hashes):
            rule = f"ending at len(hashes) = {len(hashes)}"
            raise param_error("offsets", owner, rule, int(offsets[-1]))
        offsets.setflags(write=False)
        hashes.setflags(write=False)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "hashes", hashes)
        object.__setattr__(self, "block_tokens", int(self.block_tokens))

    @classmethod
    def from_lists(
        cls, blocks: Sequence[Sequence[int] | npt.NDArray[np.int64]], block_tokens: int
    ) -> PrefixBlocks:
        """Build from one list of block identities per request."""
        counts = np.fromiter((len(b) for b in blocks), dtype=np.int64, count=len(blocks))
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        flat = [int(h) for b in blocks for h in b]
        return cls(offsets, np.asarray(flat, dtype=np.int64), block_tokens)

    @classmethod
    def empty(cls, n: int, block_tokens: int) -> PrefixBlocks:
        """``n`` requests listing no block."""
        return cls(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), block_tokens)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def __eq__(self, other: object) -> bool:
        # NOTE: the generated dataclass __eq__ compares arrays with ==, which raises for n > 1.
        if not isinstance(other, PrefixBlocks):
            return NotImplemented
        return (
            self.block_tokens == other.block_tokens
            and np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.hashes, other.hashes)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking arrays: not hashable

    def of(self, i: int) -> IntArray:
        """Request ``i``'s block identities (a read-only view), in prompt order."""
        return self.hashes[self.offsets[i] : self.offsets[i + 1]]

    def counts(self) -> IntArray:
        """Blocks listed per request, shape (n,)."""
        return np.diff(self.offsets)

    def positions(self) -> IntArray:
        """Each block's index ``j`` within its prompt, shape (len(hashes),)."""
        counts = self.counts()
        return np.arange(len(self.hashes), dtype=np.int64) - np.repeat(self.offsets[:-1], counts)

    def request_of_block(self) -> IntArray:
        """Each block's request index, shape (len(hashes),)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.counts())

    def chained_keys(self) -> IntArray:
        """One int64 key per block identifying the block and every block before it in its prompt.

        ``key[j] = splitmix64(key[j - 1] ^ splitmix64(hash[j]))`` with a fixed seed before block
        0, so equal keys at position ``j`` mean the same first ``j + 1`` blocks (up to 64-bit
        collisions, about ``n**2 / 2**65`` for ``n`` distinct prefixes). Deterministic across
        runs and machines.
        """
        chain = jit_with_helpers(_chain_keys)
        return np.asarray(chain(self.offsets, self.hashes.view(np.uint64)).view(np.int64))

    def take(self, indices: npt.ArrayLike) -> PrefixBlocks:
        """The blocks of the requests at ``indices`` (ints, in the order given)."""
        idx = np.asarray(indices, dtype=np.int64)
        counts = self.counts()[idx]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        starts = self.offsets[:-1][idx]
        within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
        return PrefixBlocks(
            offsets, self.hashes[np.repeat(starts, counts) + within], self.block_tokens
        )

    def truncated(self, max_counts: npt.ArrayLike) -> PrefixBlocks:
        """Each request's first ``min(count, max_counts[i])`` blocks (e.g. a cut prompt's)."""
        limit = np.minimum(self.counts(), np.maximum(np.asarray(max_counts, dtype=np.int64), 0))
        keep = self.positions() < np.repeat(limit, self.counts())
        offsets = np.concatenate([[0], np.cumsum(limit)]).astype(np.int64)
        return PrefixBlocks(offsets, self.hashes[keep], self.block_tokens)

    @classmethod
    def concat(cls, parts: Sequence[PrefixBlocks]) -> PrefixBlocks:
        """The requests of ``parts`` one after another (one block size; hashes kept as they
        are, so equal hashes in two parts are the same content)."""
        sizes = {p.block_tokens for p in parts}
        if len(sizes) != 1:
            raise InputError(
                f"cannot concatenate prefix blocks of different block sizes {sorted(sizes)} "
                "(re-read the traces with one block_tokens)"
            )
        counts = np.concatenate([p.counts() for p in parts])
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(offsets, np.concatenate([p.hashes for p in parts]), sizes.pop())

    def check_fits(self, input_tokens: IntArray, source: str) -> None:
        """Raise :class:`InputError` naming the first request listing more full blocks than its
        prompt holds (``count > input_tokens // block_tokens``), or a row count mismatch."""
        if len(self) != len(input_tokens):
            raise InputError(
                f"{source}: prefix_blocks lists {len(self)} requests, the workload has "
                f"{len(input_tokens)}"
            )
        full = np.asarray(input_tokens, dtype=np.int64) // self.block_tokens
        bad = np.flatnonzero(self.counts() > full)
        if len(bad):
            i = int(bad[0])
            more = f" ({len(bad) - 1} more rows break this rule)" if len(bad) > 1 else ""
            raise InputError(
                f"{source}: prefix_blocks[{i}] lists {int(self.counts()[i])} blocks of "
                f"{self.block_tokens} tokens, more than the {int(full[i])} full blocks of "
                f"input_tokens[{i}]={int(input_tokens[i])}; list only the prompt's full blocks "
                f"(or check the block size){more}"
            )


def number_keys(keys: npt.ArrayLike) -> tuple[IntArray, int]:
    """``(ids, count)``: each key's dense id (0, 1, ... in order of first appearance) and the
    number of distinct keys. Two keys get one id exactly when they are equal.

    >>> ids, count = number_keys([40, 7, 40, 9])
    >>> ids.tolist(), count
    ([0, 1, 0, 2], 3)
    """
    flat = np.ascontiguousarray(np.asarray(keys, dtype=np.int64).reshape(-1))
    ids, count = jit_with_helpers(_first_seen_ids)(flat)
    return np.asarray(ids, dtype=np.int64), int(count)


@functools.cache
def jit_with_helpers(py_func: Callable[..., Any]) -> Any:
    """``py_func`` compiled by numba (cached on disk), with this module's helpers callable
    from it (:func:`_splitmix64`, :func:`_slot_of`, :func:`_doubled`, :func:`_number_into`,
    :func:`_prompt`, :func:`_chain_step`).

    NOTE: numba is imported here, on first use: it takes ~0.5 s to import, and a workload that
    never keys its prefix blocks should not pay for it.

    NOTE: numba checks a cached function against its own source file only, and the helpers'
    code is compiled into each caller: keep the compiled callers of the helpers in this module,
    or an edit of a helper would leave another module's cached code stale.
    """
    from numba import njit

    _register_helpers()
    return njit(cache=True)(py_func)


@functools.cache
def _register_helpers() -> None:
    """Make the helpers callable from compiled code (once: numba keeps one overload each)."""
    from numba.extending import register_jitable

    for helper in (_splitmix64, _slot_of, _doubled, _number_into, _prompt, _chain_step):
        register_jitable(helper)


def _chain_keys(offsets: IntArray, hashes: _U64) -> _U64:
    """:meth:`PrefixBlocks.chained_keys` as one loop, four prompts at a time in step.

    NOTE: each key waits for the one before it (two multiplications deep), so a prompt at a
    time left the CPU's multipliers mostly idle; four independent chains interleaved keep them
    busy (compiled, 15.4 million blocks: 0.087 s, against 0.116 s one prompt at a time and ~1 s
    for a numpy step per block position)."""
    keys = np.empty(hashes.shape[0], dtype=np.uint64)
    n = offsets.shape[0] - 1
    for i in range(0, n, 4):
        (s0, l0), (s1, l1) = _prompt(offsets, i, n), _prompt(offsets, i + 1, n)
        (s2, l2), (s3, l3) = _prompt(offsets, i + 2, n), _prompt(offsets, i + 3, n)
        k0 = k1 = k2 = k3 = _CHAIN_SEED
        for j in range(max(l0, l1, l2, l3)):  # the four chains' steps, each on its own key
            k0 = _chain_step(keys, hashes, s0 + j, k0) if j < l0 else k0
            k1 = _chain_step(keys, hashes, s1 + j, k1) if j < l1 else k1
            k2 = _chain_step(keys, hashes, s2 + j, k2) if j < l2 else k2
            k3 = _chain_step(keys, hashes, s3 + j, k3) if j < l3 else k3
    return keys


def _prompt(offsets: IntArray, i: int, n: int) -> tuple[int, int]:
    """(first block, blocks) of prompt ``i`` of ``n`` ((0, 0) past the last)."""
    if i >= n:
        return 0, 0
    return offsets[i], offsets[i + 1] - offsets[i]


def _chain_step(keys: _U64, hashes: _U64, j: int, key: Any) -> Any:
    """Block ``j``'s key after ``key`` (its predecessor's), written to ``keys[j]``."""
    key = _splitmix64(key ^ _splitmix64(hashes[j]))
    keys[j] = key
    return key


def _first_seen_ids(keys: IntArray) -> tuple[IntArray, int]:
    """:func:`number_keys` by open addressing (linear probing, at most half full, doubled when
    needed): one pass, ~0.5 s for 15 million keys, where ``np.unique``'s sort takes ~7 s."""
    slots = 1024
    while slots < keys.shape[0] // 4:  # keys repeat: a quarter as many slots as keys, to start
        slots *= 2
    table_key = np.zeros(slots, dtype=np.int64)
    table_id = np.full(slots, -1, dtype=np.int64)
    ids = np.empty(keys.shape[0], dtype=np.int64)
    done, count = _number_into(keys, 0, 0, table_key, table_id, ids)
    while done < keys.shape[0]:
        table_key, table_id = _doubled(table_key, table_id)
        done, count = _number_into(keys, done, count, table_key, table_id, ids)
    return ids, count


def _number_into(
    keys: IntArray, start: int, count: int, table_key: IntArray, table_id: IntArray, ids: IntArray
) -> tuple[int, int]:
    """Number ``keys[start:]`` into the table (``count`` ids given so far) until it is done or
    half full: ``(keys done, ids given)``.

    NOTE: the doubling is left to the caller so that this loop's arrays never change (numba
    then keeps them in registers: measured 0.5 s against 1.3 s with the doubling inside)."""
    slots = table_id.shape[0]
    for i in range(start, keys.shape[0]):
        key = keys[i]
        slot = _slot_of(key, slots)
        while table_id[slot] >= 0 and table_key[slot] != key:
            slot = (slot + 1) & (slots - 1)
        if table_id[slot] < 0:
            if 2 * (count + 1) > slots:
                return i, count
            table_key[slot] = key
            table_id[slot] = count
            count += 1
        ids[i] = table_id[slot]
    return keys.shape[0], count


def _doubled(table_key: IntArray, table_id: IntArray) -> tuple[IntArray, IntArray]:
    """The table of :func:`_first_seen_ids` in twice the slots, its entries placed again."""
    slots = 2 * table_id.shape[0]
    new_key = np.zeros(slots, dtype=np.int64)
    new_id = np.full(slots, -1, dtype=np.int64)
    for old in range(table_id.shape[0]):
        if table_id[old] >= 0:
            slot = _slot_of(table_key[old], slots)
            while new_id[slot] >= 0:
                slot = (slot + 1) & (slots - 1)
            new_key[slot] = table_key[old]
            new_id[slot] = table_id[old]
    return new_key, new_id


def _slot_of(key: int, slots: int) -> np.int64:
    """The slot ``key`` probes first among ``slots`` (a power of two): the key's splitmix64,
    whose low bits depend on all of the key's."""
    return np.int64(_splitmix64(np.uint64(key)) & np.uint64(slots - 1))


def _int64_array(values: npt.ArrayLike, name: str, owner: str) -> IntArray:
    raw = np.asarray(values)
    if raw.ndim != 1 or (raw.size and raw.dtype.kind not in "iu"):
        raise param_error(name, owner, "a 1-D array of integers", values)
    if raw.dtype.kind == "u" and raw.size and int(raw.max()) > np.iinfo(np.int64).max:
        raise param_error(name, owner, "integers that fit in int64", values)
    return np.array(raw, dtype=np.int64)  # a copy: the caller's array stays theirs
