"""The steps ``pdopt plan`` used to hold, now library calls (issue 37, "library first"): profile
costs with their fit errors, sweeps, the recommended mode and the refusals, each checked on its
own; tests/plan/test_plan_deployment.py checks that the command prints the library's answer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pdopt.errors import ConfigError, InfeasiblePlanError
from pdopt.plan import plan_deployment, profile_costs
from pdopt.plan._pipeline import pick_mode
from pdopt.plan._sweep import SweepPoint, scaled_prices, sweep_deployment
from pdopt.plan._uncertainty import ROOFLINE_PRIOR_ERROR
from pdopt.workload import archetype_workload

V100 = Path(__file__).resolve().parents[2] / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv"
WL = archetype_workload("sharegpt", 4.0, n_requests=300, seed=0)


def test_profile_costs_fit_each_profile_and_state_its_error() -> None:
    found = profile_costs([V100])
    assert found.model is not None and found.model.name == "Qwen2.5-7B"
    assert set(found.costs) == {("V100-32GB", 1)}
    (error,) = found.errors.values()
    assert 0.0 < error < ROOFLINE_PRIOR_ERROR  # a roofline table fits itself closely
    fit = found.fits[str(V100)]
    assert fit["prefill_r2"] > 0.9 and fit["decode_r2"] is not None


def test_a_sweep_gives_one_row_per_value_and_a_failed_point_says_why() -> None:
    def plan_at(rate: float) -> object:
        if rate > 1000:
            raise InfeasiblePlanError("no plan within the limits")
        return plan_deployment(WL, "Qwen2.5-7B", {"H100-SXM": 8}, ttft_slo_s=1.0, tpot_slo_s=0.1,
                               rate_per_s=rate, arrival_cv=1.0, verify=False)  # fmt: skip

    points = sweep_deployment(plan_at, [2.0, 8.0, 5000.0])  # type: ignore[arg-type]
    rows = [p.row() for p in points]
    assert [r["value"] for r in rows] == [2.0, 8.0, 5000.0]
    assert rows[0]["gpus"] <= rows[1]["gpus"] and rows[0]["meets"] is True
    assert rows[1]["plan"]["tokens"]["usd_per_m_tokens"] == rows[1]["usd_per_m_tokens"] > 0
    assert "not verified" in rows[0]["verdict"]
    assert rows[2]["gpus"] is None and rows[2]["verdict"] == "no plan: no plan within the limits"
    assert isinstance(points[2], SweepPoint) and points[2].result is None
    assert scaled_prices({"H100-SXM": 2.0}, 1.5) == {"H100-SXM": 3.0}


def test_the_recommended_mode_is_the_cheapest_that_meets_unless_full_pd_is_as_cheap() -> None:
    assert pick_mode([(True, 10.0, 4), (True, 8.0, 4), (True, 9.0, 3)]) == 1
    assert pick_mode([(True, 8.0, 4), (True, 8.0, 4)]) is None  # a tie keeps full P/D
    assert pick_mode([(False, 8.0, 4), (True, 20.0, 8)]) == 1  # P/D misses: any mode that meets
    assert pick_mode([(False, 8.0, 4), (False, 2.0, 1)]) is None


def test_the_refusals_name_the_knob() -> None:
    long = WL.with_lengths([8000] * len(WL), WL.output_tokens)
    with pytest.raises(ConfigError, match="--too-long truncate"):
        plan_deployment(long, "Llama-2-7B", {"H100-SXM": 8}, ttft_slo_s=1.0, tpot_slo_s=0.1,
                        rate_per_s=4.0, arrival_cv=1.0)  # fmt: skip
    with pytest.raises(ConfigError, match="--no-sim"):
        plan_deployment(WL, "Qwen2.5-7B", {"H100-SXM": math.inf}, ttft_slo_s=1.0,
                        tpot_slo_s=0.1, rate_per_s=1e7, arrival_cv=1.0)  # fmt: skip
