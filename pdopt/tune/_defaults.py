"""The policy's default settings as a study's baseline: its first trial, and the floor of the
recommendation.

:func:`default_params` gives, for each searched parameter, the value a run of the scenario uses
when nothing is tuned: the scenario's own ``policy_flags``, else the policy's declared default
(its constructor's), with a default of None resolved as the run resolves it (Phasor's
:meth:`pdopt.policies.Phasor.settings`: Δt = the scenario's tick, T_cool = 20·Δt), and
``alpha_scale`` = 1. :func:`pdopt.tune.tune` enqueues them as a trial (user attribute
``defaults``) when its study has none yet, so the defaults are scored like any trial, at the
study's fidelity.

:func:`recommend` never recommends settings worse than the defaults on the (single) target:
when no feasible trial beats the defaults' value, or the DES confirmation of the best is no
better than the defaults' own, the recommendation is the defaults.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from pdopt.scenario import Scenario
from pdopt.tune._objective import Objective
from pdopt.tune._space import CategoricalParam, IntParam, SearchSpace

if TYPE_CHECKING:
    import optuna

DEFAULTS_ATTR = "defaults"
"""The user attribute marking the trial of the policy's default settings."""


def default_params(scenario: Scenario, space: SearchSpace) -> tuple[dict[str, Any], str]:
    """The default value of each parameter of ``space`` for ``scenario`` (module docstring),
    and ``""``; or ``{}`` and why there is no defaults trial (a default that is None after
    resolution, or one outside a categorical parameter's choices)."""
    from pdopt.policies import Phasor

    policy = scenario.make_policy()
    declared = {
        name: p.default
        for name, p in inspect.signature(type(policy)).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    resolved: dict[str, Any] = {}
    if isinstance(policy, Phasor):
        resolved = dataclasses.asdict(policy.settings(scenario.slo, scenario.tick_s))
    params: dict[str, Any] = {}
    for param in space.params:
        name = param.name
        value = _default(name, scenario, resolved, declared)
        if value is None:
            return {}, f"{name} has no default value to start from"
        if isinstance(param, CategoricalParam) and value not in param.choices:
            return {}, f"the default {name} = {value!r} is not among its choices"
        if isinstance(param, IntParam) and float(value).is_integer():
            value = int(value)
        params[name] = value
    return params, ""


def _default(
    name: str, scenario: Scenario, resolved: dict[str, Any], declared: dict[str, Any]
) -> Any:
    if name == "alpha_scale":
        return 1.0
    for source in (scenario.policy_flags, resolved, declared):
        if source.get(name) is not None:
            return source[name]
    return scenario.tick_s if name == "delta_t_s" else None


def enqueue_defaults(study: optuna.Study, params: dict[str, Any]) -> bool:
    """Queue the defaults trial unless the study already holds one; True when queued."""
    if any(t.user_attrs.get(DEFAULTS_ATTR) for t in study.get_trials(deepcopy=False)):
        return False
    study.enqueue_trial(params, user_attrs={DEFAULTS_ATTR: True})
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class Recommendation:
    """What :func:`recommend` decides: the recommended row(s) and why."""

    chosen: pd.DataFrame
    defaults: pd.DataFrame
    verdict: str
    note: str


def recommend(
    trials: pd.DataFrame,
    best: pd.DataFrame,
    confirmed: pd.DataFrame,
    objective: Objective,
    des_defaults: pd.Series | None,
    why_no_defaults: str = "",
) -> Recommendation:
    """The recommendation: ``best`` (``verdict`` ``"best"``), the defaults (``"defaults"``) when
    no trial beats them (``note`` says so), ``"pareto"`` with several targets, ``"none"`` when
    nothing is feasible. ``des_defaults``: the defaults' DES metrics when ``confirmed`` holds
    the DES re-run of the best (the confirmation decides then); ``why_no_defaults``: why the
    study has no defaults trial (:func:`default_params`), for the note."""
    defaults = trials[trials[DEFAULTS_ATTR]] if DEFAULTS_ATTR in trials else trials.head(0)
    if best.empty:
        return Recommendation(best, defaults, "none", "")
    if objective.is_multi:
        on_front = bool(best[DEFAULTS_ATTR].any())
        note = "the defaults are on the Pareto front" if on_front else ""
        return Recommendation(best, defaults, "pareto", note)
    target = objective.targets[0]
    if bool(best[DEFAULTS_ATTR].iloc[0]):
        note = f"no trial beats the defaults on {target.metric}: keep the defaults"
        return Recommendation(best, defaults, "defaults", note)
    if defaults.empty or not bool(defaults["feasible"].iloc[0]):
        why = (
            f"no defaults trial{': ' + why_no_defaults if why_no_defaults else ''}"
            if defaults.empty
            else "the defaults break the constraints"
        )
        return Recommendation(best, defaults, "best", why)
    if des_defaults is not None and len(confirmed):
        row = confirmed.iloc[0]
        mine = float(row[f"des_{target.metric}"])
        theirs = objective.values(des_defaults)[0]
        ok = all(v <= 0 for v in objective.violations(des_defaults))
        better = mine < theirs if target.direction == "minimize" else mine > theirs
        if ok and (not bool(row["des_feasible"]) or not better or math.isnan(mine)):
            note = (
                f"the DES confirmation of the best ({target.metric} {mine:.6g}) does not beat "
                f"the defaults' ({theirs:.6g}): keep the defaults"
            )
            return Recommendation(defaults, defaults, "defaults", note)
    return Recommendation(best, defaults, "best", "")
