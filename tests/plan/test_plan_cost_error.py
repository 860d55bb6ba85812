"""The cost model's error in a plan's 95% confidence (issue 37, deliver 2): the binding draw is
simulated once more with every cost model slowed by its documented error (the roofline prior's
10%, or a profile's fit error), and the plan is confident only if that run's upper bounds meet
the SLOs too."""

from __future__ import annotations

import json
import math

import pytest

from pdopt.cli import main
from pdopt.costmodel import CostModel, DecodeModel, HybridModel, PrefillModel, TtftModel
from pdopt.plan import plan_deployment
from pdopt.plan._uncertainty import ROOFLINE_PRIOR_ERROR, slowed_cost
from pdopt.workload import archetype_workload

COST = CostModel(
    PrefillModel(2e3, 2e9, 1e13, intercept_s=0.002),
    DecodeModel(0.01, 1e-4, 1e-6, 6e-5, 128, 8),
    TtftModel(1e-9, 1e-5, 0.003),
    HybridModel(0.02, 1e-4, 1e-7, 5e-5, 1e-9, 0.005),
)


def test_slowed_cost_multiplies_every_gpu_time_and_keeps_the_rest() -> None:
    slow = slowed_cost(COST, 1.25)
    prompts = [512, 2048]
    assert slow.prefill.batch_time_s(prompts) == pytest.approx(
        1.25 * COST.prefill.batch_time_s(prompts)
    )
    assert float(slow.decode.iteration_time_s(32, 40_000)) == pytest.approx(
        1.25 * float(COST.decode.iteration_time_s(32, 40_000))
    )
    assert slow.ttft is not None and COST.ttft is not None
    assert float(slow.ttft.predict(1000)) == pytest.approx(1.25 * float(COST.ttft.predict(1000)))
    assert slow.hybrid is not None and COST.hybrid is not None
    assert slow.hybrid.iteration_time_s(4, 1000, [64], [128]) == pytest.approx(
        1.25 * COST.hybrid.iteration_time_s(4, 1000, [64], [128])
    )
    assert (slow.decode.experts, slow.overhead) == (COST.decode.experts, COST.overhead)
    assert slowed_cost(COST, 1.0) == COST


def _plan(error: float | None) -> object:
    wl = archetype_workload("sharegpt", 4.0, n_requests=600, seed=0)
    return plan_deployment(wl, "Qwen2.5-7B", {"H100-SXM": 4}, ttft_slo_s=1.0, tpot_slo_s=0.1,
                           rate_per_s=4.0, arrival_cv=1.0, cost_model_error=error)  # fmt: skip


def test_the_confidence_includes_the_cost_models_error() -> None:
    default = _plan(None)
    assert default.meets and default.cost_error is not None  # type: ignore[attr-defined]
    err = default.cost_error  # type: ignore[attr-defined]
    assert set(err.errors.values()) == {ROOFLINE_PRIOR_ERROR}
    # the slowed run is slower than the plan's own check on the same draw
    assert err.check.sim_ttft_q_s > default.verified.final.check.sim_ttft_q_s  # type: ignore[attr-defined]
    ok, text = default.confidence()  # type: ignore[attr-defined]
    sampling_ok, _ = default.verified.confidence()  # type: ignore[attr-defined]
    assert ok is (sampling_ok and err.meets_confidently)
    assert "documented error (H100-SXM/tp1 10.0%" in text and "cost model's error" in text
    assert "sampling of requests only" not in text
    # 0: the sampling only, said so; a cost model 31 times slower breaks the confidence
    none = _plan(0.0)
    assert none.cost_error is None  # type: ignore[attr-defined]
    assert "not included" in none.confidence()[1]  # type: ignore[attr-defined]
    slow = _plan(30.0)
    assert slow.meets and slow.confidence()[0] is False  # type: ignore[attr-defined]
    assert not slow.cost_error.meets_confidently  # type: ignore[attr-defined]


def test_the_command_reports_the_error_it_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "Qwen2.5-7B", "--gpus", "H100-SXM=4", "--workload", "sharegpt",
            "--rate", "4", "--requests", "600", "--ttft-slo", "1", "--tpot-slo", "0.1",
            "--verify-draws", "1", "--json"]  # fmt: skip
    assert main(args) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    err = verdict["cost_model_error"]
    assert set(err["errors"].values()) == {ROOFLINE_PRIOR_ERROR}
    assert math.isfinite(err["ttft_q_upper_s"]) and err["draw"] == 0
    assert not verdict["confident"] or err["meets_confidently"]
    assert "cost model's error" in verdict["confidence"]
