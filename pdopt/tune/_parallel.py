"""Fan trials out: local worker processes, or the workers of a Dask cluster, all sharing one
study through a storage URL (Optuna's pattern: each worker runs ``study.optimize`` on the same
study and the storage serialises trial creation).

Dask: ``dask_scheduler="tcp://host:port"`` connects a :class:`distributed.Client`
(:func:`pdopt.parallel.open_runs`; ``"local"`` starts a LocalCluster here); one task per
Dask worker thread runs :func:`pdopt.tune._worker.run_worker`. Every machine must reach the
storage (SQLite or a journal file only on one machine or a shared file system; PostgreSQL
anywhere) and import pdopt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pdopt.errors import ConfigError
from pdopt.parallel import open_runs
from pdopt.tune._claims import counted
from pdopt.tune._worker import TrialRunner, load_study, run_worker


def run_parallel(
    storage: object,
    study_name: str,
    runner: TrialRunner,
    n_trials: int,
    seed: int,
    n_workers: int,
    dask_scheduler: str | None,
    progress: bool,
) -> None:
    """Run workers until the study holds ``n_trials`` counted trials; re-raise a worker's error."""
    if dask_scheduler is not None:
        _on_dask(dask_scheduler, storage, study_name, runner, n_trials, seed, progress)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(n_workers, mp_context=ctx, initializer=_ignore_interrupt) as pool:
        futures = [
            pool.submit(run_worker, storage, study_name, runner, n_trials, seed + i, False, i == 0)
            for i in range(n_workers)
        ]
        _watch(futures, storage, study_name, runner, n_trials, progress, lambda f: f.done())
        for f in futures:
            f.result()


def _ignore_interrupt() -> None:
    """Worker processes leave Ctrl-C (sent to the whole terminal process group) to the parent,
    which ends them (``pdopt.cli``): no traceback from each worker."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _on_dask(
    address: str,
    storage: object,
    study_name: str,
    runner: TrialRunner,
    n_trials: int,
    seed: int,
    progress: bool,
) -> None:
    # the connection (and its errors, naming --dask) is pdopt.parallel's
    with open_runs(address) as runs:
        client = runs.client
        slots = sum(client.nthreads().values())
        if slots < 1:
            raise ConfigError(f"the Dask cluster at {address} has no workers")
        futures = [
            client.submit(
                run_worker,
                storage,
                study_name,
                runner,
                n_trials,
                seed + i,
                False,
                i == 0,
                pure=False,
            )
            for i in range(slots)
        ]
        _watch(futures, storage, study_name, runner, n_trials, progress, lambda f: f.done())
        client.gather(futures)


def _watch(
    futures: list[Any],
    storage: object,
    study_name: str,
    runner: TrialRunner,
    n_trials: int,
    progress: bool,
    done: Callable[[Future[Any]], bool],
) -> None:
    """Wait for the workers; with ``progress``, poll the shared study and draw a bar."""
    if not progress:
        while not all(done(f) for f in futures):
            time.sleep(0.2)
        return
    from tqdm import tqdm

    study = load_study(storage, study_name, runner.objective, 0, runner.steps)
    with tqdm(total=n_trials, desc=f"study {study_name}", unit="trial") as bar:
        while True:
            finished = all(done(f) for f in futures)
            bar.n = min(counted(study), n_trials)
            bar.refresh()
            if finished:
                return
            time.sleep(0.5)
