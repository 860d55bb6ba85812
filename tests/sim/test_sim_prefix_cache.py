"""Prefix caching in the simulator (issue 35): hits skip prefill compute, never a block whose
predecessor misses, cache off (or no blocks) identical to no cache, an unbounded cache's hit
rate equals the analytic one, LRU eviction under a small KV, every request ends exactly once."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.sim._prefix_cache import PrefixCache
from pdopt.workload import PrefixBlocks, Workload

SLO = Slo(5.0, 0.5)
COST = CostModel(PrefillModel(3e5, 1.4e10, 1e14, 1.0, 0.004), DecodeModel(0.02, 5e-5, 7e-8))


def cluster(kind: str, *, caching: bool = True, kv_blocks: int = 20000) -> ClusterSpec:
    if kind == "pd":
        return ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=kv_blocks, prefix_caching=caching)
    return ClusterSpec.build(
        COST,
        0,
        0,
        2,
        colocated_schedule="hybrid" if kind == "hybrid" else "prefill_first",
        kv_capacity_blocks=kv_blocks,
        chunk_tokens=512,
        prefix_caching=caching,
    )


POLICY = {"pd": "round_robin", "hybrid": "sarathi", "prefill_first": "vllm"}


def shared_prompts(n: int, groups: int, seed: int = 0, block: int = 16) -> Workload:
    """``n`` requests of 200 tokens: 8 blocks (128 tokens) shared per group, then own blocks."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, groups, n)
    blocks = [
        [int(g) * 100 + j for j in range(8)] + [10_000 + 20 * i + j for j in range(4)]
        for i, g in enumerate(group)
    ]
    arrival = np.sort(rng.uniform(0, n / 4.0, n))
    return Workload(
        arrival,
        np.full(n, 200),
        np.full(n, 20),
        prefix_blocks=PrefixBlocks.from_lists(blocks, block),
    )


@pytest.mark.parametrize("kind", ["pd", "hybrid", "prefill_first"])
def test_cache_off_or_no_blocks_is_exactly_no_cache(kind: str) -> None:
    wl = shared_prompts(120, 3)
    plain = dataclasses.replace(wl, prefix_blocks=None)
    base = simulate(plain, cluster(kind, caching=False), make_policy(POLICY[kind]), slo=SLO)
    for driver, caching in ((wl, False), (plain, True)):
        res = simulate(driver, cluster(kind, caching=caching), make_policy(POLICY[kind]), slo=SLO)
        pd.testing.assert_frame_equal(res.requests, base.requests)
        assert "cached_tokens" not in res.requests


@pytest.mark.parametrize("kind", ["pd", "hybrid", "prefill_first"])
def test_unbounded_cache_hits_what_the_trace_reuses(kind: str) -> None:
    # one worker per prefill so the analytic count is exact: a request hits its group's 8 shared
    # blocks (128 tokens) when any earlier request of its group has finished its prefill there
    wl = shared_prompts(200, 4, seed=3)
    one = (
        ClusterSpec.build(COST, 1, 1, kv_capacity_blocks=20000, prefix_caching=True)
        if kind == "pd"
        else ClusterSpec.build(
            COST,
            0,
            0,
            1,
            colocated_schedule="hybrid" if kind == "hybrid" else "prefill_first",
            kv_capacity_blocks=20000,
            chunk_tokens=512,
            prefix_caching=True,
        )
    )
    res = simulate(wl, one, make_policy(POLICY[kind]), slo=SLO)
    q = res.requests
    assert (q["status"] == "finished").all()
    cached = q["cached_tokens"].to_numpy()
    assert set(np.unique(cached)) <= {0, 128}
    # a hit needs a group member whose prefill ended before this one started
    groups = wl.prefix_blocks.hashes[wl.prefix_blocks.offsets[:-1]] // 100  # type: ignore[union-attr]
    start, end = q["prefill_start_s"].to_numpy(), q["prefill_end_s"].to_numpy()
    for i in range(len(q)):
        mates = (groups == groups[i]) & (np.arange(len(q)) != i)
        expected = 128 if np.any(end[mates] <= start[i]) else 0
        assert cached[i] == expected, i
    # and the skipped compute is what a hit saves: a 200-token prefill alone vs 72 tokens after 128
    assert res.workers["prefix_hit_tokens"].sum() == cached.sum()
    assert res.workers["prefix_evictions"].sum() == 0


def test_hits_shorten_prefill_by_the_skipped_work() -> None:
    # two identical prompts far apart on one P/D pair: the second prefills 8 tokens after 192
    blocks = PrefixBlocks.from_lists([list(range(12)), list(range(12))], 16)
    wl = Workload([0.0, 10.0], [200, 200], [2, 2], prefix_blocks=blocks)
    res = simulate(wl, cluster("pd"), make_policy("round_robin"), slo=SLO)
    q = res.requests
    pre = COST.prefill
    first = q.loc[0, "prefill_end_s"] - q.loc[0, "prefill_start_s"]
    assert first == pytest.approx(pre.batch_time_s([200]), rel=1e-12)
    # round robin sends the second prompt to the other prefill worker: a miss there
    assert q.loc[1, "cached_tokens"] == 0
    one = ClusterSpec.build(COST, 1, 1, kv_capacity_blocks=20000, prefix_caching=True)
    q = simulate(wl, one, make_policy("round_robin"), slo=SLO).requests
    second = q.loc[1, "prefill_end_s"] - q.loc[1, "prefill_start_s"]
    assert q.loc[1, "cached_tokens"] == 192
    hand = pre.intercept_s + pre.chunk_work_flop(192, 8) / pre.p_peak_flops
    assert second == pytest.approx(hand, rel=1e-12)


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    blocks = PrefixBlocks.from_lists([list(range(4)), list(range(4))], 16)
    wl = Workload([0.0, 10.0], [64, 64], [3, 3], prefix_blocks=blocks)
    one = ClusterSpec.build(
        COST,
        0,
        0,
        1,
        colocated_schedule="hybrid",
        chunk_tokens=512,
        kv_capacity_blocks=1000,
        prefix_caching=True,
    )
    q = simulate(wl, one, make_policy("sarathi"), slo=SLO).requests
    assert list(q["cached_tokens"]) == [0, 63]


def test_a_small_kv_evicts_least_recently_used_blocks() -> None:
    # 40 distinct 12-block prompts, each sent twice in a row, then all again: with KV for only a
    # few prompts, the second pass finds the early prompts evicted
    prompts = [[1000 * p + j for j in range(12)] for p in range(40)]
    order = [p for p in range(40) for _ in (0, 1)] + list(range(40))
    wl = Workload(
        np.arange(len(order)) * 1.0,
        np.full(len(order), 200),
        np.full(len(order), 2),
        prefix_blocks=PrefixBlocks.from_lists([prompts[p] for p in order], 16),
    )
    one = ClusterSpec.build(
        COST,
        0,
        0,
        1,
        colocated_schedule="hybrid",
        chunk_tokens=512,
        kv_capacity_blocks=60,
        prefix_caching=True,
    )
    res = simulate(wl, one, make_policy("sarathi"), slo=SLO)
    cached = res.requests["cached_tokens"].to_numpy()
    assert (cached[1:80:2] == 192).all()  # the repeat right after: still cached
    assert (cached[80:] == 0).all()  # 40 prompts later: evicted (60 blocks hold 5 prompts)
    assert res.workers["prefix_evictions"].iloc[0] > 0


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["match", "pin", "unpin"]), st.integers(0, 5), st.integers(0, 30)
        ),
        max_size=60,
    )
)
def test_every_block_is_referenced_or_lru_exactly_once(ops: list[tuple[str, int, int]]) -> None:
    cache = PrefixCache(1)
    prompts = [np.arange(p * 10, p * 10 + 6, dtype=np.int64) for p in range(6)]
    held: list[int] = []
    for op, p, free in ops:
        keys = prompts[p]
        if op == "match":
            n = cache.match(keys, free)
            # a hit is a leading run: every block before a hit is cached
            assert all(int(k) in cache.refs for k in keys[:n])
            assert len(cache.lru) <= free
        elif op == "pin":
            cache.pin(keys)
            held.append(p)
        elif held:
            cache.unpin(prompts[held.pop()])
        cache.check()
    for p in held:
        cache.unpin(prompts[p])
    cache.check()
    assert all(v == 0 for v in cache.refs.values())


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), kv=st.integers(30, 400), kind=st.sampled_from(sorted(POLICY)))
def test_every_request_ends_once_and_hits_are_leading_blocks(seed: int, kv: int, kind: str) -> None:
    wl = shared_prompts(60, 3, seed=seed)
    res = simulate(wl, cluster(kind, kv_blocks=kv), make_policy(POLICY[kind]), slo=SLO)
    q = res.requests
    assert len(q) == 60 and q["status"].isin(["finished", "rejected"]).all()
    cached = q["cached_tokens"].to_numpy()
    # only whole shared blocks (the group's 8) or own blocks after them can hit: multiples of 16
    assert ((cached % 16 == 0) | (cached == 199)).all()
    assert (cached <= 199).all()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), kv=st.integers(13, 60))
def test_a_bounded_cache_matches_the_lru_stack_distance_curve(seed: int, kv: int) -> None:
    # Requests one at a time (each ends before the next arrives), so a worker's free KV is its
    # whole capacity at every lookup: its prefix cache is an LRU of that many blocks, and the
    # simulated hits are the trace-level LRU estimate (pdopt.plan's prefix_hits) exactly.
    from pdopt.plan._demand import prefix_hits

    rng = np.random.default_rng(seed)
    n = 80
    prompts = [
        [int(g) * 100 + j for j in range(int(rng.integers(1, 12)))] for g in rng.integers(0, 9, n)
    ]
    inputs = np.array([16 * len(p) for p in prompts])  # whole blocks: all of a prompt is cacheable
    wl = Workload(
        np.arange(n) * 10.0,
        inputs,
        np.ones(n, dtype=int),
        prefix_blocks=PrefixBlocks.from_lists(prompts, 16),
    )
    one = ClusterSpec.build(
        COST,
        0,
        0,
        1,
        colocated_schedule="hybrid",
        chunk_tokens=4096,
        kv_capacity_blocks=kv,
        prefix_caching=True,
    )
    q = simulate(wl, one, make_policy("sarathi"), slo=SLO).requests
    assert (q["status"] == "finished").all()
    assert q["cached_tokens"].tolist() == prefix_hits(wl, kv * 16).tolist()


def test_metrics_report_the_hit_rates() -> None:
    wl = shared_prompts(200, 4, seed=3)
    res = simulate(wl, cluster("hybrid"), make_policy("sarathi"), slo=SLO)
    q, m = res.requests, res.metrics()
    assert m["prefix_hit_rate_tokens"] == q["cached_tokens"].sum() / q["input_tokens"].sum()
    assert m["prefix_hit_rate_requests"] == (q["cached_tokens"] > 0).mean() > 0.5
    plain = simulate(wl, cluster("hybrid", caching=False), make_policy("sarathi"), slo=SLO)
    assert "prefix_hit_rate_tokens" not in plain.metrics()
