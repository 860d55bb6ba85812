"""Prefix reuse statistics: the stack-distance curve against a brute-force LRU cache, the
unbounded fraction against a hand computation."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import ParameterError
from pdopt.workload import (
    PrefixBlocks,
    Workload,
    reuse_stats,
    shared_prefix_workload,
    stack_distances,
)


def _workload(lists: list[list[int]], block_tokens: int = 4, extra: int = 1) -> Workload:
    inputs = [block_tokens * len(b) + extra for b in lists]
    return Workload(
        np.arange(len(lists), dtype=float),
        inputs,
        [1] * len(lists),
        "w",
        PrefixBlocks.from_lists(lists, block_tokens),
    )


def _lru(lists: list[list[int]], capacity: int) -> tuple[int, int]:
    """Brute force: (hit blocks, requests with a hit) for an LRU cache of ``capacity`` blocks,
    blocks identified by their whole prefix; a request hits its leading cached blocks, then uses
    all its blocks tail first (block 0 most recent)."""
    cache: OrderedDict[tuple[int, ...], None] = OrderedDict()
    hit_blocks = hit_requests = 0
    for hashes in lists:
        prefixes = [tuple(hashes[: j + 1]) for j in range(len(hashes))]
        leading = 0
        while leading < len(prefixes) and prefixes[leading] in cache:
            leading += 1
        hit_blocks += leading
        hit_requests += leading > 0
        for prefix in reversed(prefixes):
            cache[prefix] = None
            cache.move_to_end(prefix)
            while len(cache) > capacity:
                cache.popitem(last=False)
    return hit_blocks, hit_requests


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 3), max_size=6).map(lambda b: b or []),
        min_size=1,
        max_size=25,
    ),
    st.lists(st.integers(1, 20), min_size=1, max_size=5),
)
def test_curve_equals_brute_force_lru(lists: list[list[int]], sizes: list[int]) -> None:
    w = _workload(lists)
    stats = reuse_stats(w, cache_blocks=sizes)
    prompt = int(w.input_tokens.sum())
    for row, size in zip(stats.curve.itertuples(), sizes, strict=True):
        blocks, requests = _lru(lists, size)
        assert row.cache_blocks == size
        assert row.token_hit_rate == pytest.approx(4 * blocks / prompt)
        assert row.request_hit_rate == pytest.approx(requests / len(lists))
    unbounded_blocks, unbounded_requests = _lru(lists, 10**6)
    assert stats.summary["reusable_token_fraction"] == pytest.approx(4 * unbounded_blocks / prompt)
    assert stats.summary["request_hit_fraction"] == pytest.approx(unbounded_requests / len(lists))


def test_unbounded_fraction_by_hand() -> None:
    # blocks of 10 tokens; prompts 35, 40, 25, 31 tokens (one token past the listed blocks or
    # exact), hashes: A B C | A B D | A E | A B D
    lists = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 4]]
    w = Workload([0.0, 1, 2, 3], [35, 40, 25, 31], [1, 1, 1, 1], "h",
                 PrefixBlocks.from_lists(lists, 10))  # fmt: skip
    s = reuse_stats(w).summary
    # reusable: request 2 reuses A B (20), request 3 reuses A (10), request 4 reuses A B D (30)
    assert s["reusable_token_fraction"] == pytest.approx(60 / 131)
    assert s["request_hit_fraction"] == pytest.approx(3 / 4)
    assert s["distinct_blocks"] == 5  # A, AB, ABC, ABD, AE
    assert s["listed_token_fraction"] == pytest.approx(110 / 131)
    assert s["reusable_tokens_mean"] == pytest.approx(15.0)


def test_a_block_never_hits_without_its_predecessor() -> None:
    # the same second hash after a different first one is not reuse
    s = reuse_stats(_workload([[1, 2], [3, 2], [1, 2]])).summary
    assert s["reusable_token_fraction"] == pytest.approx(8 / 27)


def test_stack_distances_small() -> None:
    b = PrefixBlocks.from_lists([[1, 2], [1, 2], [3], [1], [], [1, 2]], block_tokens=4)
    assert stack_distances(b).tolist() == [0, 0, 1, 2, 0, 2, 1, 3]


def test_default_sizes_reach_every_distinct_block() -> None:
    w = shared_prefix_workload(
        np.arange(300, dtype=float),
        num_system_prompts=4,
        system_prompt_tokens=320,
        users_per_system_prompt=5,
        question_tokens=64,
        output_tokens=16,
        multi_turn=True,
        seed=0,
    )
    s = reuse_stats(w)
    curve = s.curve
    assert curve["cache_blocks"].iloc[-1] >= s.summary["distinct_blocks"]
    assert curve["token_hit_rate"].is_monotonic_increasing
    assert curve["token_hit_rate"].iloc[-1] == pytest.approx(s.summary["reusable_token_fraction"])
    assert curve["cache_tokens"].tolist() == (curve["cache_blocks"] * 16).tolist()


def test_single_turn_shared_prefix_matches_the_analytic_fraction() -> None:
    # 3 system prompts of 20 blocks, 1000 requests: all but the first request of each system
    # prompt reuse its 20 blocks; the 4 question blocks are never reused.
    n = 1000
    w = shared_prefix_workload(
        np.arange(n, dtype=float),
        num_system_prompts=3,
        system_prompt_tokens=320,
        users_per_system_prompt=10,
        question_tokens=64,
        output_tokens=8,
        seed=1,
    )
    s = reuse_stats(w).summary
    assert s["reusable_token_fraction"] == pytest.approx((n - 3) * 320 / (n * 384))
    assert s["request_hit_fraction"] == pytest.approx((n - 3) / n)


def test_needs_blocks_and_good_sizes() -> None:
    with pytest.raises(ParameterError, match="prefix_blocks"):
        reuse_stats(Workload([0.0], [5], [1]))
    with pytest.raises(ParameterError, match="cache_blocks"):
        reuse_stats(_workload([[1]]), cache_blocks=[0])
