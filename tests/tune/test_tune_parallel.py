"""pdopt.tune's distributed claims with real processes: two local worker processes sharing one
SQLite or journal-file study, a real local Dask cluster (two worker processes), and a worker
process killed with SIGKILL mid-study whose finished trials all survive the resume.

Each study is the tiny fluid scenario (about 30 ms a trial); the processes' start-up (imports)
dominates the time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.scenario import Scenario
from pdopt.tune import FloatParam, SearchSpace, _claims, open_storage, tune

COST = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
SPACE = SearchSpace((FloatParam("theta_flow", 0.3, 0.95), FloatParam("cool_s", 0.2, 5.0)))


def tiny_scenario() -> Scenario:
    from pdopt.workload import archetype_workload

    wl = archetype_workload("production_mix", 20.0, duration_s=60.0, seed=1)
    cluster = ClusterSpec.build(COST, 2, 4, 2, kv_capacity_blocks=4000, mixed_pool_role="decode")
    return Scenario(wl, cluster, "phasor", Slo(1.0, 0.1))


def url_of(kind: str, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/s.db" if kind == "sqlite" else f"journal:///{tmp_path}/s.log"


def stored_trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials read afresh from the storage (not from a TuneResult)."""
    return optuna.load_study(study_name=name, storage=open_storage(url)).get_trials()


def assert_exactly(trials: list[optuna.trial.FrozenTrial], n: int) -> None:
    """n COMPLETE trials, unique numbers and parameter sets; anything else is a surplus claim
    that never ran (FAIL, no parameters)."""
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(done) == n
    assert len({t.number for t in trials}) == len(trials)
    assert len({tuple(sorted(t.params.items())) for t in done}) == n
    for t in trials:
        if t.state.name != "COMPLETE":
            assert t.state.name == "FAIL" and t.user_attrs.get("surplus") and not t.params


@pytest.mark.parametrize("kind", [pytest.param("sqlite", marks=pytest.mark.slow), "journal"])
def test_two_local_processes_share_one_study(tmp_path: Path, kind: str) -> None:
    url = url_of(kind, tmp_path)
    res = tune(tiny_scenario(), SPACE, n_trials=20, storage=url, study_name="p", n_workers=2)
    trials = stored_trials(url, "p")
    assert_exactly(trials, 20)
    assert len(res.trials) == len(trials)
    # the trials ran in worker processes, not here, and both workers took part
    pids = {w.rsplit(":", 1)[1] for w in res.trials["worker"] if w}
    assert str(os.getpid()) not in pids
    assert len(pids) == 2
    if kind == "journal":
        return
    # resuming with more workers than trials left runs exactly the missing one
    more = tune(tiny_scenario(), SPACE, n_trials=21, storage=url, study_name="p", n_workers=2)
    assert_exactly(stored_trials(url, "p"), 21)
    assert (more.trials["state"] == "COMPLETE").sum() == 21


@pytest.mark.slow
def test_a_local_dask_cluster_runs_the_study_and_the_sweep(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    from pdopt.tune import sensitivity_table

    url = url_of("journal", tmp_path)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        dask_pids = {str(p) for p in client.run(os.getpid).values()}
        res = tune(tiny_scenario(), SPACE, n_trials=16, storage=url, study_name="d",
                   dask_scheduler=cluster.scheduler_address)  # fmt: skip
        table = sensitivity_table(
            tiny_scenario(), fidelity="fluid", dask_scheduler=cluster.scheduler_address
        )
    assert_exactly(stored_trials(url, "d"), 16)
    pids = {w.rsplit(":", 1)[1] for w in res.trials["worker"] if w}
    assert pids and pids <= dask_pids  # every trial ran in a Dask worker process
    local = sensitivity_table(tiny_scenario(), fidelity="fluid")
    # same simulations, same numbers: the Dask sweep is only a fan-out
    pd.testing.assert_frame_equal(table, local)


_WORKER = """
import sys
sys.path.insert(0, {tests!r})
from test_tune_parallel import SPACE, tiny_scenario
from pdopt.tune import tune
tune(tiny_scenario(), SPACE, n_trials=10_000, storage={url!r}, study_name="k")
"""


def _complete(url: str) -> list[optuna.trial.FrozenTrial]:
    try:
        trials = stored_trials(url, "k")
    except KeyError:  # the worker has not created the study yet
        return []
    return [t for t in trials if t.state.name == "COMPLETE"]


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_killed_worker_loses_no_finished_trial(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kill often lands just as the worker starts its next trial; between Optuna creating
    # that trial and the worker tagging it there is no pid to check, and such an untagged
    # RUNNING trial counts as alive for UNTAGGED_S (30 s). Seen once in CI: 11 of 12 trials.
    # Resuming "30 s later" keeps the test about what it checks, not that wait.
    monkeypatch.setattr(_claims, "UNTAGGED_S", 0.0)
    url = url_of(kind, tmp_path)
    code = _WORKER.format(tests=str(Path(__file__).parent), url=url)
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180.0  # a hang guard: the worker imports optuna first
        while len(_complete(url)) < 5:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the worker had not finished 5 trials after 180 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)  # mid-study: no clean-up, maybe mid-trial or mid-write
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    before = {t.number: (t.params, t.values) for t in _complete(url)}
    assert len(before) >= 5
    n = len(before) + 4
    # no fail_stale: the resuming worker sees the killed process is gone (same host)
    res = tune(tiny_scenario(), SPACE, n_trials=n, storage=url, study_name="k")
    after = {t.number: (t.params, t.values) for t in _complete(url)}
    assert {k: after[k] for k in before} == before  # every finished trial kept, unchanged
    assert len(after) == n
    # what the killed worker left running (if it was mid-trial) is FAIL now, nothing else
    states = res.trials.set_index("number")["state"]
    assert set(states.drop(list(after))) <= {"FAIL"}
    assert len(states) - len(after) <= 1
    assert "RUNNING" not in set(states)


def test_an_untagged_running_trial_counts_as_alive_until_untagged_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial a worker killed between Optuna creating it and tagging it: no pid to check,
    so it counts towards n_trials (another host may be running it) until UNTAGGED_S after its
    start; then it is failed and replaced."""
    url = url_of("journal", tmp_path)
    tune(tiny_scenario(), SPACE, n_trials=2, storage=url, study_name="u")
    study = optuna.load_study(study_name="u", storage=open_storage(url))
    study.ask()  # RUNNING, no "worker" tag (this study's sampler is Optuna's default)
    tune(tiny_scenario(), SPACE, n_trials=4, storage=url, study_name="u")
    states = [t.state.name for t in stored_trials(url, "u")]
    assert states.count("COMPLETE") == 3 and states.count("RUNNING") == 1
    monkeypatch.setattr(_claims, "UNTAGGED_S", 0.0)  # as if 30 s had passed
    tune(tiny_scenario(), SPACE, n_trials=4, storage=url, study_name="u")
    states = [t.state.name for t in stored_trials(url, "u")]
    assert states.count("COMPLETE") == 4 and states.count("FAIL") == 1
    assert "RUNNING" not in states


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _running_trial(study: optuna.Study, worker: str | None) -> None:
    trial = study.ask()
    if worker is not None:
        trial.set_user_attr("worker", worker)


def test_claims_count_live_running_trials_and_fail_dead_ones() -> None:
    """In memory, no extra processes: a RUNNING trial of a live process (another host, or this
    one) counts towards n_trials, so a worker runs nothing beyond it; one of a process that no
    longer exists on this host is marked FAIL and replaced."""
    import socket

    from pdopt.tune import P99_UNDER_CAPACITY_FLOOR
    from pdopt.tune._claims import counted, fail_dead_local, optimize
    from pdopt.tune._worker import TrialRunner, load_study

    storage = optuna.storages.InMemoryStorage()
    runner = TrialRunner(tiny_scenario(), SPACE, P99_UNDER_CAPACITY_FLOOR, "fluid", (1.0,))
    study = load_study(storage, "c", P99_UNDER_CAPACITY_FLOOR, 0, (1.0,))
    optimize(study, runner, 2, progress=False)
    assert counted(study) == 2
    _running_trial(study, "elsewhere:1")  # a worker on another machine, assumed alive
    _running_trial(study, f"{socket.gethostname()}:{os.getpid()}")  # this process: alive
    optimize(study, runner, 4, progress=False)
    # 2 complete + 2 live running = 4: the one trial asked is a surplus claim, nothing ran
    assert counted(study) == 2
    assert study.get_trials()[-1].user_attrs.get("surplus")
    assert fail_dead_local(study) == 0
    dead = f"{socket.gethostname()}:{_dead_pid()}"
    _running_trial(study, dead)
    optimize(study, runner, 5, progress=False)  # fails the dead trial, runs one in its place
    states = [t.state.name for t in study.get_trials()]
    assert states == ["COMPLETE", "COMPLETE", "RUNNING", "RUNNING", "FAIL", "FAIL", "COMPLETE"]
    assert "surplus" not in study.get_trials()[5].user_attrs  # the dead one, failed
    assert study.get_trials()[-1].user_attrs["worker"].endswith(f":{os.getpid()}")


def test_a_surplus_claim_runs_nothing() -> None:
    """One trial left and another worker's trial already RUNNING: the trial this worker asks
    (the later number) gives up before running anything and the worker stops."""
    from pdopt.tune import P99_UNDER_CAPACITY_FLOOR
    from pdopt.tune._claims import optimize
    from pdopt.tune._worker import TrialRunner, load_study

    storage = optuna.storages.InMemoryStorage()
    runner = TrialRunner(tiny_scenario(), SPACE, P99_UNDER_CAPACITY_FLOOR, "fluid", (1.0,))
    study = load_study(storage, "s", P99_UNDER_CAPACITY_FLOOR, 0, (1.0,))
    _running_trial(study, "elsewhere:1")
    optimize(study, runner, 1, progress=False)
    first, second = study.get_trials()
    assert first.state.name == "RUNNING"
    assert second.state.name == "FAIL" and second.user_attrs["surplus"] and not second.params
