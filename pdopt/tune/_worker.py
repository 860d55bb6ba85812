"""What a tuning worker runs: the trial objective, the study it opens and :func:`run_worker`.

:func:`pdopt.tune.tune` runs trials here in its own process, or sends :func:`run_worker` and a
:class:`TrialRunner` to worker processes or Dask workers (:mod:`pdopt.tune._parallel`); each
opens the shared study with :func:`load_study`. Imports run one way: ``_study`` →
``_parallel`` → ``_worker`` → ``_claims``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from pdopt.errors import ConfigError
from pdopt.scenario import Scenario
from pdopt.sim import load_compiled_engine
from pdopt.tune._claims import optimize
from pdopt.tune._defaults import DEFAULTS_ATTR
from pdopt.tune._objective import Objective
from pdopt.tune._scenario import evaluate
from pdopt.tune._space import SearchSpace
from pdopt.tune._storage import open_storage

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, slots=True)
class TrialRunner:
    """The picklable objective function (sent to worker processes and Dask workers)."""

    scenario: Scenario
    space: SearchSpace
    objective: Objective
    fidelity: str
    steps: tuple[float, ...]

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        import optuna

        if self.fidelity == "des":
            # in every process that runs trials: a trial's run may be below the size at which
            # engine="auto" loads it, and the fidelity's probe timed this engine
            load_compiled_engine()
        baseline = bool(trial.user_attrs.get(DEFAULTS_ATTR))
        with warnings.catch_warnings():
            # a default outside its searched range is run as it is: the baseline, not a draw
            warnings.filterwarnings("ignore", "Fixed parameter .* is out of range")
            params = self.space.suggest(trial)
        metrics = pd.Series(dtype=float)
        for i, fraction in enumerate(self.steps):
            metrics = evaluate(self.scenario, params, self.fidelity, fraction=fraction)
            if self.objective.is_multi or fraction >= 1.0 or baseline:
                continue  # the defaults' trial always runs to the end
            trial.report(self.objective.values(metrics)[0], step=i)
            if trial.should_prune():
                _record(trial, metrics, self.objective)
                raise optuna.TrialPruned()
        _record(trial, metrics, self.objective)
        values = self.objective.values(metrics)
        return values if self.objective.is_multi else values[0]


def _record(trial: optuna.Trial, metrics: pd.Series, objective: Objective) -> None:
    # NOTE: one attribute holding every metric: each attribute is a storage write (a SQLite
    # commit), so 40 separate ones cost more than the fluid run itself.
    trial.set_user_attr("metrics", {str(k): float(v) for k, v in metrics.items()})
    violations = objective.violations(metrics)
    trial.set_user_attr("violations", violations)
    for c, v in zip(objective.constraints, violations, strict=True):
        # constraint-aware samplers read these (<= 0 is feasible); inf would break TPE's math
        trial.set_constraint(f"{c.metric}{c.op}{c.bound:g}", min(v, 1e12))


def make_sampler(objective: Objective, seed: int) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, seeded); constraints reach it through ``Trial.set_constraint``."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=5 + 5 * objective.is_multi
        )


def make_pruner(objective: Objective, steps: tuple[float, ...]) -> optuna.pruners.BasePruner:
    """The median pruner on partial runs (single objective with several steps), else none."""
    import optuna

    if objective.is_multi or len(steps) < 2:
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)


def load_study(
    storage: object, study_name: str, objective: Objective, seed: int, steps: tuple[float, ...]
) -> optuna.Study:
    """Create the study or open the existing one (its directions must match)."""
    import optuna

    study = optuna.create_study(
        storage=open_storage(storage),
        study_name=study_name,
        directions=objective.directions,  # type: ignore[arg-type]
        sampler=make_sampler(objective, seed),
        pruner=make_pruner(objective, steps),
        load_if_exists=True,
    )
    have = [d.name.lower() for d in study.directions]
    if have != objective.directions:
        raise ConfigError(
            f"study {study_name!r} exists with directions {have}, not {objective.directions}; "
            "choose another study_name or the same targets"
        )
    return study


def run_worker(
    storage: object,
    study_name: str,
    runner: TrialRunner,
    n_trials: int,
    seed: int,
    progress: bool = False,
    pops_queued: bool = True,
) -> int:
    """Optimise until the study holds ``n_trials`` counted trials; returns trials run here.

    The entry point of a worker process or Dask task: Optuna stays at WARNING in it (no line
    per study opened or trial run). Only one worker of a run ``pops_queued``: the others start
    once no enqueued trial waits (the defaults' baseline; :func:`_await_queued`).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(storage, study_name, runner.objective, seed, runner.steps)
    if not pops_queued:
        _await_queued(study)
    before = len(study.get_trials(deepcopy=False))
    optimize(study, runner, n_trials, progress)
    return len(study.get_trials(deepcopy=False)) - before


QUEUED_WAIT_S = 60.0
"""How long a worker that does not pop enqueued trials waits for them to be taken."""


def _await_queued(study: optuna.Study) -> None:
    """Wait until no trial of ``study`` is WAITING (taken by the worker that pops them), for at
    most :data:`QUEUED_WAIT_S`.

    NOTE: two workers popping one enqueued trial at the same instant can both run it in SQLite
    storage (Optuna's pop is a read then a write), and the second's result then fails to record;
    one popping worker avoids that while the others start at once beside it.
    """
    import time

    import optuna

    deadline = time.monotonic() + QUEUED_WAIT_S
    waiting = (optuna.trial.TrialState.WAITING,)
    while study.get_trials(deepcopy=False, states=waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
