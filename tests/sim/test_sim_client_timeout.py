"""Client timeouts (issue 34, item 3): a request still waiting for its first prefill when its
client gives up leaves the queue aborted (a miss, nothing held); one in service runs to its end;
without a timeout runs are unchanged; every request ends exactly once."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ConfigError
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.workload import Workload

SLO = Slo(2.0, 0.5)
# 1 s per 1000-token prompt, 10 ms per decode step
COST = CostModel(PrefillModel(0.0, 1e9, 1e12, 1.0, 0.0), DecodeModel(0.01, 0.0, 0.0))


def overloaded(n: int = 20) -> Workload:
    """``n`` 1000-token prompts at once: prefill alone takes 1 s each, FCFS on one worker."""
    return Workload(np.zeros(n), np.full(n, 1000), np.full(n, 3))


@pytest.mark.parametrize("kind", ["pd", "mixed"])
def test_queued_requests_past_the_timeout_are_aborted(kind: str) -> None:
    cluster = (
        ClusterSpec.build(COST, 1, 1, max_batch_size=1)
        if kind == "pd"
        else ClusterSpec.build(COST, 0, 0, 1, max_batch_size=1)
    )
    policy = make_policy("round_robin" if kind == "pd" else "vllm")
    res = simulate(overloaded(), cluster, policy, slo=SLO, client_timeout_s=4.5)
    q = res.requests
    status = q["status"].tolist()
    # batches of one, 1 s each: prompts 0-4 start by 4.0 s (< 4.5 s), the rest time out queued
    assert status[:5] == ["finished"] * 5 and status[5:] == ["aborted"] * 15
    aborted = q[q["status"] == "aborted"]
    assert (aborted["finish_s"] == 4.5).all() and aborted["prefill_start_s"].isna().all()
    assert aborted["reason"].str.startswith("client timeout").all()
    metrics = res.metrics()
    assert metrics["aborted"] == 15 and metrics["finished"] == 5
    assert metrics["slo_attainment"] <= 5 / 20


def test_without_a_timeout_runs_are_unchanged_and_a_long_one_changes_nothing() -> None:
    cluster = ClusterSpec.build(COST, 1, 1, max_batch_size=1)
    base = simulate(overloaded(), cluster, make_policy("round_robin"), slo=SLO)
    late = simulate(
        overloaded(), cluster, make_policy("round_robin"), slo=SLO, client_timeout_s=1e6
    )
    pd.testing.assert_frame_equal(base.requests, late.requests)
    with pytest.raises(ConfigError, match="compiled"):
        simulate(
            overloaded(),
            cluster,
            make_policy("round_robin"),
            slo=SLO,
            client_timeout_s=1.0,
            engine="compiled",
        )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 1000),
    timeout=st.floats(0.05, 20.0),
    kind=st.sampled_from(["round_robin", "vllm", "sarathi"]),
)
def test_every_request_ends_once(seed: int, timeout: float, kind: str) -> None:
    rng = np.random.default_rng(seed)
    n = 60
    wl = Workload(
        np.sort(rng.uniform(0, 10, n)), rng.integers(100, 3000, n), rng.integers(1, 50, n)
    )
    cluster = (
        ClusterSpec.build(COST, 1, 1, kv_capacity_blocks=600)
        if kind == "round_robin"
        else ClusterSpec.build(COST, 0, 0, 2, kv_capacity_blocks=600, colocated_schedule="hybrid")
    )
    res = simulate(wl, cluster, make_policy(kind), slo=SLO, client_timeout_s=timeout)
    q = res.requests
    assert len(q) == n and q["status"].isin(["finished", "aborted", "rejected"]).all()
    aborted = q[q["status"] == "aborted"]
    assert (aborted["finish_s"] - aborted["arrival_s"]).round(9).eq(round(timeout, 9)).all()
    # a finished request started its prefill before its client gave up
    done = q[q["status"] == "finished"]
    assert (done["prefill_start_s"] - done["arrival_s"] <= timeout + 1e-9).all()


def test_a_scenario_carries_the_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pdopt.scenario import Scenario

    cluster = ClusterSpec.build(COST, 1, 1, max_batch_size=1)
    sc = Scenario(overloaded(), cluster, "round_robin", SLO, client_timeout_s=4.5)
    assert sc.run().metrics()["aborted"] == 15
    back = Scenario.from_toml(sc.to_toml(tmp_path / "s.toml"))
    assert back.client_timeout_s == 4.5 and back == sc
