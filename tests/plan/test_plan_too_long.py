"""Requests beyond the context window are part of the offered traffic (issue 37, deliver 1):
counted as misses in the verdict, or the plan refuses naming the knob; ``--too-long drop`` and
``truncate`` are explicit and said in the demand line, ``--json`` and the exported plan."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pdopt.cli import main
from pdopt.plan._context import offered_traffic, rejections_allowed
from pdopt.scenario import Scenario
from pdopt.workload import Workload, archetype_workload

# Llama-2-7B has a 4,096-token window; longbench's prompts reach it (a third go beyond).
LONG = ["plan", "--model", "Llama-2-7B", "--gpus", "H100-SXM=8", "--workload", "longbench",
        "--rate", "1", "--requests", "300", "--ttft-slo", "3", "--tpot-slo", "0.1",
        "--verify-draws", "1"]  # fmt: skip


def test_a_heavily_rejected_workload_is_refused_naming_the_knobs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main([*LONG, "--json"])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    err = captured.err
    assert "exceed Llama-2-7B's 4,096-token context window" in err and "counted as a miss" in err
    for knob in ("--max-context", "--too-long truncate", "--too-long drop", "--model"):
        assert knob in err


def test_drop_plans_the_others_and_says_so_everywhere(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "plan.toml"
    code = main([*LONG, "--too-long", "drop", "--json", "--out", str(out)])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    too_long = payload["workload"]["too_long"]
    assert too_long["treatment"] == "drop" and too_long["offered"] == 300
    assert 0.2 < too_long["fraction"] < 0.5 and "dropped (--too-long drop)" in too_long["text"]
    kept = 300 - too_long["over_context_window"]
    assert payload["check"]["sim_requests"] == kept
    # the GPUs see the kept share of the offered rate
    assert payload["demand"]["rate_per_s"] == pytest.approx(kept / 300)
    assert payload["demand"]["offered_rate_per_s"] == 1
    head = [x for x in out.read_text(encoding="utf-8").splitlines() if x.startswith("#")]
    assert any("dropped (--too-long drop)" in x for x in head)
    main([*LONG, "--too-long", "drop"])
    text = capsys.readouterr().out
    assert "demand:" in text.splitlines()[2] and "dropped" in text.splitlines()[2]


def test_misses_count_in_the_verdict_and_the_exported_plan_replays_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 4.5% of phasor_mix is beyond the window: allowed at P90, each one a miss.
    out = tmp_path / "plan.toml"
    code = main(["plan", "--model", "Llama-2-7B", "--gpus", "H100-SXM=8", "--workload",
                 "phasor_mix", "--rate", "2", "--requests", "400", "--ttft-slo", "3",
                 "--tpot-slo", "0.1", "--quantile", "0.9", "--verify-draws", "1", "--json",
                 "--out", str(out)])  # fmt: skip
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    over = payload["workload"]["too_long"]["over_context_window"]
    assert over > 0 and sum(payload["rejected_by_reason"].values()) >= over
    check = payload["check"]
    assert check["sim_requests"] == 400  # every offered request is in the verdict
    assert check["sim_attainment"] <= 1 - over / 400 + 1e-12
    replay = Scenario.from_toml(out).run()
    assert int((replay.requests["status"] == "rejected").sum()) == over
    assert float(replay.metrics()["slo_attainment"]) == pytest.approx(check["sim_attainment"])


def test_a_longer_deployment_window_rejects_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*LONG, "--max-context", "16384", "--no-sim", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["workload"]["too_long"]["over_context_window"] == 0
    assert payload["context_window_tokens"] == 16384 and payload["rejected_by_reason"] == {}


def test_truncate_fits_every_request_in_the_window() -> None:
    wl = archetype_workload("longbench", 1.0, n_requests=300, seed=0)
    traffic = offered_traffic(wl, 4096, "truncate")
    served = traffic.served
    assert len(served) == 300 and traffic.over_window > 0
    assert np.all(served.input_tokens + served.output_tokens <= 4096)
    assert np.all(served.input_tokens >= 1)


def test_the_miss_allowance_is_the_verdicts_quantile() -> None:
    n = 200
    wl = Workload(np.arange(n, dtype=float), np.full(n, 100), np.full(n, 10))
    long = Workload(wl.arrival_s, np.where(np.arange(n) < 2, 5000, 100), wl.output_tokens)
    assert rejections_allowed(offered_traffic(long, 4096), 0.99)  # 2 of 200 at P99
    longer = Workload(wl.arrival_s, np.where(np.arange(n) < 3, 5000, 100), wl.output_tokens)
    assert not rejections_allowed(offered_traffic(longer, 4096), 0.99)
    assert rejections_allowed(offered_traffic(longer, 4096, "drop"), 0.99)
