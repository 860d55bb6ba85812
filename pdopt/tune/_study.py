"""``tune``: an Optuna study over a policy's parameters against a simulator.

One trial = one simulation of the scenario with the sampled parameters (:func:`evaluate`). With
``steps`` (fractions of the workload's time span, e.g. ``(0.25, 0.5, 1.0)``) a single-objective
trial reports its value on each growing prefix and Optuna's median pruner stops poor trials
early. ``confirm_top`` re-runs the best fluid trials with the discrete-event simulator
(multi-fidelity: screen with the fluid model, confirm with the request-level one).

A study is identified by ``study_name`` in ``storage`` and resumes where it stopped
(``load_if_exists``): ``n_trials`` is the *total* wanted, trials already complete or pruned count.

Several workers end with exactly ``n_trials`` counted trials, and a killed worker's trial is
found and failed: :mod:`pdopt.tune._claims`.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from pdopt._validation import check_int_at_least, check_one_of
from pdopt.errors import ConfigError
from pdopt.scenario import Scenario
from pdopt.tune._claims import optimize, this_worker
from pdopt.tune._objective import P99_UNDER_CAPACITY_FLOOR, Objective
from pdopt.tune._scenario import FIDELITIES, evaluate
from pdopt.tune._space import PHASOR_SPACE, SearchSpace
from pdopt.tune._storage import is_shared, open_storage

if TYPE_CHECKING:
    import optuna

    from pdopt.tune._results import TuneResult


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

        params = self.space.suggest(trial)
        metrics = pd.Series(dtype=float)
        for i, fraction in enumerate(self.steps):
            metrics = evaluate(self.scenario, params, self.fidelity, fraction=fraction)
            if self.objective.is_multi or fraction >= 1.0:
                continue
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

    class WorkerTaggingTPE(optuna.samplers.TPESampler):
        """TPE that records ``worker`` (``host:pid``) on a trial as soon as it exists (module
        docstring): a process killed before its objective ran is still recognised as dead."""

        def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            study._storage.set_trial_user_attr(trial._trial_id, "worker", this_worker())
            super().before_trial(study, trial)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
        return WorkerTaggingTPE(
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


def fail_running(study: optuna.Study) -> int:
    """Mark every RUNNING trial FAIL (a killed worker's); safe only when no worker runs."""
    import optuna

    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for t in running:
        study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    return len(running)


def run_worker(
    storage: object,
    study_name: str,
    runner: TrialRunner,
    n_trials: int,
    seed: int,
    progress: bool = False,
) -> int:
    """Optimise until the study holds ``n_trials`` counted trials; returns trials run here."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(storage, study_name, runner.objective, seed, runner.steps)
    before = len(study.get_trials(deepcopy=False))
    optimize(study, runner, n_trials, progress)
    return len(study.get_trials(deepcopy=False)) - before


def tune(
    scenario: Scenario,
    space: SearchSpace = PHASOR_SPACE,
    objective: Objective = P99_UNDER_CAPACITY_FLOOR,
    *,
    n_trials: int = 50,
    fidelity: str = "fluid",
    steps: Sequence[float] = (1.0,),
    storage: object = None,
    study_name: str = "pdopt-tune",
    seed: int = 0,
    n_workers: int = 1,
    dask_scheduler: str | None = None,
    confirm_top: int = 0,
    fail_stale: bool = False,
    progress: bool = False,
) -> TuneResult:
    """Run (or resume) a study and return a :class:`pdopt.tune.TuneResult`.

    Parameters
    ----------
    scenario : Scenario
    space : SearchSpace
        Parameters and ranges (default :data:`PHASOR_SPACE`).
    objective : Objective
        Targets and constraints (default: P99 E2E with ≥ 90% SLO attainment).
    n_trials : int
        Total counted (complete or pruned) trials the study should hold.
    fidelity : str
        ``"fluid"`` (screen) or ``"des"``.
    steps : sequence of float
        Increasing fractions of the workload span ending at 1 (partial runs for pruning).
    storage : None, str or optuna storage
        See :mod:`pdopt.tune._storage`; worker processes and Dask need a URL.
    study_name : str
    seed : int
        Sampler seed (worker ``i`` uses ``seed + i``).
    n_workers : int
        Local worker processes sharing the storage (1: this process).
    dask_scheduler : str or None
        ``tcp://host:port`` of a Dask scheduler: one worker per Dask thread runs trials.
    confirm_top : int
        Re-run the best ``confirm_top`` feasible trials (single objective) or Pareto trials
        (multi) with the discrete-event simulator.
    fail_stale : bool
        Before running, mark RUNNING trials FAIL (a killed worker's; only when none is alive).
    progress : bool
        Draw a progress bar (tqdm) on stderr.

    Examples
    --------
    >>> from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
    >>> from pdopt.scenario import Scenario
    >>> from pdopt.sim import ClusterSpec, Slo
    >>> from pdopt.workload import archetype_workload
    >>> cost = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
    >>> sc = Scenario(archetype_workload("production_mix", 20.0, duration_s=60.0, seed=1),
    ...               ClusterSpec.build(cost, 2, 4, 2, mixed_pool_role="decode"),
    ...               "phasor", Slo(1.0, 0.1))
    >>> res = tune(sc, n_trials=4)
    >>> len(res.trials)
    4
    """
    from pdopt.tune._parallel import run_parallel
    from pdopt.tune._results import build_result

    owner = "tune"
    check_int_at_least(n_trials, 1, "n_trials", owner)
    check_int_at_least(n_workers, 1, "n_workers", owner)
    check_int_at_least(confirm_top, 0, "confirm_top", owner)
    check_one_of(fidelity, FIDELITIES, "fidelity", owner)
    fractions = tuple(float(s) for s in steps)
    if (
        not fractions
        or fractions[-1] != 1.0
        or any(b <= a for a, b in itertools.pairwise(fractions))
    ):
        raise ConfigError(f"steps must increase and end at 1.0; got {list(steps)}")
    if any(not (0 < f <= 1) or math.isnan(f) for f in fractions):
        raise ConfigError(f"steps must lie in (0, 1]; got {list(steps)}")
    runner = TrialRunner(scenario, space, objective, fidelity, fractions)
    parallel = n_workers > 1 or dask_scheduler is not None
    if parallel and not is_shared(storage):
        raise ConfigError(
            "parallel workers need a storage URL they can all open: sqlite:///FILE.db or "
            "journal:///FILE.log on one machine, postgresql://… across machines"
        )
    study = load_study(storage, study_name, objective, seed, fractions)
    if fail_stale:
        fail_running(study)
    if parallel:
        run_parallel(
            storage, study_name, runner, n_trials, seed, n_workers, dask_scheduler, progress
        )
    else:
        _run_here(study, runner, n_trials, progress)
    return build_result(study, storage, scenario, objective, confirm_top)


def _run_here(study: optuna.Study, runner: TrialRunner, n_trials: int, progress: bool) -> None:
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        optimize(study, runner, n_trials, progress)
    finally:
        optuna.logging.set_verbosity(verbosity)
