"""``pdopt tune --dask [ADDRESS]`` (issue 38, item 3): the trials on a LocalCluster started by
the command, ``--dask-scheduler`` kept as the old spelling, bad addresses named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from pdopt.cli import main


def _config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["tune", "--example-config"]) == 0
    text = capsys.readouterr().out.replace("n_requests = 2000", "n_requests = 200")
    path = tmp_path / "tune.toml"
    path.write_text(text.replace('fidelity = "auto"', 'fidelity = "fluid"'))
    return path


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--dask", "scheduler:8786"], "--dask 'scheduler:8786'"),
        (["--dask-scheduler", "scheduler:8786"], "--dask-scheduler 'scheduler:8786'"),
        (["--dask", "tcp://127.0.0.1:9"], "--dask tcp://127.0.0.1:9: no Dask scheduler"),
        (["--dask", "--dask-scheduler", "tcp://h:1"], "not both"),
    ],
)
def test_bad_dask_options_are_errors_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    if "tcp://127.0.0.1:9" in flags:
        pytest.importorskip("distributed")
    path = _config(tmp_path, capsys)
    url = f"journal:///{tmp_path}/s.log"
    assert main(["tune", str(path), "--storage", url, "--n-trials", "2", *flags]) == 1
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_trials_run_on_a_local_cluster_the_command_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("distributed")
    path = _config(tmp_path, capsys)
    url = f"journal:///{tmp_path}/s.log"
    csv = tmp_path / "t.csv"
    assert main(["tune", str(path), "--storage", url, "--n-trials", "4", "--confirm-top", "0",
                 "--dask", "--json", "--trials-csv", str(csv)]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    # a worker whose claim came after the study held 4 gives it up as a FAIL (surplus)
    assert out["states"].get("COMPLETE") == 4 and set(out["states"]) <= {"COMPLETE", "FAIL"}
    workers = {str(w) for w in pd.read_csv(csv)["worker"].dropna()}
    # the trials ran in Dask worker processes ("host:pid"), none in this one
    assert workers and not any(w.rsplit(":", 1)[1] == str(os.getpid()) for w in workers)
