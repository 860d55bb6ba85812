"""``pdopt plan`` fails early and says what it does (issue 37, deliver 3): output paths are
checked before any work, absurd demand is refused at once, progress shows on a terminal only."""

from __future__ import annotations

import io
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdopt.cli import main

SMALL = ["plan", "--model", "Qwen2.5-7B", "--gpus", "H100-SXM=8", "--workload", "sharegpt",
         "--rate", "2", "--requests", "200", "--ttft-slo", "1", "--tpot-slo", "0.1",
         "--verify-draws", "1"]  # fmt: skip


def _elapsed(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """CPU seconds the command's process used (wall time on 2 shared cores varies by seconds
    between two runs of the same command), and its outcome."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "pdopt", *args], capture_output=True, text=True, timeout=120
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, done


def test_an_unwritable_out_fails_before_any_work(tmp_path: Path) -> None:
    # The interpreter and the CLI's own imports are not the plan's work: measured alone (the
    # same process start and parser, printing the help), then subtracted. A plan this size
    # runs for tens of seconds; the refusal costs what starting the command costs.
    startup, _ = _elapsed("plan", "--help")
    missing = tmp_path / "no-such-folder" / "plan.toml"
    took, done = _elapsed(*SMALL, "--rate", "500", "--requests", "20000", "--out", str(missing))
    assert done.returncode == 2 and done.stdout == ""
    assert f"argument --out: {missing}" in done.stderr and "does not exist" in done.stderr
    assert took - startup < 2.0, (took, startup)


@pytest.mark.parametrize(
    ("out", "says"), [("", "is a folder"), ("file.txt/plan.toml", "is not a folder")]
)
def test_out_paths_are_checked_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, says: str
) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(SystemExit) as info:
        main([*SMALL, "--out", str(tmp_path / out)])
    assert info.value.code == 2 and says in capsys.readouterr().err


def test_no_sim_with_out_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*SMALL, "--no-sim", "--out", str(tmp_path / "plan.toml")])
    assert info.value.code == 2 and "drop --no-sim" in capsys.readouterr().err


def test_absurd_demand_is_refused_in_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    code = main([*SMALL, "--gpus", "H100-SXM=inf", "--rate", "1e9"])
    err = capsys.readouterr().err
    assert code == 1 and time.perf_counter() - start < 20
    assert "needs at least" in err and "--no-sim" in err and "deployments" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_shows_on_a_terminal_unless_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], quiet: bool
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main([*SMALL, "--json", *(["--quiet"] if quiet else [])])
    assert code == 0 and json.loads(capsys.readouterr().out)["verdict"]["meets"]
    assert ("plan: size, simulate, correct" in terminal.getvalue()) is not quiet
