"""Optuna tuning of a policy's parameters against the fluid or request-level simulator
(:func:`choose_fidelity`: the request-level one wherever the study fits a time budget).

``tune(scenario, space, objective, n_trials=..., storage=...)`` runs or resumes a study and
returns a :class:`TuneResult` (trials, best or Pareto front beside the policy's defaults, DES
confirmations, importances); :func:`metric_names` lists what targets may name;
:func:`sensitivity_table` reproduces the Phasor paper's Table 5 layout; :func:`plot_pareto_front`
and :func:`plot_importances` write PNG figures. Optuna is imported only when a study runs.
"""

from pdopt.tune._defaults import default_params
from pdopt.tune._fidelity import DEFAULT_BUDGET_S, FidelityChoice, choose_fidelity
from pdopt.tune._metrics import check_objective, metric_names, metric_problem
from pdopt.tune._objective import (
    LATENCY_CAPACITY_OVERHEAD,
    P99_UNDER_CAPACITY_FLOOR,
    Constraint,
    Objective,
    Target,
    parse_constraint,
    parse_target,
)
from pdopt.tune._plots import plot_importances, plot_pareto_front
from pdopt.tune._results import TuneResult
from pdopt.tune._scenario import (
    FIDELITIES,
    FLUID_READS,
    check_tunable,
    evaluate,
    inert_params,
    scaled_alpha,
    trial_scenario,
)
from pdopt.tune._sensitivity import (
    SENSITIVITY_DEFAULTS,
    TABLE5_METRICS,
    TABLE5_ROWS,
    sensitivity_table,
)
from pdopt.tune._space import (
    PHASOR_DEFAULTS,
    PHASOR_SPACE,
    CategoricalParam,
    FloatParam,
    IntParam,
    SearchSpace,
    parse_param,
)
from pdopt.tune._storage import open_storage
from pdopt.tune._study import tune

__all__ = [
    "DEFAULT_BUDGET_S",
    "FIDELITIES",
    "FLUID_READS",
    "LATENCY_CAPACITY_OVERHEAD",
    "P99_UNDER_CAPACITY_FLOOR",
    "PHASOR_DEFAULTS",
    "PHASOR_SPACE",
    "SENSITIVITY_DEFAULTS",
    "TABLE5_METRICS",
    "TABLE5_ROWS",
    "CategoricalParam",
    "Constraint",
    "FidelityChoice",
    "FloatParam",
    "IntParam",
    "Objective",
    "SearchSpace",
    "Target",
    "TuneResult",
    "check_objective",
    "check_tunable",
    "choose_fidelity",
    "default_params",
    "evaluate",
    "inert_params",
    "metric_names",
    "metric_problem",
    "open_storage",
    "parse_constraint",
    "parse_param",
    "parse_target",
    "plot_importances",
    "plot_pareto_front",
    "scaled_alpha",
    "sensitivity_table",
    "trial_scenario",
    "tune",
]
