"""``pdopt plan`` end to end on shipped profiles, with ``--json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.workload import archetype_workload, write_csv_trace

ROOT = Path(__file__).resolve().parents[2]
V100 = str(ROOT / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv")
BASE = ["plan", "--profile", V100, "--ttft-slo", "1.0", "--tpot-slo", "0.1"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    code = main([*BASE, *args, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)  # type: ignore[no-any-return]


def test_plan_json_sizes_checks_and_prices(capsys: pytest.CaptureFixture[str]) -> None:
    payload = run_json(capsys, "--workload", "production_mix", "--rate", "6",
                       "--requests", "1500", "--gpus", "V100-32GB=16")  # fmt: skip
    milp = payload["milp"]
    assert isinstance(milp, dict) and milp["status"] == "optimal"
    counts = {c["role"]: c["workers"] for c in milp["counts"]}
    assert counts["prefill"] >= 1 and counts["decode"] >= 1
    assert milp["n_gpus"] == sum(counts.values()) <= 16
    # V100 catalogue price 2.5 USD/h per GPU.
    assert milp["cost_per_hour"] == pytest.approx(2.5 * milp["n_gpus"])
    assert milp["cost_per_1k_requests"] == pytest.approx(milp["cost_per_hour"] / 6 / 3.6)
    analytic = payload["analytic"]
    assert isinstance(analytic, dict)
    assert analytic["cost_per_hour"] >= milp["cost_per_hour"] - 1e-9
    check = payload["check"]
    assert isinstance(check, dict) and check["sim_requests"] == 1500
    pred = check["predicted"]
    assert pred["stable"] and pred["ttft_attainment"] >= 0.99
    assert check["sim_attainment"] >= 0.95
    assert check["sim_ttft_p99_s"] == pytest.approx(pred["ttft_p99_s"], rel=0.5)
    assert check["sim_tpot_mean_s"] == pytest.approx(pred["tpot_s"], rel=0.15)
    assert payload["model"] == "Qwen2.5-7B"


def test_plan_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--workload", "short_short", "--rate", "4", "--requests", "300"]) == 0
    out = capsys.readouterr().out
    assert "MILP (optimal" in out and "TTFT P99 (s)" in out and "per 1k requests" in out


def test_plan_trace_workload_and_no_sim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    write_csv_trace(archetype_workload("sharegpt", 5.0, n_requests=400, seed=3), trace)
    payload = run_json(capsys, "--workload", str(trace), "--no-sim", "--gpus", "V100-32GB")
    assert "check" not in payload
    demand = payload["demand"]
    assert isinstance(demand, dict) and demand["rate_per_s"] == pytest.approx(5.0, rel=0.2)


def test_plan_infeasible_inventory_exits_1_with_the_binding_constraint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main([*BASE, "--workload", "production_mix", "--rate", "40", "--requests", "200",
                 "--gpus", "V100-32GB=2", "--json"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "binding: GPU inventory" in err and "the closest within the limits serves" in err


def test_plan_infeasible_ttft_names_the_closest_slo(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--profile", V100, "--ttft-slo", "0.01", "--tpot-slo", "0.1",
            "--workload", "long_short", "--rate", "1", "--requests", "100"]  # fmt: skip
    assert main(args) == 1
    assert "binding: TTFT SLO" in capsys.readouterr().err


def test_plan_unknown_workload_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--workload", "no_such_thing", "--rate", "1"]) == 1
    assert "neither an archetype" in capsys.readouterr().err
