"""PrefixBlocks and how every Workload operation carries them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import InputError, ParameterError
from pdopt.workload import PrefixBlocks, Workload
from pdopt.workload._prefix import number_keys, splitmix64


def _blocks(lists: list[list[int]], block_tokens: int = 4) -> PrefixBlocks:
    return PrefixBlocks.from_lists(lists, block_tokens)


def _workload() -> Workload:
    return Workload(
        [0.0, 1.0, 2.0, 3.0],
        [8, 12, 4, 9],
        [1, 2, 3, 4],
        name="w",
        prefix_blocks=_blocks([[1, 2], [1, 2, 3], [5], []]),
    )


def test_of_counts_and_views() -> None:
    b = _blocks([[1, 2], [1, 2, 3], [5], []])
    assert b.of(1).tolist() == [1, 2, 3]
    assert b.of(3).tolist() == []
    assert b.counts().tolist() == [2, 3, 1, 0]
    assert b.positions().tolist() == [0, 1, 0, 1, 2, 0]
    assert b.request_of_block().tolist() == [0, 0, 1, 1, 1, 2]
    with pytest.raises(ValueError):
        b.hashes[0] = 9  # read-only


def test_chained_keys_identify_prefixes() -> None:
    b = _blocks([[1, 2, 3], [1, 2, 4], [2, 2, 3], [1]])
    k = b.chained_keys().reshape(-1)
    first, second, third, fourth = k[0:3], k[3:6], k[6:9], k[9:]
    assert first[0] == second[0] == fourth[0] and first[1] == second[1]
    assert first[2] != second[2]
    # equal hash at position 1 and 2, but a different block 0: no key in common
    assert not set(third.tolist()) & set(first.tolist())
    assert k.dtype == np.int64


def test_chained_keys_are_fixed_numbers() -> None:
    # Deterministic across runs and machines: pinned values (splitmix64 chain, see _prefix.py).
    keys = _blocks([[0, 1]]).chained_keys().tolist()
    again = PrefixBlocks(np.array([0, 2]), np.array([0, 1]), 4).chained_keys().tolist()
    assert keys == again
    assert keys == _PINNED_KEYS


_PINNED_KEYS = [2784110298613529038, -7885047978928580192]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=5), min_size=1, max_size=8))
def test_equal_key_iff_equal_prefix(lists: list[list[int]]) -> None:
    b = _blocks(lists)
    keys = b.chained_keys()
    seen: dict[tuple[int, ...], int] = {}
    for i, hashes in enumerate(lists):
        row = keys[b.offsets[i] : b.offsets[i + 1]]
        for j in range(len(hashes)):
            prefix = tuple(hashes[: j + 1])
            if prefix in seen:
                assert seen[prefix] == row[j]
            else:
                assert int(row[j]) not in seen.values()
                seen[prefix] = int(row[j])


_INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_INT64, max_size=6), max_size=9))  # 0 to 9 prompts: every lane count
def test_chained_keys_follow_their_definition(lists: list[list[int]]) -> None:
    # the compiled loop against the docstring's formula, step by step with numpy's splitmix64
    b = _blocks(lists)
    expected = []
    for hashes in lists:
        key = np.uint64(0x5044_4F50_545F_4B56)
        for h in hashes:
            mixed = splitmix64(np.array([h], dtype=np.int64).view(np.uint64))[0]
            key = splitmix64(np.array([key ^ mixed], dtype=np.uint64))[0]
            expected.append(int(np.array([key], dtype=np.uint64).view(np.int64)[0]))
    assert b.chained_keys().tolist() == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 40), _INT64), max_size=3000))
def test_number_keys_numbers_by_first_appearance(keys: list[int]) -> None:
    ids, count = number_keys(np.array(keys, dtype=np.int64))
    first_seen: dict[int, int] = {}
    for key in keys:
        first_seen.setdefault(key, len(first_seen))
    assert ids.tolist() == [first_seen[k] for k in keys]
    assert count == len(first_seen)
    assert ids.dtype == np.int64


def test_number_keys_past_many_doublings() -> None:
    # 52,000 keys start the table at 16,384 slots; 50,000 distinct ones double it three times
    rng = np.random.default_rng(3)
    pool = np.unique(rng.integers(-(2**63), 2**63 - 1, 50_000, dtype=np.int64))
    rng.shuffle(pool)
    keys = np.concatenate([pool, rng.choice(pool, 2_000)])
    ids, count = number_keys(keys)
    assert count == len(pool)
    assert np.array_equal(ids[: len(pool)], np.arange(len(pool)))
    assert np.array_equal(pool[ids], keys)  # one id per key, and the same key for an id


def test_splitmix64_is_the_published_finaliser() -> None:
    # SplitMix64's output for seed 0 (Steele, Lea & Flood 2014; e.g. Java's SplittableRandom)
    assert int(splitmix64(np.array([0], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize(
    ("offsets", "hashes", "match"),
    [
        ([1, 2], [1, 2], "starting at 0"),
        ([0, 2, 1], [1, 2], "non-decreasing"),
        ([0, 1], [1, 2], "ending at len"),
        ([0, 1], [1.5], "integers"),
    ],
)
def test_bad_layouts(offsets: list[int], hashes: list[float], match: str) -> None:
    with pytest.raises(ParameterError, match=match):
        PrefixBlocks(np.asarray(offsets), np.asarray(hashes), 4)


def test_workload_refuses_more_blocks_than_the_prompt_holds() -> None:
    with pytest.raises(InputError, match=r"w: prefix_blocks\[1\] lists 3 blocks of 4 tokens"):
        Workload([0.0, 1.0], [8, 11], [1, 1], "w", _blocks([[1, 2], [1, 2, 3]]))
    with pytest.raises(InputError, match="lists 1 requests, the workload has 2"):
        Workload([0.0, 1.0], [8, 11], [1, 1], "w", _blocks([[1]]))


def test_operations_carry_blocks() -> None:
    w = _workload()
    assert w == w and w != Workload(w.arrival_s, w.input_tokens, w.output_tokens, "w")
    assert w[1:3].prefix_blocks == _blocks([[1, 2, 3], [5]])
    assert w[::2].prefix_blocks == _blocks([[1, 2], [5]])
    assert w.take(w.input_tokens > 8).prefix_blocks == _blocks([[1, 2, 3], []])
    assert w.take([0, 3]).prefix_blocks == _blocks([[1, 2], []])
    assert w.scale_rate(2.0).prefix_blocks == w.prefix_blocks
    assert w.window(1.0, 3.0) == w[1:3]
    shifted = w.take([2, 3]).shifted_to_zero()
    assert shifted.arrival_s.tolist() == [0.0, 1.0]
    assert shifted.prefix_blocks == _blocks([[5], []])


def test_from_unsorted_reorders_blocks() -> None:
    w = Workload.from_unsorted(
        [2.0, 0.0, 1.0], [8, 4, 12], [1, 1, 1], "u", _blocks([[1, 2], [5], [1, 2, 3]])
    )
    assert w.input_tokens.tolist() == [4, 12, 8]
    assert w.prefix_blocks == _blocks([[5], [1, 2, 3], [1, 2]])


def test_take_refuses_unsorted_rows_and_bad_masks() -> None:
    w = _workload()
    with pytest.raises(InputError, match="must be sorted"):
        w.take([2, 0])
    with pytest.raises(InputError, match="row mask"):
        w.take(np.array([True, False]))


def test_without_blocks_nothing_changes() -> None:
    w = Workload([0.0, 1.0], [8, 11], [1, 1])
    assert w.prefix_blocks is None
    assert w[0:1].prefix_blocks is None and w.scale_rate(2).prefix_blocks is None


def test_with_lengths_cuts_blocks_to_the_new_prompts() -> None:
    w = _workload()  # prompts 8, 12, 4, 9 in blocks of 4
    cut = w.with_lengths([5, 12, 4, 3], w.output_tokens)
    assert cut.prefix_blocks == _blocks([[1], [1, 2, 3], [5], []])
    assert cut.arrival_s.tolist() == w.arrival_s.tolist()
    assert Workload([0.0], [9], [1]).with_lengths([4], [2]).prefix_blocks is None


def test_concat_merges_in_arrival_order_with_blocks() -> None:
    a = Workload([0.0, 2.0], [8, 8], [1, 1], "a", _blocks([[1, 2], [1]]))
    b = Workload([1.0, 2.0], [4, 4], [1, 1], "b", _blocks([[7], []]))
    both = Workload.concat([a, b], name="ab")
    assert both.arrival_s.tolist() == [0.0, 1.0, 2.0, 2.0]
    assert both.prefix_blocks == _blocks([[1, 2], [7], [1], []])
    assert both.name == "ab"
    plain = Workload.concat([Workload([0.0], [4], [1]), Workload([1.0], [4], [1])])
    assert plain.prefix_blocks is None and len(plain) == 2
    with pytest.raises(InputError, match="have no prefix blocks and others have"):
        Workload.concat([a, Workload([1.0], [4], [1], "bare")])
    other_size = Workload([1.0], [8], [1], "c", _blocks([[1]], block_tokens=8))
    with pytest.raises(InputError, match="different block sizes"):
        Workload.concat([a, other_size])


def test_blocks_survive_pickling() -> None:
    # Sweeps fan scenarios out to other processes (Dask) by pickling them.
    import pickle

    w = _workload()
    assert pickle.loads(pickle.dumps(w)) == w
