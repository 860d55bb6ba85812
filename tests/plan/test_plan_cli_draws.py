"""``pdopt plan --json``: what a verdict covers (``--verify-draws``), and what ``--out`` holds
when ``--compare-modes`` recommends a colocated deployment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.scenario import Scenario
from pdopt.workload import archetype_workload, write_csv_trace

ROOT = Path(__file__).resolve().parents[2]
V100 = str(ROOT / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv")
BASE = ["plan", "--profile", V100, "--tpot-slo", "0.1", "--json"]
SMALL = ["--workload", "sharegpt", "--rate", "6", "--requests", "800", "--ttft-slo", "1",
         "--gpus", "V100-32GB=8,A100-80GB=2"]  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main([*BASE, *args])
    return code, json.loads(capsys.readouterr().out)


def test_an_archetype_is_verified_on_three_draws_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, payload = run(capsys, *SMALL)
    verdict = payload["verdict"]
    assert isinstance(verdict, dict) and code == 0 and verdict["meets"]
    covers = verdict["covers"]
    assert covers["draws"] == 3 and covers["draws_met"] == 3 and covers["seeds"] == [0, 1, 2]
    assert covers["requests_per_draw"] == [800, 800, 800] and covers["workload"] == "generated"
    assert covers["text"] == "3 of 3 draws of 800 requests (seeds 0-2)"
    assert verdict["text"].startswith(f"meets the SLOs in simulation on {covers['text']}")
    its = payload["iterations"]
    assert isinstance(its, list)
    for it in its:
        assert it["draws"] == 3 and len(it["draw_checks"]) == 3
        assert it["sim_ttft_q_s"] == max(c["sim_ttft_q_s"] for c in it["draw_checks"])
        assert it["meets"] == (it["draws_met"] == 3)
    # the check shown (and exported) is the final plan's binding draw
    final = its[-1]
    binding = final["draw_checks"][final["binding_draw"]]
    check = payload["check"]
    assert isinstance(check, dict)
    assert {k: check[k] for k in binding} == binding
    # one goodput in plan's report: SLO attainment × the offered rate
    assert check["sim_goodput_at_offered_rate_rps"] == binding["sim_attainment"] * 6.0
    assert "sim_goodput_at_rate_rps" not in check and "sim_goodput_rps" not in check


def test_verify_draws_and_seed_name_the_draws(capsys: pytest.CaptureFixture[str]) -> None:
    _, one = run(capsys, *SMALL, "--verify-draws", "1", "--seed", "5")
    covers = one["verdict"]["covers"]  # type: ignore[index]
    assert covers["seeds"] == [5] and covers["text"] == "1 of 1 draw of 800 requests (seed 5)"
    _, again = run(capsys, *SMALL, "--verify-draws", "1", "--seed", "5")

    def summary(payload: dict[str, object]) -> list[tuple[float, float, object]]:
        its = payload["iterations"]
        assert isinstance(its, list)
        return [(it["sim_ttft_q_s"], it["sim_tpot_q_s"], it["plan"]["counts"]) for it in its]

    assert summary(again) == summary(one)  # same seed, same result


def test_a_trace_is_one_draw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    write_csv_trace(archetype_workload("sharegpt", 6.0, n_requests=800, seed=0), trace)
    code, payload = run(capsys, "--workload", str(trace), "--ttft-slo", "1",
                        "--gpus", "V100-32GB=8,A100-80GB=2", "--verify-draws", "3")  # fmt: skip
    covers = payload["verdict"]["covers"]  # type: ignore[index]
    assert code == 0 and covers["draws"] == 1 and covers["workload"] == "trace (one draw)"
    assert any("a trace is one draw" in n for n in payload["notes"])  # type: ignore[union-attr]


def test_compare_modes_exports_the_recommended_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cm.toml"
    code, payload = run(capsys, "--workload", "sharegpt", "--rate", "6", "--requests", "800",
                        "--ttft-slo", "1.5", "--gpus", "V100-32GB=8,A100-80GB=2",
                        "--verify-draws", "2", "--compare-modes", "--out", str(out))  # fmt: skip
    assert code == 0
    rows = payload["modes"]
    assert isinstance(rows, list)
    for row in rows:  # every mode checked on the same draws; a count that meets ran them all
        assert row["draws"] == 2 and (not row["meets"] or row["draws_met"] == 2)
    full = rows[0]
    best = min((r for r in rows if r["meets"]), key=lambda r: (r["cost_per_hour"], r["gpus"]))
    assert best is not full and best["cost_per_hour"] < full["cost_per_hour"]  # colocated wins
    assert best["mode"] in str(payload["scenario_holds"])
    sc = Scenario.from_toml(out)
    assert sc.policy_name == best["policy"]
    assert len(sc.cluster.workers) == best["workers"]
    assert {w.role.value for w in sc.cluster.workers} == {"mixed"}
    assert sc.seed == best["binding_draw"]
    assert main(["simulate", str(out), "--json"]) == 0
    replay = json.loads(capsys.readouterr().out)["metrics"]
    assert replay["slo_attainment"] == best["attainment"]
