"""The Python engine's memory-bounded recording (issue 38: 1M requests with a time series in
<= 1.5 GB): the time series is evaluated a batch of snapshots at a time into column blocks
(pdopt.sim._telemetry), and the request table becomes a frame without extra copies
(pdopt.sim._requests). What is checked here is that the batching changes no row and that the
snapshots stay bounded; the peak itself is measured by benchmarks/bench_policies.py
(``sim_memory_timeseries``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.model_spec import SlidingWindow
from pdopt.policies import make_policy
from pdopt.sim import _telemetry as telemetry
from pdopt.sim import simulate
from pdopt.sim._requests import RequestTable
from pdopt.sim._telemetry import _FIELDS, Telemetry
from pdopt.workload import Workload

SLO = Slo(1.0, 0.1)
COST = CostModel(PrefillModel(1e6, 1e9, 1e12, 1.0, 0.01), DecodeModel(0.01, 1e-3, 1e-5))
LINK = LinkSpec("l", 1e9, 1e-3)


def bursty(n: int, seed: int) -> Workload:
    """Bursts with idle gaps (long stretches one snapshot stands for), prompts 16–600."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(0.01, n) * np.where(rng.random(n) < 0.05, 300.0, 1.0)
    return Workload(np.cumsum(gaps), rng.integers(16, 600, n), rng.integers(2, 200, n))


CASES = {
    "disaggregated": (lambda: ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=120, link=LINK),
                      "least_loaded"),
    "colocated": (lambda: ClusterSpec.build(COST, 0, 0, 3, kv_capacity_blocks=120,
                                            max_running=12), "sarathi"),
    "sliding_window": (lambda: dataclasses.replace(
        ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=80, link=LINK),
        sliding_window=SlidingWindow(128, 18, 36)), "least_loaded"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_small_batches_chunks_and_blocks_give_the_same_frames(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows evaluated a few snapshots at a time, in chunks of a few ticks, into blocks of a few
    rows (every carry between them exercised) equal one evaluation of the whole run."""
    cluster, policy = CASES[case]
    wl = bursty(300, seed=len(case))

    def run() -> pd.DataFrame:
        res = simulate(wl, cluster(), make_policy(policy), slo=SLO, tick_s=0.01, engine="python")
        return res.timeseries

    whole = run()
    monkeypatch.setattr(telemetry, "_BATCH_ROWS", 24)
    monkeypatch.setattr(telemetry, "_CHUNK_ROWS", 16)
    monkeypatch.setattr(telemetry, "_BLOCK_ROWS", 40)
    pieces = run()
    assert len(whole) > 40 * 100  # many blocks, batches and chunks
    pd.testing.assert_frame_equal(pieces, whole, check_exact=True)
    assert (whole["kv_used_blocks"] > 0).any() and (whole["busy_frac"] > 0).any()


def test_pending_snapshots_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshots waiting for evaluation never exceed one batch: a run's memory holds its
    rows as machine numbers, not every snapshot until the end."""
    monkeypatch.setattr(telemetry, "_BATCH_ROWS", 64)
    pending: list[int] = []
    snapshot = Telemetry.snapshot

    def recorded(self: Telemetry, k: int, need: int) -> None:
        snapshot(self, k, need)
        pending.append(len(self._rows) // len(_FIELDS))

    monkeypatch.setattr(Telemetry, "snapshot", recorded)
    cluster, policy = CASES["disaggregated"]
    simulate(
        bursty(300, seed=1), cluster(), make_policy(policy), slo=SLO, tick_s=0.01, engine="python"
    )
    n_w = 4
    assert len(pending) > 10 * 64 // n_w
    assert max(pending) <= 64 + n_w


def test_frame_hands_its_rows_over_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """frame() gives the run's rows away (its blocks are freed as the columns are joined): a
    second call raises rather than return an empty or partial frame."""
    seen: list[Telemetry] = []
    frame = Telemetry.frame

    def recorded(self: Telemetry) -> pd.DataFrame:
        seen.append(self)
        return frame(self)

    monkeypatch.setattr(Telemetry, "frame", recorded)
    cluster, policy = CASES["disaggregated"]
    res = simulate(
        bursty(20, seed=2), cluster(), make_policy(policy), slo=SLO, tick_s=0.01, engine="python"
    )
    assert len(res.timeseries) and len(seen) == 1
    with pytest.raises(RuntimeError, match="called already"):
        frame(seen[0])


def test_request_frame_does_not_share_memory_with_the_table() -> None:
    """to_frame reads the table's columns without copying them first; the frame's constructor
    copies them into its own blocks, so the frame never aliases the engine's buffers."""
    table = RequestTable(6)
    frame = table.to_frame(6, ("a", "b"), cached=True)
    buffers = [
        np.frombuffer(getattr(table, name), dtype=np.uint8)
        for name in ("arrival_s", "input_tokens", "output_tokens", "prefill_start_s", "finish_s",
                     "preemptions", "migrations", "migrated_bytes", "cached_tokens")
    ]  # fmt: skip
    for name in frame.columns:
        values = frame[name].to_numpy()
        if values.dtype != object:
            assert not any(np.shares_memory(values, b) for b in buffers), name
    del buffers, values
    table.arrival_s.append(1.0)  # no numpy view (the frame's) left exporting the table's
