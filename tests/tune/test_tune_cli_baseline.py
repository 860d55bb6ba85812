"""``pdopt tune`` as a new user meets it: the best printed beside the policy's defaults (text and
``--json``), never a recommendation worse than them, an unknown target metric refused (exit 2 for
``--target``, a ``[tune] targets`` error for the file), and Ctrl-C on an in-memory study saying
that its trials are lost and how to keep them."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdopt.cli import _interrupted, main
from pdopt.cli._tune import _say_trials_are_lost, lost_trials_line

DEFAULTS = {"theta_frag": 0.168, "theta_flow": 0.62, "delta_t_s": 0.05, "cool_s": 1.0}


@pytest.fixture
def config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["tune", "--example-config"]) == 0
    text = capsys.readouterr().out.replace("n_requests = 2000", "n_requests = 300")
    text = text.replace('fidelity = "auto"', 'fidelity = "fluid"')  # the screening's baseline
    path = tmp_path / "tune.toml"
    path.write_text(text)
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["tune", *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_json_shows_the_defaults_and_never_recommends_worse(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(capsys, str(config), "--n-trials", "4")
    defaults = out["defaults"]
    assert isinstance(defaults, dict) and defaults["number"] == 0
    assert defaults["params"] == DEFAULTS and defaults["feasible"] is True
    assert set(defaults["values"]) == {"e2e_p99_s"}
    best = out["best"]
    assert isinstance(best, list)
    # at the screening fidelity no recommended trial is worse than the defaults
    assert best[0]["value_e2e_p99_s"] <= defaults["values"]["e2e_p99_s"]
    if out["recommendation"] == "defaults":
        assert out["best_params"] == DEFAULTS and "keep the defaults" in str(out["note"])
        assert out["best_settings"]["policy_flags"] == DEFAULTS  # type: ignore[index]
    else:
        assert out["recommendation"] == "best"
        # confirm_top = 1: the best beats the defaults at DES too (their DES run is shown)
        confirmed = out["confirmed"]
        assert isinstance(confirmed, list)
        assert confirmed[0]["des_e2e_p99_s"] < defaults["des_values"]["e2e_p99_s"]


def test_text_prints_the_best_beside_the_defaults(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", str(config), "--n-trials", "1", "--confirm-top", "0"]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("best parameters:"))
    assert header.split()[-2:] == ["best", "defaults"]
    assert "  theta_flow" in text and "  e2e_p99_s" in text
    assert "recommendation: no trial beats the defaults on e2e_p99_s: keep the defaults" in text
    assert "to reproduce: tick_s = 0.05; [policy.flags] theta_frag = 0.168" in text


def test_an_unknown_target_option_exits_2(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["tune", str(config), "--target", "min:e2e_p98_s"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --target: 'e2e_p98_s'" in err and "closest: e2e_p99_s" in err
    with pytest.raises(SystemExit) as exc:
        main(["tune", str(config), "--constraint", "slo_attain>=0.9"])
    assert exc.value.code == 2 and "argument --constraint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a DES-only metric under the fluid fidelity
        main(["tune", str(config), "--target", "min:kv_fits_nowhere"])
    assert exc.value.code == 2 and "only the des fidelity" in capsys.readouterr().err


def test_target_and_constraint_options_override_the_file(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(capsys, str(config), "--n-trials", "2", "--confirm-top", "0",
                   "--target", "min:ttft_p99_s", "--constraint", "goodput_rps>=0")  # fmt: skip
    assert out["targets"] == ["minimize:ttft_p99_s"]


def test_an_unknown_target_in_the_file_names_it(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config.write_text(config.read_text().replace('"min:e2e_p99_s"', '"min:e2e_p98_s"'))
    assert main(["tune", str(config)]) == 1
    err = capsys.readouterr().err
    assert f"{config} [tune] targets: expected a metric of the fluid simulator" in err
    assert "closest: e2e_p99_s" in err and '"min:e2e_p98_s"' in err


def test_the_lost_trials_line_says_how_to_keep_them() -> None:
    line = lost_trials_line(None)
    assert line.startswith("pdopt: interrupted; the study was in memory")
    assert "--storage sqlite:///study.db" in line and "journal:///study.log" in line
    assert "\n" not in line


def test_a_shared_storage_keeps_the_cli_handler() -> None:
    previous = signal.signal(signal.SIGINT, _interrupted)
    try:
        with _say_trials_are_lost("sqlite:///study.db"):
            assert signal.getsignal(signal.SIGINT) is _interrupted
        with _say_trials_are_lost("memory"):
            assert signal.getsignal(signal.SIGINT) is not _interrupted
        assert signal.getsignal(signal.SIGINT) is _interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_on_an_in_memory_study(config: Path) -> None:
    """A real Ctrl-C after the first trial: one line on stderr, exit code 130."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdopt", "tune", str(config), "--n-trials", "100000",
         "--progress", "--confirm-top", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    seen, deadline = b"", time.monotonic() + 120
    try:
        while b"1/100000" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
            chunk = os.read(proc.stderr.fileno(), 4096) if ready else b""
            if not chunk:
                break
            seen += chunk  # the progress bar: "1/100000" once trial 0 (the defaults) is done
        assert b"1/100000" in seen, seen[-500:]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    lines = err.decode().strip().splitlines()
    assert lines == [lost_trials_line("memory")]
