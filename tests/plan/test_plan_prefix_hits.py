"""Plans that count prefix-cache hits (issue 35, item 5): the demand's prefill service leaves out
the cached tokens, the LRU estimate matches a brute-force cache, and a plan on a workload with
reuse sizes fewer prefill GPUs with caching than without."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.plan import solve_pd_sizing, worker_options
from pdopt.plan._demand import demand_from_workload, prefix_hits
from pdopt.workload import PrefixBlocks, Workload


def brute_force_hits(
    lists: list[list[int]], block: int, capacity: int, inputs: list[int]
) -> list[int]:
    """An LRU of chained keys, a request's blocks used tail first (its first block most recent)."""
    cache: OrderedDict[tuple[int, ...], None] = OrderedDict()
    out = []
    for blocks, length in zip(lists, inputs, strict=True):
        keys = [tuple(blocks[: j + 1]) for j in range(len(blocks))]
        lead = 0
        for key in keys:
            if key not in cache:
                break
            lead += 1
        out.append(min(lead * block, length - 1))
        for key in reversed(keys):
            cache.pop(key, None)
            cache[key] = None
            while len(cache) > capacity:
                cache.popitem(last=False)
    return out


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=25),
    capacity=st.integers(1, 12),
)
def test_prefix_hits_match_a_brute_force_lru(prompts: list[list[int]], capacity: int) -> None:
    n = len(prompts)
    inputs = [16 * len(p) + 5 for p in prompts]
    wl = Workload(
        np.arange(n, dtype=float),
        inputs,
        [2] * n,
        prefix_blocks=PrefixBlocks.from_lists(prompts, 16),
    )
    expected = brute_force_hits(prompts, 16, capacity, inputs)
    assert prefix_hits(wl, capacity * 16).tolist() == expected


def shared_prefix(n: int = 3000, groups: int = 20, rate: float = 40.0) -> Workload:
    """3,000-token prompts, 2,880 of them (180 blocks) a prefix shared per group."""
    rng = np.random.default_rng(0)
    group = rng.integers(0, groups, n)
    blocks = [
        [int(g) * 1000 + j for j in range(180)] + [10**6 + 10 * i + j for j in range(7)]
        for i, g in enumerate(group)
    ]
    return Workload(
        np.sort(rng.uniform(0, n / rate, n)),
        np.full(n, 3000),
        np.full(n, 200),
        prefix_blocks=PrefixBlocks.from_lists(blocks, 16),
    )


def test_prefill_service_leaves_out_the_cached_tokens() -> None:
    wl = shared_prefix(n=200)
    plain = demand_from_workload(wl, ttft_slo_s=1.0, tpot_slo_s=0.1)
    cached = demand_from_workload(wl, ttft_slo_s=1.0, tpot_slo_s=0.1, cache_tokens=1e9)
    assert plain.cached_tokens is None and plain.hit_fraction == 0.0
    # every group's first request misses: 200 − 20 requests hit their 2,880 shared tokens
    assert cached.cached_tokens is not None
    assert cached.hit_fraction == pytest.approx((200 - 20) * 2880 / (200 * 3000))
    option = worker_options(["H100-SXM"], "Llama-3.1-8B", (1,))[0]
    pre = option.cost.prefill
    full, hit = plain.prefill_service_s(pre), cached.prefill_service_s(pre)
    i = int(np.flatnonzero(cached.cached_tokens)[0])
    expected = pre.intercept_s + pre.chunk_work_flop(2880, 120) / pre.p_peak_flops
    assert hit[i] == pytest.approx(expected)
    assert full[i] == pytest.approx(float(pre.request_time_s(3000)))


def test_a_plan_with_caching_needs_fewer_prefill_gpus() -> None:
    wl = shared_prefix()
    options = worker_options(["H100-SXM"], "Llama-3.1-8B", (1,))
    plans = {}
    for label, cache in (("off", None), ("on", 1e9)):
        demand = demand_from_workload(wl, ttft_slo_s=1.0, tpot_slo_s=0.1, cache_tokens=cache)
        plans[label] = solve_pd_sizing(demand, options)
    prefill = {k: sum(c.gpus for c in p.counts if c.role == "prefill") for k, p in plans.items()}
    assert prefill["on"] < prefill["off"]


def test_plan_cli_counts_hits_and_says_so(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from pdopt.cli import main
    from pdopt.workload import poisson_arrivals, shared_prefix_workload, write_csv_trace

    wl = shared_prefix_workload(
        poisson_arrivals(30.0, n_requests=900, seed=1),
        num_system_prompts=10,
        system_prompt_tokens=2000,
        users_per_system_prompt=20,
        question_tokens=200,
        output_tokens=150,
        seed=1,
    )
    path = tmp_path / "sp.csv"
    write_csv_trace(wl, path)
    base = [
        "plan",
        "--workload",
        str(path),
        "--model",
        "Llama-3.1-8B",
        "--gpus",
        "H100-SXM=16",
        "--ttft-slo",
        "1",
        "--tpot-slo",
        "0.1",
        "--quiet",
        "--json",
    ]
    gpus, caches = {}, {}
    for label, extra in (("on", []), ("off", ["--no-prefix-cache"])):
        assert main([*base, *extra]) == 0
        payload = json.loads(capsys.readouterr().out)
        gpus[label] = payload["recommendation"]["n_gpus"]
        caches[label] = payload["demand"]["prefix_cache"]
    assert gpus["on"] < gpus["off"]
    on = caches["on"]
    assert on["used"] and on["assumed_hit_fraction"] > 0.8
    # the verification ran with the cache on and hit about what the plan assumed
    assert on["simulated_hit_fraction"] == pytest.approx(on["assumed_hit_fraction"], abs=0.05)
    assert not caches["off"]["used"] and "--no-prefix-cache" in caches["off"]["text"]
