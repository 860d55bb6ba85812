"""``pdopt capacity --dask``: the replicate seeds' searches on a Dask cluster give the serial
answer (issue 38, item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.capacity import RateSearch, crossing_of, max_rate_crossing
from pdopt.cli import main
from pdopt.scenario import Scenario

CONFIG = """
seed = 3
tick_s = 0.05
record_timeseries = false

[workload]
archetype = "production_mix"
rate_per_s = 10.0
n_requests = 200

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


def write(tmp_path: Path, capacity: str) -> Path:
    path = tmp_path / "cap.toml"
    path.write_text(CONFIG.format(capacity=capacity))
    return path


OPEN = 'mode = "open"\ntarget_attainment = 0.9\nrel_tol = 0.1\nseeds = 2\nmax_evaluations = 8'


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["capacity", *argv, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_bad_address_is_an_error_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, OPEN)
    assert main(["capacity", str(path), "--dask", "localhost:8786", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "pdopt: error: --dask 'localhost:8786'" in err and "tcp://HOST:8786" in err


def test_the_crossing_over_seeds_is_the_searches_combined(tmp_path: Path) -> None:
    path = tmp_path / "sim.toml"
    path.write_text(CONFIG.split("[capacity]")[0])
    scenario = Scenario.from_toml(path)
    replicates = [scenario, scenario.replace(seed=scenario.seed + 1)]
    search = RateSearch(0.9, 0.1, 1.0, 8)
    ticks: list[int] = []
    via = max_rate_crossing(
        replicates, lambda sc: RateSearch.answer(search(sc)), progress=lambda: ticks.append(1)
    )
    direct = crossing_of([RateSearch.answer(search(sc)) for sc in replicates], [3, 4])
    assert via == direct and via.seeds == (3, 4) and len(ticks) == 2


@pytest.mark.slow
def test_dask_local_cluster_gives_the_serial_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("distributed")
    path = write(tmp_path, OPEN)
    serial = _json(capsys, str(path))
    on_dask = _json(capsys, str(path), "--dask")
    assert on_dask == serial
    crossing = serial["crossing"]
    assert isinstance(crossing, dict) and crossing["seeds"] == [3, 4]
