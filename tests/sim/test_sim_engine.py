"""Unit tests of the engine on tiny hand-checkable scenarios."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ConfigError, ParameterError
from pdopt.policies import make_policy
from pdopt.sim import ClosedLoop, MoveWorker, Policy, PolicyDecisionError, PolicyTraits, simulate
from pdopt.sim._links import Links
from pdopt.workload import Workload

# prefill: 1 ms + l * 0.1 ms (alpha = 0); decode: tau = 10 ms + 1 ms·B + 1 µs·C
COST = CostModel(PrefillModel(0.0, 1e9, 1e13, 1.0, 1e-3), DecodeModel(0.01, 1e-3, 1e-6))
SLO = Slo(1.0, 0.1)
LINK = LinkSpec("test", 1e9, 1e-3)


def cluster(n_p: int = 1, n_d: int = 1, **kw: object) -> ClusterSpec:
    opts: dict[str, object] = dict(kv_capacity_blocks=1000, kv_bytes_per_token=1e5, link=LINK)
    opts.update(kw)
    return ClusterSpec.build(COST, n_p, n_d, **opts)  # type: ignore[arg-type]


def test_single_request_timestamps_by_hand() -> None:
    wl = Workload([0.5], [100], [4])
    r = simulate(wl, cluster(), make_policy("round_robin"), slo=SLO).requests.iloc[0]
    prefill_end = 0.5 + 1e-3 + 100 * 1e-4
    assert r.prefill_start_s == 0.5
    assert r.prefill_end_s == pytest.approx(prefill_end, abs=1e-12)
    assert r.first_token_s == r.prefill_end_s
    transfer_end = prefill_end + 1e-3 + 100 * 1e5 / 1e9
    assert r.transfer_end_s == pytest.approx(transfer_end, abs=1e-12)
    assert r.decode_start_s == r.transfer_end_s
    # three iterations with B = 1 and contexts 101, 102, 103
    taus = [0.01 + 1e-3 + 1e-6 * c for c in (101, 102, 103)]
    assert r.finish_s == pytest.approx(transfer_end + sum(taus), abs=1e-12)
    assert r.tpot_s == pytest.approx((r.finish_s - r.first_token_s) / 3)
    assert r.status == "finished" and r.reason == ""


def test_one_output_token_finishes_at_prefill_end_without_decode() -> None:
    wl = Workload([0.0], [50], [1])
    r = simulate(wl, cluster(n_d=0), make_policy("round_robin"), slo=SLO).requests.iloc[0]
    assert r.finish_s == r.prefill_end_s == r.first_token_s
    assert math.isnan(r.transfer_start_s) and math.isnan(r.decode_start_s)
    assert math.isnan(r.tpot_s) and r.decode_worker == ""


def test_prefill_batch_respects_token_budget_and_cap() -> None:
    # four requests queued behind a long one; budget 250 tokens, cap 2 per batch
    wl = Workload([0.0, 0.001, 0.001, 0.001, 0.001], [1000, 100, 100, 100, 100], [1] * 5)
    res = simulate(
        wl,
        cluster(n_d=0, max_batch_tokens=250, max_batch_size=2),
        make_policy("round_robin"),
        slo=SLO,
    )
    starts = res.requests["prefill_start_s"].to_numpy()
    assert starts[1] == starts[2] > starts[0]  # batched together
    assert starts[3] == starts[4] > starts[2]
    assert res.requests["prefill_end_s"][0] == pytest.approx(1e-3 + 0.1)


def test_link_is_fifo() -> None:
    # a slow link (0.1 s of wire per request) behind a fast prefill (11 ms per request)
    wl = Workload([0.0, 0.0], [100, 100], [2, 2])
    slow = LinkSpec("slow", 1e8, 1e-3)
    res = simulate(wl, cluster(link=slow), make_policy("round_robin"), slo=SLO).requests
    wire = 100 * 1e5 / 1e8
    assert res.prefill_end_s[1] < res.transfer_end_s[0]
    assert res.transfer_start_s[1] == pytest.approx(res.transfer_start_s[0] + wire)
    assert res.transfer_end_s[1] == pytest.approx(res.transfer_end_s[0] + wire)


def test_request_that_never_fits_is_rejected_with_reason() -> None:
    wl = Workload([0.0, 0.1], [100, 5000], [10, 10])
    res = simulate(wl, cluster(kv_capacity_blocks=100), make_policy("round_robin"), slo=SLO)
    req = res.requests
    assert list(req["status"]) == ["finished", "rejected"]
    assert "exceeds" in req["reason"][1]
    assert (res.events["kind"] == "rejection").sum() == 1
    assert res.metrics()["slo_attainment"] == 0.5


def test_config_errors() -> None:
    wl = Workload([0.0], [10], [5])
    with pytest.raises(ConfigError, match="no decode worker"):
        simulate(wl, cluster(n_d=0), make_policy("round_robin"), slo=SLO)
    with pytest.raises(ConfigError, match="no prefill"):
        ClusterSpec.build(COST, 0, 2)
    with pytest.raises(ConfigError, match="no workers"):
        ClusterSpec((), 1.0)
    with pytest.raises(ConfigError):
        simulate(wl, cluster(), make_policy("round_robin"), slo=(1.0, 0.1))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        cluster(idle_power_w=500.0, max_power_w=100.0)


def test_preemption_is_counted_and_request_recomputed() -> None:
    # capacity 4 blocks of 16 tokens: both are admitted (2 blocks each), both cannot grow to 3
    wl = Workload([0.0, 0.0], [16, 16], [30, 30])
    res = simulate(
        wl, cluster(kv_capacity_blocks=4), make_policy("round_robin"), slo=SLO, tick_s=0.005
    )
    req = res.requests
    assert (req["status"] == "finished").all()
    assert req["preemptions"].sum() >= 1
    assert (res.events["kind"] == "preemption").sum() == req["preemptions"].sum()
    ts = res.timeseries
    assert ts["kv_used_blocks"].between(0, 4).all()


def test_determinism_and_no_side_effects() -> None:
    rng = np.random.default_rng(3)
    wl = Workload(
        np.cumsum(rng.exponential(0.01, 200)), rng.integers(1, 500, 200), rng.integers(1, 100, 200)
    )
    a = simulate(wl, cluster(2, 2), make_policy("least_loaded"), slo=SLO, seed=5)
    b = simulate(wl, cluster(2, 2), make_policy("least_loaded"), slo=SLO, seed=5)
    for name in ("requests", "timeseries", "events", "workers"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    pd.testing.assert_series_equal(a.metrics(), b.metrics())


def test_closed_loop_keeps_clients_in_flight() -> None:
    driver = ClosedLoop(3, 0.5, ([100, 200], [5, 1]), 9)
    res = simulate(driver, cluster(), make_policy("round_robin"), slo=SLO)
    req = res.requests
    assert len(req) == 9 and (req["status"] == "finished").all()
    assert (req["arrival_s"][:3] == 0).all()
    # each later request arrives think time after some request ended
    ends = np.sort(req["finish_s"].to_numpy())
    np.testing.assert_allclose(np.sort(req["arrival_s"][3:].to_numpy()), ends[:6] + 0.5)


def test_closed_loop_staggered_starts_by_hand() -> None:
    """Client i sends its first request at i · spread / clients; later ones a think time after
    an end. One output token: a request ends at its prefill end, 1 ms + 100 · 0.1 ms later."""
    driver = ClosedLoop(4, 10.0, ([100], [1]), 8, start_spread_s=2.0)
    req = simulate(driver, cluster(), make_policy("round_robin"), slo=SLO).requests
    assert req["arrival_s"][:4].tolist() == [0.0, 0.5, 1.0, 1.5]
    np.testing.assert_allclose(req["finish_s"][:4], req["arrival_s"][:4] + 0.011, atol=1e-12)
    np.testing.assert_allclose(req["arrival_s"][4:], req["finish_s"][:4].to_numpy() + 10.0)
    # more clients than requests: only the first n_requests clients send
    few = ClosedLoop(4, 0.0, ([100], [1]), 2, start_spread_s=2.0)
    assert few.first_send_s().tolist() == [0.0, 0.5]
    with pytest.raises(ParameterError, match="start_spread_s"):
        ClosedLoop(4, 0.0, ([100], [1]), 8, start_spread_s=-1.0)


def test_timeseries_and_metrics_columns() -> None:
    wl = Workload([0.0, 0.02], [300, 300], [40, 40])
    res = simulate(
        wl,
        cluster(2, 1, idle_power_w=50.0, max_power_w=250.0),
        make_policy("round_robin"),
        slo=SLO,
        tick_s=0.01,
    )
    ts = res.timeseries
    assert set(ts["worker"]) == {"p0", "p1", "d0"}
    assert ts["busy_frac"].between(0, 1).all()
    assert ts["power_w"].between(50, 250).all()
    m = res.metrics()
    for key in (
        "ttft_p99_s",
        "tpot_p50_s",
        "e2e_p90_s",
        "ttft_mean_s",
        "slo_attainment",
        "goodput_rps",
        "throughput_rps",
        "fragmentation_pct",
        "false_oom",
        "preemptions",
        "energy_per_output_token_j",
    ):
        assert key in m.index
    busy = res.workers.set_index("worker")["busy_s"]
    assert busy["p0"] == pytest.approx(1e-3 + 300 * 1e-4)
    energy = (50 * res.makespan_s * 3 + 200 * busy.sum()) / 80
    assert m["energy_per_output_token_j"] == pytest.approx(energy)


class Bad(Policy):
    name = "bad"

    def __init__(self, prefill: object = 0, decode: object = 1) -> None:
        self.p, self.d = prefill, decode

    def route_prefill(self, request, view):  # type: ignore[no-untyped-def]
        return self.p

    def route_decode(self, request, view):  # type: ignore[no-untyped-def]
        return self.d


@pytest.mark.parametrize(
    ("p", "d", "match"),
    [
        (1, 1, "role is decode"),
        (7, 1, "valid indices"),
        ("x", 1, "index"),
        (0, 0, "role is prefill"),
    ],
)
def test_invalid_decisions_name_the_policy(p: object, d: object, match: str) -> None:
    with pytest.raises(PolicyDecisionError, match=f"'bad'.*{match}"):
        simulate(Workload([0.0], [10], [3]), cluster(), Bad(p, d), slo=SLO)


class Mover(Policy):
    """Round-robin routing; at the first tick moves decode worker 2 to the prefill pool."""

    name = "mover"
    TRAITS = PolicyTraits(wants_ticks=True)

    def start(self, ctx):  # type: ignore[no-untyped-def]
        self.k = 0
        self.moved = False

    def route_prefill(self, request, view):  # type: ignore[no-untyped-def]
        self.k += 1
        idx = view.prefill_workers
        return int(idx[self.k % len(idx)])

    def route_decode(self, request, view):  # type: ignore[no-untyped-def]
        idx = view.decode_workers
        return int(idx[request.request_id % len(idx)])

    def on_tick(self, view):  # type: ignore[no-untyped-def]
        if self.moved:
            return ()
        self.moved = True
        return [MoveWorker(2, "prefill", "prefill")]


@pytest.mark.parametrize(("link", "tick_s"), [(LINK, 0.05), (LinkSpec("slow", 1e8, 0.02), 0.2)])
def test_move_worker_drains_and_changes_role(link: LinkSpec, tick_s: float) -> None:
    # the slow link keeps KV transfers to d1 in flight when d1 leaves the decode pool
    rng = np.random.default_rng(0)
    wl = Workload(
        np.cumsum(rng.exponential(0.005, 100)), rng.integers(10, 300, 100), rng.integers(2, 50, 100)
    )
    res = simulate(wl, cluster(1, 2, link=link), Mover(), slo=SLO, tick_s=tick_s)
    assert (res.requests["status"] == "finished").all()
    moves = res.events[res.events["kind"] == "pool_move"]
    assert list(moves["worker"]) == ["d1"]
    assert res.workers.set_index("worker").loc["d1", "role"] == "prefill"
    late = res.requests[res.requests["arrival_s"] > 2 * tick_s]
    assert (late["prefill_worker"] == "d1").any()


def test_links_queue_copies_fifo_with_overlapping_latency() -> None:
    cluster = ClusterSpec.build(COST, 1, 1, link=LinkSpec("l", 100.0, 0.5))
    links = Links(cluster)
    assert links.send(0, 1, 200.0, 1.0) == (1.0, 3.5)  # wire 2 s, latency 0.5 s
    assert links.send(0, 1, 100.0, 1.5) == (3.0, 4.5)  # waits for the wire, not the latency
    assert links.send(1, 0, 100.0, 1.5) == (1.5, 3.0)  # the reverse link is another wire


class Probe(Policy):
    """Round-robin routing that checks, in every call, that the view's arrays are shared within
    the call and equal to a fresh computation (the view's per-call memo, pdopt.sim._view)."""

    name = "probe"
    TRAITS = PolicyTraits(wants_ticks=True)

    def start(self, ctx):  # type: ignore[no-untyped-def]
        self.k = 0
        self.used: list[tuple[float, list[int]]] = []

    def _check(self, view):  # type: ignore[no-untyped-def]
        shared = [view.kv_used_blocks, view.kv_free_blocks, view.running, view.queued_prefill_flop]
        assert view.kv_used_blocks is shared[0] and view.kv_free_blocks is shared[1]
        assert view.running_contexts(1) == view.running_contexts(1)  # equal copies of one memo
        view.close_call()  # what an engine check outside a policy call would read
        fresh = [view.kv_used_blocks, view.kv_free_blocks, view.running, view.queued_prefill_flop]
        assert view.kv_used_blocks is not fresh[0]
        view.open_call()
        for a, b in zip(shared, fresh, strict=True):
            np.testing.assert_array_equal(a, b)
        run = view.running_requests(1)
        np.testing.assert_array_equal(run["request_id"], view.running_contexts(1)["request_id"])
        self.used.append((view.now_s, shared[0].tolist()))

    def route_prefill(self, request, view):  # type: ignore[no-untyped-def]
        self._check(view)
        return 0

    def route_decode(self, request, view):  # type: ignore[no-untyped-def]
        self._check(view)
        return 1

    def on_tick(self, view):  # type: ignore[no-untyped-def]
        self._check(view)
        return ()


def test_view_arrays_are_shared_within_a_call_and_current_across_calls() -> None:
    rng = np.random.default_rng(3)
    wl = Workload(
        np.cumsum(rng.exponential(0.01, 60)), rng.integers(10, 300, 60), rng.integers(2, 80, 60)
    )
    probe = Probe()
    res = simulate(wl, cluster(1, 1), probe, slo=SLO, tick_s=0.01)
    assert (res.requests["status"] == "finished").all()
    seen = {tuple(used) for _, used in probe.used}
    assert len(seen) > 10  # the KV use moved between calls: no call saw a stale memo
