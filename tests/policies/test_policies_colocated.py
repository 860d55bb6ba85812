"""vLLM-style and Sarathi-style colocated baselines: schedule, routing, and the TTFT/TPOT trade."""

from __future__ import annotations

import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ParameterError
from pdopt.policies import Sarathi, make_policy
from pdopt.sim import simulate
from pdopt.workload import Workload, archetype_workload

SLO = Slo(2.0, 0.1)
# prefill: 10 ms + 0.5 ms per prompt token; decode: tau = 15 ms + 0.2 ms per running request
COST = CostModel(PrefillModel(0.0, 5e8, 1e12, 1.0, 0.01), DecodeModel(0.015, 2e-4, 0.0))


def colocated(n: int, schedule: str = "prefill_first", **kw: object) -> ClusterSpec:
    opts: dict[str, object] = dict(
        kv_capacity_blocks=4000, max_batch_size=8, max_batch_tokens=8192, max_running=64
    )
    opts.update(kw)
    return ClusterSpec.build(COST, 0, 0, n, colocated_schedule=schedule, **opts)  # type: ignore[arg-type]


def test_the_policy_sets_the_engine_schedule_over_the_cluster_spec() -> None:
    # one worker, so routing cannot differ: the run equals the cluster-spec schedule it names
    wl = archetype_workload("long_short", 1.0, n_requests=40, seed=3)
    for name, schedule in (("vllm", "prefill_first"), ("sarathi", "hybrid")):
        other = "hybrid" if schedule == "prefill_first" else "prefill_first"
        by_policy = simulate(wl, colocated(1, other), make_policy(name), slo=SLO)
        by_spec = simulate(wl, colocated(1, schedule), make_policy("round_robin"), slo=SLO)
        pd.testing.assert_frame_equal(by_policy.requests, by_spec.requests)


def test_sarathi_chunk_size_reaches_the_engine() -> None:
    wl = archetype_workload("long_short", 1.0, n_requests=40, seed=3)
    by_policy = simulate(wl, colocated(1, "prefill_first"), Sarathi(chunk_tokens=128), slo=SLO)
    by_spec = simulate(
        wl, colocated(1, "hybrid", chunk_tokens=128), make_policy("round_robin"), slo=SLO
    )
    pd.testing.assert_frame_equal(by_policy.requests, by_spec.requests)


@pytest.mark.parametrize("budget", ["iteration", "prefill"])
def test_sarathi_chunk_budget_reaches_the_engine(budget: str) -> None:
    # Sarathi-Serve's iteration budget is the default; the old prefill-only budget a flag
    wl = archetype_workload("long_short", 1.0, n_requests=40, seed=3)
    kw = {} if budget == "iteration" else {"chunk_budget": budget}
    by_policy = simulate(
        wl, colocated(1, "prefill_first", chunk_budget="prefill"), Sarathi(128, **kw), slo=SLO
    )
    by_spec = simulate(
        wl,
        colocated(1, "hybrid", chunk_tokens=128, chunk_budget=budget),
        make_policy("round_robin"),
        slo=SLO,
    )
    pd.testing.assert_frame_equal(by_policy.requests, by_spec.requests)


def test_iteration_budget_prefills_slower_under_decode_load() -> None:
    # The same run under both meanings: sharing the budget with the decodes leaves fewer
    # prefill tokens per iteration, so TTFT is no lower, and higher on average.
    wl = archetype_workload("long_short", 1.5, n_requests=200, seed=1)
    runs = {
        b: simulate(wl, colocated(2), Sarathi(256, chunk_budget=b), slo=SLO).requests
        for b in ("iteration", "prefill")
    }
    assert runs["iteration"]["ttft_s"].mean() > runs["prefill"]["ttft_s"].mean()


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_decode_stays_on_the_prefill_worker_without_transfer(name: str) -> None:
    wl = archetype_workload("medium_medium", 1.0, n_requests=150, seed=1)
    q = simulate(wl, colocated(3), make_policy(name), slo=SLO).requests
    assert (q["status"] == "finished").all()
    assert (q["decode_worker"] == q["prefill_worker"]).all()
    assert (q["transfer_end_s"] == q["transfer_start_s"]).all()
    assert set(q["prefill_worker"]) == {"m0", "m1", "m2"}


def test_round_robin_routing_alternates_workers() -> None:
    wl = Workload([0.0, 0.01, 0.02, 0.03, 0.04, 0.05], [10] * 6, [2] * 6)
    q = simulate(wl, colocated(3), make_policy("vllm", prefill_routing="round_robin"), slo=SLO)
    assert q.requests["prefill_worker"].tolist() == ["m0", "m1", "m2"] * 2


def test_least_outstanding_avoids_the_busy_worker() -> None:
    # a long prompt occupies m0; the next two short ones go to m1 and m2
    wl = Workload([0.0, 0.01, 0.02], [4000, 10, 10], [2, 2, 2])
    q = simulate(wl, colocated(3), make_policy("vllm"), slo=SLO).requests
    assert q["prefill_worker"].tolist() == ["m0", "m1", "m2"]


def test_chunking_trades_ttft_for_tpot_on_long_prompts() -> None:
    # Sarathi-Serve's trade: prefill-priority (vLLM) stalls every running decode for a whole
    # ~1 s prefill, chunking bounds each iteration (lower P99 TPOT) but spreads a prompt over
    # several iterations (higher TTFT). Measured here: vLLM P99 TPOT ~0.25 s vs ~0.16 s.
    wl = archetype_workload("long_short", 1.5, n_requests=300, seed=1)
    v = simulate(wl, colocated(2), make_policy("vllm"), slo=SLO).requests
    s = simulate(wl, colocated(2), Sarathi(chunk_tokens=256), slo=SLO).requests
    assert s["tpot_s"].quantile(0.99) < 0.8 * v["tpot_s"].quantile(0.99)
    assert v["ttft_s"].median() < s["ttft_s"].median()


def test_bad_flags_are_rejected_with_the_rule() -> None:
    with pytest.raises(ParameterError, match="chunk_tokens"):
        Sarathi(chunk_tokens=0)
    with pytest.raises(ParameterError, match="chunk_budget"):
        Sarathi(chunk_budget="decode")
    with pytest.raises(ParameterError, match="chunk_budget"):
        make_policy("arrow", chunk_budget="both")
    with pytest.raises(ParameterError, match="prefill_routing"):
        make_policy("vllm", prefill_routing="random")
