"""``tune``: an Optuna study over a policy's parameters against a simulator.

One trial = one simulation of the scenario with the sampled parameters (:func:`evaluate`). With
``steps`` (fractions of the workload's time span, e.g. ``(0.25, 0.5, 1.0)``) a single-objective
trial reports its value on each growing prefix and Optuna's median pruner stops poor trials
early. ``confirm_top`` re-runs the best fluid trials with the discrete-event simulator
(multi-fidelity: screen with the fluid model, confirm with the request-level one).

The policy's default settings are the first trial (:mod:`pdopt.tune._defaults`): the result
shows the best beside them and recommends the defaults when no trial beats them.

A study is identified by ``study_name`` in ``storage`` and resumes where it stopped
(``load_if_exists``): ``n_trials`` is the *total* wanted, trials already complete or pruned count.

Several workers end with exactly ``n_trials`` counted trials, and a killed worker's trial is
found and failed: :mod:`pdopt.tune._claims`. What a worker runs (the trial objective, the study
it opens) is in :mod:`pdopt.tune._worker`, fanning out to workers in :mod:`pdopt.tune._parallel`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pdopt._validation import check_int_at_least, check_one_of
from pdopt.errors import ConfigError
from pdopt.scenario import Scenario
from pdopt.tune._claims import counted, fail_running, optimize
from pdopt.tune._defaults import default_params, enqueue_defaults
from pdopt.tune._metrics import check_objective
from pdopt.tune._objective import P99_UNDER_CAPACITY_FLOOR, Objective
from pdopt.tune._parallel import run_parallel
from pdopt.tune._results import TuneResult, build_result
from pdopt.tune._scenario import FIDELITIES, check_tunable
from pdopt.tune._space import PHASOR_SPACE, SearchSpace
from pdopt.tune._storage import FIDELITY_ATTR, is_shared
from pdopt.tune._worker import TrialRunner, load_study

if TYPE_CHECKING:
    import optuna


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
    with_defaults: bool = True,
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
    with_defaults : bool
        Run the policy's default settings as the study's first trial (once per study) and
        never recommend settings worse than them (:mod:`pdopt.tune._defaults`).

    Raises
    ------
    ConfigError
        A target or constraint that names no metric of ``fidelity`` (with the closest names,
        :func:`pdopt.tune.metric_problem`), bad steps, or parallel workers without a URL.

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
    check_objective(objective, fidelity)
    runner = TrialRunner(scenario, space, objective, fidelity, fractions)
    parallel = n_workers > 1 or dask_scheduler is not None
    if parallel and not is_shared(storage):
        raise ConfigError(
            "parallel workers need a storage URL they can all open: sqlite:///FILE.db or "
            "journal:///FILE.log on one machine, postgresql://… across machines"
        )
    study = load_study(storage, study_name, objective, seed, fractions)
    _keep_one_fidelity(study, fidelity)
    if fail_stale:
        fail_running(study)
    why_no_defaults = ""
    if with_defaults:
        params, why_no_defaults = default_params(check_tunable(scenario), space)
        if params and counted(study) < n_trials:
            enqueue_defaults(study, params)
    if parallel:
        run_parallel(
            storage, study_name, runner, n_trials, seed, n_workers, dask_scheduler, progress
        )
    else:
        optimize(study, runner, n_trials, progress)
    return build_result(study, storage, scenario, objective, confirm_top, fidelity, why_no_defaults)


def _keep_one_fidelity(study: optuna.Study, fidelity: str) -> None:
    """Record the study's fidelity (:data:`pdopt.tune._storage.FIDELITY_ATTR`); a study whose
    trials ran at another one is not resumed at this one (its trials would not compare)."""
    ran = study.user_attrs.get(FIDELITY_ATTR)
    if ran is not None and ran != fidelity and counted(study) > 0:
        raise ConfigError(
            f"study {study.study_name!r} ran its trials at {ran} fidelity: resume it with "
            f"fidelity {ran!r} (--fidelity {ran}), or give a new --study-name for {fidelity}"
        )
    if ran != fidelity:
        study.set_user_attr(FIDELITY_ATTR, fidelity)
