"""The replay of real vLLM serving runs (issue 34): on a small sample of the measured H100 runs
(``../shared/data/realgpu``, skipped without it) pdopt's colocated engine is within the issue's
bands, the overhead fit recovers known terms, and the CLI prints valid JSON and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pdopt.costmodel import ServerOverhead
from pdopt.errors import InputError
from pdopt.validate import (
    METRICS,
    fit_server_overhead,
    read_runs,
    replay_runs,
    run_workload,
    summarize,
)

RUNS = Path(__file__).parents[2].parent / "shared" / "data" / "realgpu" / "h100_vllm_serving.csv"
needs_data = pytest.mark.skipif(not RUNS.exists(), reason=f"development data absent: {RUNS}")


def sample(tmp_path: Path, seconds: float = 120.0) -> Path:
    """Two calm runs (a dense TP1 and an MoE TP2), each stage cut to ``seconds``."""
    table = pd.read_csv(RUNS)
    keep = table["exp"].str.contains("llama-2-7b-tp1-general|mixtral-8x7b-v0-1-tp2-codegen")
    table = table[keep & (table["stage"].astype(str) != "all")].copy()
    scale = seconds / table["duration_s"]
    table["n_sent"] = (table["n_sent"] * scale).round().astype(int)
    table["duration_s"] = seconds
    path = tmp_path / "runs.csv"
    table.to_csv(path, index=False)
    return path


@needs_data
def test_a_sample_of_the_real_runs_is_within_the_issue_bands(tmp_path: Path) -> None:
    replay = replay_runs(read_runs(sample(tmp_path)))
    assert len(replay) == 4 and not replay["overloaded"].any()
    # every stage: E2E mean within 10%, and no predicted overload (TTFT within 2x)
    assert (replay["e2e_mean_err_pct"].abs() <= 10).all(), replay["e2e_mean_err_pct"]
    assert (replay["ttft_mean_predicted"] <= 2 * replay["ttft_mean_measured"]).all()
    summary = summarize(replay)
    assert summary["ttft_mean_mape_pct"] <= 20
    assert summary["tpot_mean_mape_pct"] <= 10
    assert summary["false_overloads"] == 0
    # the shared prompts are served from the prefix cache after their first round
    assert (replay["hit_fraction"] > 0.8).all()


@needs_data
def test_without_the_prefix_cache_the_same_runs_are_priced_higher(tmp_path: Path) -> None:
    stages = read_runs(sample(tmp_path, seconds=60.0))
    cached = replay_runs(stages)
    uncached = replay_runs(stages, prefix_caching=False)
    assert (uncached["hit_fraction"] == 0).all()
    assert (uncached["ttft_mean_predicted"] > cached["ttft_mean_predicted"]).all()


@needs_data
def test_the_workload_follows_inference_perf_shared_prefix() -> None:
    stages = read_runs(RUNS)
    run = stages[stages["exp"].str.contains("codellama-34b-tp2-codegen")].reset_index(drop=True)
    workload, stage_of = run_workload(run, seed=1)
    assert len(workload) == run["n_sent"].sum()
    assert np.bincount(stage_of).tolist() == run["n_sent"].tolist()
    blocks = workload.prefix_blocks
    assert blocks is not None and blocks.block_tokens == 16
    # 11 system prompts x 4 users = 44 distinct prompts, cycled
    distinct = {tuple(blocks.of(i).tolist()) for i in range(len(workload))}
    assert len(distinct) == 44
    assert tuple(blocks.of(0).tolist()) == tuple(blocks.of(44).tolist())


@needs_data
def test_the_overloaded_run_fails_as_measured_when_its_clients_time_out() -> None:
    """Llama-2-7B `reasoning` (4 req/s for 1200 s, beyond the GPU): inference-perf's clients give
    up after 300 s, whatever the request's state; 4,068 of 4,800 requests failed. The replay
    with the same timeout fails as many (4,058) and the survivors' latencies match."""
    stages = read_runs(RUNS)
    run = stages[stages["exp"].str.contains("llama-2-7b-tp1-reasoning")].reset_index(drop=True)
    row = replay_runs(run).iloc[0]
    assert row["overloaded"] and row["n_failed"] == 4068
    assert row["n_failed_predicted"] == pytest.approx(row["n_failed"], rel=0.05)
    assert abs(row["ttft_mean_err_pct"]) <= 10 and abs(row["e2e_mean_err_pct"]) <= 10


def test_failed_requests_mark_a_stage_overloaded() -> None:
    replay = pd.DataFrame(
        {
            "overloaded": [False, False, True, True],
            "ttft_mean_predicted": [50.0, 60.0, 100.0, float("nan")],  # ms; NaN: none succeeded
            "n_failed": [0, 0, 4, 3000],
            "n_failed_predicted": [0, 2, 0, 2500],
        }
        | {f"{m}_err_pct": [1.0, -2.0, 0.0, 0.0] for m in METRICS}
    )
    summary = summarize(replay)
    assert summary["overloads_predicted"] == 1 and summary["overloads_measured"] == 2
    assert summary["false_overloads"] == 1  # the calm stage where 2 requests timed out
    assert summary["failed_measured_overloaded"] == 3004
    assert summary["failed_predicted_overloaded"] == 2500
    assert summary["failed_predicted_calm"] == 2
    assert summary["e2e_mean_mape_pct"] == pytest.approx(1.5)


def test_the_overhead_fit_recovers_known_terms() -> None:
    rng = np.random.default_rng(0)
    tpot = rng.uniform(5, 25, 12)
    engine = rng.uniform(5, 40, 12)
    measured = engine + 4.0 + 1.5 * tpot
    replay = pd.DataFrame(
        {
            "overloaded": [False] * 12,
            "ttft_mean_measured": measured,
            "engine_ttft_mean_ms": engine,
            "tpot_mean_predicted": tpot,
        }
    )
    fitted = fit_server_overhead(replay)
    assert fitted.fixed_s == pytest.approx(0.004, rel=1e-9)
    assert fitted.stream_iterations == pytest.approx(1.5, rel=1e-9)
    extra = ServerOverhead(0.004, 0.0, 1.5).client_extra_s([100, 100], [0.01, np.nan])
    np.testing.assert_allclose(extra, [0.019, 0.004])


def test_a_table_without_its_columns_is_refused_naming_them(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("exp,stage\nx,0\n")
    with pytest.raises(InputError, match=r"bad.csv: missing column\(s\) \['pdopt_model'"):
        read_runs(path)
    with pytest.raises(InputError, match="no such file"):
        read_runs(tmp_path / "absent.csv")


@needs_data
def test_cli_prints_json_alone(tmp_path: Path) -> None:
    path = sample(tmp_path, seconds=30.0)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdopt",
            "validate",
            "realgpu",
            str(path),
            "--exp",
            "codegen",
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["prefix_caching"] is True
    assert len(payload["stages"]) == 2
    assert set(payload["summary"]) >= {"e2e_mean_mape_pct", "false_overloads"}
    bad = subprocess.run(
        [sys.executable, "-m", "pdopt", "validate", "realgpu", str(path), "--exp", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1 and "no run's exp contains 'nope'" in bad.stderr
    assert "Traceback" not in bad.stderr
