"""``pdopt tune`` end to end: the example config as printed, run with few trials, ``--json``
parsed and checked against the ``--trials-csv`` file, PNG plots written, a journal study resumed
by a second command, text output, and errors with exit code 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pdopt.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
SPACE_NAMES = {"theta_frag", "theta_flow", "delta_t_s", "cool_s"}


def example_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["tune", "--example-config"]) == 0
    text = capsys.readouterr().out
    assert "[tune]" in text and 'name = "phasor"' in text
    assert 'fidelity = "auto"' in text
    # these tests check the study's mechanics on the fast fluid screening; the "auto" choice
    # has its own tests (test_tune_fidelity.py)
    path = tmp_path / "tune.toml"
    path.write_text(text.replace('fidelity = "auto"', 'fidelity = "fluid"'))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["tune", *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_example_config_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = example_config(tmp_path, capsys)
    csv, plots = tmp_path / "trials.csv", tmp_path / "plots"
    out = run_json(capsys, str(path), "--n-trials", "6", "--trials-csv", str(csv),
                   "--plots", str(plots))  # fmt: skip
    assert out["trials"] == 6 and out["states"] == {"COMPLETE": 6}
    assert out["storage"] == "memory" and out["targets"] == ["minimize:e2e_p99_s"]
    assert isinstance(out["best_params"], dict) and set(out["best_params"]) == SPACE_NAMES
    # the CSV holds every trial; the reported best is its best feasible one
    trials = pd.read_csv(csv)
    assert len(trials) == 6 and (trials["state"] == "COMPLETE").all()
    feasible = trials[trials["feasible"] & (trials["slo_attainment"] >= 0.9)]
    best = out["best"]
    assert isinstance(best, list) and len(best) == 1
    assert best[0]["value_e2e_p99_s"] == pytest.approx(feasible["value_e2e_p99_s"].min())
    assert best[0]["number"] == int(feasible.loc[feasible["value_e2e_p99_s"].idxmin(), "number"])
    # confirm_top = 1 in the example: the best trial re-run by the request-level simulator
    confirmed = out["confirmed"]
    assert isinstance(confirmed, list) and len(confirmed) == 1
    assert confirmed[0]["number"] == best[0]["number"] and confirmed[0]["des_e2e_p99_s"] > 0
    assert out["plots"] == [str(plots / "pareto.png"), str(plots / "importance.png")]
    for name in ("pareto.png", "importance.png"):
        assert (plots / name).read_bytes()[:8] == PNG


def test_journal_study_resumes_across_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = example_config(tmp_path, capsys)
    url = f"journal:///{tmp_path}/study.log"
    common = [str(path), "--storage", url, "--study-name", "cli", "--confirm-top", "0"]
    first = run_json(capsys, *common, "--n-trials", "3", "--trials-csv", str(tmp_path / "a.csv"))
    second = run_json(capsys, *common, "--n-trials", "5", "--trials-csv", str(tmp_path / "b.csv"))
    assert first["trials"] == 3 and second["trials"] == 5 and second["storage"] == url
    a, b = pd.read_csv(tmp_path / "a.csv"), pd.read_csv(tmp_path / "b.csv")
    pd.testing.assert_frame_equal(a.drop(columns="duration_s"),
                                  b.head(3).drop(columns="duration_s"))  # fmt: skip
    # text output of the same (complete) study: nothing more runs
    assert main(["tune", *common, "--n-trials", "5"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("study cli (") and "5 trials" in text and "best parameters:" in text


def test_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = example_config(tmp_path, capsys)
    assert main(["tune", str(path), "--n-trials", "2", "--n-workers", "2"]) == 1
    assert "storage URL" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace("n_trials = 50", "n_trails = 50"))
    assert main(["tune", str(bad)]) == 1
    assert "n_trails" in capsys.readouterr().err
    assert main(["tune", str(tmp_path / "missing.toml")]) == 1


@pytest.mark.slow
def test_two_worker_processes_from_the_command_line(tmp_path: Path) -> None:
    """The installed ``pdopt tune`` with ``--n-workers 2`` on SQLite, as a user runs it.

    The workers share the study's trial budget, so one that starts late can find it spent:
    fluid trials take ~10 ms, and 8 of them were once all run by the first worker before the
    second had started (a loaded 2-core machine); 100 leave it over a second to start."""
    config = subprocess.run(
        [sys.executable, "-m", "pdopt", "tune", "--example-config"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = tmp_path / "tune.toml"
    path.write_text(config.replace('fidelity = "auto"', 'fidelity = "fluid"'))
    url = f"sqlite:///{tmp_path}/study.db"
    done = subprocess.run(
        [sys.executable, "-m", "pdopt", "tune", str(path), "--storage", url, "--n-workers", "2",
         "--n-trials", "100", "--confirm-top", "0", "--json", "--trials-csv",
         str(tmp_path / "t.csv")],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    out = json.loads(done.stdout)
    assert out["states"].get("COMPLETE") == 100
    trials = pd.read_csv(tmp_path / "t.csv")
    assert trials["number"].is_unique and trials["worker"].nunique() == 2


def _simulate_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, float]:
    assert main(["simulate", str(path), "--quiet", "--json"]) == 0
    metrics: dict[str, float] = json.loads(capsys.readouterr().out)["metrics"]
    return metrics


def test_the_best_trial_reproduces_with_simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The confirmed (DES) objective of the best trial is what ``pdopt simulate`` gives for the
    settings the tuner prints: the written ``--best-config``, and the user's config with the
    printed ``tick_s`` and ``[policy.flags]`` (Δt is also the engine tick)."""
    path = example_config(tmp_path, capsys)
    path.write_text(path.read_text().replace("n_requests = 2000", "n_requests = 300"))
    best_config = tmp_path / "best.toml"
    out = run_json(capsys, str(path), "--n-trials", "5", "--best-config", str(best_config))
    # the fluid screening has no fragmentation: theta_frag is marked, and has no importance
    assert out["inert_params"] == ["theta_frag"]
    importances = out["importances"]
    assert isinstance(importances, dict) and importances and "theta_frag" not in importances
    confirmed = out["confirmed"]
    assert isinstance(confirmed, list) and len(confirmed) == 1
    des = confirmed[0]["des_e2e_p99_s"]
    settings = out["best_settings"]
    assert isinstance(settings, dict) and out["best_config"] == str(best_config)
    assert settings["tick_s"] == settings["policy_flags"]["delta_t_s"]
    assert settings["policy_flags"] == out["best_params"]
    assert _simulate_json(capsys, best_config)["e2e_p99_s"] == des
    # the user's own config, edited as the output says
    flags = "\n".join(f"{k} = {v!r}" for k, v in settings["policy_flags"].items())
    text = path.read_text().split("\n[tune]")[0]  # simulate takes no [tune] table
    text = text.replace("tick_s = 0.05", f"tick_s = {settings['tick_s']!r}", 1)
    edited = tmp_path / "edited.toml"
    edited.write_text(text.replace("[policy.flags]", f"[policy.flags]\n{flags}", 1))
    assert _simulate_json(capsys, edited)["e2e_p99_s"] == des


def test_inert_params_by_fidelity_and_policy() -> None:
    from pdopt.tune import inert_params

    names = ("theta_frag", "theta_flow", "delta_t_s", "cool_s", "defrag", "alpha_scale")
    assert inert_params(names, "phasor", "fluid") == ("theta_frag", "defrag")
    assert inert_params(names, "phasor", "des") == ()
    assert inert_params(("prefill_threshold_tokens", "alpha_scale"), "splitwise", "fluid") == (
        "prefill_threshold_tokens",
    )
