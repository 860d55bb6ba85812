"""Requests beyond the context window are rejected before the run, with the reason, by both
engines; the others run exactly as they would alone (issue 17, item 3)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pdopt.cli import main
from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.scenario import Scenario
from pdopt.sim import context_rejections, rejections_by_reason, simulate
from pdopt.workload import Workload

COST = CostModel(PrefillModel(0.0, 2e9, 1e14), DecodeModel(0.01, 1e-4, 1e-7))
SLO = Slo(1.0, 0.1)


def _workload() -> Workload:
    rng = np.random.default_rng(0)
    n = 60
    return Workload(
        np.sort(rng.uniform(0, 30, n)), rng.integers(16, 3000, n), rng.integers(1, 400, n)
    )


def test_the_rule_names_prompt_and_total_overflows() -> None:
    reasons = context_rejections([100, 900, 1200], [50, 200, 1], 1000)
    assert list(reasons) == [
        "",
        "prompt + output exceed the 1000-token context window",
        "prompt exceeds the 1000-token context window",
    ]


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_over_long_requests_are_rejected_and_the_rest_run_as_alone(engine: str) -> None:
    wl = _workload()
    window = 2000
    cluster = dataclasses.replace(ClusterSpec.build(COST, 2, 2), max_context_tokens=window)
    res = simulate(wl, cluster, make_policy("least_loaded"), slo=SLO, engine=engine)
    req = res.requests
    reasons = context_rejections(wl.input_tokens, wl.output_tokens, window)
    over = reasons != ""
    assert over.sum() > 0
    assert list(req["request_id"]) == list(range(len(wl)))  # each request once, its own id
    assert (req["status"][over] == "rejected").all()
    assert list(req["reason"][over]) == list(reasons[over])
    assert rejections_by_reason(req) == pd.Series(reasons[over]).value_counts().to_dict()
    rejections = res.events[res.events["kind"] == "rejection"]
    assert sorted(rejections["request_id"]) == list(np.flatnonzero(over))
    # The requests that fit: the same run as without the others.
    keep = ~over
    alone = simulate(
        Workload(wl.arrival_s[keep], wl.input_tokens[keep], wl.output_tokens[keep]),
        ClusterSpec.build(COST, 2, 2), make_policy("least_loaded"), slo=SLO, engine=engine,
    )  # fmt: skip
    kept = req[keep].reset_index(drop=True).drop(columns="request_id")
    np.testing.assert_array_equal(kept["ttft_s"], alone.requests["ttft_s"])
    np.testing.assert_array_equal(kept["finish_s"], alone.requests["finish_s"])
    m = res.metrics()
    assert m["rejected"] == over.sum() and m["requests"] == len(wl)


def test_no_window_changes_nothing() -> None:
    wl = _workload()
    plain = simulate(wl, ClusterSpec.build(COST, 2, 2), make_policy("least_loaded"), slo=SLO)
    wide = dataclasses.replace(ClusterSpec.build(COST, 2, 2), max_context_tokens=10**6)
    same = simulate(wl, wide, make_policy("least_loaded"), slo=SLO)
    pd.testing.assert_frame_equal(plain.requests, same.requests)


def test_scenario_files_carry_the_window_and_simulate_counts_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = dataclasses.replace(ClusterSpec.build(COST, 1, 1), max_context_tokens=2000)
    sc = Scenario(_workload(), cluster, "least_loaded", SLO)
    path = sc.to_toml(tmp_path / "s.toml")
    assert Scenario.from_toml(path) == sc
    assert main(["simulate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = rejections_by_reason(sc.run().requests)
    assert out["rejected_by_reason"] == expected and sum(expected.values()) > 0


def test_hardware_config_takes_the_model_s_window(tmp_path: Path) -> None:
    text = """
[workload]
arrival_s = [0.0, 1.0]
input_tokens = [100, 5000]
output_tokens = [10, 10]
[cluster]
gpu = "A100-80GB"
model = "Llama-2-7B"
n_prefill = 1
n_decode = 1
max_context_tokens = "model"
[policy]
name = "least_loaded"
[slo]
ttft_s = 1.0
tpot_s = 0.1
"""
    path = tmp_path / "hw.toml"
    path.write_text(text)
    sc = Scenario.from_toml(path)
    assert sc.cluster.max_context_tokens == 4096
    reasons = sc.run().requests["reason"].tolist()
    assert reasons == ["", "prompt exceeds the 4096-token context window"]
