"""The fluid simulator (issue 7) against the request-level simulator on the same inputs.

Measured (production mix 1024/256, 2 P + 6 D, least_loaded, 3,000-8,000 requests; fluid error):
throughput within 0.2%, mean TTFT within 2.3%, mean prefill queue within 5% at loads 0.3-0.8;
TPOT within 1%. Known gaps (not asserted): the mean queue at load 0.3 on 3 workers is 15% low
(0.017 vs 0.0145 requests), P99 E2E is 10-20% low at load 0.8, and heavy-tailed prompts
(ShareGPT-like) are far off: Allen–Cunneen overestimates the wait of least-work routing there.
Pool moves on a shock–recovery run: same first promotion, same members, same window as the
Phasor policy; the fluid model moves members 1.7 times as often (34 moves vs 20, see the test).
"""

from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ConfigError
from pdopt.fluid import FluidWorkload, simulate_fluid
from pdopt.fluid._core import drain_excess, lindley
from pdopt.policies import Phasor, make_policy
from pdopt.sim import simulate
from pdopt.workload import (
    ConstantLengths,
    archetype_workload,
    generate_workload,
    get_archetype,
    piecewise_rate_arrivals,
    shock_recovery_schedule,
)

COST = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
SLO = Slo(1.0, 0.1)
SERVICE_S = float(COST.prefill.request_time_s(1024))


def test_lindley_closed_form_equals_the_recursion() -> None:
    rng = np.random.default_rng(0)
    arrivals = rng.exponential(1.0, 500)
    cap = np.full(500, 1.05)
    for start in (0.0, 3.0):
        b, ref = start, []
        for a, c in zip(arrivals, cap, strict=True):
            b = max(0.0, b + a - c)
            ref.append(b)
        np.testing.assert_allclose(lindley(arrivals, cap, start), ref, atol=1e-9)


def test_excess_after_a_move_drains_behind_the_backlog_at_spare_capacity() -> None:
    """drain_excess against a tick-by-tick priority server: each tick's capacity serves the
    arrivals and the fluid backlog first, what is left serves the excess a move left behind."""
    rng = np.random.default_rng(1)
    work = rng.exponential(0.2, 400) * np.where(np.arange(400) < 150, 1.3, 0.7)
    cap = np.full(400, 0.2)
    for b0, e0 in ((0.0, 0.0), (0.0, 3.0), (2.0, 1.5)):
        b, e, ref = b0, e0, []
        for a, c in zip(work, cap, strict=True):
            served = min(b + a, c)
            b = b + a - served
            e -= min(e, c - served)
            ref.append(e)
        backlog = lindley(work, cap, b0)
        np.testing.assert_allclose(drain_excess(work, cap, backlog, b0, e0), ref, atol=1e-9)


def _compare(load: float, n_requests: int) -> dict[str, float]:
    rate = load * 2 / SERVICE_S
    wl = archetype_workload("production_mix", rate, n_requests=n_requests, seed=3)
    cluster = ClusterSpec.build(COST, 2, 6, kv_capacity_blocks=20000)
    des = simulate(wl, cluster, make_policy("least_loaded"), slo=SLO)
    m = des.metrics()
    ts = des.timeseries
    window = (ts["role"] == "prefill") & (ts["t_s"] <= wl.arrival_s[-1])
    queue = float(ts[window].groupby("t_s")["queue_len"].sum().mean())
    f = simulate_fluid(wl, cluster, Phasor(), slo=SLO, rate_window_s=1e9).metrics()
    return {
        "throughput": f["throughput_rps"] / m["throughput_rps"] - 1,
        "ttft": f["ttft_mean_s"] / m["ttft_mean_s"] - 1,
        "queue": f["prefill_queue_mean"] / queue - 1,
        "tpot": f["tpot_mean_s"] / m["tpot_mean_s"] - 1,
    }


@pytest.mark.parametrize("load", [0.5, 0.8])
def test_fluid_matches_the_discrete_event_simulator(load: float) -> None:
    errors = _compare(load, 3000)
    for name, err in errors.items():
        assert abs(err) < 0.10, (name, err)


@pytest.mark.slow
@pytest.mark.parametrize("load", [0.3, 0.5, 0.65, 0.8])
def test_fluid_matches_des_on_more_requests(load: float) -> None:
    errors = _compare(load, 8000)
    for name, err in errors.items():
        assert abs(err) < 0.10, (name, err)


def _shock_inputs() -> tuple[object, ClusterSpec]:
    arch = get_archetype("production_mix")
    sched = shock_recovery_schedule(10.0, 40.0, 90.0, 120.0, 210.0)
    arrivals = piecewise_rate_arrivals(sched, seed=1)
    wl = generate_workload(arrivals, arch.input_lengths, arch.output_lengths, seed=1)
    cluster = ClusterSpec.build(COST, 2, 4, 2, kv_capacity_blocks=4000, mixed_pool_role="decode")
    return wl, cluster


def test_shock_promotes_a_mixed_node_to_prefill_like_the_phasor_policy() -> None:
    """Phasor (request level, defrag off) promotes m0 then m1 to prefill at 90.95/91.00 s and
    sends the last one home at 122.6 s; the fluid model's first promotion must be the same
    member, the same direction, within 1 s, and no move happens before the shock."""
    wl, cluster = _shock_inputs()
    res = simulate_fluid(wl, cluster, Phasor(), slo=SLO, drain_s=20.0, rate_window_s=1.0)
    moves = res.events
    assert len(moves) > 0
    first = moves.iloc[0]
    assert first["worker"] == "m0"
    assert first["detail"] == "decode->prefill pool=prefill"
    assert 90.0 <= first["t_s"] <= 92.0
    assert (moves["t_s"] >= 90.0).all()
    last = moves.iloc[-1]
    assert last["detail"].endswith("pool=mixed") and last["t_s"] < 125.0


def _members_in_prefill(events: pd.DataFrame, t_s: np.ndarray) -> np.ndarray:
    """Mixed-pool members serving prefill at each instant of ``t_s`` (from pool_move rows)."""
    count = np.zeros_like(t_s)
    for _, moves in events[events["kind"] == "pool_move"].groupby("worker"):
        up = np.zeros_like(t_s)
        for t, detail in zip(moves["t_s"], moves["detail"], strict=True):
            up[t_s >= t] = 1.0 if detail.endswith("pool=prefill") else 0.0
        count += up
    return count


def test_shock_recovery_pool_decisions_match_the_phasor_policy() -> None:
    """Issue 7: "the same pool-promotion decisions on a shock–recovery run", against the
    request-level Phasor policy (defrag off, same θ_flow, T_cool and Φ_T SLO) on the same input.

    Agreement measured with the paper's rule (issue 15: no release of balanced members, T_cool
    from every move, promoted members evacuate their decodes in the DES): the first move is the
    same member in the same direction (DES 90.95 s, fluid 90.25 s), both promote both members
    during the shock (90–120 s) and nothing before it, both end with a return home (DES 125.30 s,
    fluid 121.15 s). The fluid model moves 34 times against the DES's 20 (1.7×; 86 vs 14 before
    issue 15). Since issue 18 the DES re-queues a preempted decode at the *front* of the prefill
    queue (vLLM's order): its recompute is served before waiting fresh prompts, which keeps the
    prefill backlog up a little longer and moves the DES's last return home from 123.75 s (18
    moves with ``preempted_requeue="back"``) to 125.30 s (20 moves); hence the window's end at
    the shock's end + 10 s and the 5 s bound on the last moves.

    Why the fluid model still moves more (measured): from about 106 s the decode pool is full in
    both models (Φ_S = 0), so the rule's verdict is the sign of Φ_T. In the DES a member promoted
    then cannot evacuate its decodes (no room elsewhere) and drains them in place for seconds (m0
    serves 24 prefills from 105 s to 110 s against 48–50 by p0 and p1 after its promotion at
    105.9 s); the policy counts that drain as prefill work, so Φ_T stays negative and
    nobody is sent home. Also, 162 decodes are preempted and recomputed on the prefill pool
    (17% of its busy time from 106 s to 120 s). The fluid model has neither: a promoted member
    serves prefill from the next tick, four workers serve the offered 3.4 worker-seconds per
    second, Φ_T reaches 0 and a member goes home, to come back after T_cool. The DES with
    ``kv_allocation="reserve_output"`` (no preemption) still moves only 20 times, so
    preemption explains few of the extra moves; the drain in place, which the fluid model
    does not model, is the likelier rest."""
    wl, cluster = _shock_inputs()
    des = simulate(wl, cluster, make_policy("phasor", defrag=False, ttft_slo_s=SLO.ttft_s),
                   slo=SLO, tick_s=0.05, record_timeseries=False)  # fmt: skip
    d_moves = des.events[des.events["kind"] == "pool_move"]
    f_moves = simulate_fluid(wl, cluster, Phasor(), slo=SLO, drain_s=20.0, rate_window_s=1.0).events
    for moves in (d_moves, f_moves):
        assert moves["t_s"].between(90.0, 130.0).all()
        assert moves["detail"].iloc[-1].endswith("pool=mixed")
        promoted = moves[moves["detail"].str.endswith("pool=prefill")]
        assert set(promoted["worker"]) == {"m0", "m1"}
    d0, f0 = d_moves.iloc[0], f_moves.iloc[0]
    assert (f0["worker"], f0["detail"]) == (d0["worker"], d0["detail"])
    assert abs(f0["t_s"] - d0["t_s"]) <= 1.0
    assert abs(f_moves["t_s"].iloc[-1] - d_moves["t_s"].iloc[-1]) <= 5.0
    assert len(f_moves) <= 2.0 * len(d_moves)
    t_s = np.arange(80.0, 135.0, 0.05)
    d_up, f_up = _members_in_prefill(d_moves, t_s), _members_in_prefill(f_moves, t_s)
    assert np.mean((d_up >= 1) == (f_up >= 1)) >= 0.9
    shock = (t_s >= 90.0) & (t_s < 125.0)
    assert 1.0 <= f_up[shock].mean() <= d_up[shock].mean()


def test_no_flow_control_means_no_moves() -> None:
    wl, cluster = _shock_inputs()
    res = simulate_fluid(wl, cluster, None, slo=SLO)
    assert res.events.empty and res.metrics()["pool_moves"] == 0
    off = simulate_fluid(wl, cluster, Phasor(mixed_pool=False), slo=SLO)
    assert off.metrics().equals(res.metrics())


def test_thresholds_are_the_policys_settings() -> None:
    """The macro rule runs with Phasor.settings(slo, tick): T_TTFT_SLO is the run's TTFT SLO
    unless the policy overrides it, T_cool is 20·Δt unless given."""
    wl, cluster = _shock_inputs()
    run = simulate_fluid(wl, cluster, Phasor(), slo=Slo(0.4, 0.1), drain_s=20.0)
    pinned = simulate_fluid(wl, cluster, Phasor(ttft_slo_s=0.4), slo=SLO, drain_s=20.0)
    assert run.events.equals(pinned.events)
    other = simulate_fluid(wl, cluster, Phasor(ttft_slo_s=3.0), slo=SLO, drain_s=20.0)
    assert not other.events.equals(pinned.events)
    cool = simulate_fluid(wl, cluster, Phasor(cool_s=1.0), slo=SLO, tick_s=0.05, drain_s=20.0)
    default = simulate_fluid(wl, cluster, Phasor(), slo=SLO, tick_s=0.05, drain_s=20.0)
    assert cool.events.equals(default.events)
    with pytest.raises(ConfigError, match="delta_t_s"):
        simulate_fluid(wl, cluster, Phasor(delta_t_s=0.1), slo=SLO, tick_s=0.05)
    with pytest.raises(ConfigError, match="Phasor"):
        simulate_fluid(wl, cluster, make_policy("least_loaded"), slo=SLO)  # type: ignore[arg-type]


def test_importing_the_fluid_model_does_not_load_the_event_engine() -> None:
    code = (
        "import sys, pdopt.fluid; "
        "print(sorted(m for m in sys.modules "
        "if m.startswith(('pdopt.sim.', 'pdopt.policies', 'pdopt.cluster'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout))
    # the fluid model shares specs, drivers, result columns and codes with the event engine,
    # never the engine itself (core, components, view, kernel, compiled engine) nor policies
    engine = {"_engine", "_core", "_control", "_migration", "_mixed", "_arrivals", "_links",
              "_view", "_kernel", "_prefill", "_decode", "_simulate", "_compiled"}  # fmt: skip
    policies = {m for m in loaded if m.startswith("pdopt.policies")}
    engine_loaded = {m for m in loaded if m.startswith("pdopt.sim.") and m.split(".")[2] in engine}
    assert not policies and not engine_loaded, loaded
    assert "pdopt.cluster._spec" in loaded


def test_same_seed_same_result_and_timeseries_shape() -> None:
    wl = archetype_workload("production_mix", 10.0, duration_s=30.0, seed=2)
    cluster = ClusterSpec.build(COST, 1, 2)
    a = simulate_fluid(wl, cluster, Phasor(), slo=SLO, seed=5)
    b = simulate_fluid(wl, cluster, Phasor(), slo=SLO, seed=5)
    assert a.metrics().equals(b.metrics())
    ts = a.timeseries
    assert set(ts["pool"]) == {"prefill", "decode"}
    assert len(ts) == 2 * len(FluidWorkload.from_workload(wl).rate_per_s)
    assert (ts["kv_used_blocks"] >= 0).all()


def test_overload_builds_a_backlog_that_drains() -> None:
    rate = np.r_[np.full(200, 2.0 / SERVICE_S), np.zeros(400)]  # 200% load for 10 s, then 0
    fw = FluidWorkload(rate, 0.05, np.full(8, 1024.0), np.full(8, 1.0))
    res = simulate_fluid(fw, ClusterSpec.build(COST, 1, 1), Phasor(), slo=SLO)
    q = res.timeseries.query("pool == 'prefill'")["queue_len"].to_numpy()
    # the fluid backlog peaks at 10 s of excess work (10 s / S requests); the stationary queue
    # at the capped utilisation 0.98 adds about 25 requests; all is gone by the end
    assert 10.0 / SERVICE_S < q.max() < 1.3 * 10.0 / SERVICE_S
    assert q[-1] < 1.0


def test_schedule_input_and_errors() -> None:
    fw = FluidWorkload.from_schedule(
        shock_recovery_schedule(), ConstantLengths(512), ConstantLengths(64), tick_s=0.1
    )
    assert len(fw.rate_per_s) == 2100 and fw.rate_per_s[1000] == 25.0
    with pytest.raises(ConfigError):
        simulate_fluid(fw, ClusterSpec.build(COST, 1, 1), Phasor(), slo=SLO, tick_s=0.05)
    with pytest.raises(ConfigError):
        FluidWorkload(np.array([-1.0]), 0.05, np.ones(1), np.ones(1))
