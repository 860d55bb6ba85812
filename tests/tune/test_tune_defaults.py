"""The policy's defaults as every study's first trial, and a recommendation never worse than
them: :func:`pdopt.tune.default_params`, the enqueued trial (once per study, never pruned), and
:func:`pdopt.tune._defaults.recommend` on hand-made trial tables (ties, a better trial, a DES
confirmation that does not beat the defaults, infeasible defaults, several targets)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.scenario import Scenario
from pdopt.tune import (
    PHASOR_SPACE,
    CategoricalParam,
    FloatParam,
    IntParam,
    Objective,
    SearchSpace,
    default_params,
    tune,
)
from pdopt.tune._defaults import recommend
from pdopt.workload import archetype_workload

COST = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
SPACE = SearchSpace((FloatParam("theta_flow", 0.3, 0.95), FloatParam("cool_s", 0.2, 5.0)))


def tiny_scenario(**changes: object) -> Scenario:
    wl = archetype_workload("production_mix", 20.0, duration_s=20.0, seed=1)
    cluster = ClusterSpec.build(COST, 2, 4, 2, kv_capacity_blocks=4000, mixed_pool_role="decode")
    return Scenario(wl, cluster, "phasor", Slo(1.0, 0.1)).replace(**changes)


def test_defaults_are_the_published_settings_and_the_scenario_tick() -> None:
    params, why = default_params(tiny_scenario(tick_s=0.02), PHASOR_SPACE)
    # Δt = the tick; T_cool = 20·Δt (Phasor.settings); thresholds as declared
    assert why == "" and params == {
        "theta_frag": 0.168, "theta_flow": 0.62, "delta_t_s": 0.02, "cool_s": 0.4,
    }  # fmt: skip


def test_the_scenarios_flags_are_its_defaults() -> None:
    sc = tiny_scenario(policy_flags={"theta_flow": 0.7, "delta_t_s": 0.1, "max_moves": 2})
    space = SearchSpace((*PHASOR_SPACE.params, IntParam("max_moves", 1, 8),
                         FloatParam("alpha_scale", 0.5, 2.0)))  # fmt: skip
    params, _ = default_params(sc, space)
    assert params["theta_flow"] == 0.7 and params["delta_t_s"] == 0.1
    assert params["cool_s"] == pytest.approx(2.0) and params["max_moves"] == 2
    assert params["alpha_scale"] == 1.0


def test_no_defaults_trial_when_a_default_is_not_a_choice() -> None:
    space = SearchSpace((CategoricalParam("decode_routing", ("phi_s",)),))
    params, why = default_params(tiny_scenario(), space)
    assert params == {} and "'free_kv' is not among its choices" in why
    res = tune(tiny_scenario(), space, n_trials=2)
    assert not res.trials["defaults"].any() and res.defaults.empty
    assert "no defaults trial" in res.note


def test_the_first_trial_runs_the_defaults_once_per_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    first = tune(tiny_scenario(), SPACE, n_trials=3, storage=url, study_name="d", steps=(0.5, 1))
    row = first.trials.iloc[0]
    assert bool(row["defaults"]) and row["state"] == "COMPLETE"
    assert (row["param_theta_flow"], row["param_cool_s"]) == (0.62, 1.0)
    assert first.trials["defaults"].sum() == 1 and len(first.defaults) == 1
    # resumed: no second defaults trial
    again = tune(tiny_scenario(), SPACE, n_trials=5, storage=url, study_name="d")
    assert len(again.trials) == 5 and again.trials["defaults"].sum() == 1
    assert (
        not tune(tiny_scenario(), SPACE, n_trials=2, with_defaults=False).trials["defaults"].any()
    )


def test_a_default_outside_the_range_is_run_as_it_is() -> None:
    space = SearchSpace((FloatParam("theta_flow", 0.7, 0.95),))
    res = tune(tiny_scenario(), space, n_trials=2)
    assert res.defaults["param_theta_flow"].iloc[0] == 0.62


def test_one_trial_recommends_the_defaults() -> None:
    res = tune(tiny_scenario(), SPACE, n_trials=1)
    assert res.recommendation == "defaults" and "no trial beats the defaults" in res.note
    assert res.best_params == {"theta_flow": 0.62, "cool_s": 1.0}
    assert res.best_scenario is not None and res.best_scenario.policy_flags["theta_flow"] == 0.62


# -- recommend() on hand-made tables ----------------------------------------------------------
MIN = Objective.parse(["min:e2e_p99_s"], ["slo_attainment>=0.9"])


def trials(values: list[float], feasible: list[bool]) -> pd.DataFrame:
    return pd.DataFrame({
        "number": range(len(values)),
        "value_e2e_p99_s": values,
        "param_x": [float(i) for i in range(len(values))],
        "feasible": feasible,
        "defaults": [i == 0 for i in range(len(values))],
    })  # fmt: skip


def best_of(frame: pd.DataFrame) -> pd.DataFrame:
    from pdopt.tune._results import best_frame

    return best_frame(frame, MIN)


def test_a_tie_recommends_the_defaults() -> None:
    frame = trials([2.0, 2.0, 3.0], [True] * 3)
    rec = recommend(frame, best_of(frame), pd.DataFrame(), MIN, None)
    assert rec.verdict == "defaults" and int(rec.chosen["number"].iloc[0]) == 0


def test_a_better_trial_is_recommended() -> None:
    frame = trials([2.0, 1.5, 3.0], [True] * 3)
    rec = recommend(frame, best_of(frame), pd.DataFrame(), MIN, None)
    assert rec.verdict == "best" and int(rec.chosen["number"].iloc[0]) == 1


def test_a_des_confirmation_no_better_than_the_defaults_recommends_them() -> None:
    frame = trials([2.0, 1.5], [True, True])
    confirmed = pd.DataFrame({"number": [1], "des_e2e_p99_s": [2.5], "des_feasible": [True]})
    des_defaults = pd.Series({"e2e_p99_s": 2.4, "slo_attainment": 0.95})
    rec = recommend(frame, best_of(frame), confirmed, MIN, des_defaults)
    assert rec.verdict == "defaults" and "does not beat the defaults" in rec.note
    assert int(rec.chosen["number"].iloc[0]) == 0
    # better at DES: the best stays
    rec = recommend(frame, best_of(frame), confirmed, MIN, des_defaults.replace(2.4, 2.6))
    assert rec.verdict == "best"


def test_infeasible_defaults_do_not_block_a_feasible_trial() -> None:
    frame = trials([1.0, 2.0], [False, True])
    rec = recommend(frame, best_of(frame), pd.DataFrame(), MIN, None)
    assert rec.verdict == "best" and "break the constraints" in rec.note


def test_several_targets_give_a_pareto_front_with_the_defaults_marked() -> None:
    res = tune(tiny_scenario(), SPACE, Objective.parse(["min:e2e_p99_s", "max:goodput_rps"]),
               n_trials=3)  # fmt: skip
    assert res.recommendation == "pareto" and len(res.defaults) == 1
    assert ("on the Pareto front" in res.note) == bool(res.best["defaults"].any())
