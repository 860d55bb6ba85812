"""The same study on PostgreSQL: two worker processes, one study, exactly n trials, then a
resume through the CLI's storage URL.

The server is the ``postgres_url`` fixture (``conftest.py``): a throwaway PostgreSQL started from
the ``pgserver`` wheel of the dev extras, or the server ``PDOPT_TEST_POSTGRES_URL`` names. Each
run uses a fresh study name, so the database may be reused.
"""

from __future__ import annotations

import os
import uuid

from pdopt.tune import tune


def test_two_processes_share_one_postgres_study_and_resume(postgres_url: str) -> None:
    url = postgres_url
    from test_tune_parallel import SPACE, assert_exactly, stored_trials, tiny_scenario

    name = f"pg-{uuid.uuid4().hex[:8]}"
    res = tune(tiny_scenario(), SPACE, n_trials=12, storage=url, study_name=name, n_workers=2)
    assert_exactly(stored_trials(url, name), 12)
    pids = {w.rsplit(":", 1)[1] for w in res.trials["worker"] if w}
    assert len(pids) == 2 and str(os.getpid()) not in pids
    first = {t.number: t.params for t in stored_trials(url, name) if t.state.name == "COMPLETE"}
    tune(tiny_scenario(), SPACE, n_trials=15, storage=url, study_name=name, n_workers=1)
    again = stored_trials(url, name)
    assert_exactly(again, 15)
    # resuming kept every finished trial as it was
    assert {t.number: t.params for t in again if t.number in first} == first
