"""Cost per million input/output/total tokens and energy per token in every plan (issue 37,
deliver 5)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdopt.cli import main
from pdopt.hardware import get_gpu
from pdopt.plan import Demand
from pdopt.plan._economics import token_economics

DEMAND = Demand(10.0, np.full(8, 1000.0), np.full(8, 100.0), 1.0, 0.1)


def test_a_pd_plan_splits_its_cost_by_pool_and_states_the_total() -> None:
    rows = [{"gpu": "H100-SXM", "tp": 2, "role": "prefill", "workers": 1},
            {"gpu": "A100-80GB", "tp": 1, "role": "decode", "workers": 3}]  # fmt: skip
    prices = {("H100-SXM", 2): 14.0, ("A100-80GB", 1): 4.0}
    e = token_economics(rows, prices, DEMAND)
    # 10 req/s × 1000 input tokens = 10,000 tokens/s = 36 M/h; 1,000 output tokens/s = 3.6 M/h
    assert e["usd_per_m_input_tokens"] == pytest.approx(14.0 / 36.0)
    assert e["usd_per_m_output_tokens"] == pytest.approx(12.0 / 3.6)
    assert e["usd_per_m_tokens"] == pytest.approx(26.0 / 39.6)
    watts = 2 * get_gpu("H100-SXM").max_power_w + 3 * get_gpu("A100-80GB").max_power_w
    assert e["power_w_at_tdp"] == pytest.approx(watts)
    assert e["joules_per_token_at_tdp"] == pytest.approx(watts / 11_000)


def test_a_colocated_deployment_states_the_total_only() -> None:
    rows = [{"gpu": "H100-SXM", "tp": 1, "role": "colocated", "workers": 2}]
    e = token_economics(rows, {("H100-SXM", 1): 7.0}, DEMAND)
    assert e["usd_per_m_input_tokens"] is None and e["usd_per_m_output_tokens"] is None
    assert e["usd_per_m_tokens"] == pytest.approx(14.0 / 39.6)


def test_every_plan_states_its_token_costs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "Qwen2.5-7B", "--gpus", "H100-SXM=8", "--workload", "sharegpt",
            "--rate", "4", "--requests", "200", "--ttft-slo", "1", "--tpot-slo", "0.1",
            "--no-sim"]  # fmt: skip
    assert main([*args, "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)["recommendation"]["tokens"]
    assert tokens["usd_per_m_tokens"] > 0 and tokens["joules_per_token_at_tdp"] > 0
    assert main(args) == 0
    line = capsys.readouterr().out.splitlines()[3]
    assert line.startswith("per token:") and "per million input tokens" in line and " J " in line
