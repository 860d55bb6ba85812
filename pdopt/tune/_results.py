"""A study's results as plain tables: every trial, the best (or the Pareto front), DES
confirmations and parameter importances."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from pdopt.scenario import Scenario
from pdopt.tune._defaults import DEFAULTS_ATTR, recommend
from pdopt.tune._objective import Objective
from pdopt.tune._scenario import evaluate, inert_params, trial_scenario

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, slots=True)
class TuneResult:
    """What :func:`pdopt.tune.tune` returns.

    Attributes
    ----------
    study_name, storage : str
        Where the study lives (``storage`` is ``"memory"`` for an in-memory study).
    targets : tuple of str
        ``"minimize:metric"`` / ``"maximize:metric"`` per objective.
    trials : DataFrame
        One row per trial: number, state, ``value_<metric>`` per target, ``param_<name>``,
        the run's metrics (``<metric>``), ``feasible`` (constraints met), ``duration_s`` and
        ``worker`` (``host:pid`` of the process that ran it; empty for a trial that never ran).
    best : DataFrame
        Single objective: the best feasible trial (one row). Multi-objective: the feasible
        Pareto front. Same columns as ``trials``.
    confirmed : DataFrame
        Discrete-event re-runs of ``best`` (``confirm_top``): trial number, parameters, and the
        fluid and DES values of each target (``fluid_<metric>``, ``des_<metric>``).
    importances : dict
        fANOVA importance of each parameter for the first target (empty with < 4 trials).
    inert : tuple of str
        Parameters the trials' fidelity cannot see (:func:`pdopt.tune.inert_params`: e.g.
        ``theta_frag`` under the fluid model, which has no fragmentation). They are sampled, so
        ``best_params`` holds a value for each, but change no screening result and are left out
        of ``importances``; only the DES confirmation runs them.
    best_scenario : Scenario or None
        The scenario the recommended parameters (``best_params``) run as a DES confirmation
        (:func:`pdopt.tune.trial_scenario`: its parameters as policy flags, and the engine tick
        ``tick_s`` = ``delta_t_s`` when tuned); ``best_scenario.run()`` reproduces its
        ``confirmed`` values. None when nothing is feasible.
    defaults : DataFrame
        The trial of the policy's default settings (one row, columns of ``trials``; the study's
        first trial, :mod:`pdopt.tune._defaults`), with ``des_<metric>`` per target when the
        best was confirmed at DES; empty when the study has none.
    recommendation : str
        ``"best"``, ``"defaults"`` (no trial beats them on the target, at the study's fidelity
        or in the DES confirmation: ``best_params`` and ``best_scenario`` are then the
        defaults'), ``"pareto"`` (several targets) or ``"none"`` (nothing feasible).
    note : str
        Why, in words, when the defaults are recommended (or cannot be compared).
    """

    study_name: str
    storage: str
    targets: tuple[str, ...]
    trials: pd.DataFrame
    best: pd.DataFrame
    confirmed: pd.DataFrame
    importances: dict[str, float] = field(default_factory=dict)
    best_scenario: Scenario | None = None
    inert: tuple[str, ...] = ()
    defaults: pd.DataFrame = field(default_factory=pd.DataFrame)
    recommendation: str = "best"
    note: str = ""

    @property
    def best_params(self) -> dict[str, Any]:
        """The recommended parameters: those of the defaults when ``recommendation`` is
        ``"defaults"``, else of the first row of ``best`` (empty when nothing is feasible)."""
        rows = self.defaults if self.recommendation == "defaults" else self.best
        if rows.empty:
            return {}
        row = rows.iloc[0]
        return {c.removeprefix("param_"): row[c] for c in _param_columns(rows)}


def trials_frame(study: optuna.Study, objective: Objective) -> pd.DataFrame:
    """Every trial as a row (see :class:`TuneResult`)."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"number": t.number, "state": t.state.name}
        values = t.values or [math.nan] * len(objective.targets)
        for target, v in zip(objective.targets, values, strict=True):
            row[f"value_{target.metric}"] = v
        row.update({f"param_{k}": v for k, v in t.params.items()})
        row.update(t.user_attrs.get("metrics", {}))
        violations = t.user_attrs.get("violations", [])
        row["feasible"] = t.state.name == "COMPLETE" and all(v <= 0 for v in violations)
        done = t.duration.total_seconds() if t.duration is not None else math.nan
        row["duration_s"] = done
        row["worker"] = str(t.user_attrs.get("worker", ""))
        row[DEFAULTS_ATTR] = bool(t.user_attrs.get(DEFAULTS_ATTR, False))
        rows.append(row)
    return pd.DataFrame(rows)


def pareto_mask(values: np.ndarray, directions: list[str]) -> np.ndarray:
    """Rows of ``values`` (n × k) not dominated by another row (minimising after sign flips)."""
    signs = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    v = values * signs
    keep = np.ones(len(v), dtype=bool)
    for i in range(len(v)):
        no_worse = np.all(v <= v[i], axis=1)
        better = np.any(v < v[i], axis=1)
        keep[i] = not np.any(no_worse & better)
    return keep


def best_frame(trials: pd.DataFrame, objective: Objective) -> pd.DataFrame:
    """The best feasible trial (single) or the feasible Pareto front (multi)."""
    if trials.empty:
        return trials
    ok = trials[trials["feasible"]]
    cols = [f"value_{t.metric}" for t in objective.targets]
    ok = ok[np.all(np.isfinite(ok[cols].to_numpy(dtype=float)), axis=1)]
    if ok.empty:
        return ok
    if not objective.is_multi:
        # on a tie the defaults win: a trial is recommended only when it beats them
        ascending = objective.targets[0].direction == "minimize"
        order = ok.assign(_later=~ok[DEFAULTS_ATTR]) if DEFAULTS_ATTR in ok else ok
        keys = [cols[0], "_later"] if DEFAULTS_ATTR in ok else [cols[0]]
        first = order.sort_values(keys, ascending=[ascending, True][: len(keys)], kind="stable")
        return ok.loc[first.index[:1]]
    front = ok[pareto_mask(ok[cols].to_numpy(dtype=float), objective.directions)]
    return front.sort_values(cols[0], kind="stable")


def confirm(best: pd.DataFrame, scenario: Scenario, objective: Objective, top: int) -> pd.DataFrame:
    """Re-run the first ``top`` rows of ``best`` with the discrete-event simulator."""
    rows = []
    for _, row in best.head(top).iterrows():
        params = _row_params(row, best)
        metrics = evaluate(scenario, params, "des")
        out: dict[str, Any] = {"number": int(row["number"]), **params}
        for t, v in zip(objective.targets, objective.values(metrics), strict=True):
            out[f"fluid_{t.metric}"] = row[f"value_{t.metric}"]
            out[f"des_{t.metric}"] = v
        out["des_feasible"] = all(x <= 0 for x in objective.violations(metrics))
        rows.append(out)
    return pd.DataFrame(rows)


def _row_params(row: pd.Series, frame: pd.DataFrame) -> dict[str, Any]:
    """A trial row's parameters (a NaN cell: a parameter that trial did not draw)."""
    params = {c.removeprefix("param_"): row[c] for c in _param_columns(frame)}
    return {k: v for k, v in params.items() if not _is_nan(v)}


def _param_columns(frame: pd.DataFrame) -> list[str]:
    return [str(c) for c in frame.columns if str(c).startswith("param_")]


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def importances(study: optuna.Study, inert: tuple[str, ...] = ()) -> dict[str, float]:
    """fANOVA importances for the first target of the parameters not ``inert`` (empty when too
    few complete trials)."""
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    finite = [t for t in done if t.values and all(math.isfinite(v) for v in t.values)]
    if len(finite) < 4:
        return {}
    seen = sorted({name for t in finite for name in t.params if name not in inert})
    if not seen:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = optuna.importance.get_param_importances(
                study, target=lambda t: t.values[0], params=seen, normalize=True
            )
    except (RuntimeError, ValueError):
        return {}
    return {k: float(v) for k, v in out.items()}


def build_result(
    study: optuna.Study,
    storage: object,
    scenario: Scenario,
    objective: Objective,
    confirm_top: int,
    fidelity: str = "des",
    why_no_defaults: str = "",
) -> TuneResult:
    """Collect the study into a :class:`TuneResult` (running the DES confirmations, of the
    defaults too when the best is not them); the parameters ``fidelity`` cannot see are marked
    inert; the recommendation is never worse than the defaults (:func:`recommend`)."""
    trials = trials_frame(study, objective)
    best = best_frame(trials, objective)
    confirmed = confirm(best, scenario, objective, confirm_top) if confirm_top else pd.DataFrame()
    des_defaults = _confirm_defaults(trials, best, confirmed, scenario, objective, fidelity)
    rec = recommend(trials, best, confirmed, objective, des_defaults, why_no_defaults)
    defaults = rec.defaults
    if des_defaults is not None:
        values = objective.values(des_defaults)
        defaults = defaults.assign(
            **{f"des_{t.metric}": v for t, v in zip(objective.targets, values, strict=True)}
        )
    label = storage if isinstance(storage, str) else "memory"
    targets = tuple(f"{t.direction}:{t.metric}" for t in objective.targets)
    chosen = rec.chosen
    best_scenario = (
        None if chosen.empty else trial_scenario(scenario, _row_params(chosen.iloc[0], chosen))
    )
    names = tuple(c.removeprefix("param_") for c in _param_columns(trials))
    inert = inert_params(names, scenario.policy_name, fidelity)
    return TuneResult(
        study.study_name, label, targets, trials, best, confirmed, importances(study, inert),
        best_scenario, inert, defaults, rec.verdict, rec.note,
    )  # fmt: skip


def _confirm_defaults(
    trials: pd.DataFrame,
    best: pd.DataFrame,
    confirmed: pd.DataFrame,
    scenario: Scenario,
    objective: Objective,
    fidelity: str,
) -> pd.Series | None:
    """The defaults' DES metrics when the (single-target) best was confirmed at DES and is not
    the defaults' trial: their trial's own at DES fidelity, else one DES run."""
    if objective.is_multi or confirmed.empty or best.empty or DEFAULTS_ATTR not in trials:
        return None
    defaults = trials[trials[DEFAULTS_ATTR] & trials["feasible"]]
    if defaults.empty or bool(best[DEFAULTS_ATTR].iloc[0]):
        return None
    if fidelity == "des":
        return defaults.iloc[0]
    return evaluate(scenario, _row_params(defaults.iloc[0], defaults), "des")
