"""``compute_metrics``' fragmentation figures on hand-built time series, and on a run."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import (
    TIMESERIES_COLUMNS,
    SimResult,
    compute_metrics,
    fragmentation_by_tick,
    simulate,
)
from pdopt.sim._result import _pcts, decode_begin_s
from pdopt.workload import Workload

SLO = Slo(1.0, 0.1)


def _result(rows: list[tuple[float, str, str, int, int]]) -> SimResult:
    """A SimResult with no requests and a time series of (t_s, worker, role, free, stranded)."""
    ts = pd.DataFrame(
        [
            {c: 0 for c in TIMESERIES_COLUMNS}
            | {"t_s": t, "worker": w, "pool": role, "role": role}
            | {"kv_free_blocks": free, "kv_stranded_blocks": stranded}
            for t, w, role, free, stranded in rows
        ],
        columns=list(TIMESERIES_COLUMNS),
    )
    numbers = ["arrival_s", "ttft_s", "tpot_s", "e2e_s", "output_tokens", "preemptions"]
    numbers += ["migrations", "migrated_bytes", "migration_downtime_s"]
    requests = pd.DataFrame({c: np.zeros(0) for c in numbers} | {"status": np.zeros(0, object)})
    events = pd.DataFrame(columns=["t_s", "kind", "worker", "request_id", "detail"])
    workers = pd.DataFrame({"worker": ["d0"], "energy_j": [0.0]})
    return SimResult(requests, ts, events, workers, SLO, 0.1, 0, 0.0)


# Three ticks. 0.1 s: d0 10 free all stranded, d1 30 free none: 10/40 = 25%. 0.2 s: nothing
# free on decode workers (the prefill worker's free blocks do not count): 0%. 0.3 s: a mixed
# worker with 40 free, 4 stranded: 10%; the prefill row (50 stranded) is left out.
ROWS = [
    (0.1, "p0", "prefill", 100, 50),
    (0.1, "d0", "decode", 10, 10),
    (0.1, "d1", "decode", 30, 0),
    (0.2, "p0", "prefill", 100, 50),
    (0.2, "d0", "decode", 0, 0),
    (0.2, "d1", "decode", 0, 0),
    (0.3, "p0", "prefill", 100, 50),
    (0.3, "m0", "mixed", 40, 4),
]


def test_fragmentation_per_tick_mean_and_peak_by_hand() -> None:
    res = _result(ROWS)
    per_tick = fragmentation_by_tick(res.timeseries)
    assert per_tick.index.tolist() == [0.1, 0.2, 0.3]
    assert per_tick.tolist() == pytest.approx([25.0, 0.0, 10.0])
    m = compute_metrics(res, SLO)
    assert m["fragmentation_mean_pct"] == pytest.approx(35.0 / 3)
    assert m["fragmentation_peak_pct"] == pytest.approx(25.0)
    # the old ratio sums over all ticks first: (10 + 4) / (40 + 0 + 40)
    assert m["fragmentation_pct"] == pytest.approx(100 * 14 / 80)


def test_fragmentation_tick_without_decode_rows_counts_as_zero() -> None:
    res = _result([(0.1, "p0", "prefill", 10, 5), (0.2, "p0", "prefill", 10, 5)])
    assert fragmentation_by_tick(res.timeseries).tolist() == [0.0, 0.0]
    m = compute_metrics(res, SLO)
    assert (m["fragmentation_mean_pct"], m["fragmentation_peak_pct"]) == (0.0, 0.0)


def test_fragmentation_metrics_nan_without_timeseries() -> None:
    res = _result([])
    m = compute_metrics(res, SLO)
    for key in ("fragmentation_pct", "fragmentation_mean_pct", "fragmentation_peak_pct"):
        assert math.isnan(m[key])
    assert fragmentation_by_tick(res.timeseries).empty


def test_fragmentation_metrics_of_a_run_match_its_timeseries() -> None:
    """On a run where KV binds: the per-tick figures are the time series' own, recomputed."""
    cost = CostModel(PrefillModel(0.0, 1e9, 1e13, 1.0, 1e-3), DecodeModel(0.01, 1e-3, 1e-6))
    cluster = ClusterSpec.build(cost, 1, 2, kv_capacity_blocks=60, kv_bytes_per_token=1e4)
    rng = np.random.default_rng(3)
    wl = Workload(np.sort(rng.uniform(0, 2, 60)), rng.integers(100, 400, 60), [60] * 60)
    res = simulate(wl, cluster, make_policy("round_robin"), slo=SLO, tick_s=0.05)
    m = res.metrics()
    ts = res.timeseries[res.timeseries["role"] == "decode"]
    g = ts.groupby("t_s")[["kv_free_blocks", "kv_stranded_blocks"]].sum()
    free, stranded = g["kv_free_blocks"].to_numpy(), g["kv_stranded_blocks"].to_numpy()
    per_tick = [100 * s / f if f else 0.0 for f, s in zip(free, stranded, strict=True)]
    assert max(per_tick) > 0  # the example does fragment
    assert m["fragmentation_mean_pct"] == pytest.approx(np.mean(per_tick))
    assert m["fragmentation_peak_pct"] == pytest.approx(max(per_tick))
    assert m["fragmentation_pct"] == pytest.approx(100 * stranded.sum() / free.sum())


def _decode_begin_by_walking(requests: pd.DataFrame, workers: pd.DataFrame) -> np.ndarray:
    """decode_begin_s's definition, request by request: from the decode admission, follow the
    batches a prefill_first worker starts back to back (a batch starting at its members'
    prefill_start_s ends at their latest prefill_end_s)."""
    begin = requests["decode_start_s"].to_numpy(dtype=float).copy()
    sched = dict(zip(workers["worker"], workers["colocated_schedule"], strict=True))
    for i, row in enumerate(requests.itertuples()):
        w = row.prefill_worker
        if sched.get(w) != "prefill_first" or row.decode_worker != w or np.isnan(begin[i]):
            continue
        mine = requests[requests["prefill_worker"] == w].dropna(
            subset=["prefill_start_s", "prefill_end_s"]
        )
        ends = mine.groupby("prefill_start_s")["prefill_end_s"].max().to_dict()
        t = begin[i]
        while t in ends and ends[t] > t:
            t = ends[t]
        begin[i] = t
    return begin


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_decode_begin_follows_back_to_back_batches_as_defined(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    grid = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, np.nan])
    starts = np.array(data.draw(st.lists(grid, min_size=n, max_size=n)))
    ends = starts + np.array(
        data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n))
    )
    requests = pd.DataFrame(
        {
            "prefill_worker": data.draw(
                st.lists(st.sampled_from(["m0", "m1", "p0"]), min_size=n, max_size=n)
            ),
            "decode_worker": data.draw(
                st.lists(st.sampled_from(["m0", "m1", "d0"]), min_size=n, max_size=n)
            ),
            "prefill_start_s": starts,
            "prefill_end_s": ends,
            "decode_start_s": np.array(data.draw(st.lists(grid, min_size=n, max_size=n))),
        }
    )
    workers = pd.DataFrame(
        {
            "worker": ["m0", "m1", "p0", "d0"],
            "colocated_schedule": ["prefill_first", "hybrid", None, None],
        }
    )
    np.testing.assert_array_equal(
        decode_begin_s(requests, workers), _decode_begin_by_walking(requests, workers)
    )


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), max_size=60),
    st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=4),
)
def test_percentiles_taken_together_are_those_taken_one_at_a_time(values, qs):
    array = np.array(values, dtype=np.float64)
    together = _pcts(array, tuple(qs))
    alone = [float(np.percentile(array, q)) if len(array) else math.nan for q in qs]
    np.testing.assert_array_equal(together, alone)


def test_a_missing_status_or_kind_counts_as_neither_finished_nor_any_event() -> None:
    cost = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
    wl = Workload([0.0, 0.1, 0.2], [512, 512, 512], [8, 8, 8])
    res = simulate(wl, ClusterSpec.build(cost, 1, 1), make_policy("round_robin"), slo=SLO)
    requests = res.requests.astype({"status": "string", "prefill_worker": "string"})
    requests.loc[1, ["status", "prefill_worker"]] = pd.NA
    events = pd.DataFrame({c: pd.Series([pd.NA], dtype="string") for c in res.events.columns})
    metrics = compute_metrics(dataclasses.replace(res, requests=requests, events=events), SLO)
    assert metrics["finished"] == 2.0
    assert metrics["rejected"] == 1.0
    assert metrics["false_oom"] == 0.0
