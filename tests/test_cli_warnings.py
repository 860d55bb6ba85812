"""pdopt's warnings look alike in every command: one ``pdopt: warning: ...`` line on stderr,
never Python's ``file.py:N: DataWarning:`` and source line; stdout (``--json``) stays JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
PDOPT = [sys.executable, "-m", "pdopt"]
SORTED = (
    "pdopt: warning: unsorted.csv: 1 of 3 rows arrive before the row above them; sorted all rows "
    "by arrival time (stable, none dropped)"
)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PDOPT, *argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("warnings")
    (folder / "unsorted.csv").write_text(
        "arrival_s,input_tokens,output_tokens\n5,10,10\n1,3,5\n3,4,4\n"
    )
    example = _run(["simulate", "--example-config"], folder).stdout
    config = example.replace('archetype = "production_mix"', 'trace = "unsorted.csv"', 1)
    (folder / "s.toml").write_text(config)
    return folder


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "s.toml", "--quiet", "--json"],
        ["simulate", "s.toml", "--quiet"],
        ["capacity", "s.toml", "--quiet", "--json"],
        ["workload", "stats", "unsorted.csv"],
    ],
    ids=lambda argv: "-".join(argv[:2]) + ("-json" if "--json" in argv else ""),
)
def test_a_trace_warning_is_one_clean_line_in_every_command(folder: Path, argv: list[str]) -> None:
    out = _run(argv, folder)
    assert out.returncode == 0, out.stderr
    assert SORTED in out.stderr.splitlines(), out.stderr
    assert "DataWarning" not in out.stderr and ".py:" not in out.stderr, out.stderr
    if "--json" in argv:
        json.loads(out.stdout)  # stdout is the JSON and nothing else
