"""``phasor_mechanisms.py`` on Dask (issue 38, item 3): its queue-divergence and shock-recovery
parts give the same tables and series serially and on a LocalCluster of 2 workers, rows in the
serial order. (The whole ``--quick`` script, byte-identical CSVs included, was compared by hand:
it takes about a minute on a LocalCluster here, too long for the suite.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.fixture(autouse=True)
def _experiments_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))


@pytest.mark.slow
def test_divergence_and_shock_parts_are_the_same_on_a_local_cluster() -> None:
    pytest.importorskip("distributed")
    import _common as c
    import phasor_mechanisms as pm

    from pdopt.parallel import LOCAL, open_runs

    cost = c.v100_cost_model()
    serial = argparse.Namespace(seed=0, quick=True, dask=None)
    expected = [pm.queue_divergence(serial, cost), pm.shock_recovery(serial, cost)]
    with open_runs(LOCAL, n_workers=2) as runs:
        on_dask = argparse.Namespace(seed=0, quick=True, dask=runs)
        got = [pm.queue_divergence(on_dask, cost), pm.shock_recovery(on_dask, cost)]
    for (table, series), (want_table, want_series) in zip(got, expected, strict=True):
        pd.testing.assert_frame_equal(table, want_table)
        pd.testing.assert_frame_equal(series, want_series)
    div, shock = expected[0][0], expected[1][0]
    assert list(div["system"]) == ["memory_centric", "phasor"]
    assert list(shock["system"]) == [label for label, *_ in pm.SHOCK_SYSTEMS]
