"""KV blocks of a sliding-window model count the tokens each layer holds, in both engines.

Hand computation (gpt-oss-120b: 36 layers, 18 sliding with a 128-token window, 16-token blocks):
a request holding ``L`` tokens holds ``E = (18·L + 18·min(L, 128)) / 36`` full-token equivalents
and ``ceil(E / 16)`` blocks. At ``L = 1010 .. 1024`` that is ``E = 569 .. 576``, 36 blocks,
where counting every token in every layer gives ``ceil(L / 16) = 64``; a 640-block decode
worker then runs ``floor(640 / 36) = 17`` such requests at once instead of ``floor(640 / 64) =
10``.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.model_spec import SlidingWindow
from pdopt.policies import make_policy
from pdopt.sim import SimResult, simulate
from pdopt.sim._closed_form import (
    NEVER,
    kv_blocks,
    window_first_growth_failure,
    window_growth,
)
from pdopt.workload import Workload

GPT_OSS = SlidingWindow(128, 18, 36)
SLO = Slo(5.0, 0.5)
FAST_PREFILL = CostModel(
    PrefillModel(1.0, 1.0, 1e15, intercept_s=1e-4), DecodeModel(0.01, 0.0, 0.0)
)


def _cluster(window: SlidingWindow | None, cap: int, **kwargs: object) -> ClusterSpec:
    cluster = ClusterSpec.build(FAST_PREFILL, 1, 1, kv_capacity_blocks=cap, **kwargs)  # type: ignore[arg-type]
    return dataclasses.replace(cluster, sliding_window=window)


def _max_concurrency(result: SimResult) -> int:
    """Most requests decoding at once, from their decode start and finish times."""
    req = result.requests
    start = req["decode_start_s"].to_numpy()
    end = req["finish_s"].to_numpy()
    return max(int(((start <= t) & (t < end)).sum()) for t in start)


@pytest.mark.parametrize(
    ("tokens", "window", "blocks"),
    [
        (100, GPT_OSS, 7),  # inside the window: ceil(100 / 16)
        (1000, GPT_OSS, 36),  # E = (18·1000 + 18·128) / 36 = 564; ceil(35.25)
        (8192, GPT_OSS, 260),  # E = 4160
        (8192, None, 512),
        (5000, SlidingWindow(4096, 32, 32), 256),  # Mistral: every layer keeps 4096
    ],
)
def test_kv_blocks_hand_values(tokens: int, window: SlidingWindow | None, blocks: int) -> None:
    cluster = _cluster(window, 4096)
    assert cluster.kv_blocks(tokens) == blocks
    if window is None:
        assert cluster.kv_blocks(tokens) == -(-tokens // 16)


@pytest.mark.parametrize("window", [(128, 18, 36), (1024, 52, 62), (4096, 32, 32)])
def test_window_growth_matches_a_per_boundary_count(window: tuple[int, int, int]) -> None:
    rng = random.Random(7)
    offsets = [rng.randrange(-50, 3000) for _ in range(9)]
    n, bt = 60, 16

    def held(m: int) -> int:
        return sum(kv_blocks(o + m, bt, *window) for o in offsets)

    for m2 in range(n, n + 400, 37):
        assert window_growth(offsets, 9, bt, *window, n + 1, m2) == held(m2) - held(n)
    for free in (0, 3, 40, 500):
        m = window_first_growth_failure(offsets, 9, bt, *window, n, free)
        if window[1] == window[2]:  # every layer slides: past the window nothing grows
            assert m == NEVER or held(m) - held(n) > free
            continue
        assert held(m) - held(n) > free >= held(m - 1) - held(n)


def _pressured_workload(n: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(
        np.sort(rng.uniform(0.0, 2.0, n)),
        rng.integers(50, 3000, n),
        rng.integers(20, 400, n),
    )


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded"])
def test_both_engines_identical_for_a_windowed_model_under_kv_pressure(policy: str) -> None:
    cost = CostModel(PrefillModel(2e3, 2e9, 1e14, intercept_s=0.002), DecodeModel(0.01, 1e-4, 1e-7))
    cluster = dataclasses.replace(
        ClusterSpec.build(cost, 1, 2, kv_capacity_blocks=600, kv_bytes_per_token=73_728.0),
        sliding_window=GPT_OSS,
    )
    workload = _pressured_workload(120, 3)
    runs = [
        simulate(workload, cluster, make_policy(policy), slo=SLO, engine=engine)
        for engine in ("python", "compiled")
    ]
    assert (runs[0].events["kind"] == "preemption").sum() > 0  # growth did outgrow the KV
    python, compiled = runs
    pd.testing.assert_frame_equal(python.requests, compiled.requests, check_exact=True)
    pd.testing.assert_frame_equal(python.events, compiled.events, check_exact=True)
    pd.testing.assert_frame_equal(python.timeseries, compiled.timeseries, check_exact=True)
    req = runs[0].requests
    assert req["request_id"].is_unique and len(req) == len(workload)
    assert (req["status"] == "finished").all()
    assert (runs[0].timeseries["kv_used_blocks"] <= 600).all()


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_decode_concurrency_rises_with_the_window(engine: str) -> None:
    n = 40
    workload = Workload(np.zeros(n), np.full(n, 1009), np.full(n, 16))  # contexts 1010..1024
    got = {}
    for name, window in (("full", None), ("window", GPT_OSS)):
        cluster = _cluster(window, 640, max_running=64)
        result = simulate(workload, cluster, make_policy("round_robin"), slo=SLO, engine=engine)
        assert (result.requests["status"] == "finished").all()
        assert not (result.events["kind"] == "preemption").any()  # blocks constant: no growth
        got[name] = _max_concurrency(result)
    assert got == {"full": 640 // 64, "window": 640 // 36}


def test_reserve_output_reserves_the_windowed_peak() -> None:
    # peak context 1009 + 16 − 1 = 1024: E = 576, 36 blocks (64 without the window)
    n = 40
    workload = Workload(np.zeros(n), np.full(n, 1009), np.full(n, 16))
    cluster = _cluster(GPT_OSS, 640, max_running=64, kv_allocation="reserve_output")
    result = simulate(workload, cluster, make_policy("round_robin"), slo=SLO, engine="python")
    assert _max_concurrency(result) == 17


@pytest.mark.parametrize("allocation", ["on_demand", "reserve_output"])
def test_migrations_and_colocation_keep_windowed_kv_within_capacity(allocation: str) -> None:
    """The Python engine's own paths (Phasor's KV migrations, mixed workers) with a window:
    every request ends exactly once and the KV stays within capacity."""
    cost = CostModel(PrefillModel(50.0, 1e9, 1e13, 1.0, 5e-4), DecodeModel(5e-3, 1e-4, 1e-7))
    rng = np.random.default_rng(0)
    n = 400
    wl = Workload(
        np.cumsum(rng.exponential(0.01, n)), rng.integers(100, 900, n), rng.integers(2, 300, n)
    )
    cluster = dataclasses.replace(
        ClusterSpec.build(
            cost, 2, 2, 2, kv_capacity_blocks=90, kv_bytes_per_token=1e4,
            link=LinkSpec("l", 1e9, 1e-4), mixed_pool_role="decode", max_running=12,
            kv_allocation=allocation,
        ),
        sliding_window=GPT_OSS,
    )  # fmt: skip
    res = simulate(wl, cluster, make_policy("phasor"), slo=SLO, tick_s=0.01)
    assert (res.events["kind"] == "migration_end").sum() > 0
    req = res.requests
    assert req["request_id"].is_unique and len(req) == n
    assert (req["status"] == "finished").all()
    assert res.timeseries["kv_used_blocks"].between(0, 90).all()
    mixed = dataclasses.replace(
        ClusterSpec.build(cost, 0, 0, 2, kv_capacity_blocks=90, kv_allocation=allocation),
        sliding_window=GPT_OSS,
    )
    res = simulate(wl, mixed, make_policy("sarathi"), slo=SLO, tick_s=0.01)
    assert (res.requests["status"] == "finished").all() and len(res.requests) == n
    assert res.timeseries["kv_used_blocks"].between(0, 90).all()
