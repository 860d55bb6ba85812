"""``pdopt plan --sweep NAME=V1,V2,...`` (issue 37, deliver 5): one plan per value, a table,
``--json`` rows and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main

BASE = ["plan", "--model", "Qwen2.5-7B", "--gpus", "H100-SXM=16", "--workload", "sharegpt",
        "--rate", "10", "--requests", "300", "--ttft-slo", "0.5", "--tpot-slo", "0.03",
        "--no-sim"]  # fmt: skip


def _rows(capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, object]]:
    main([*BASE, *extra, "--json"])
    payload = json.loads(capsys.readouterr().out)
    return payload["rows"]  # type: ignore[no-any-return]


def test_a_rate_sweep_prints_a_table_and_charts_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    chart = tmp_path / "sweep.png"
    assert main([*BASE, "--sweep", "rate=5,200", "--sweep-chart", str(chart)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pdopt plan --sweep rate") and f"chart written to {chart}" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = _rows(capsys, "--sweep", "rate=5,200")
    assert [r["value"] for r in rows] == [5, 200]
    assert rows[0]["gpus"] <= rows[1]["gpus"]  # type: ignore[operator]


def test_a_price_factor_scales_the_cost_and_a_point_without_plan_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = _rows(capsys, "--sweep", "price=1,2")
    assert rows[1]["cost_per_hour"] == pytest.approx(2 * rows[0]["cost_per_hour"])  # type: ignore[operator]
    rows = _rows(capsys, "--sweep", "ttft-slo=0.5,0.0001")
    assert rows[0]["gpus"] is not None and rows[1]["gpus"] is None
    assert str(rows[1]["verdict"]).startswith("no plan:")


@pytest.mark.parametrize("bad", ["speed=1,2", "rate=", "rate=1,-2"])
def test_a_bad_sweep_is_refused_naming_the_option(
    capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*BASE, "--sweep", bad])
    assert info.value.code == 2 and "argument --sweep" in capsys.readouterr().err
