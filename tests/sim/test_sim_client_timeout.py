"""Client timeouts (issue 34, item 3): a client gives up ``client_timeout_s`` after its request's
arrival whatever the request's state (queued, in prefill, in a KV transfer, waiting for decode
admission, decoding); the request ends aborted at that deadline (a failure, out of the latency
metrics) and what it holds is freed, so the freed KV admits others; without a timeout runs are
unchanged; every request ends exactly once."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
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


def states(res) -> list[str]:  # type: ignore[no-untyped-def]
    """Each request's state when its client gave up ("" when it did not)."""
    reason = res.requests["reason"]
    return [
        r.rsplit("(", 1)[1].rstrip(")") if r.startswith("client timeout") else "" for r in reason
    ]


def test_pd_requests_past_the_timeout_are_aborted_queued_or_in_prefill() -> None:
    cluster = ClusterSpec.build(COST, 1, 1, max_batch_size=1)
    res = simulate(overloaded(), cluster, make_policy("round_robin"), slo=SLO, client_timeout_s=4.5)
    q = res.requests
    # batches of one, 1 s each: prompts 0-3 are served by 4.02 s; prompt 4's prefill (4-5 s)
    # is in flight at 4.5 s, the rest are still queued
    assert q["status"].tolist() == ["finished"] * 4 + ["aborted"] * 16
    assert states(res) == [""] * 4 + ["in prefill"] + ["queued for prefill"] * 15
    aborted = q[q["status"] == "aborted"]
    assert (aborted["finish_s"] == 4.5).all()
    assert q.loc[4, "prefill_start_s"] == 4.0 and np.isnan(q.loc[4, "first_token_s"])
    assert aborted["prefill_start_s"].iloc[1:].isna().all()
    metrics = res.metrics()
    assert metrics["aborted"] == 16 and metrics["finished"] == 4
    assert metrics["slo_attainment"] <= 4 / 20


def test_colocated_decodes_stalled_behind_prefills_are_aborted_too() -> None:
    """vLLM's prefill-first schedule stalls the running decodes while prompts wait: at 4.5 s
    prompts 0-3 hold their first token and are aborted while decoding."""
    cluster = ClusterSpec.build(COST, 0, 0, 1, max_batch_size=1)
    res = simulate(overloaded(), cluster, make_policy("vllm"), slo=SLO, client_timeout_s=4.5)
    q = res.requests
    assert (q["status"] == "aborted").all() and (q["finish_s"] == 4.5).all()
    assert states(res) == ["decoding"] * 4 + ["in prefill"] + ["queued for prefill"] * 15
    assert q["first_token_s"].iloc[:4].tolist() == [1.0, 2.0, 3.0, 4.0]
    metrics = res.metrics()
    assert metrics["aborted"] == 20 and metrics["finished"] == 0
    assert metrics["slo_attainment"] == 0 and np.isnan(metrics["ttft_mean_s"])


def test_a_request_aborted_while_decoding_frees_its_kv_for_a_waiting_one() -> None:
    """A (1000 output tokens) decodes from ~1 s and holds the KV that B (ready at 2 s) needs;
    A's client gives up at 3 s: A leaves at the next iteration boundary and B is admitted
    there, instead of at A's finish near 11 s."""
    wl = Workload(np.array([0.0, 0.5]), np.array([1000, 1000]), np.array([1000, 3]))
    cluster = ClusterSpec.build(COST, 1, 1, kv_capacity_blocks=125)  # one request's KV at a time
    base = simulate(wl, cluster, make_policy("round_robin"), slo=SLO).requests
    res = simulate(wl, cluster, make_policy("round_robin"), slo=SLO, client_timeout_s=3.0)
    q = res.requests
    assert base["status"].tolist() == ["finished"] * 2 and base.loc[1, "decode_start_s"] > 10.9
    assert q["status"].tolist() == ["aborted", "finished"]
    assert states(res) == ["decoding", ""] and q.loc[0, "finish_s"] == 3.0
    # B is admitted at A's first iteration boundary after 3 s (A's steps are 10 ms apart)
    step = 0.01
    boundary = (
        q.loc[0, "decode_start_s"] + np.ceil((3.0 - q.loc[0, "decode_start_s"]) / step) * step
    )
    assert q.loc[1, "decode_start_s"] == pytest.approx(boundary, abs=1e-9)
    assert 3.0 <= q.loc[1, "decode_start_s"] < 3.0 + step
    # the aborted request's first token is out of the latency metrics, as queued aborts are
    metrics = res.metrics()
    assert metrics["aborted"] == 1 and metrics["finished"] == 1
    assert metrics["ttft_mean_s"] == pytest.approx(q.loc[1, "ttft_s"])
    assert metrics["e2e_mean_s"] == pytest.approx(q.loc[1, "e2e_s"])


def test_aborts_waiting_for_decode_admission_and_in_a_kv_transfer() -> None:
    # B (2000-token prompt, ready ~2 s) waits for the KV that A (short prompt, 1000 outputs,
    # decoding from ~0.2 s) holds; B's client leaves at 3 s, then A's at 3.1 s
    wl = Workload(np.array([0.0, 0.1]), np.array([2000, 100]), np.array([3, 1000]))
    cluster = ClusterSpec.build(COST, 2, 1, kv_capacity_blocks=140)
    res = simulate(wl, cluster, make_policy("round_robin"), slo=SLO, client_timeout_s=3.0)
    q = res.requests
    assert states(res) == ["waiting for decode admission", "decoding"]
    assert q["finish_s"].tolist() == [3.0, 3.1] and np.isnan(q.loc[0, "decode_start_s"])
    # a 5 s link: the KV is still in flight when the client leaves; it is dropped on arrival
    slow = ClusterSpec.build(COST, 1, 1, link=LinkSpec("slow", 1e12, 5.0))
    one = Workload(np.array([0.0]), np.array([1000]), np.array([10]))
    res = simulate(one, slow, make_policy("round_robin"), slo=SLO, client_timeout_s=3.0)
    q = res.requests
    assert states(res) == ["in KV transfer"] and q.loc[0, "finish_s"] == 3.0
    assert q.loc[0, "transfer_end_s"] > 6.0 and np.isnan(q.loc[0, "decode_start_s"])


def test_a_chunked_prompt_aborted_in_prefill_frees_its_kv_at_the_iteration_end() -> None:
    """Sarathi-style chunks of 512 tokens (~0.5 s each): a 4000-token prompt holds its whole
    KV from its first chunk, so a second prompt cannot start; the first's client leaves at
    1.2 s, during its third chunk, and the second starts when that iteration ends."""
    wl = Workload(np.array([0.0, 1.3]), np.array([4000, 300]), np.array([3, 3]))
    cluster = ClusterSpec.build(
        COST, 0, 0, 1, kv_capacity_blocks=300, colocated_schedule="hybrid", chunk_tokens=512
    )
    policy = make_policy("sarathi", chunk_tokens=512)
    base = simulate(wl, cluster, policy, slo=SLO).requests
    res = simulate(
        wl, cluster, make_policy("sarathi", chunk_tokens=512), slo=SLO, client_timeout_s=1.2
    )
    q = res.requests
    assert base.loc[1, "prefill_start_s"] > 3.5
    assert states(res) == ["in prefill", ""] and q["status"].tolist() == ["aborted", "finished"]
    assert 1.3 <= q.loc[1, "prefill_start_s"] < 1.6 and q.loc[1, "finish_s"] < 2.5


def test_aborts_during_migrations_end_them_and_free_both_sides() -> None:
    """Phasor migrates running requests between decode workers: clients that give up during a
    pre-copy cancel it (the request then leaves its source at a boundary), during the
    stop-and-copy or before joining free both sides' holds at once; every request still ends
    once and the KV stays within capacity."""
    cost = CostModel(PrefillModel(50.0, 1e9, 1e13, 1.0, 5e-4), DecodeModel(5e-3, 1e-4, 1e-7))
    cluster = ClusterSpec.build(
        cost, 1, 3, kv_capacity_blocks=50, kv_bytes_per_token=1e5, link=LinkSpec("l", 1e9, 1e-3)
    )
    cancelled = migrating = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)
        n = 60
        wl = Workload(
            np.cumsum(rng.exponential(0.01, n)), rng.integers(1, 400, n), rng.integers(1, 300, n)
        )
        res = simulate(
            wl, cluster, make_policy("phasor"), slo=Slo(1.0, 0.1), tick_s=0.01,
            record_timeseries=True, client_timeout_s=0.3,
        )  # fmt: skip
        q, ev = res.requests, res.events
        assert q["status"].isin(["finished", "aborted"]).all()
        assert ev.loc[ev["kind"] == "abort", "request_id"].is_unique
        assert (res.timeseries["kv_used_blocks"] <= 50).all()
        cancelled += int(
            ((ev["kind"] == "migration_cancel") & (ev["detail"] == "client timeout")).sum()
        )
        migrating += states(res).count("migrating")
    assert cancelled > 0 and migrating > 0


def test_without_a_timeout_runs_are_unchanged_and_a_long_one_changes_nothing() -> None:
    for cluster, name in (
        (ClusterSpec.build(COST, 1, 1, max_batch_size=1), "round_robin"),
        (ClusterSpec.build(COST, 0, 0, 1, colocated_schedule="hybrid"), "sarathi"),
    ):
        base = simulate(overloaded(), cluster, make_policy(name), slo=SLO)
        late = simulate(overloaded(), cluster, make_policy(name), slo=SLO, client_timeout_s=1e6)
        pd.testing.assert_frame_equal(base.requests, late.requests)
    with pytest.raises(ConfigError, match="client timeouts under Arrow's"):
        simulate(
            overloaded(),
            ClusterSpec.build(COST, 1, 2),
            make_policy("arrow"),
            slo=SLO,
            client_timeout_s=1.0,
            engine="compiled",
        )


def _timeout_cases() -> list[tuple[Workload, ClusterSpec, str, dict, float, float]]:
    """Runs whose clients give up in every state, with their control tick (this file's cases,
    random bursts on a disaggregated and on a colocated cluster, vLLM's and Sarathi's
    schedules, and Phasor's migrations)."""
    rng = np.random.default_rng(7)
    n = 120
    burst = Workload(
        np.cumsum(rng.exponential(0.05, n)), rng.integers(50, 1500, n), rng.integers(1, 200, n)
    )
    hybrid = ClusterSpec.build(
        COST, 0, 0, 2, kv_capacity_blocks=300, colocated_schedule="hybrid", chunk_tokens=512
    )
    cases: list = [
        (overloaded(), ClusterSpec.build(COST, 1, 1, max_batch_size=1), "round_robin", {}, 4.5),
        (overloaded(), ClusterSpec.build(COST, 0, 0, 1, max_batch_size=1), "vllm", {}, 4.5),
        (
            Workload(np.array([0.0, 0.1]), np.array([2000, 100]), np.array([3, 1000])),
            ClusterSpec.build(COST, 2, 1, kv_capacity_blocks=140),
            "round_robin", {}, 3.0,
        ),
        (
            Workload(np.array([0.0]), np.array([1000]), np.array([10])),
            ClusterSpec.build(COST, 1, 1, link=LinkSpec("slow", 1e12, 5.0)),
            "round_robin", {}, 3.0,
        ),
        (
            Workload(np.array([0.0, 1.3]), np.array([4000, 300]), np.array([3, 3])),
            ClusterSpec.build(
                COST, 0, 0, 1, kv_capacity_blocks=300, colocated_schedule="hybrid",
                chunk_tokens=512,
            ),
            "sarathi", {"chunk_tokens": 512}, 1.2,
        ),
        (burst, ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=200), "least_loaded", {}, 2.0),
        (burst, ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=200), "distserve", {}, 2.5),
        (burst, hybrid, "sarathi", {"chunk_tokens": 512}, 1.5),
        (burst, ClusterSpec.build(COST, 0, 0, 2, kv_capacity_blocks=300), "vllm", {}, 2.0),
    ]  # fmt: skip
    cases = [(*case, 0.25) for case in cases]
    # Phasor's migrations (test_aborts_during_migrations_end_them_and_free_both_sides's runs)
    cost = CostModel(PrefillModel(50.0, 1e9, 1e13, 1.0, 5e-4), DecodeModel(5e-3, 1e-4, 1e-7))
    cluster = ClusterSpec.build(
        cost, 1, 3, kv_capacity_blocks=50, kv_bytes_per_token=1e5, link=LinkSpec("l", 1e9, 1e-3)
    )
    for seed in range(3):
        rng = np.random.default_rng(seed)
        wl = Workload(
            np.cumsum(rng.exponential(0.01, 60)), rng.integers(1, 400, 60), rng.integers(1, 300, 60)
        )
        cases.append((wl, cluster, "phasor", {}, 0.3, 0.01))
    return cases


def test_the_compiled_engine_aborts_as_the_python_engine_in_every_state(no_fallback) -> None:
    """``engine="compiled"`` with client timeouts gives the Python engine's result bit for bit
    (requests, reasons, event log, time series, workers, makespan), without handing the run
    back; across the cases clients give up in every state a request can be in, migrating
    included (migrations cancelled by a client too)."""
    from tests.sim.test_sim_compiled import assert_identical

    seen: set[str] = set()
    cancels = 0
    for wl, cluster, name, flags, timeout, tick_s in _timeout_cases():
        runs = []
        for engine in ("python", "compiled"):
            no_fallback["compiled"] = engine == "compiled"
            try:
                runs.append(
                    simulate(
                        wl,
                        cluster,
                        make_policy(name, **flags),
                        slo=SLO,
                        client_timeout_s=timeout,
                        record_timeseries=True,
                        tick_s=tick_s,
                        engine=engine,
                    )
                )
            finally:
                no_fallback["compiled"] = False
        python, compiled = runs
        assert_identical(python, compiled)
        seen |= set(states(python)) - {""}
        ev = python.events
        cancels += int(
            ((ev["kind"] == "migration_cancel") & (ev["detail"] == "client timeout")).sum()
        )
    assert seen == {
        "queued for prefill",
        "in prefill",
        "in KV transfer",
        "waiting for decode admission",
        "decoding",
        "migrating",
    }
    assert cancels > 0


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
    assert (res.events["kind"] == "abort").sum() == len(aborted)
    # a finished request finished before its client gave up
    done = q[q["status"] == "finished"]
    assert (done["finish_s"] - done["arrival_s"] <= timeout + 1e-9).all()


def test_a_scenario_carries_the_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pdopt.scenario import Scenario

    cluster = ClusterSpec.build(COST, 1, 1, max_batch_size=1)
    sc = Scenario(overloaded(), cluster, "round_robin", SLO, client_timeout_s=4.5)
    assert sc.run().metrics()["aborted"] == 16
    back = Scenario.from_toml(sc.to_toml(tmp_path / "s.toml"))
    assert back.client_timeout_s == 4.5 and back == sc


def test_a_chunked_prompt_given_up_during_its_iteration_releases_its_cached_blocks(
    no_fallback,
) -> None:
    """One Sarathi worker (16-token chunks, 12 blocks) with prefix caching. Request 1 hits the
    4 blocks request 0 left cached and its client gives up while a chunk of it is in flight:
    dropped when that iteration ends, it releases its references to those blocks as any other
    dropped prompt does (before, it kept them for good: never evicted, request 4 found 63 of
    its 64 tokens cached, 0 evictions). Both engines alike."""
    from pdopt.cluster import Role, WorkerSpec
    from pdopt.workload import PrefixBlocks
    from tests.sim.test_sim_compiled import COST as TWIN_COST
    from tests.sim.test_sim_compiled import assert_identical

    lists = [
        [1, 2, 3, 4],
        [1, 2, 3, 4, 10, 11, 12, 13, 14, 15],
        [20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
        [30, 31, 32, 33, 34, 35, 36],
        [1, 2, 3, 4],
    ]
    wl = Workload(
        np.array([0.0, 0.05, 0.2, 0.3, 0.4]),
        np.array([len(keys) * 16 for keys in lists]),
        np.ones(5, dtype=np.int64),
        prefix_blocks=PrefixBlocks.from_lists(lists, 16),
    )
    worker = WorkerSpec(
        "m0", Role.MIXED, TWIN_COST, colocated_schedule="hybrid", chunk_tokens=16,
        kv_capacity_blocks=12, block_tokens=16, max_batch_tokens=512, max_batch_size=4,
        max_running=4,
    )  # fmt: skip
    cluster = ClusterSpec((worker,), kv_bytes_per_token=2e5, prefix_caching=True)
    runs = []
    for engine in ("python", "compiled"):
        no_fallback["compiled"] = engine == "compiled"
        try:
            policy, timeout = make_policy("sarathi"), 0.025
            run = simulate(wl, cluster, policy, slo=SLO, client_timeout_s=timeout, engine=engine)
            runs.append(run)
        finally:
            no_fallback["compiled"] = False
    python, compiled = runs
    assert_identical(python, compiled)
    assert states(python)[1] == "in prefill" and python.requests["cached_tokens"][1] == 64
    assert python.requests["cached_tokens"][4] == 32
    assert int(python.workers["prefix_evictions"].iloc[0]) == 2
