"""Phasor on the compiled engine against the Python engine: identical results.

The compiled twin runs Phasor's micro loop (prefill by the largest Φ_T, a draining member's
remaining decode time counted as work; decode by free KV net of the waiting requests, or by Φ_S),
its meso loop (defragmentation by migration), its macro loop (every Δt, at most one Mixed-pool
member moves on the pools' mean Φ_T and Φ_S, θ_flow and T_cool) and the evacuation of promoted
members, with the engine's migrations (pre-copy stages, stop-and-copy at a boundary, takeover,
cancels), bit for bit: requests (migration counts, downtime and bytes), event log
(``migration_*`` and ``pool_move`` rows), time series and the workers frame.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, LinkSpec, Role, WorkerSpec
from pdopt.policies import make_policy
from pdopt.policies.phasor import Phasor
from pdopt.sim import ClosedLoop, simulate
from pdopt.sim._simulate import _compiled_codes
from pdopt.testing.strategies import small_workloads
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import (
    COST,
    MOE_COST,
    SLO,
    check_both_engines,
    client_timeouts,
    hypothesis_event,
    note_aborts,
)
from tests.sim.test_sim_compiled_splitwise import HEALTH, _overload_cluster, mixed_pool_clusters

WITHOUT_MIGRATIONS = {"defrag": False, "evacuate": False}


@st.composite
def phasor_flags(draw):
    """The settings a tuner samples (Δt, θ_frag, θ_flow, T_cool) and every ablation: routing
    by Φ_T or queue length, decode by free KV or Φ_S, defragmentation (proactive or reactive),
    the macro loop and the evacuation on or off, releases, the migrations' limits."""
    return {
        "defrag": draw(st.booleans()) or draw(st.booleans()),
        "proactive": draw(st.booleans()) or draw(st.booleans()),
        "evacuate": draw(st.booleans()) or draw(st.booleans()),
        "mixed_pool": draw(st.booleans()) or draw(st.booleans()),
        "theta_frag": draw(st.sampled_from([0.05, 0.168, 0.5, 0.9])),
        "min_remaining_tokens": draw(st.sampled_from([0, 16, 64])),
        "max_moves": draw(st.sampled_from([1, 4, 8])),
        "phi_routing": draw(st.booleans()) or draw(st.booleans()),
        "decode_routing": draw(st.sampled_from(["free_kv", "free_kv", "phi_s"])),
        "delta_t_s": draw(st.sampled_from([None, 0.005, 0.02, 0.05])),
        "theta_flow": draw(st.sampled_from([0.3, 0.62, 0.9, 1.5])),
        "cool_s": draw(st.sampled_from([None, 0.0, 0.03, 0.2])),
        "ttft_slo_s": draw(st.sampled_from([None, 0.05, 0.3])),
        "release_balanced": draw(st.booleans()),
    }


def run(driver, cluster, flags, record_timeseries, tick_s, engine, timeout=None):
    return simulate(
        driver,
        cluster,
        make_policy("phasor", **flags),
        slo=SLO,
        record_timeseries=record_timeseries,
        tick_s=tick_s,
        engine=engine,
        client_timeout_s=timeout,
    )


def check(driver, cluster, flags, record, tick_s, no_fallback, timeout=None):
    """Both engines identical, or refusing alike (:func:`check_both_engines`); the Python
    engine's result (None on a refusal). ``timeout``: the clients' (None: they wait)."""
    python = check_both_engines(
        lambda engine: run(driver, cluster, flags, record, tick_s, engine, timeout), no_fallback
    )
    if python is not None:
        events = python.events
        moves = int((events["kind"] == "pool_move").sum())
        hypothesis_event(
            f"pool moves: {'none' if not moves else '1-5' if moves <= 5 else 'over 5'}"
        )
        ends = events[events["kind"] == "migration_end"]
        hypothesis_event(f"migrations: {'none' if ends.empty else 'some'}")
        if ends["detail"].str.endswith("rerouted").any():
            hypothesis_event("a migration rerouted (its destination left the decode pool)")
        for reason in events[events["kind"] == "migration_cancel"]["detail"]:
            hypothesis_event(f"cancel: {reason.split(' has ')[0]}")
    return python


@settings(max_examples=120, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    mixed_pool_clusters(),
    phasor_flags(),
    st.sampled_from([None, 0.005, 0.01, 0.05]),
    client_timeouts(),
)
def test_compiled_phasor_matches_python_engine(
    no_fallback, workload, cluster, flags, tick_s, timeout
):
    """Without a time series (the policy's ticks still run), and with one every ``tick_s``;
    with and without client timeouts (migrations cancelled or ended by them)."""
    python = check(
        workload, cluster, flags, tick_s is not None, tick_s or 0.01, no_fallback, timeout
    )
    if python is not None:
        note_aborts(python)


@settings(max_examples=40, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    mixed_pool_clusters(),
    phasor_flags(),
    st.integers(1, 6),
    st.sampled_from([0.0, 0.02]),
    client_timeouts(),
)
def test_compiled_phasor_matches_in_a_closed_loop(
    no_fallback, workload, cluster, flags, clients, think_s, timeout
):
    driver = ClosedLoop(clients, think_s, workload, 3 * len(workload), start_spread_s=0.1)
    check(driver, cluster, flags, True, 0.01, no_fallback, timeout)


def _overload():
    # 1,000 requests keep every property the test asserts with room (hundreds of migrations,
    # members promoted both ways, releases, preemptions), at half the 2,000's time
    rng = np.random.default_rng(7)
    n = 1000
    return Workload(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(16, 600, n), rng.integers(2, 300, n)
    )


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"proactive": False, "max_moves": 8},
        {"mixed_pool": False},
        {"phi_routing": False, "decode_routing": "phi_s", "theta_frag": 0.5},
        {**WITHOUT_MIGRATIONS, "release_balanced": True, "delta_t_s": 0.02, "cool_s": 0.0},
    ],
    ids=["paper", "reactive", "no_mixed_pool", "ablations", "release"],
)
@pytest.mark.parametrize("record", [False, True], ids=["no_ts", "ts"])
def test_compiled_phasor_matches_under_overload(flags, record, no_fallback):
    """A bursty overload with a three-worker Mixed pool: hundreds of migrations (some
    cancelled), members promoted both ways (and, with releases, sent home), promoted decode
    members evacuated or draining, preemptions and false OOMs."""
    python = check(_overload(), _overload_cluster("front", COST), flags, record, 0.01, no_fallback)
    assert python is not None
    kinds = python.events["kind"]
    moves = python.events[kinds == "pool_move"]
    assert python.requests["preemptions"].sum() > 0
    if flags.get("mixed_pool", True):
        assert len(moves) >= 5
        assert moves["detail"].str.startswith("decode->prefill").any()  # a member drains
        assert moves["detail"].str.startswith("prefill->decode").any()
    if flags.get("defrag", True):
        assert (kinds == "migration_end").sum() > 100
        assert python.requests["migration_downtime_s"].sum() > 0
    if flags.get("release_balanced"):
        assert moves["detail"].str.endswith("pool=mixed").any()


def test_phasor_runs_compiled_with_its_settings():
    """The default Phasor (defragmentation and evacuation on) has a twin, its settings passed
    once started; before, zeros stand in."""
    cluster = _overload_cluster("front", COST)
    for flags in ({}, WITHOUT_MIGRATIONS, {"defrag": False, "mixed_pool": False}):
        policy = Phasor(**flags)
        codes = _compiled_codes("compiled", policy, policy.traits(), cluster, 10)
        assert codes is not None and codes[:3] == (8, 7, 2)
        assert codes[3] == (0.0,) * 12


def test_a_phasor_subclass_with_its_own_rule_has_no_compiled_twin():
    class Greedy(Phasor):
        def _effective_free(self, view, idx):
            return np.asarray(view.kv_free_blocks[idx])

    assert Greedy(**WITHOUT_MIGRATIONS).traits().compiled_routing is None
    assert Greedy(**WITHOUT_MIGRATIONS).compiled_tick() is None
    assert Phasor(**WITHOUT_MIGRATIONS, phi_routing=False, decode_routing="phi_s").traits() \
        .compiled_routing == ("phasor_queue", "phasor_phi_s")  # fmt: skip


@pytest.mark.parametrize("flags", [{}, WITHOUT_MIGRATIONS], ids=["paper", "no_migrations"])
def test_an_moe_decode_runs_compiled_identically(flags, no_fallback):
    """The drain time's expert term (a float power, the C library's pow in both engines): on a
    decode pool of MoE workers under overload, and with one MoE member in the Mixed pool (a
    prefill-home member drains after a round trip)."""
    burst = _overload()[:700]
    python = check(burst, _overload_cluster("front", MOE_COST), flags, False, 0.01, no_fallback)
    assert python is not None
    assert (python.events["kind"] == "pool_move").sum() > 0
    member = ClusterSpec(
        (
            WorkerSpec("p0", Role.PREFILL, COST, 100),
            WorkerSpec("m0", Role.PREFILL, MOE_COST, 100, pool="mixed"),
            WorkerSpec("d0", Role.DECODE, COST, 100),
        ),
        kv_bytes_per_token=2e5,
    )
    policy = Phasor(**flags)
    assert _compiled_codes("compiled", policy, policy.traits(), member, 10) is not None
    assert check(burst, member, flags, True, 0.01, no_fallback) is not None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3848), st.integers(0, 2**32 - 1))
def test_pairwise_sum_is_numpys_sum(n, seed):
    """A pool's mean Φ is numpy's: its pairwise sum, bit for bit, up to max_pool() values."""
    from pdopt.sim._compiled._phasor import max_pool, pairwise_sum

    assert max_pool() == 3848
    rng = np.random.default_rng(seed)
    values = rng.normal(size=n + 3) * 10.0 ** rng.integers(-3, 3, size=n + 3)
    assert pairwise_sum(values, 3, n) == values[3:].sum()


def _busy_links_cluster(seed):
    """A small cluster with a three-worker Mixed pool under an overload whose migrations are
    slow (seed-dependent link, KV size and limits): members leave the decode pool while KV is
    copied to them."""
    rng = np.random.default_rng(seed)
    n = 600
    workload = Workload(
        np.cumsum(rng.exponential(0.003, n)), rng.integers(16, 700, n), rng.integers(2, 300, n)
    )
    lim = {
        "kv_capacity_blocks": int(rng.choice([60, 120, 200])),
        "max_running": int(rng.choice([8, 24])),
    }
    workers = (
        WorkerSpec("p0", Role.PREFILL, COST, **lim),
        WorkerSpec("m0", Role.PREFILL, COST, pool="mixed", **lim),
        WorkerSpec("m1", Role.DECODE, COST, pool="mixed", **lim),
        WorkerSpec("m2", Role.DECODE, COST, pool="mixed", **lim),
        WorkerSpec("d0", Role.DECODE, COST, **lim),
    )
    link = [LinkSpec.ethernet(1), LinkSpec.ethernet(10), LinkSpec.nvlink()][seed % 3]
    cluster = ClusterSpec(workers, kv_bytes_per_token=float(rng.choice([2e5, 1e6])), link=link)
    flags = {
        "delta_t_s": float(rng.choice([0.01, 0.02])),
        "cool_s": 0.0,
        "theta_flow": float(rng.choice([0.62, 0.9])),
        "release_balanced": bool(seed % 2),
        "max_moves": 8,
    }
    return workload, cluster, flags


@pytest.mark.parametrize(
    ("seed", "kind", "detail"),
    [
        (0, "migration_cancel", "destination has"),
        (2, "migration_end", "rerouted"),
        (4, "migration_cancel", "destination left the decode pool"),
    ],
    ids=["no_room", "rerouted", "destination_left"],
)
def test_compiled_migrations_take_the_rare_paths_alike(seed, kind, detail, no_fallback):
    """A migration cancelled because its destination lacks room to grow its hold, one whose
    destination left the decode pool during the pre-copy (cancelled) or the stop-and-copy (its
    KV routed on from there): identical on both engines (seeds found by search)."""
    workload, cluster, flags = _busy_links_cluster(seed)
    python = check(workload, cluster, flags, True, 0.01, no_fallback)
    assert python is not None
    rows = python.events[python.events["kind"] == kind]["detail"]
    assert rows.str.contains(detail).any()
