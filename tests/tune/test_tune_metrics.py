"""Targets and constraints must name a metric the trials' simulator reports:
:func:`pdopt.tune.metric_names` read from the simulators themselves, ``tune`` refusing
``min:e2e_p98_s`` with the closest names, and the fluid fidelity pointing at DES for the
metrics only the request-level simulator has."""

from __future__ import annotations

import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ConfigError
from pdopt.scenario import Scenario
from pdopt.tune import (
    PHASOR_SPACE,
    Objective,
    check_objective,
    evaluate,
    metric_names,
    metric_problem,
    tune,
)
from pdopt.workload import archetype_workload

COST = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))


def tiny_scenario() -> Scenario:
    wl = archetype_workload("production_mix", 10.0, duration_s=5.0, seed=1)
    cluster = ClusterSpec.build(COST, 1, 2, 1, mixed_pool_role="decode")
    return Scenario(wl, cluster, "phasor", Slo(1.0, 0.1))


@pytest.mark.parametrize("fidelity", ["des", "fluid"])
def test_metric_names_are_what_a_trial_reports(fidelity: str) -> None:
    reported = evaluate(tiny_scenario(), {}, fidelity)
    assert set(metric_names(fidelity)) == set(reported.index)


def test_fluid_metrics_are_mostly_des_metrics() -> None:
    fluid, des = set(metric_names("fluid")), set(metric_names("des"))
    assert {"e2e_p99_s", "slo_attainment", "goodput_rps", "migrations"} <= fluid & des
    assert "kv_fits_nowhere" in des - fluid


def test_problems_name_the_closest_metrics() -> None:
    assert metric_problem("e2e_p99_s") is None
    problem = metric_problem("e2e_p98_s")
    assert problem is not None and "'e2e_p98_s'" in problem and "closest: e2e_p99_s" in problem
    assert "metric_names()" in str(metric_problem("zzzz"))
    assert "only the des fidelity" in str(metric_problem("kv_fits_nowhere", "fluid"))


@pytest.mark.parametrize(
    ("targets", "constraints", "bad"),
    [
        (["min:e2e_p98_s"], [], "target 'e2e_p98_s'"),
        (["min:e2e_p99_s"], ["slo_atainment>=0.9"], "constraint 'slo_atainment'"),
    ],
)
def test_tune_refuses_an_unknown_metric_before_any_trial(
    targets: list[str], constraints: list[str], bad: str
) -> None:
    objective = Objective.parse(targets, constraints)
    with pytest.raises(ConfigError, match=bad):
        tune(tiny_scenario(), PHASOR_SPACE, objective, n_trials=1)
    with pytest.raises(ConfigError, match="closest"):
        check_objective(objective, "des")
