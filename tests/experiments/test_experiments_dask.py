"""The experiments on Dask (issue 38, item 3): one quick script writes byte-identical CSVs
serially and on a LocalCluster of 2 workers; ``run_all`` hands ``--dask`` to every script."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.fixture(autouse=True)
def _experiments_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))


def _energy(out: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> dict[str, bytes]:
    """Run ``energy.py --quick`` (3 short runs) into ``out``; its CSVs' bytes by name."""
    argv = ["energy.py", "--quick", "--out", str(out), "--systems", "phasor,distserve", *extra]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(EXPERIMENTS / "energy.py"), run_name="__main__")
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.csv"))}


@pytest.mark.slow
def test_a_quick_experiment_writes_the_same_csvs_on_a_local_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("distributed")
    serial = _energy(tmp_path / "serial", monkeypatch)
    on_dask = _energy(tmp_path / "dask", monkeypatch, "--dask", "--dask-workers", "2")
    assert set(serial) == {"energy.csv", "energy_summary.csv"}
    assert on_dask == serial


def test_a_bad_dask_address_stops_the_script_naming_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _energy(tmp_path, monkeypatch, "--dask", "somehost:8786")
    assert "--dask 'somehost:8786'" in capsys.readouterr().err


def test_run_all_passes_the_scheduler_address_to_every_script(tmp_path: Path) -> None:
    import run_all

    for step in run_all.STEPS:
        cmd, _ = run_all.command(step, tmp_path, True, tmp_path, 0, "tcp://10.0.0.1:8786")
        if cmd is not None:
            assert cmd[cmd.index("--dask") + 1] == "tcp://10.0.0.1:8786"
        serial, _ = run_all.command(step, tmp_path, True, tmp_path, 0)
        assert serial is None or "--dask" not in serial
    with run_all.scheduler("tcp://10.0.0.1:8786", None) as address:
        assert address == "tcp://10.0.0.1:8786"
    with run_all.scheduler(None, None) as address:
        assert address is None
