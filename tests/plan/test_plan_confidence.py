"""A plan's verdict with 95% confidence (issue 37, deliver 2): distribution-free upper bounds
of the simulated quantiles, checked for coverage against a known distribution."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pdopt.cli import main
from pdopt.plan._verify import quantile_upper_bound


@pytest.mark.parametrize(("n", "q"), [(1000, 0.99), (4000, 0.99), (500, 0.9)])
def test_the_upper_bound_covers_the_true_quantile_95_percent_of_the_time(n: int, q: float) -> None:
    rng = np.random.default_rng(0)
    true = -math.log(1 - q)  # the exponential distribution's q-quantile
    covered = [quantile_upper_bound(rng.exponential(size=n), q) >= true for _ in range(2000)]
    assert 0.93 <= float(np.mean(covered)) <= 0.985


def test_too_few_requests_for_the_quantile_give_no_finite_bound() -> None:
    assert quantile_upper_bound(np.ones(50), 0.99) == math.inf
    assert math.isnan(quantile_upper_bound(np.array([]), 0.99))


def test_the_verdict_says_whether_it_holds_with_95_percent_confidence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--model", "Qwen2.5-7B", "--gpus", "H100-SXM=4", "--workload", "sharegpt",
            "--rate", "4", "--requests", "1000", "--ttft-slo", "1", "--tpot-slo", "0.1",
            "--verify-draws", "1", "--json"]  # fmt: skip
    assert main(args) == 0
    payload = json.loads(capsys.readouterr().out)
    verdict, check = payload["verdict"], payload["check"]
    assert check["sim_ttft_q_upper_s"] >= check["sim_ttft_q_s"]
    sampling = check["sim_ttft_q_upper_s"] <= 1 and check["sim_tpot_q_upper_s"] <= 0.1
    # confident: the sampling bounds and those of the run with the cost models slowed by their
    # documented error (tests/plan/test_plan_cost_error.py)
    assert verdict["confident"] is (sampling and verdict["cost_model_error"]["meets_confidently"])
    assert "with 95% confidence" in verdict["confidence"]
