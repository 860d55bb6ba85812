"""Config files and ``pdopt simulate`` end to end (--json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.errors import ConfigError
from pdopt.scenario import EXAMPLE_CONFIG, Scenario
from pdopt.sim import ClosedLoop


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sim.toml"
    path.write_text(text)
    return path


def test_example_config_parses(tmp_path: Path) -> None:
    cfg = Scenario.from_toml(_write(tmp_path, EXAMPLE_CONFIG))
    assert cfg.policy == "least_loaded"
    assert len(cfg.cluster.workers) == 8
    assert cfg.slo.ttft_s == 2.0


def test_cli_json_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = EXAMPLE_CONFIG.replace("n_requests = 2000", "n_requests = 50")
    path = _write(tmp_path, text)
    assert main(["simulate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"]["requests"] == 50
    assert out["metrics"]["finished"] == 50
    for key in ("fragmentation_pct", "fragmentation_mean_pct", "fragmentation_peak_pct"):
        assert 0.0 <= out["metrics"][key] <= 100.0
    assert len(out["workers"]) == 8


def test_cli_runs_the_engine_the_config_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """engine = "compiled" and "python" print the same metrics (identical runs)."""
    outs = []
    for engine in ("compiled", "python"):
        text = EXAMPLE_CONFIG.replace("n_requests = 2000", "n_requests = 300").replace(
            'engine = "auto"', f'engine = "{engine}"'
        )
        assert Scenario.from_toml(_write(tmp_path, text)).engine == engine
        assert main(["simulate", str(_write(tmp_path, text)), "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out)["metrics"])
    assert outs[0] == outs[1]


def test_cli_example_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--example-config"]) == 0
    assert capsys.readouterr().out == EXAMPLE_CONFIG


def test_closed_loop_config(tmp_path: Path) -> None:
    text = (
        EXAMPLE_CONFIG.replace("# [workload.closed_loop]", "[workload.closed_loop]")
        .replace("# clients = 32", "clients = 4")
        .replace("# think_time_s = 1.0", "think_time_s = 0.5")
    )
    cfg = Scenario.from_toml(_write(tmp_path, text))
    assert isinstance(cfg.workload, ClosedLoop) and cfg.workload.clients == 4
    assert cfg.workload.start_spread_s == 0.0
    spread = text.replace("# start_spread_s = 0.0", "start_spread_s = 2.5")
    cfg = Scenario.from_toml(_write(tmp_path, spread))
    assert isinstance(cfg.workload, ClosedLoop) and cfg.workload.start_spread_s == 2.5


def test_kv_allocation_config(tmp_path: Path) -> None:
    cfg = Scenario.from_toml(_write(tmp_path, EXAMPLE_CONFIG))
    assert {w.kv_allocation for w in cfg.cluster.workers} == {"on_demand"}
    text = EXAMPLE_CONFIG.replace('kv_allocation = "on_demand"', 'kv_allocation = "reserve_output"')
    cfg = Scenario.from_toml(_write(tmp_path, text))
    assert {w.kv_allocation for w in cfg.cluster.workers} == {"reserve_output"}


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        ("tick_s = 0.05", "tick = 0.05", r"sim.toml tick: expected a key among \[.*\], got an"),
        ('link = "nvlink"', 'link = "pigeon"', r'\[cluster\] link: expected one of .*"pigeon"'),
        ('archetype = "production_mix"', 'archtype = "x"', r"\[workload\] archtype: .* unknown"),
        ("ttft_s = 2.0", "", r"sim.toml \[slo\] ttft_s: expected a number > 0, got nothing"),
        ('engine = "auto"', 'engine = "fast"', r"toml engine: expected one of .*\"fast\""),
        ("n_prefill = 4", 'n_prefill = "four"', r'n_prefill: expected an int >= 0, got "four"'),
        ("tick_s = 0.05", "tick_s = -1", r"sim.toml tick_s: expected a number > 0, got -1"),
        ('name = "least_loaded"', 'name = "x"', r"\[policy\] name: expected one of .*, got"),
        (
            'kv_allocation = "on_demand"',
            'kv_allocation = "eager"',
            r'sim.toml \[cluster\] kv_allocation: expected one of .*"eager"',
        ),
        ("# start_spread_s = 0.0", "start_spread_s = 1", r"expected a key among"),
    ],
)
def test_config_errors(tmp_path: Path, old: str, new: str, match: str) -> None:
    """One format: file, table, key, what was expected, what was given."""
    with pytest.raises(ConfigError, match=match):
        Scenario.from_toml(_write(tmp_path, EXAMPLE_CONFIG.replace(old, new)))


def test_cli_error_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(tmp_path / "missing.toml")]) == 1
    assert "no such config file" in capsys.readouterr().err
