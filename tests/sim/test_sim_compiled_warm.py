"""The compiled engine compiled ahead (``python -m pdopt.sim._compiled``) and the line a run
prints on stderr when it must compile it (issue 38: the first compiled run must not stall
silently)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.sim._compiled import _warm
from pdopt.workload import Workload


def _tiny_run() -> None:
    cost = CostModel(PrefillModel(0.0, 2e9, 1e14), DecodeModel(0.01, 1e-4, 1e-7))
    cluster = ClusterSpec.build(cost, 1, 1)
    wl = Workload([0.0, 0.1], [512, 256], [8, 1])
    simulate(wl, cluster, make_policy("least_loaded"), slo=Slo(1.0, 0.1), engine="compiled")


def test_a_run_that_compiles_says_so_on_stderr_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_warm, "cache_is_cold", lambda: True)
    _tiny_run()
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert lines[0] == _warm.COMPILING
    assert lines[1].startswith("pdopt: compiled the simulation engine in ")


def test_a_run_that_loads_the_engine_says_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_warm, "cache_is_cold", lambda: False)
    _tiny_run()
    assert capsys.readouterr() == ("", "")


def test_cache_is_warm_once_this_process_has_the_engine() -> None:
    _tiny_run()
    assert _warm.cache_is_cold() is False


def test_warm_runs_the_disaggregated_engine_without_a_word(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ran = _warm.warm()
    assert ran[0] == "least_loaded"
    assert set(ran) <= {name for name, _ in _warm._warm_runs()}
    assert capsys.readouterr() == ("", "")


def test_the_module_entry_point_prints_one_line_on_stderr() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pdopt.sim._compiled"], capture_output=True, text=True, check=True
    )
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line
    assert line.startswith("pdopt: ")
    assert "simulation engine" in line
