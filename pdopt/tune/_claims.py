"""Claims: several workers end a study with exactly ``n_trials`` counted trials, and a killed
worker's RUNNING trial is recognised.

Exactly ``n_trials`` with several workers: Optuna numbers trials atomically in the storage, so a
trial's number is its claim. A worker stops asking when the complete, pruned and running trials
already reach ``n_trials``; if two workers ask at the same instant, the one whose trial has
``n_trials`` live trials (complete, pruned or running) numbered before it gives it up at once
(state FAIL, user attribute ``surplus``) before running anything.

A killed worker's trial stays RUNNING. Each trial records ``worker`` = ``host:pid`` first thing
in its objective (Optuna samples a trial's parameters lazily, inside the objective, so nothing
slow runs between the trial's creation and its tag); a worker starting on the same host marks
FAIL the RUNNING trials of processes that no longer exist, and never counts them as live. A dead
worker on another host is found by the RDB heartbeat (:mod:`pdopt.tune._storage`) or by
``fail_stale`` when no worker is alive.

Only Optuna's public API: trials are failed with ``Study.tell(number, state=FAIL)``, and a
surplus claim is kept out of the log by Optuna's verbosity (:class:`_Claimed`), not by filtering
its messages.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

    TrialFunction = Callable[[optuna.Trial], float | list[float]]


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
    return _fail(study, [t for t in running if _is_dead_running(t)])


def fail_running(study: optuna.Study) -> int:
    """Mark every RUNNING trial FAIL (a killed worker's); safe only when no worker runs."""
    import optuna

    return _fail(study, study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def _fail(study: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> int:
    import optuna

    for t in trials:
        # skip_if_finished: another worker may fail the same dead trial first
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    return len(trials)


@dataclass(frozen=True, slots=True)
class _Claimed:
    """The objective behind a claim check: tags the trial with this worker; a surplus trial
    stops this worker and runs nothing.

    A surplus claim is bookkeeping, not an error, but Optuna logs every failed trial at WARNING:
    the claim that gives up lowers Optuna's verbosity to ERROR for what is left of this
    :func:`optimize` call (the study is stopped, so only this trial's own bookkeeping), and
    :func:`optimize` restores it.
    """

    runner: TrialFunction
    n_trials: int

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        import optuna

        trial.set_user_attr("worker", this_worker())
        if _live_before(trial.study, trial.number) >= self.n_trials:
            trial.set_user_attr("surplus", True)
            trial.study.stop()
            optuna.logging.set_verbosity(optuna.logging.ERROR)
            raise SurplusTrial(f"trial {trial.number}: the study already holds {self.n_trials}")
        return self.runner(trial)


@dataclass(frozen=True, slots=True)
class _StopWhenClaimed:
    """Callback: stop when complete, pruned and live running trials reach ``n_trials``."""

    n_trials: int

    def __call__(self, study: optuna.Study, trial: object) -> None:
        if _live_before(study, 1 << 62) >= self.n_trials:
            study.stop()


def optimize(study: optuna.Study, runner: TrialFunction, n_trials: int, progress: bool) -> None:
    """Run trials of ``study`` here until it holds ``n_trials`` counted ones (module docstring).

    Optuna logs at WARNING meanwhile (not one INFO line per trial); its verbosity is restored.
    """
    import optuna

    fail_dead_local(study)
    left = n_trials - counted(study)
    if left <= 0:
        return
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(verbosity, optuna.logging.WARNING))
    try:
        study.optimize(
            _Claimed(runner, n_trials),
            n_trials=left,
            catch=(SurplusTrial,),
            callbacks=[_StopWhenClaimed(n_trials)],
            show_progress_bar=progress,
        )
    finally:
        optuna.logging.set_verbosity(verbosity)
