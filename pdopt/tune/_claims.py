"""Claims: several workers end a study with exactly ``n_trials`` counted trials, and a killed
worker's RUNNING trial is recognised.

Exactly ``n_trials`` with several workers: Optuna numbers trials atomically in the storage, so a
trial's number is its claim. A worker stops asking when the complete, pruned and running trials
already reach ``n_trials``; if two workers ask at the same instant, the one whose trial has
``n_trials`` live trials (complete, pruned or running) numbered before it gives it up at once
(state FAIL, user attribute ``surplus``) before running anything.

A killed worker's trial stays RUNNING. Each trial records ``worker`` = ``host:pid`` as soon as
it is created (the sampler's ``before_trial``); a worker starting on the same host marks FAIL the
RUNNING trials of processes that no longer exist, and never counts them as live. A dead worker
on another host is found by the RDB heartbeat (:mod:`pdopt.tune._storage`) or by ``fail_stale``
when no worker is alive.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

    from pdopt.tune._study import TrialRunner


def counted(study: optuna.Study) -> int:
    """Trials that count towards ``n_trials``: complete or pruned."""
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


UNTAGGED_S = 30.0
"""A RUNNING trial with no ``worker`` tag this long after its start is a killed worker's."""


class SurplusTrial(Exception):
    """A trial asked after the study already held or ran ``n_trials`` live trials."""


def this_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _is_dead(worker: object) -> bool:
    """True for ``host:pid`` of a process on this host that no longer exists."""
    host, _, pid = str(worker).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine (or not started yet): assume alive
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, another user's
    return False


def _is_dead_running(t: optuna.trial.FrozenTrial) -> bool:
    """A RUNNING trial whose process is gone: on this host and no longer exists, or never
    tagged (killed between the trial's creation and its tag) for ``UNTAGGED_S``."""
    worker = t.user_attrs.get("worker")
    if worker is not None:
        return _is_dead(worker)
    start = t.datetime_start
    return start is not None and (datetime.datetime.now() - start).total_seconds() > UNTAGGED_S


def _is_live(t: optuna.trial.FrozenTrial) -> bool:
    state = t.state.name
    if state == "RUNNING":
        return not _is_dead_running(t)
    return state in ("COMPLETE", "PRUNED")


def _live_before(study: optuna.Study, number: int) -> int:
    """Complete, pruned and running (by a live process) trials numbered before ``number``."""
    return sum(t.number < number and _is_live(t) for t in study.get_trials(deepcopy=False))


def fail_dead_local(study: optuna.Study) -> int:
    """Mark FAIL the RUNNING trials whose worker process on this host no longer exists."""
    import optuna

    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    dead = [t for t in running if _is_dead_running(t)]
    for t in dead:
        study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    return len(dead)


@dataclass(frozen=True, slots=True)
class _Claimed:
    """The objective behind a claim check: a surplus trial stops this worker, runs nothing."""

    runner: TrialRunner
    n_trials: int
    surplus: set[int]  # numbers of this worker's surplus claims (for the log filter)

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        if _live_before(trial.study, trial.number) >= self.n_trials:
            self.surplus.add(trial.number)
            trial.set_user_attr("surplus", True)
            trial.study.stop()
            raise SurplusTrial(f"trial {trial.number}: the study already holds {self.n_trials}")
        return self.runner(trial)


@dataclass(frozen=True, slots=True)
class _StopWhenClaimed:
    """Callback: stop when complete, pruned and live running trials reach ``n_trials``."""

    n_trials: int

    def __call__(self, study: optuna.Study, trial: object) -> None:
        if _live_before(study, 1 << 62) >= self.n_trials:
            study.stop()


@dataclass(frozen=True, slots=True)
class _QuietSurplus:
    """Log filter: Optuna's two "Trial N failed" warnings of a surplus claim are dropped."""

    surplus: set[int]

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "SurplusTrial" in text:
            return False
        return not any(text.startswith(f"Trial {n} failed with value") for n in self.surplus)


def optimize(study: optuna.Study, runner: TrialRunner, n_trials: int, progress: bool) -> None:
    """Run trials of ``study`` here until it holds ``n_trials`` counted ones (module docstring)."""

    fail_dead_local(study)
    left = n_trials - counted(study)
    if left <= 0:
        return
    # a surplus claim is bookkeeping, not an error: keep Optuna from logging it as a failure
    surplus: set[int] = set()
    quiet = _QuietSurplus(surplus)
    log = logging.getLogger("optuna.study._optimize")
    log.addFilter(quiet)
    try:
        study.optimize(
            _Claimed(runner, n_trials, surplus),
            n_trials=left,
            catch=(SurplusTrial,),
            callbacks=[_StopWhenClaimed(n_trials)],
            show_progress_bar=progress,
        )
    finally:
        log.removeFilter(quiet)
