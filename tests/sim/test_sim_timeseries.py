"""The time series sampled in closed form (pdopt.sim._telemetry) against per-tick oracles.

A run whose policy does not act on ticks skips the ticks between events and evaluates their rows
at the end; the oracles here run every tick (a policy that wants ticks) and read the same values
one tick at a time through the view, whose properties call the scalar owners
(DecodeSide.used_blocks, PrefillSide.outstanding_flop, pdopt.freeness.stranded_blocks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.policies._baselines import LeastLoaded
from pdopt.policies.colocated import VLLM, Sarathi
from pdopt.sim import Action, ClusterView, PolicyTraits, simulate
from pdopt.sim._closed_form import boundaries_before, growth
from pdopt.sim._telemetry import Telemetry, boundaries_before_array, growth_array
from pdopt.workload import Workload

SLO = Slo(1.0, 0.1)
COST = CostModel(PrefillModel(1e6, 1e9, 1e12, 1.0, 0.01), DecodeModel(0.01, 1e-3, 1e-5))
VIEW_COLUMNS = {  # time-series column -> ClusterView property
    "queue_len": "queue_len",
    "queued_prefill_flop": "queued_prefill_flop",
    "running": "running",
    "kv_used_blocks": "kv_used_blocks",
    "kv_free_blocks": "kv_free_blocks",
    "kv_stranded_blocks": "kv_stranded_blocks",
}


def ticking(base: type) -> type:
    """``base`` (a policy class) made to want ticks and to read the view at each one."""

    class Ticking(base):  # type: ignore[misc, valid-type]
        TRAITS = PolicyTraits(
            wants_ticks=True,
            colocated_schedule=base.TRAITS.colocated_schedule,
            chunk_tokens=base.TRAITS.chunk_tokens,
        )

        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            self.rows: list[dict[str, object]] = []

        def traits(self) -> PolicyTraits:
            own = super().traits()
            return PolicyTraits(
                wants_ticks=True,
                colocated_schedule=own.colocated_schedule,
                chunk_tokens=own.chunk_tokens,
            )

        def on_tick(self, view: ClusterView) -> Sequence[Action]:
            values = {col: getattr(view, prop) for col, prop in VIEW_COLUMNS.items()}
            for w in range(view.n_workers):
                row: dict[str, object] = {"t_s": view.now_s, "worker": view.names[w]}
                row["role"] = str(view.roles[w])
                row["pool"] = view.pools[w]
                row.update({col: v[w].item() for col, v in values.items()})
                self.rows.append(row)
            return ()

    return Ticking


def workload(n: int, rate: float, seed: int, spread: float = 1.0) -> Workload:
    """Bursts separated by idle gaps (long idle stretches), prompts 1–600, outputs 1–120."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, n) * np.where(rng.random(n) < 0.1, 20 * spread, 1.0)
    return Workload(np.cumsum(gaps), rng.integers(1, 600, n), rng.integers(1, 120, n))


CASES = {
    "sarathi": (lambda: ClusterSpec.build(COST, 0, 0, 2, kv_capacity_blocks=300), Sarathi, ()),
    "vllm": (lambda: ClusterSpec.build(COST, 0, 0, 2, kv_capacity_blocks=300), VLLM, ()),
    "disaggregated": (
        lambda: ClusterSpec.build(
            COST, 2, 2, kv_capacity_blocks=200, link=LinkSpec("l", 1e9, 1e-3)
        ),
        LeastLoaded,
        (),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("tick_s", [0.05, 0.013])
def test_skipped_ticks_give_the_rows_and_events_of_every_tick(
    case: str, tick_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, base, args = CASES[case]
    wl = workload(120, 30.0, seed=len(case))
    snapshots = []
    snapshot = Telemetry.snapshot
    monkeypatch.setattr(Telemetry, "snapshot", lambda *a: snapshots.append(snapshot(*a)))
    fast = simulate(wl, cluster(), base(*args), slo=SLO, tick_s=tick_s, engine="python")
    n_ticks = fast.timeseries["t_s"].nunique()
    assert len(snapshots) < n_ticks / 2  # the ticks were mostly skipped
    oracle_policy = ticking(base)(*args)
    slow = simulate(wl, cluster(), oracle_policy, slo=SLO, tick_s=tick_s, engine="python")
    # the run itself is the same, every tick or not
    for name in ("requests", "events", "workers", "timeseries"):
        pd.testing.assert_frame_equal(getattr(fast, name), getattr(slow, name), check_exact=True)
    # and each tick's row is what the view (the scalar owners) reads at that tick
    oracle = pd.DataFrame(oracle_policy.rows)
    assert len(oracle) == len(fast.timeseries) > 0
    if case != "disaggregated":
        # NOTE: a mixed worker's row takes free blocks from its decode side's capacity, which
        # already excludes the prompts its prefill side reserves (_mixed._sync_cap); the view
        # takes them from the whole capacity, so the two free counts differ there by design.
        oracle = oracle.drop(columns=["kv_free_blocks", "kv_stranded_blocks"])
    got = fast.timeseries[oracle.columns]
    pd.testing.assert_frame_equal(got, oracle, check_exact=True, check_dtype=False)
    # the scenario exercises what the skipping must get right
    counts = fast.timeseries["kv_used_blocks"].to_numpy()
    assert counts.max() > 0 and (fast.timeseries["queue_len"] > 0).any()
    kinds = set(fast.events["kind"]) | set(slow.events["kind"])
    assert kinds & {"false_oom", "preemption"}  # KV pressure


def test_a_tick_at_an_events_time_comes_after_it_as_before() -> None:
    # arrivals exactly on ticks (0.1 = 2 · 0.05): the arrival goes first, then the tick's row
    wl = Workload([0.0, 0.1, 0.25, 2.0], [100, 200, 50, 10], [30, 5, 60, 2])
    cluster = ClusterSpec.build(COST, 0, 0, 1, kv_capacity_blocks=100)
    fast = simulate(wl, cluster, make_policy("vllm"), slo=SLO, engine="python")
    policy = ticking(VLLM)()
    slow = simulate(wl, cluster, policy, slo=SLO, engine="python")
    pd.testing.assert_frame_equal(fast.timeseries, slow.timeseries, check_exact=True)
    oracle = pd.DataFrame(policy.rows).drop(columns=["kv_free_blocks", "kv_stranded_blocks"])
    pd.testing.assert_frame_equal(
        fast.timeseries[oracle.columns], oracle, check_exact=True, check_dtype=False
    )
    assert fast.timeseries.loc[fast.timeseries["t_s"] == 0.1, "running"].item() >= 1


@settings(max_examples=200, deadline=None)
@given(
    t_seg=st.floats(0.0, 100.0),
    a_seg=st.floats(1e-4, 0.2),
    half_d2b=st.sampled_from([0.0, 1e-9, 3e-6, 1e-4]),
    dts=st.lists(st.floats(-1.0, 50.0), min_size=1, max_size=20),
)
def test_boundaries_before_array_equals_the_scalar(
    t_seg: float, a_seg: float, half_d2b: float, dts: list[float]
) -> None:
    t = np.array([t_seg + dt for dt in dts])
    n = len(t)
    got = boundaries_before_array(np.full(n, t_seg), np.full(n, a_seg), np.full(n, half_d2b), t)
    want = [boundaries_before(t_seg, a_seg, half_d2b, float(x)) for x in t]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(
    cnt=st.lists(st.integers(0, 9), min_size=16, max_size=16),
    m1=st.integers(0, 10_000),
    lengths=st.lists(st.integers(0, 200), min_size=1, max_size=20),
)
def test_growth_array_equals_the_scalar(cnt: list[int], m1: int, lengths: list[int]) -> None:
    b = sum(cnt)
    n = len(lengths)
    got = growth_array(
        np.array([cnt]), np.zeros(n, np.int64), np.full(n, b), 16, np.full(n, m1),
        np.array(lengths),
    )  # fmt: skip
    assert got.tolist() == [growth(cnt, b, 16, m1, m1 + length - 1) for length in lengths]
