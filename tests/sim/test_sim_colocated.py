"""Mixed (colocated) workers: both schedules by hand, chunk accounting, phases, moves."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, LinkSpec, Slo, WorkerSpec
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ParameterError
from pdopt.policies import make_policy
from pdopt.sim import (
    Action,
    ClusterView,
    MoveWorker,
    Policy,
    PolicyDecisionError,
    PolicyTraits,
    RequestInfo,
    RunContext,
    SetPhase,
    simulate,
)
from pdopt.sim._prefill import PrefillSide
from pdopt.testing.strategies import small_workloads, worker_limits
from pdopt.workload import Workload

SLO = Slo(1.0, 0.1)
T0 = 0.01  # prefill intercept, s
# prefill: 10 ms + l · 1 ms (alpha = 0); decode: tau = 10 ms + 1 ms · B (d2 = 0)
FLAT = CostModel(PrefillModel(0.0, 1e9, 1e12, 1.0, T0), DecodeModel(0.01, 1e-3, 0.0))
# with attention (alpha > 0) and a context term, for chunk accounting
ALPHA, BETA, PEAK = 1e6, 1e9, 1e12
QUAD = CostModel(PrefillModel(ALPHA, BETA, PEAK, 1.0, T0), DecodeModel(0.01, 1e-3, 1e-5))


def work(done: int, c: int) -> float:
    """Chunk work by hand: alpha·((d+c)² − d²) + beta·c."""
    return ALPHA * ((done + c) ** 2 - done**2) + BETA * c


def mixed(
    cost: CostModel, n: int = 1, schedule: str = "prefill_first", **kw: object
) -> ClusterSpec:
    opts: dict[str, object] = dict(
        kv_capacity_blocks=1000, kv_bytes_per_token=1e5, link=LinkSpec("l", 1e9, 1e-3)
    )
    opts.update(kw)
    return ClusterSpec.build(cost, 0, 0, n, colocated_schedule=schedule, **opts)  # type: ignore[arg-type]


def row(res: object, i: int) -> pd.Series:
    return res.requests.iloc[i]  # type: ignore[attr-defined, no-any-return]


# -- prefill_first (vLLM) -------------------------------------------------------------------------
def test_prefill_first_by_hand_decode_stalls_for_a_prefill() -> None:
    # A prefills alone [0, 0.11]; B (arrived at 0.05) is prefilled next [0.11, 0.32] while A,
    # admitted at 0.11, stalls; then both decode at tau(2) = 12 ms, A alone at tau(1) = 11 ms.
    wl = Workload([0.0, 0.05], [100, 200], [5, 3])
    res = simulate(wl, mixed(FLAT), make_policy("round_robin"), slo=SLO)
    a, b = row(res, 0), row(res, 1)
    assert a.prefill_end_s == pytest.approx(0.11)
    assert b.prefill_start_s == pytest.approx(0.11)
    assert b.first_token_s == pytest.approx(0.32)
    # same worker: no KV transfer
    assert a.transfer_start_s == a.transfer_end_s == pytest.approx(0.11)
    assert a.decode_start_s == pytest.approx(0.11)
    assert b.finish_s == pytest.approx(0.32 + 2 * 0.012)
    assert a.finish_s == pytest.approx(0.344 + 2 * 0.011)
    assert a.ttft_s == pytest.approx(0.11)
    assert b.ttft_s == pytest.approx(0.27)
    assert (res.requests.decode_worker == "m0").all()
    # busy: the prefill batches plus the decode iterations, the stall not counted twice
    busy = 0.11 + 0.21 + 2 * 0.012 + 2 * 0.011
    assert res.workers.busy_s.iloc[0] == pytest.approx(busy)


def test_prefill_first_interrupts_decode_at_the_next_iteration_boundary() -> None:
    # A decodes from 0.11 at 11 ms per iteration; B arrives at 0.15, inside iteration 4
    # ([0.143, 0.154]); B's batch starts at 0.154 and A resumes after it.
    wl = Workload([0.0, 0.15], [100, 50], [20, 2])
    res = simulate(wl, mixed(FLAT), make_policy("round_robin"), slo=SLO)
    a, b = row(res, 0), row(res, 1)
    boundary = 0.11 + 4 * 0.011
    assert b.prefill_start_s == pytest.approx(boundary)
    b_end = boundary + T0 + 0.05
    assert b.first_token_s == pytest.approx(b_end)
    # A made 4 tokens before B, then 1 iteration with B (tau(2)), then 14 alone
    assert b.finish_s == pytest.approx(b_end + 0.012)
    assert a.finish_s == pytest.approx(b_end + 0.012 + 14 * 0.011)


def test_routing_decode_elsewhere_transfers_kv() -> None:
    class Cross(Policy):
        name = "cross"

        def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
            return 0

        def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
            return 1

    wl = Workload([0.0], [100], [3])
    r = row(simulate(wl, mixed(FLAT, 2), Cross(), slo=SLO), 0)
    wire = 100 * 1e5 / 1e9
    assert r.transfer_start_s == pytest.approx(0.11)
    assert r.transfer_end_s == pytest.approx(0.11 + 1e-3 + wire)
    assert r.finish_s == pytest.approx(r.transfer_end_s + 2 * 0.011)
    assert (r.prefill_worker, r.decode_worker) == ("m0", "m1")


# -- hybrid (Sarathi) -----------------------------------------------------------------------------
def test_chunk_costs_sum_to_the_whole_prefill() -> None:
    spec = WorkerSpec("w", "mixed", QUAD, 100)
    side = PrefillSide(spec)
    rng = np.random.default_rng(7)
    for _ in range(50):
        length = int(rng.integers(1, 5000))
        cuts = np.sort(rng.choice(np.arange(1, length), size=min(5, length - 1), replace=False))
        edges = [0, *cuts.tolist(), length]
        total = sum(side.chunk_flop(a, b - a) for a, b in itertools.pairwise(edges))
        assert total == pytest.approx(side.work_flop(length), rel=1e-12)


def test_hybrid_chunk_only_iterations_by_hand() -> None:
    # one request of 150 tokens, chunks 64 + 64 + 22, no decode running: t0 + chunk work each
    wl = Workload([0.0], [150], [3])
    res = simulate(
        wl, mixed(QUAD, schedule="hybrid", chunk_tokens=64), make_policy("round_robin"), slo=SLO
    )
    r = row(res, 0)
    chunks = [work(0, 64), work(64, 64), work(128, 22)]
    first = 3 * T0 + sum(chunks) / PEAK
    assert r.first_token_s == pytest.approx(first)
    assert sum(chunks) == pytest.approx(ALPHA * 150**2 + BETA * 150)
    # then two decode iterations alone, contexts 151 and 152: tau = d0 + d1 + d2·C
    assert r.finish_s == pytest.approx(first + 2 * 0.011 + 1e-5 * (151 + 152))


@pytest.mark.parametrize(("budget", "chunks"), [("iteration", (63, 37)), ("prefill", (64, 36))])
def test_hybrid_iteration_is_one_fused_pass_by_hand(budget: str, chunks: tuple[int, int]) -> None:
    # A (16 tokens) decodes; B (100 tokens) arrives during A's 3rd iteration and is prefilled in
    # two chunks riding on A's next two iterations; B's first token comes at the end of the
    # second; then both decode together. Sarathi-Serve's iteration budget (issue 18): 64 tokens
    # minus A's decode token leaves 63 for the chunk; "prefill": 64 on top of the decode.
    # One fused pass per iteration (issue 34): the chunks' pass t0 + beta·(1 + c)/P_peak is the
    # larger (d0 + d1 = 0.011 < 0.01 + 0.064), and with t0 = d0, beta/P_peak = d1 it equals
    # τ(1, C) − d2·C + beta·c/P_peak, so the pass is τ(B, C) + chunk work / P_peak here.
    wl = Workload([0.0, 0.03], [16, 100], [12, 3])
    cluster = mixed(QUAD, schedule="hybrid", chunk_tokens=64, chunk_budget=budget)
    res = simulate(wl, cluster, make_policy("round_robin"), slo=SLO)
    a, b = row(res, 0), row(res, 1)
    t = T0 + work(0, 16) / PEAK
    assert a.first_token_s == pytest.approx(t)

    def tau(batch: int, ctx: int) -> float:
        return 0.01 + 1e-3 * batch + 1e-5 * ctx

    ctx = 17
    n_done = 1  # tokens of A so far
    while t <= 0.03:  # A alone until B has arrived
        t += tau(1, ctx)
        ctx += 1
        n_done += 1
    assert b.prefill_start_s == pytest.approx(t)
    first, second = chunks
    step = tau(1, ctx) + work(0, first) / PEAK
    # the engine charges exactly what the cost model prices for this iteration
    assert QUAD.hybrid_iteration_time_s([first], 1, ctx, [0]) == pytest.approx(step, rel=1e-12)
    t += step
    ctx += 1
    n_done += 1
    t += tau(1, ctx) + work(first, second) / PEAK
    ctx += 1
    n_done += 1
    assert b.first_token_s == pytest.approx(t, rel=1e-12)
    # B joins: contexts A = ctx, B = 101; B needs 2 more tokens
    for k in range(2):
        t += tau(2, ctx + 101 + k)
        ctx += 1
        n_done += 1
    assert b.finish_s == pytest.approx(t)
    while n_done < 12:
        t += tau(1, ctx)
        ctx += 1
        n_done += 1
    assert a.finish_s == pytest.approx(t)


def test_iteration_budget_leaves_chunk_tokens_minus_b_for_prefill() -> None:
    # Four decodes run when E (40 tokens) arrives; budget 12: 12 − 4 = 8 prefill tokens per
    # iteration, so E takes ceil(40 / 8) = 5 iterations. Each is one fused pass (issue 34):
    # max(decode pass τ(4) = 0.014, chunks' pass (4 + 8) tokens · 1 ms = 0.012) = 0.014 (t0 = 0,
    # no attention): the 8 chunk tokens ride on the memory-bound decode pass for free.
    wl = Workload([0.0, 0.0, 0.0, 0.0, 0.05], [4, 4, 4, 4, 40], [60, 60, 60, 60, 2])
    flat = CostModel(PrefillModel(0.0, 1e9, 1e12, 1.0, 0.0), DecodeModel(0.01, 1e-3, 0.0))
    cluster = mixed(flat, schedule="hybrid", chunk_tokens=12)
    res = simulate(wl, cluster, make_policy("round_robin"), slo=SLO)
    e = row(res, 4)
    # 5 hybrid iterations of max(τ(4), (4 + 8) tokens · 1 ms) = max(0.014, 0.012)
    assert e.first_token_s - e.prefill_start_s == pytest.approx(5 * 0.014)
    # the old meaning: 12 prefill tokens on top of the 4 decodes, ceil(40 / 12) = 4 iterations:
    # three of max(τ(4), (4 + 12) · 1 ms) = 0.016 and the last (4 tokens) of max(0.014, 0.008)
    old = simulate(
        wl,
        mixed(flat, schedule="hybrid", chunk_tokens=12, chunk_budget="prefill"),
        make_policy("round_robin"),
        slo=SLO,
    )
    e_old = row(old, 4)
    chunks = 3 * 0.016 + 0.014
    assert e_old.first_token_s - e_old.prefill_start_s == pytest.approx(chunks)


def test_no_prefill_tokens_while_decodes_fill_the_iteration_budget() -> None:
    # Budget 3 with 3 decodes running: no chunk until one finishes (Sarathi-Serve schedules no
    # prefill token when the decodes use the whole budget), then 3 − 2 = 1 token per iteration.
    wl = Workload([0.0, 0.0, 0.0, 0.001], [1, 1, 1, 2], [5, 8, 8, 2])
    flat = CostModel(PrefillModel(0.0, 1e9, 1e12, 1.0, 0.0), DecodeModel(0.01, 1e-3, 0.0))
    res = simulate(
        wl, mixed(flat, schedule="hybrid", chunk_tokens=3), make_policy("round_robin"), slo=SLO
    )
    a, d = row(res, 0), row(res, 3)
    assert d.prefill_start_s == pytest.approx(a.finish_s)
    assert d.prefill_start_s > d.arrival_s + 0.03
    # two fused iterations of max(τ(2) = 0.012, (2 + 1) tokens · 1 ms = 0.003) = 0.012 each
    assert d.first_token_s - d.prefill_start_s == pytest.approx(2 * 0.012)


def test_max_running_gates_the_start_of_a_prompt_by_hand() -> None:
    # Issue 34: a prompt in prefill counts against max_running (vLLM's max_num_seqs). With
    # max_running = 1, B (arrived at 0.05) waits while A decodes: A prefills [0, 0.11] and
    # decodes 2 tokens at τ(1) = 11 ms to 0.132; only then B prefills, 10 ms + 50 ms.
    wl = Workload([0.0, 0.05], [100, 50], [3, 2])
    res = simulate(wl, mixed(FLAT, max_running=1), make_policy("round_robin"), slo=SLO)
    a, b = row(res, 0), row(res, 1)
    assert a.finish_s == pytest.approx(0.132)
    assert b.prefill_start_s == pytest.approx(0.132)
    assert b.first_token_s == pytest.approx(0.192)
    assert b.finish_s == pytest.approx(0.203)


def test_decodes_routed_in_do_not_lift_the_prompt_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    # Worker 1 takes the decodes of prompts prefilled on worker 0, so its running + waiting
    # decodes exceed max_running = 2 while a long prompt of its own is chunked: it may start no
    # new prompt then (a negative seat count once read as "no limit" in start_chunks).
    calls: list[tuple[int, int]] = []
    start_chunks = PrefillSide.start_chunks

    def spy(self: PrefillSide, *args: object) -> list[int]:
        started = start_chunks(self, *args)  # type: ignore[arg-type]
        calls.append((int(args[-1]), len(started)))  # type: ignore[call-overload]
        return started

    monkeypatch.setattr(PrefillSide, "start_chunks", spy)
    own = {0, 9, 10, 11, 12}

    class Split(Policy):
        name = "split"

        def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
            return 1 if request.request_id in own else 0

        def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
            return 1

    arrivals = [0.0] + [0.001 * i for i in range(1, 9)] + [0.05] * 4
    wl = Workload(arrivals, [2000] + [10] * 8 + [50] * 4, [50] * 13)
    cluster = mixed(FLAT, 2, "hybrid", chunk_tokens=64, max_running=2, kv_capacity_blocks=10000)
    res = simulate(wl, cluster, Split(), slo=SLO)
    assert (res.requests.status == "finished").all()
    assert calls and all(seats >= 0 and started <= seats for seats, started in calls)


def test_policy_can_force_the_schedule_and_chunk() -> None:
    class Forced(Policy):
        name = "forced"
        TRAITS = PolicyTraits(colocated_schedule="hybrid", chunk_tokens=64)

        def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
            return 0

        def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
            return 0

    wl = Workload([0.0], [150], [3])
    forced = row(simulate(wl, mixed(QUAD), Forced(), slo=SLO), 0)
    spec = row(simulate(wl, mixed(QUAD, schedule="hybrid", chunk_tokens=64), Forced(), slo=SLO), 0)
    assert forced.first_token_s == spec.first_token_s == pytest.approx(3 * T0 + 0.1725)


def test_schedule_is_validated() -> None:
    with pytest.raises(ParameterError, match="colocated_schedule"):
        WorkerSpec("w", "mixed", FLAT, 10, colocated_schedule="sarathi")
    with pytest.raises(ParameterError, match="chunk_tokens"):
        WorkerSpec("w", "mixed", FLAT, 10, chunk_tokens=0)


@pytest.mark.parametrize("schedule", ["prefill_first", "hybrid"])
def test_kv_is_shared_and_never_over_capacity(schedule: str) -> None:
    rng = np.random.default_rng(3)
    n = 150
    wl = Workload(np.sort(rng.uniform(0, 2, n)), rng.integers(1, 300, n), rng.integers(2, 120, n))
    cl = mixed(QUAD, 2, schedule, kv_capacity_blocks=40, block_tokens=16, chunk_tokens=48)
    res = simulate(wl, cl, make_policy("least_loaded"), slo=SLO, tick_s=0.005)
    assert (res.requests.status == "finished").all()
    ts = res.timeseries
    assert (ts.kv_used_blocks <= 40).all() and (ts.kv_used_blocks >= 0).all()
    assert ts.kv_used_blocks.max() > 30  # pressure was real
    assert res.requests.preemptions.sum() > 0
    assert ((ts.busy_frac >= 0) & (ts.busy_frac <= 1)).all()


# -- phases and moves ------------------------------------------------------------------------------
class Scripted(Policy):
    """Routes everything to worker ``to`` and applies ``script[tick]`` actions."""

    name = "scripted"
    TRAITS = PolicyTraits(wants_ticks=True)

    def __init__(self, script: dict[int, list[Action]], to: int = 0) -> None:
        self.script = script
        self.to = to
        self.k = 0

    def start(self, ctx: RunContext) -> None:
        self.k = 0

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        return self.to if self.to in idx else int(idx[0])

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.decode_workers
        return self.to if self.to in idx else int(idx[0])

    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        self.k += 1
        return self.script.get(self.k, [])


def test_decode_phase_queues_prefills_until_both() -> None:
    # tick 1 (0.01 s): decode only; A arrives at 0.02 and waits; tick 50 (0.5 s): both
    policy = Scripted({1: [SetPhase(0, "decode")], 50: [SetPhase(0, "both")]})
    res = simulate(Workload([0.02], [100], [3]), mixed(FLAT), policy, slo=SLO, tick_s=0.01)
    r = row(res, 0)
    assert r.prefill_start_s == pytest.approx(0.5)
    assert r.first_token_s == pytest.approx(0.61)
    phases = res.events[res.events.kind == "phase"]
    assert list(phases.detail) == ["both->decode", "decode->both"]


def test_prefill_phase_stalls_running_decodes() -> None:
    # A decodes from 0.11 at 11 ms; at 0.2 the phase becomes prefill: A stops at the boundary
    # 0.11 + 9·0.011 and waits until 0.5, then makes its last 40 tokens
    policy = Scripted({20: [SetPhase(0, "prefill")], 50: [SetPhase(0, "both")]})
    res = simulate(Workload([0.0], [100], [50]), mixed(FLAT), policy, slo=SLO, tick_s=0.01)
    r = row(res, 0)
    assert r.finish_s == pytest.approx(0.5 + 40 * 0.011)
    busy = res.workers.busy_s.iloc[0]
    assert busy == pytest.approx(0.11 + 49 * 0.011)


def test_prefill_phase_runs_prefills_while_decodes_wait() -> None:
    # phase prefill from 0.05: A (decoding) stalls at its next boundary; B arrives at 0.3 and is
    # prefilled at once; back to both at 0.6
    policy = Scripted({5: [SetPhase(0, "prefill")], 60: [SetPhase(0, "both")]})
    wl = Workload([0.0, 0.3], [20, 100], [30, 4])
    res = simulate(wl, mixed(FLAT), policy, slo=SLO, tick_s=0.01)
    a, b = row(res, 0), row(res, 1)
    assert b.prefill_start_s == pytest.approx(0.3)
    assert b.first_token_s == pytest.approx(0.41)
    assert b.decode_start_s >= 0.41
    assert b.finish_s > 0.6 and a.finish_s > 0.6


def test_set_phase_on_a_non_mixed_worker_is_an_error() -> None:
    policy = Scripted({1: [SetPhase(0, "prefill")]})
    cl = ClusterSpec.build(FLAT, 1, 1, kv_capacity_blocks=100)
    with pytest.raises(PolicyDecisionError, match="only mixed workers"):
        simulate(Workload([0.0], [10], [300]), cl, policy, slo=SLO, tick_s=0.01)
    bad = Scripted({1: [SetPhase(0, "sleep")]})
    with pytest.raises(PolicyDecisionError, match="phase 'sleep'"):
        simulate(Workload([0.0], [10], [300]), mixed(FLAT), bad, slo=SLO, tick_s=0.01)


@pytest.mark.parametrize("schedule", ["prefill_first", "hybrid"])
def test_move_decode_worker_to_mixed_and_back(schedule: str) -> None:
    # p0 prefills, d0 decodes; at 0.1 d0 becomes mixed and takes prefills too; at 0.6 it goes back
    script: dict[int, list[Action]] = {
        10: [MoveWorker(1, "mixed", "mixed")],
        60: [MoveWorker(1, "decode", "decode")],
    }

    class Prefer(Scripted):
        def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
            idx = view.prefill_workers
            return 1 if 1 in idx else int(idx[0])

        def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
            return 1

    rng = np.random.default_rng(5)
    n = 60
    wl = Workload(np.sort(rng.uniform(0, 1, n)), rng.integers(10, 300, n), rng.integers(2, 40, n))
    cl = ClusterSpec.build(
        QUAD, 1, 1, kv_capacity_blocks=200, colocated_schedule=schedule, chunk_tokens=64
    )
    res = simulate(wl, cl, Prefer(script), slo=SLO, tick_s=0.01)
    req = res.requests
    assert (req.status == "finished").all()
    between = (req.arrival_s > 0.1) & (req.arrival_s < 0.5)
    assert (req.loc[between, "prefill_worker"] == "d0").all()
    assert (req.loc[req.arrival_s > 0.7, "prefill_worker"] == "p0").all()
    assert list(res.workers.role) == ["prefill", "decode"]


def test_a_move_to_prefill_and_back_during_a_hybrid_iteration_changes_nothing() -> None:
    # found by the invariants test below (HYPOTHESIS_PROFILE=explore): m0 moves mixed -> prefill
    # -> mixed while a hybrid iteration (A's decode plus B's whole prompt, about 0.39 s) is in
    # flight. The move back closed admission (as for a prefill batch in flight), so B, completed
    # at the iteration's end, waited in m0's admission queue with nothing scheduled to admit it.
    # Within one step the two moves are a no-op: the run is the one without them.
    wl = Workload([0.0, 0.05], [10, 300], [60, 5])
    cl = ClusterSpec.build(
        QUAD, 0, 1, 1, kv_capacity_blocks=1000, colocated_schedule="hybrid", chunk_tokens=4000
    )
    moves: dict[int, list[Action]] = {
        10: [MoveWorker(1, "prefill", "prefill")],
        11: [MoveWorker(1, "mixed", "mixed")],
    }
    res = simulate(wl, cl, Scripted(moves, to=1), slo=SLO, tick_s=0.01, engine="python")
    still = simulate(wl, cl, Scripted({}, to=1), slo=SLO, tick_s=0.01, engine="python")
    b = row(res, 1)
    assert b.prefill_start_s < 0.09 and b.first_token_s > 0.11  # the moves fall inside it
    assert b.decode_start_s == b.first_token_s  # admitted at the iteration's end
    pd.testing.assert_frame_equal(res.requests, still.requests)


# -- invariants ------------------------------------------------------------------------------------
class RandomMixer(Policy):
    """Random routing, moves and phases (deterministic from the seed); a phase other than both
    lasts one tick, so no worker stays blocked."""

    name = "random_mixer"
    TRAITS = PolicyTraits(wants_ticks=True)

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def start(self, ctx: RunContext) -> None:
        self.rng = np.random.default_rng(ctx.seed)
        self.phased: list[int] = []

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        return int(idx[self.rng.integers(len(idx))])

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.decode_workers
        ok = idx[view.kv_capacity_blocks[idx] >= request.peak_kv_blocks]
        return int(ok[self.rng.integers(len(ok))])

    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        out: list[Action] = [SetPhase(w, "both") for w in self.phased if view.roles[w] == "mixed"]
        self.phased = []
        u = self.rng.random()
        w = int(self.rng.integers(view.n_workers))
        if u < 0.15:
            role = str(self.rng.choice(["prefill", "decode", "mixed"]))
            others_p = [i for i in view.prefill_workers if i != w]
            others_d = [i for i in view.decode_workers if i != w]
            if (role != "prefill" or others_d) and (role != "decode" or others_p):
                out.append(MoveWorker(w, role, role))
        elif u < 0.4 and view.roles[w] == "mixed":
            out.append(SetPhase(w, str(self.rng.choice(["prefill", "decode"]))))
            self.phased.append(w)
        return out


@st.composite
def mixed_scenarios(draw: st.DrawFn) -> tuple[Workload, ClusterSpec, int]:
    wl = draw(small_workloads())
    cluster = ClusterSpec.build(
        QUAD,
        draw(st.integers(0, 1)),
        draw(st.integers(0, 1)),
        draw(st.integers(1, 3)),
        **draw(worker_limits(min_kv_blocks=4)),
        kv_bytes_per_token=1e4,
        link=LinkSpec("l", 1e9, 1e-4),
        colocated_schedule=draw(st.sampled_from(["prefill_first", "hybrid"])),
        chunk_tokens=draw(st.integers(1, 300)),
    )
    return wl, cluster, draw(st.integers(0, 1000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_scenarios())
def test_invariants_with_mixed_workers_moves_and_phases(
    case: tuple[Workload, ClusterSpec, int],
) -> None:
    wl, cluster, seed = case
    res = simulate(wl, cluster, RandomMixer(), slo=SLO, tick_s=0.01, seed=seed)
    req = res.requests
    assert len(req) == len(wl)
    assert req["status"].isin(["finished", "rejected"]).all()
    assert (req.loc[req.status == "rejected", "reason"] != "").all()
    done = req[req.status == "finished"]
    order = ["arrival_s", "prefill_start_s", "prefill_end_s", "transfer_start_s"]
    order += ["transfer_end_s", "decode_start_s", "finish_s"]
    for values in done[order].to_numpy():
        seen = values[~np.isnan(values)]
        assert np.all(np.diff(seen) >= -1e-12)
    assert (done.first_token_s >= done.prefill_end_s - 1e-12).all()
    ts = res.timeseries
    cap = cluster.workers[0].kv_capacity_blocks
    assert (ts.kv_used_blocks >= 0).all() and (ts.kv_used_blocks <= cap).all()
    assert ((ts.busy_frac >= 0) & (ts.busy_frac <= 1)).all()
    busy = res.workers.busy_s.to_numpy()
    assert np.all(busy >= -1e-9) and np.all(busy <= res.makespan_s + 1e-9)
    # determinism
    again = simulate(wl, cluster, RandomMixer(), slo=SLO, tick_s=0.01, seed=seed)
    pd.testing.assert_frame_equal(req, again.requests)
    pd.testing.assert_frame_equal(ts, again.timeseries)


def test_every_request_ends_once_under_load_both_schedules() -> None:
    rng = np.random.default_rng(11)
    n = 400
    wl = Workload(np.sort(rng.uniform(0, 4, n)), rng.integers(1, 800, n), rng.integers(1, 200, n))
    for schedule in ("prefill_first", "hybrid"):
        cl = mixed(QUAD, 3, schedule, kv_capacity_blocks=120, chunk_tokens=128)
        res = simulate(wl, cl, make_policy("least_loaded"), slo=SLO)
        assert (res.requests.status == "finished").all()
        assert res.requests.request_id.is_unique
        # tokens conserved: every finished request's decode produced output - 1 tokens after TTFT
        multi = res.requests[res.requests.output_tokens > 1]
        assert (multi.finish_s > multi.first_token_s).all()


def test_a_worker_leaving_mixed_at_a_hybrid_boundary_admits_decodes_again() -> None:
    # found by the invariants test above: m1 moves mixed -> prefill -> decode while a hybrid
    # iteration (with decodes, so not stalled) is in flight; when it ends the worker must accept
    # decode work again (it stayed closed, and 11 requests waited forever)
    arrival = [0.00259631, 0.00297514, 0.00868427, 0.01118292, 0.01329217, 0.01485064]
    arrival += [0.01743716, 0.01935647, 0.02598774, 0.03284803, 0.03451702, 0.03547242]
    arrival += [0.03656128, 0.04009573, 0.04173281, 0.04407711, 0.05084595, 0.05372951]
    arrival += [0.05411923, 0.05554381, 0.05582221, 0.05734229, 0.06331144, 0.07344801]
    arrival += [0.07363237, 0.07757789, 0.07979719, 0.08216632, 0.08733843, 0.08838097]
    arrival += [0.08884645, 0.0914295, 0.09228216, 0.09859475, 0.09974483, 0.09976533]
    arrival += [0.10057024, 0.10264454, 0.10440448, 0.10536902]
    inputs = [69, 246, 300, 145, 51, 264, 204, 282, 343, 318, 195, 271, 138, 179, 315, 180, 382]
    inputs += [81, 84, 54, 347, 12, 99, 5, 325, 10, 114, 237, 52, 241, 72, 240, 151, 58, 398]
    inputs += [182, 316, 174, 391, 75]
    outputs = [19, 43, 9, 48, 77, 18, 79, 26, 22, 35, 30, 48, 32, 44, 70, 4, 55, 26, 36, 56, 41]
    outputs += [4, 70, 61, 43, 69, 2, 17, 8, 27, 70, 18, 35, 61, 8, 2, 44, 44, 20, 36]
    cluster = ClusterSpec.build(
        QUAD, 0, 1, 2, kv_capacity_blocks=144, block_tokens=1, max_batch_tokens=50,
        max_batch_size=1, max_running=1, kv_bytes_per_token=1e4, link=LinkSpec("l", 1e9, 1e-4),
        colocated_schedule="hybrid", chunk_tokens=56,
    )  # fmt: skip
    wl = Workload(arrival, inputs, outputs)
    res = simulate(wl, cluster, RandomMixer(), slo=SLO, tick_s=0.01, seed=973, engine="python")
    assert res.requests["status"].isin(["finished", "rejected"]).all()  # it raised before
