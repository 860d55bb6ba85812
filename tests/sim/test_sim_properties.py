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
