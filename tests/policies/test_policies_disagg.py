"""DistServe, Splitwise and memory-centric baselines (pdopt.policies.disagg)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ParameterError
from pdopt.policies import make_policy
from pdopt.policies.disagg import MemoryCentric, Splitwise
from pdopt.sim import RequestInfo, RunContext, simulate
from pdopt.workload import Workload

COST = CostModel(PrefillModel(1e7, 2e9, 1e13, 1.0, 1e-3), DecodeModel(5e-3, 1e-4, 1e-8))
SLO = Slo(1.0, 0.1)

SLO_CTX = Slo(1.0, 0.1)  # the run SLO a policy started by hand sees


def _workload(n: int = 80, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 2, n))
    return Workload(arrivals, rng.integers(64, 1500, n), rng.integers(2, 64, n))


def _info(rid: int, tokens: int = 100) -> RequestInfo:
    return RequestInfo(rid, 0.0, tokens, 8, tokens, 7, 8, 0)


def test_distserve_is_the_static_split() -> None:
    wl, cluster = _workload(), ClusterSpec.build(COST, 2, 2)
    a = simulate(wl, cluster, make_policy("distserve"), slo=SLO, record_timeseries=False)
    b = simulate(wl, cluster, make_policy("static_split"), slo=SLO, record_timeseries=False)
    assert a.requests.equals(b.requests)
    rr = make_policy("distserve", prefill_routing="round_robin")
    assert rr.name == "distserve"


def test_memory_centric_picks_most_free_memory_and_ignores_queues() -> None:
    view = SimpleNamespace(
        prefill_workers=np.array([0, 1, 2]),
        decode_workers=np.array([3, 4]),
        kv_free_blocks=np.array([50, 90, 90, 10, 40]),
        prefill_queue_len=np.array([0, 30, 0, 0, 0]),
        min_kv_capacity_blocks=100,
    )
    policy = MemoryCentric()
    # worker 1 holds a 30-request queue but no KV: the phantom makes it look freest (tie → 1)
    assert policy.route_prefill(_info(0), view) == 1  # type: ignore[arg-type]
    assert policy.route_decode(_info(0), view) == 4  # type: ignore[arg-type]


def test_splitwise_joins_the_shortest_queue_and_counts_pending_tokens() -> None:
    cluster = ClusterSpec.build(COST, 2, 1)
    policy = Splitwise()
    policy.start(RunContext(cluster, SLO_CTX, 0.05))
    view = SimpleNamespace(
        prefill_workers=np.array([0, 1]),
        prefill_queue_len=np.array([2, 1, 0]),
        running=np.array([1, 1, 0]),
    )
    assert policy.route_prefill(_info(0, 300), view) == 1  # 2 vs 3 requests
    policy._routed[0].extend((100, 200, 400))
    # worker 0 holds its last 3 prompts (100+200+400), worker 1 its last 2 (only 300 known)
    assert policy.pending_prefill_tokens(view) == pytest.approx((700 + 300) / 2)  # type: ignore[arg-type]


def test_splitwise_mixed_pool_reacts_to_a_prefill_backlog_and_goes_home() -> None:
    rng = np.random.default_rng(3)
    n = 120
    arrivals = np.sort(np.concatenate([rng.uniform(0, 1, n - 20), rng.uniform(1, 6, 20)]))
    wl = Workload(arrivals, np.full(n, 1024), np.full(n, 4))
    cluster = ClusterSpec.build(COST, 1, 2, 1, mixed_pool_role="decode")
    res = simulate(wl, cluster, Splitwise(prefill_threshold_tokens=4096), slo=SLO)
    moves = res.events[res.events["kind"] == "pool_move"]
    assert list(moves["worker"]) == ["m0", "m0"]
    assert moves["detail"].tolist() == [
        "decode->prefill pool=prefill",
        "prefill->decode pool=mixed",
    ]
    assert (res.requests["status"] == "finished").all()
    # the same run without the Mixed pool's help is slower to clear the backlog
    static = simulate(wl, ClusterSpec.build(COST, 1, 3), make_policy("splitwise"), slo=SLO)
    assert res.metrics()["ttft_p99_s"] < static.metrics()["ttft_p99_s"]


def test_splitwise_flags() -> None:
    with pytest.raises(ParameterError, match="prefill_threshold_tokens"):
        Splitwise(prefill_threshold_tokens=0)
