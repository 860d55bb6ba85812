"""min_load_tokens on the compiled engine against the Python engine: identical results.

Its twin (``pdopt.sim._compiled._routing``, code 4 both ways) routes a prompt to the least queued
prefill work over the worker's peak FLOP/s and a decode to the fewest running tokens (KV blocks
in use × block tokens) on random disaggregated and all-mixed clusters and workloads, time series
on and off, open and closed loop; a compiled run must never hand itself back to the Python
engine unless the Python engine raises (then both raise the same error).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, Role, Slo, WorkerSpec
from pdopt.policies import make_policy
from pdopt.policies._baselines import MinLoadTokens
from pdopt.sim import ClosedLoop, simulate
from pdopt.testing.strategies import small_workloads
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import COST, MOE_COST, assert_identical, disaggregated_clusters
from tests.sim.test_sim_compiled_colocated import both, mixed_clusters

SLO = Slo(1.0, 0.05)
MIN_LOAD = ("min_load_tokens", {})  # both()'s policy name and flags
SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}


@st.composite
def clusters(draw):
    """A disaggregated or an all-mixed random cluster (tests/sim/test_sim_compiled*.py)."""
    return draw(st.one_of(disaggregated_clusters(), mixed_clusters()))


@settings(max_examples=80, **SETTINGS)
@given(
    workload=small_workloads(),
    cluster=clusters(),
    tick_s=st.sampled_from([None, 0.001, 0.02]),
)
def test_min_load_tokens_compiled_matches_python(no_fallback, workload, cluster, tick_s):
    """Without a time series, and with one every ``tick_s`` (ticks also check false OOMs)."""
    runs = both(workload, cluster, *MIN_LOAD, no_fallback, tick_s is not None, tick_s or 0.05)
    if runs is not None:
        assert_identical(*runs)


@settings(max_examples=25, **SETTINGS)
@given(
    seed=st.integers(0, 2**31),
    cluster=clusters(),
    clients=st.integers(1, 6),
    think_s=st.sampled_from([0.0, 0.02]),
)
def test_min_load_tokens_compiled_matches_in_a_closed_loop(
    no_fallback, seed, cluster, clients, think_s
):
    workload = _poisson(seed, 20, 0.01)
    driver = ClosedLoop(clients, think_s, workload, 3 * len(workload), think="exponential")
    runs = both(driver, cluster, *MIN_LOAD, no_fallback, True, 0.01)
    if runs is not None:
        assert_identical(*runs)


def _poisson(seed: int, n: int, mean_gap_s: float) -> Workload:
    """``n`` Poisson arrivals, prompts of 1–399 tokens, outputs of 1–79 (small_workloads')."""
    rng = np.random.default_rng(seed)
    return Workload(
        np.cumsum(rng.exponential(mean_gap_s, n)), rng.integers(1, 400, n), rng.integers(1, 80, n)
    )


def _uneven(role: Role, n: int, cost) -> tuple[WorkerSpec, ...]:
    """``n`` workers of ``role`` with 40–100 % of 256 KV blocks each (decodes spread unevenly)
    and peak FLOP/s rising by half each (queued FLOP and queued seconds rank them differently)."""
    caps = np.linspace(256, 102, n).astype(int)
    return tuple(
        WorkerSpec(
            f"{role.value}{i}",
            role,
            dataclasses.replace(
                cost,
                prefill=dataclasses.replace(
                    cost.prefill, p_peak_flops=cost.prefill.p_peak_flops * (1 + 0.5 * i)
                ),
            ),
            kv_capacity_blocks=int(c),
            max_running=12,
        )
        for i, c in enumerate(caps)
    )


@pytest.mark.parametrize("timeseries", [False, True], ids=["no_ts", "ts"])
@pytest.mark.parametrize("kind", ["disaggregated", "mixed"])
@pytest.mark.parametrize("cost", [COST, MOE_COST], ids=["dense", "moe"])
def test_min_load_tokens_compiled_matches_under_overload(no_fallback, timeseries, kind, cost):
    """A burst that queues prompts and fills KV (preemptions), uneven capacities: every routing
    decision compares loaded workers, and the runs still agree bit for bit."""
    if kind == "mixed":
        workers = _uneven(Role.MIXED, 3, cost)
    else:
        workers = _uneven(Role.PREFILL, 2, cost) + _uneven(Role.DECODE, 3, cost)
    cluster = ClusterSpec(workers, kv_bytes_per_token=2e5)
    runs = both(_poisson(7, 400, 0.004), cluster, *MIN_LOAD, no_fallback, timeseries, 0.02)
    assert runs is not None
    python, compiled = runs
    assert_identical(python, compiled)
    req = python.requests
    decoded = req[req["decode_worker"] != ""]  # a rejected request has no decode worker
    # the routing spread prompts and decodes over every worker
    assert set(req["prefill_worker"]) == {w.name for w in workers if w.role is not Role.DECODE}
    assert set(decoded["decode_worker"]) == {w.name for w in workers if w.role is not Role.PREFILL}
    if kind == "mixed":  # some decodes left the worker that prefilled them, over a link
        assert (decoded["decode_worker"] != decoded["prefill_worker"]).any()


def test_the_twin_routes_by_its_own_rule():
    """The compiled min_load_tokens is not another policy's twin: on the overload cluster its
    prompts and decodes go elsewhere than least_loaded's (FLOP vs seconds, requests vs tokens)."""
    workers = _uneven(Role.PREFILL, 2, COST) + _uneven(Role.DECODE, 3, COST)
    cluster = ClusterSpec(workers, kv_bytes_per_token=2e5)
    runs = {
        name: simulate(
            _poisson(7, 400, 0.004), cluster, make_policy(name), slo=SLO, engine="compiled"
        ).requests
        for name in ("min_load_tokens", "least_loaded")
    }
    a, b = runs["min_load_tokens"], runs["least_loaded"]
    assert (a["prefill_worker"] != b["prefill_worker"]).any()
    assert (a["decode_worker"] != b["decode_worker"]).any()


def test_min_load_tokens_declares_its_twin_unless_rerouted():
    class FirstDecode(MinLoadTokens):
        def route_decode(self, request, view):
            return int(view.decode_workers[0])

    class Renamed(MinLoadTokens):
        name = "renamed"

    twin = ("min_load_tokens", "min_load_tokens")
    assert make_policy("min_load_tokens").traits().compiled_routing == twin
    assert Renamed().traits().compiled_routing == twin
    assert FirstDecode().traits().compiled_routing is None
