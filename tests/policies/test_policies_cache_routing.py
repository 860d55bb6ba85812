"""Cache-aware routing (issue 35, item 4): on a multi-worker shared-prefix workload, routing by
cache affinity (and the KV-aware score) raises the prefix-cache hit rate over load-only routing,
in P/D and colocated clusters; the rules by hand on a tiny view."""

from __future__ import annotations

import numpy as np
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.workload import PrefixBlocks, Workload

SLO = Slo(5.0, 0.5)
COST = CostModel(PrefillModel(3e5, 1.4e10, 1e14, 1.0, 0.004), DecodeModel(0.02, 5e-5, 7e-8))


def workload(n: int = 400, groups: int = 8, seed: int = 0, rate: float = 8.0) -> Workload:
    """1,024-token prompts: a 960-token prefix (60 blocks) shared per group, 4 own blocks."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, groups, n)
    blocks = [
        [int(g) * 1000 + j for j in range(60)] + [10**6 + 10 * i + j for j in range(4)]
        for i, g in enumerate(group)
    ]
    arrival = np.sort(rng.uniform(0, n / rate, n))
    return Workload(
        arrival, np.full(n, 1024), np.full(n, 16), prefix_blocks=PrefixBlocks.from_lists(blocks, 16)
    )


def hit_rate(result_requests) -> float:  # type: ignore[no-untyped-def]
    return float(result_requests["cached_tokens"].sum() / result_requests["input_tokens"].sum())


@pytest.mark.parametrize(("kv_blocks", "margin"), [(20000, 0.04), (300, 0.3)])
def test_affinity_and_kv_aware_raise_the_hit_rate_in_pd(kv_blocks: int, margin: float) -> None:
    wl = workload(rate=100.0)
    cluster = ClusterSpec.build(COST, 4, 2, kv_capacity_blocks=kv_blocks, prefix_caching=True)
    rates, ttft = {}, {}
    for name, flags in (
        ("least_loaded", {}),
        ("round_robin", {}),
        ("cache_aware", {"prefill_routing": "prefix_affinity"}),
        ("cache_aware", {"prefill_routing": "kv_aware"}),
    ):
        res = simulate(wl, cluster, make_policy(name, **flags), slo=SLO)
        assert (res.requests["status"] == "finished").all()
        rule = flags.get("prefill_routing", name)
        rates[rule] = hit_rate(res.requests)
        ttft[rule] = float(res.requests["ttft_s"].mean())
    # 8 groups on 4 workers at 100 req/s: load-only routing sends a prompt where the queue is
    # shortest, often before its group's prefix is cached there (a miss that lengthens that
    # queue), and with little KV (300 blocks: fewer than 5 of the 8 prefixes fit a worker) its
    # workers evict each other's groups; cache-aware routing keeps a group where it is cached.
    # Measured (hit rate; mean TTFT): 20,000 blocks: least_loaded 0.84, round_robin 0.83,
    # prefix_affinity 0.90, kv_aware 0.90 (273 ms -> 48 ms); 300 blocks: 0.36, 0.40, 0.90, 0.88
    # (3.0 s -> 47 ms)
    for aware in ("prefix_affinity", "kv_aware"):
        assert rates[aware] > rates["least_loaded"] + margin
        assert rates[aware] > rates["round_robin"] + margin
        assert ttft[aware] < ttft["least_loaded"] / 2
    # every group's first request misses everywhere: at most (n − 8) of n prompts hit 960 tokens
    assert rates["prefix_affinity"] <= (400 - 8) * 960 / (400 * 1024)


@pytest.mark.parametrize("rule", ["prefix_affinity", "kv_aware"])
def test_colocated_cache_routing_raises_the_hit_rate(rule: str) -> None:
    wl = workload(seed=2, rate=100.0)
    cluster = ClusterSpec.build(
        COST,
        0,
        0,
        4,
        colocated_schedule="hybrid",
        chunk_tokens=512,
        kv_capacity_blocks=20000,
        prefix_caching=True,
    )
    base = simulate(wl, cluster, make_policy("sarathi"), slo=SLO).requests
    aware = simulate(wl, cluster, make_policy("sarathi", prefill_routing=rule), slo=SLO).requests
    assert (aware["status"] == "finished").all()
    assert hit_rate(aware) > hit_rate(base) + 0.01


def test_kv_aware_leaves_a_busy_cached_worker_for_an_idle_one() -> None:
    # two P workers; prompts of one group arrive in a burst: affinity sends all of them to the
    # worker that cached the prefix, kv_aware spreads them once its queue outweighs the saving
    blocks = [[*range(60), 1000 + i] for i in range(30)]
    wl = Workload(
        np.r_[0.0, np.full(29, 1.0)],
        np.full(30, 1000),
        np.full(30, 2),
        prefix_blocks=PrefixBlocks.from_lists(blocks, 16),
    )
    cluster = ClusterSpec.build(COST, 2, 1, kv_capacity_blocks=20000, prefix_caching=True)
    used = {}
    for rule in ("prefix_affinity", "kv_aware"):
        policy = make_policy("cache_aware", prefill_routing=rule)
        q = simulate(wl, cluster, policy, slo=SLO).requests
        used[rule] = q["prefill_worker"].iloc[1:].nunique()
    assert used["prefix_affinity"] == 1
    assert used["kv_aware"] == 2


def test_without_a_cache_kv_aware_is_least_queued_work() -> None:
    wl = workload(n=120)
    cluster = ClusterSpec.build(COST, 3, 2, kv_capacity_blocks=20000)
    aware = simulate(wl, cluster, make_policy("cache_aware"), slo=SLO).requests
    least = simulate(wl, cluster, make_policy("least_loaded"), slo=SLO).requests
    assert list(aware["prefill_worker"]) == list(least["prefill_worker"])
