"""The same study on PostgreSQL: two worker processes, one study, exactly n trials, then a
resume through the CLI's storage URL.

Needs a server: set ``PDOPT_TEST_POSTGRES_URL`` (e.g. ``postgresql://postgres@localhost:5439/
pdopt_test``) and install ``pdopt[postgres]``; skipped otherwise (CI has no database server).
Each run uses a fresh study name, so the database may be reused.
"""

from __future__ import annotations

import os
import uuid

import pytest

from pdopt.tune import tune

URL = os.environ.get("PDOPT_TEST_POSTGRES_URL", "")

pytestmark = pytest.mark.skipif(not URL, reason="PDOPT_TEST_POSTGRES_URL is not set")


def test_two_processes_share_one_postgres_study_and_resume() -> None:
    pytest.importorskip("psycopg")
    from test_tune_parallel import SPACE, assert_exactly, stored_trials, tiny_scenario

    name = f"pg-{uuid.uuid4().hex[:8]}"
    res = tune(tiny_scenario(), SPACE, n_trials=12, storage=URL, study_name=name, n_workers=2)
    assert_exactly(stored_trials(URL, name), 12)
    pids = {w.rsplit(":", 1)[1] for w in res.trials["worker"] if w}
    assert len(pids) == 2 and str(os.getpid()) not in pids
    first = {t.number: t.params for t in stored_trials(URL, name) if t.state.name == "COMPLETE"}
    tune(tiny_scenario(), SPACE, n_trials=15, storage=URL, study_name=name, n_workers=1)
    again = stored_trials(URL, name)
    assert_exactly(again, 15)
    # resuming kept every finished trial as it was
    assert {t.number: t.params for t in again if t.number in first} == first
