"""``pdopt capacity CONFIG.toml [--json]`` end to end on small configs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pdopt.cli import main

SMALL = """
seed = 3
tick_s = 0.05
record_timeseries = false

[workload]
archetype = "production_mix"
rate_per_s = 10.0
n_requests = 300
{closed}

[cluster]
gpu = "A100-80GB"
model = "Llama-2-7B"
n_prefill = 1
n_decode = 1

[policy]
name = "least_loaded"

[slo]
ttft_s = 1.0
tpot_s = 0.1

[capacity]
{capacity}
"""


def write(tmp_path: Path, capacity: str, closed: str = "") -> Path:
    path = tmp_path / "cap.toml"
    path.write_text(SMALL.format(capacity=capacity, closed=closed))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["capacity", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_open_mode_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, 'mode = "open"\ntarget_attainment = 0.9\nrel_tol = 0.05')
    out = run_json(capsys, str(path))
    assert out["mode"] == "open" and out["status"] == "ok"
    lo, hi = out["bracket_scale"]  # type: ignore[misc]
    assert lo == out["max_rate_scale"] and hi - lo <= 0.05 * lo
    points = out["points"]
    assert isinstance(points, list) and len(points) >= 3
    best = [p for p in points if p["rate_scale"] == lo][-1]
    assert best["meets"] and best["attainment"] >= 0.9
    assert all(p["attainment"] < 0.9 for p in points if p["rate_scale"] == hi)
    # The same config twice: the same answer (fixed seeds).
    assert run_json(capsys, str(path)) == out


def test_closed_mode_json_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path,
        'mode = "closed"\nrequests_per_client = 5\nmax_evaluations = 20',
        closed="[workload.closed_loop]\nclients = 4\nthink_time_s = 0.5",
    )
    out = run_json(capsys, str(path))
    assert out["mode"] == "closed" and out["think_time_s"] == 0.5
    assert out["start_spread_s"] == 0.0
    assert out["status"] in ("ok", "above_max")
    n = out["max_clients"]
    assert out["bracket_clients"][0] == n  # type: ignore[index]
    assert out["ttft_p99_s"] <= 1.0 and out["tpot_p99_s"] <= 0.1  # type: ignore[operator]
    assert main(["capacity", str(path)]) == 0
    text = capsys.readouterr().out
    assert "mode closed" in text and "points tried" in text


def test_closed_mode_passes_the_start_spread_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From [workload.closed_loop], or [capacity] overriding it; the spread changes the runs."""
    capacity = 'mode = "closed"\nrequests_per_client = 3\nmax_evaluations = 6'
    loop = "[workload.closed_loop]\nclients = 4\nthink_time_s = 0.5"
    spread = "\nstart_spread_s = 5.0"
    outs = [
        run_json(capsys, str(write(tmp_path, capacity + extra, loop + in_loop)))
        for extra, in_loop in (("", ""), ("", spread), (spread, ""))
    ]
    assert [o["start_spread_s"] for o in outs] == [0.0, 5.0, 5.0]
    assert outs[1]["points"] == outs[2]["points"]
    assert outs[0]["points"] != outs[1]["points"]


def test_example_config_has_the_capacity_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--example-config"]) == 0
    text = capsys.readouterr().out
    assert "[capacity]" in text and "[workload]" in text


@pytest.mark.parametrize(
    ("capacity", "closed", "message"),
    [
        ("targt = 0.9", "", r"\[capacity\] targt: expected a key among \[.*\], got an unknown"),
        ('mode = "half"', "", r"\[capacity\] mode: expected one of .*, got \"half\""),
        ('mode = "open"', "[workload.closed_loop]\nclients = 2", "needs an open-loop"),
        ('rel_tol = "tight"', "", r"\[capacity\] rel_tol: expected a number > 0, got \"tight\""),
        ('mode = "closed"\nstart_spread_s = -1', "", r"start_spread_s: expected a number >= 0"),
        (
            'mode = "closed"',
            "[workload.closed_loop]\nclients = 2\nstart_spread_s = -2",
            r"\[workload.closed_loop\] start_spread_s: expected a number >= 0, got -2",
        ),
    ],
)
def test_config_errors_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], capacity: str, closed: str, message: str
) -> None:
    path = write(tmp_path, capacity, closed)
    assert main(["capacity", str(path), "--json"]) == 1
    err = capsys.readouterr().err
    assert str(path) in err
    assert re.search(message, err)
