"""``pdopt.plan.plan_deployment`` (issue 37, deliver 7): the pipeline as one library call gives
the command's answer on the same inputs."""

from __future__ import annotations

import json
import math

import pytest

from pdopt.cli import main
from pdopt.plan import DeploymentPlan, plan_deployment
from pdopt.workload import archetype_workload


def test_the_library_and_the_command_give_one_answer(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "Llama-2-7B", "--gpus", "H100-SXM=8,A100-80GB=inf", "--workload",
            "phasor_mix", "--rate", "4", "--requests", "300", "--ttft-slo", "1",
            "--tpot-slo", "0.05", "--quantile", "0.9", "--verify-draws", "2", "--json"]  # fmt: skip
    assert main(args) == 0
    cli = json.loads(capsys.readouterr().out)
    draws = [archetype_workload("phasor_mix", 4.0, n_requests=300, seed=s) for s in (0, 1)]
    result = plan_deployment(
        draws[0], "Llama-2-7B", {"H100-SXM": 8, "A100-80GB": math.inf}, ttft_slo_s=1.0,
        tpot_slo_s=0.05, rate_per_s=4.0, arrival_cv=1.0, quantile=0.9, draws=draws[1:],
    )  # fmt: skip
    assert isinstance(result, DeploymentPlan) and result.meets is cli["verdict"]["meets"]
    assert result.plan.to_dict()["counts"] == cli["recommendation"]["counts"]
    assert result.verified.verdict() == cli["verdict"]["text"]
    assert result.traffic.to_dict() == cli["workload"]["too_long"]
    assert result.tokens == pytest.approx(cli["recommendation"]["tokens"])
    assert result.describe().startswith("RECOMMENDED ")
