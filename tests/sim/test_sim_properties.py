"""Hypothesis invariants of the engine (issue 3, "Correctness")."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdopt.cluster import KV_ALLOCATIONS, ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import available_policies, make_policy
from pdopt.sim import simulate
from pdopt.testing.strategies import small_workloads, worker_limits
from pdopt.workload import Workload

COST = CostModel(PrefillModel(50.0, 1e9, 1e13, 1.0, 5e-4), DecodeModel(5e-3, 1e-4, 1e-7))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Workload, ClusterSpec, str]:
    wl = draw(small_workloads())
    cluster = ClusterSpec.build(
        COST,
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        **draw(worker_limits()),
        kv_bytes_per_token=1e4,
        link=LinkSpec("l", 1e9, 1e-4),
        kv_allocation=draw(st.sampled_from(KV_ALLOCATIONS)),
    )
    return wl, cluster, draw(st.sampled_from(available_policies()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants(case: tuple[Workload, ClusterSpec, str]) -> None:
    wl, cluster, name = case
    res = simulate(wl, cluster, make_policy(name), slo=Slo(1.0, 0.1), tick_s=0.01)
    req = res.requests
    # every request ends exactly once
    assert len(req) == len(wl)
    assert req["status"].isin(["finished", "rejected"]).all()
    rejected = req["status"] == "rejected"
    assert (req.loc[rejected, "reason"] != "").all()
    assert (res.events["kind"] == "rejection").sum() == rejected.sum()
    # a rejection is only for KV that can never fit
    cap_tokens = cluster.workers[0].kv_capacity_blocks * cluster.block_tokens
    need = np.where(
        req["output_tokens"] > 1,
        req["input_tokens"] + req["output_tokens"] - 1,
        req["input_tokens"],
    )
    np.testing.assert_array_equal(rejected.to_numpy(), need > cap_tokens)
    # timestamps ordered
    cols = [
        "arrival_s",
        "prefill_start_s",
        "prefill_end_s",
        "transfer_start_s",
        "transfer_end_s",
        "decode_start_s",
        "finish_s",
    ]
    done = req[~rejected]
    for row in done[cols].to_numpy():
        seen = row[~np.isnan(row)]
        assert np.all(np.diff(seen) >= 0), dict(zip(cols, row, strict=True))
    decodes = done["output_tokens"] > 1
    assert done.loc[decodes, cols].notna().all().all()
    assert done.loc[~decodes, ["transfer_start_s", "decode_start_s"]].isna().all().all()
    # KV within [0, capacity] at every sample
    ts = res.timeseries
    assert ts["kv_used_blocks"].between(0, cluster.workers[0].kv_capacity_blocks).all()
    assert (ts["kv_stranded_blocks"] <= ts["kv_free_blocks"]).all()
    # tokens conserved: finished requests emitted all their tokens, and TPOT says so
    assert (done["finish_s"] >= done["first_token_s"]).all()
    tpot = (done["finish_s"] - done["first_token_s"]) / (done["output_tokens"] - 1)
    np.testing.assert_allclose(done.loc[decodes, "tpot_s"], tpot[decodes])
    # reserved KV never grows, so nothing is preempted for it
    if cluster.workers[0].kv_allocation == "reserve_output":
        assert req["preemptions"].sum() == 0
    m = res.metrics()
    assert 0 <= m["slo_attainment"] <= 1


@st.composite
def scenarios_with_timeouts(draw: st.DrawFn) -> tuple[Workload, ClusterSpec, str, float]:
    """P/D runs as :func:`scenarios`, or colocated ones (both schedules, prefix caching on or
    off), with a client timeout short enough to catch requests in every state."""
    if draw(st.booleans()):
        wl, cluster, name = draw(scenarios())
    else:
        wl = draw(small_workloads())
        cluster = ClusterSpec.build(
            COST,
            0,
            0,
            draw(st.integers(1, 3)),
            **draw(worker_limits()),
            colocated_schedule=draw(st.sampled_from(["prefill_first", "hybrid"])),
            chunk_tokens=draw(st.integers(16, 256)),
            kv_allocation=draw(st.sampled_from(KV_ALLOCATIONS)),
        )
        name = draw(st.sampled_from(["vllm", "sarathi", "ecoserve"]))
    return wl, cluster, name, draw(st.floats(0.002, 0.5))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios_with_timeouts())
def test_invariants_with_client_timeouts(case: tuple[Workload, ClusterSpec, str, float]) -> None:
    """Clients that give up whatever the request's state (issue 34): every request still ends
    exactly once, an aborted one at its deadline, a finished one before it, and the KV stays
    within capacity as aborted requests release theirs."""
    wl, cluster, name, timeout = case
    res = simulate(
        wl, cluster, make_policy(name), slo=Slo(1.0, 0.1), tick_s=0.01, client_timeout_s=timeout
    )
    req = res.requests
    assert len(req) == len(wl)
    assert req["status"].isin(["finished", "rejected", "aborted"]).all()
    ended = res.events[res.events["kind"].isin(["abort", "rejection"])]
    assert ended["request_id"].is_unique  # one ending each
    aborted = req["status"] == "aborted"
    assert (res.events["kind"] == "abort").sum() == aborted.sum()
    late = req[aborted]
    np.testing.assert_allclose(late["finish_s"] - late["arrival_s"], timeout, rtol=1e-9)
    assert late["reason"].str.startswith("client timeout").all()
    # what an aborted request did, it did before its deadline (a KV transfer may end after it)
    for col in ("prefill_start_s", "first_token_s", "decode_start_s"):
        seen = late[col].notna()
        assert (late.loc[seen, col] <= late.loc[seen, "finish_s"] + 1e-12).all(), col
    done = req[req["status"] == "finished"]
    assert (done["finish_s"] - done["arrival_s"] <= timeout * (1 + 1e-9)).all()
    decodes = done["output_tokens"] > 1
    tpot = (done["finish_s"] - done["first_token_s"]) / (done["output_tokens"] - 1)
    np.testing.assert_allclose(done.loc[decodes, "tpot_s"], tpot[decodes])
    ts = res.timeseries
    assert ts["kv_used_blocks"].between(0, cluster.workers[0].kv_capacity_blocks).all()
    m = res.metrics()
    assert m["aborted"] == aborted.sum() and m["finished"] == len(done)
    assert m["slo_attainment"] <= len(done) / len(req)
