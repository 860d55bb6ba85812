"""Phasor on the compiled engine against the Python engine: identical results.

The compiled twin runs Phasor's micro loop (prefill by the largest Φ_T, a draining member's
remaining decode time counted as work; decode by free KV net of the waiting requests, or by Φ_S)
and its macro loop (every Δt, at most one Mixed-pool member moves on the pools' mean Φ_T and Φ_S,
θ_flow and T_cool), bit for bit: requests, event log (``pool_move`` rows), time series and the
workers frame. Its meso loop (defragmentation) and the evacuation of a promoted member issue
migrations, which the compiled engine does not run: those configurations stay on the Python
engine, and say so.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import ConfigError
from pdopt.policies import make_policy
from pdopt.policies.phasor import Phasor
from pdopt.sim import ClosedLoop, simulate
from pdopt.sim._simulate import _compiled_codes
from pdopt.testing.strategies import small_workloads
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import COST, MOE_COST, SLO, check_both_engines, hypothesis_event
from tests.sim.test_sim_compiled_splitwise import HEALTH, _overload_cluster, mixed_pool_clusters

WITHOUT_MIGRATIONS = {"defrag": False, "evacuate": False}


@st.composite
def phasor_flags(draw):
    """The settings a tuner samples (Δt, θ_flow, T_cool) and the ablations without
    migrations: routing by Φ_T or queue length, decode by free KV or Φ_S, the macro loop on or
    off (off: the evacuation flag does not matter), releases."""
    mixed_pool = draw(st.booleans()) or draw(st.booleans())
    return {
        "defrag": False,
        "evacuate": False if mixed_pool else draw(st.booleans()),
        "mixed_pool": mixed_pool,
        "phi_routing": draw(st.booleans()) or draw(st.booleans()),
        "decode_routing": draw(st.sampled_from(["free_kv", "free_kv", "phi_s"])),
        "delta_t_s": draw(st.sampled_from([None, 0.005, 0.02, 0.05])),
        "theta_flow": draw(st.sampled_from([0.3, 0.62, 0.9, 1.5])),
        "cool_s": draw(st.sampled_from([None, 0.0, 0.03, 0.2])),
        "ttft_slo_s": draw(st.sampled_from([None, 0.05, 0.3])),
        "release_balanced": draw(st.booleans()),
    }


def run(driver, cluster, flags, record_timeseries, tick_s, engine):
    return simulate(
        driver,
        cluster,
        make_policy("phasor", **flags),
        slo=SLO,
        record_timeseries=record_timeseries,
        tick_s=tick_s,
        engine=engine,
    )


def moe_decode(cluster):
    return any(w.cost.decode.has_expert_term for w in cluster.workers)


def check(driver, cluster, flags, record, tick_s, no_fallback):
    """Both engines identical, or refusing alike (:func:`check_both_engines`); the Python
    engine's result (None on a refusal). An MoE decode is refused by the compiled engine
    (the drain time's expert term: numpy's power)."""
    if moe_decode(cluster):
        with pytest.raises(ConfigError, match="MoE decode"):
            run(driver, cluster, flags, record, tick_s, "compiled")
        return None
    python = check_both_engines(
        lambda engine: run(driver, cluster, flags, record, tick_s, engine), no_fallback
    )
    if python is not None:
        moves = int((python.events["kind"] == "pool_move").sum())
        hypothesis_event(
            f"pool moves: {'none' if not moves else '1-5' if moves <= 5 else 'over 5'}"
        )
    return python


@settings(max_examples=120, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    mixed_pool_clusters(),
    phasor_flags(),
    st.sampled_from([None, 0.005, 0.01, 0.05]),
)
def test_compiled_phasor_matches_python_engine(no_fallback, workload, cluster, flags, tick_s):
    """Without a time series (the policy's ticks still run), and with one every ``tick_s``."""
    check(workload, cluster, flags, tick_s is not None, tick_s or 0.01, no_fallback)


@settings(max_examples=40, deadline=None, suppress_health_check=HEALTH)
@given(
    small_workloads(),
    mixed_pool_clusters(),
    phasor_flags(),
    st.integers(1, 6),
    st.sampled_from([0.0, 0.02]),
)
def test_compiled_phasor_matches_in_a_closed_loop(
    no_fallback, workload, cluster, flags, clients, think_s
):
    driver = ClosedLoop(clients, think_s, workload, 3 * len(workload), start_spread_s=0.1)
    check(driver, cluster, flags, True, 0.01, no_fallback)


def _overload():
    rng = np.random.default_rng(7)
    n = 2000
    return Workload(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(16, 600, n), rng.integers(2, 300, n)
    )


@pytest.mark.parametrize(
    "flags",
    [
        WITHOUT_MIGRATIONS,
        {**WITHOUT_MIGRATIONS, "phi_routing": False, "decode_routing": "phi_s"},
        {**WITHOUT_MIGRATIONS, "release_balanced": True, "delta_t_s": 0.02, "cool_s": 0.0},
    ],
    ids=["paper", "ablations", "release"],
)
@pytest.mark.parametrize("record", [False, True], ids=["no_ts", "ts"])
def test_compiled_phasor_matches_under_overload(flags, record, no_fallback):
    """A bursty overload with a three-worker Mixed pool: members promoted both ways (and, with
    releases, sent home), promoted decode members draining, preemptions and false OOMs."""
    python = check(_overload(), _overload_cluster("front", COST), flags, record, 0.01, no_fallback)
    assert python is not None
    moves = python.events[python.events["kind"] == "pool_move"]
    assert len(moves) >= 5
    assert moves["detail"].str.startswith("decode->prefill").any()  # a member drains
    assert moves["detail"].str.startswith("prefill->decode").any()
    assert python.requests["preemptions"].sum() > 0
    if flags.get("release_balanced"):
        assert moves["detail"].str.endswith("pool=mixed").any()


def test_phasor_runs_compiled_only_without_migrations():
    """The default Phasor (defragmentation and evacuation on) and any run that could migrate
    stay on the Python engine, saying why; without migrations it has a twin."""
    cluster = _overload_cluster("front", COST)
    for flags in ({}, {"defrag": False}, {"evacuate": False}):
        policy = Phasor(**flags)
        assert policy.compiled_tick() is None
        with pytest.raises(ConfigError, match="Phasor's without migrations: defrag=False"):
            _compiled_codes("compiled", policy, policy.traits(), cluster, 10)
    for flags in (WITHOUT_MIGRATIONS, {"defrag": False, "mixed_pool": False}):
        policy = Phasor(**flags)
        codes = _compiled_codes("compiled", policy, policy.traits(), cluster, 10)
        assert codes is not None and codes[:3] == (8, 7, 2)


def test_a_phasor_subclass_with_its_own_rule_has_no_compiled_twin():
    class Greedy(Phasor):
        def _effective_free(self, view, idx):
            return np.asarray(view.kv_free_blocks[idx])

    assert Greedy(**WITHOUT_MIGRATIONS).traits().compiled_routing is None
    assert Greedy(**WITHOUT_MIGRATIONS).compiled_tick() is None
    assert Phasor(**WITHOUT_MIGRATIONS, phi_routing=False, decode_routing="phi_s").traits() \
        .compiled_routing == ("phasor_queue", "phasor_phi_s")  # fmt: skip


def test_an_moe_decode_stays_on_the_python_engine():
    cluster = _overload_cluster("front", MOE_COST)
    policy = Phasor(**WITHOUT_MIGRATIONS)
    with pytest.raises(ConfigError, match="MoE decode"):
        _compiled_codes("compiled", policy, policy.traits(), cluster, 10)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3848), st.integers(0, 2**32 - 1))
def test_pairwise_sum_is_numpys_sum(n, seed):
    """A pool's mean Φ is numpy's: its pairwise sum, bit for bit, up to max_pool() values."""
    from pdopt.sim._compiled._phasor import max_pool, pairwise_sum

    assert max_pool() == 3848
    rng = np.random.default_rng(seed)
    values = rng.normal(size=n + 3) * 10.0 ** rng.integers(-3, 3, size=n + 3)
    assert pairwise_sum(values, 3, n) == values[3:].sum()
