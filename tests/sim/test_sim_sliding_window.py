"""P→D transfers of a sliding-window model move only the window of its sliding layers.

Hand computation: a 1000-token prompt of gpt-oss-120b (18 full layers, 18 sliding with a
128-token window) moves ``(18·1000 + 18·128) / 36 = 564`` tokens' worth of
``kv_bytes_per_token`` (73,728 B), in both engines and in Mooncake's transfer prediction.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.hardware import get_gpu
from pdopt.model_spec import SlidingWindow, get_model
from pdopt.policies import make_policy
from pdopt.scenario import Scenario
from pdopt.sim import simulate
from pdopt.workload import Workload

SLO = Slo(5.0, 0.5)
COST = CostModel(PrefillModel(2e3, 2e9, 1e13, intercept_s=0.002), DecodeModel(0.01, 1e-4, 1e-6))
WINDOW = SlidingWindow(128, 18, 36)
LINK = LinkSpec("slow", 1e9, 1e-3)
KV_BYTES = 73_728.0


def _cluster(window: SlidingWindow | None) -> ClusterSpec:
    cluster = ClusterSpec.build(COST, 1, 1, kv_bytes_per_token=KV_BYTES, link=LINK)
    return dataclasses.replace(cluster, sliding_window=window)


def _workload(prompt: int) -> Workload:
    n = 4
    return Workload(np.arange(n) * 10.0, np.full(n, prompt), np.full(n, 5))


@pytest.mark.parametrize("engine", ["python", "compiled"])
@pytest.mark.parametrize(("prompt", "held"), [(100, 100.0), (1000, 564.0)])
def test_transfer_moves_the_windowed_kv(engine: str, prompt: int, held: float) -> None:
    result = simulate(
        _workload(prompt), _cluster(WINDOW), make_policy("round_robin"), slo=SLO, engine=engine
    )
    req = result.requests
    took = (req["transfer_end_s"] - req["transfer_start_s"]).to_numpy()
    assert took == pytest.approx(LINK.latency_s + held * KV_BYTES / LINK.bw_bytes_per_s, rel=1e-12)


def test_both_engines_agree_bit_for_bit_with_a_window() -> None:
    runs = [
        simulate(_workload(3000), _cluster(WINDOW), make_policy("least_loaded"), slo=SLO,
                 engine=engine)
        for engine in ("python", "compiled")
    ]  # fmt: skip
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=True)
    pd.testing.assert_frame_equal(runs[0].events, runs[1].events, check_exact=True)


def test_no_window_keeps_the_full_transfer() -> None:
    req = simulate(_workload(1000), _cluster(None), make_policy("round_robin"), slo=SLO).requests
    took = (req["transfer_end_s"] - req["transfer_start_s"]).to_numpy()
    assert took == pytest.approx(LINK.latency_s + 1000 * KV_BYTES / LINK.bw_bytes_per_s)


def test_mooncake_predicts_the_windowed_transfer() -> None:
    policy = make_policy("mooncake")
    simulate(_workload(1000), _cluster(WINDOW), policy, slo=SLO, engine="python")
    assert policy._kv_bytes_of(1000) == 564.0 * KV_BYTES


def test_from_hardware_takes_the_models_window() -> None:
    model = get_model("gpt-oss-120b")
    cluster = ClusterSpec.from_hardware(get_gpu("H200"), model, COST, 1, 1)
    assert cluster.sliding_window == WINDOW
    assert cluster.kv_bytes_per_token == model.kv_bytes_per_token
    full = ClusterSpec.from_hardware(get_gpu("H200"), get_model("Llama-3.1-8B"), COST, 1, 1)
    assert full.sliding_window is None


def test_scenario_file_keeps_the_window(tmp_path: Path) -> None:
    scenario = Scenario(_workload(1000), _cluster(WINDOW), "round_robin", SLO)
    back = Scenario.from_toml(scenario.to_toml(tmp_path / "swa.toml"))
    assert back == scenario and back.cluster.sliding_window == WINDOW
