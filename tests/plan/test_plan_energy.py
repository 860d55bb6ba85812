"""A plan's energy (issue 37, deliver 5 and item 7): the check's workers carry their GPUs'
data-sheet power, so the exported scenario no longer says 0 W and the plan reports a non-zero
simulated energy per output token beside the TDP bound."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.hardware import get_gpu
from pdopt.scenario import Scenario

ARGS = ["plan", "--model", "Llama-2-7B", "--gpus", "H100-SXM=8", "--workload", "phasor_mix",
        "--rate", "4", "--requests", "300", "--ttft-slo", "1", "--tpot-slo", "0.05",
        "--quantile", "0.9", "--verify-draws", "1", "--quiet"]  # fmt: skip


def test_the_exported_plan_carries_power_and_the_plan_reports_energy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.toml"
    assert main([*ARGS, "--out", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    h100 = get_gpu("H100-SXM")
    cluster = Scenario.from_toml(out).cluster
    tp = payload["recommendation"]["counts"][0]["tp"]
    assert {c["tp"] for c in payload["recommendation"]["counts"]} == {tp}
    assert h100.max_power_w > h100.idle_power_w > 0
    for worker in cluster.workers:
        assert worker.max_power_w == pytest.approx(h100.max_power_w * tp)
        assert worker.idle_power_w == pytest.approx(h100.idle_power_w * tp)
    simulated = payload["check"]["sim_energy_per_output_token_j"]
    bound = payload["recommendation"]["tokens"]["joules_per_output_token_at_tdp"]
    # the simulated energy (idle and busy power) and the TDP bound are both reported
    assert math.isfinite(simulated) and simulated > 0
    assert bound > 0
    assert main(ARGS) == 0
    text = capsys.readouterr().out
    assert "simulated " in text and "J per output token" in text
