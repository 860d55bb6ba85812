"""pdopt.tune studies on a tiny scenario (fluid fidelity unless said): results, resume from
SQLite and journal files, multi-objective Pareto fronts, pruning, DES confirmation, plots and
the Table 5 sensitivity sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ConfigError
from pdopt.scenario import Scenario
from pdopt.tune import (
    LATENCY_CAPACITY_OVERHEAD,
    TABLE5_ROWS,
    FloatParam,
    Objective,
    SearchSpace,
    evaluate,
    plot_importances,
    plot_pareto_front,
    sensitivity_table,
    tune,
)
from pdopt.tune._results import pareto_mask
from pdopt.workload import archetype_workload

COST = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
SPACE = SearchSpace((FloatParam("theta_flow", 0.3, 0.95), FloatParam("cool_s", 0.2, 5.0)))
PNG = b"\x89PNG\r\n\x1a\n"


def tiny_scenario(rate_per_s: float = 20.0) -> Scenario:
    wl = archetype_workload("production_mix", rate_per_s, duration_s=60.0, seed=1)
    cluster = ClusterSpec.build(COST, 2, 4, 2, kv_capacity_blocks=4000, mixed_pool_role="decode")
    return Scenario(wl, cluster, "phasor", Slo(1.0, 0.1))


def test_single_objective_study_in_memory() -> None:
    res = tune(tiny_scenario(), SPACE, n_trials=6, seed=3)
    assert len(res.trials) == 6 and (res.trials["state"] == "COMPLETE").all()
    assert len(res.best) == 1
    feasible = res.trials[res.trials["feasible"]]
    assert res.best["value_e2e_p99_s"].iloc[0] == feasible["value_e2e_p99_s"].min()
    assert (feasible["slo_attainment"] >= 0.9).all()
    assert set(res.best_params) == {"theta_flow", "cool_s"}
    again = tune(tiny_scenario(), SPACE, n_trials=6, seed=3)
    np.testing.assert_array_equal(
        res.trials["value_e2e_p99_s"].to_numpy(), again.trials["value_e2e_p99_s"].to_numpy()
    )


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_study_resumes_from_a_file_storage(tmp_path: Path, kind: str) -> None:
    url = f"sqlite:///{tmp_path}/s.db" if kind == "sqlite" else f"journal:///{tmp_path}/s.log"
    first = tune(tiny_scenario(), SPACE, n_trials=3, storage=url, study_name="r")
    second = tune(tiny_scenario(), SPACE, n_trials=5, storage=url, study_name="r")
    assert len(second.trials) == 5
    np.testing.assert_array_equal(
        first.trials["value_e2e_p99_s"].to_numpy(),
        second.trials["value_e2e_p99_s"].to_numpy()[:3],
    )
    third = tune(tiny_scenario(), SPACE, n_trials=5, storage=url, study_name="r")
    assert len(third.trials) == 5  # already complete: nothing more runs
    with pytest.raises(ConfigError, match="directions"):
        tune(tiny_scenario(), SPACE, LATENCY_CAPACITY_OVERHEAD, n_trials=1, storage=url,
             study_name="r")  # fmt: skip


def test_multi_objective_pareto_front_is_non_dominated(tmp_path: Path) -> None:
    obj = Objective.parse(["min:e2e_p99_s", "max:goodput_rps"])
    res = tune(tiny_scenario(25.0), SPACE, obj, n_trials=8, seed=1)
    cols = ["value_e2e_p99_s", "value_goodput_rps"]
    done = res.trials[res.trials["state"] == "COMPLETE"]
    front = pareto_mask(done[cols].to_numpy(dtype=float), obj.directions)
    assert sorted(res.best["number"]) == sorted(done[front]["number"])
    path = plot_pareto_front(res, tmp_path / "p.png")
    assert path.read_bytes()[:8] == PNG
    assert plot_importances(res, tmp_path / "i.png").read_bytes()[:8] == PNG


def test_pruning_reports_partial_runs() -> None:
    res = tune(tiny_scenario(30.0), SPACE, n_trials=12, steps=(0.3, 1.0), seed=2)
    study_states = set(res.trials["state"])
    assert study_states <= {"COMPLETE", "PRUNED"}
    assert len(res.trials) == 12
    # a pruned trial stopped at the partial run: its metrics cover fewer requests
    full = res.trials[res.trials["state"] == "COMPLETE"]["requests"].max()
    pruned = res.trials[res.trials["state"] == "PRUNED"]
    assert (pruned["requests"] < 0.5 * full).all()


def test_des_confirmation_of_the_best() -> None:
    res = tune(tiny_scenario(), SPACE, n_trials=3, confirm_top=1)
    row = res.confirmed.iloc[0]
    assert row["number"] == res.best["number"].iloc[0]
    des = evaluate(tiny_scenario(), res.best_params, "des")
    assert row["des_e2e_p99_s"] == pytest.approx(des["e2e_p99_s"])
    # fluid and request level agree on this stable scenario within 25%
    assert row["fluid_e2e_p99_s"] == pytest.approx(row["des_e2e_p99_s"], rel=0.25)


def test_parallel_needs_a_shared_storage() -> None:
    with pytest.raises(ConfigError, match="storage URL"):
        tune(tiny_scenario(), SPACE, n_trials=2, n_workers=2)
    with pytest.raises(ConfigError, match="steps"):
        tune(tiny_scenario(), SPACE, n_trials=2, steps=(0.5,))


def test_sensitivity_table_layout_and_alpha_direction() -> None:
    static = tiny_scenario(30.0)
    static = static.replace(policy_flags={"mixed_pool": False})
    table = sensitivity_table(static, fidelity="fluid")
    assert list(table["parameter"]) == ["default"] + [r[0] for r in TABLE5_ROWS]
    assert list(table["setting"])[1:] == [r[1] for r in TABLE5_ROWS]
    assert (table.iloc[0][[c for c in table if c.endswith("_norm")]] == 1.0).all()
    ttft = dict(zip(table["setting"], table["ttft_p99_s_norm"], strict=True))
    # fixed pools: more attention work per prompt (α × 2) slows prefill, α × 0.5 speeds it up,
    # and θ_flow (no Mixed pool moves) changes nothing
    assert ttft["×2"] > 1.0 > ttft["×0.5"]
    assert ttft["0.50"] == ttft["0.80"] == 1.0


def test_optuna_storage_object_is_accepted() -> None:
    storage = optuna.storages.InMemoryStorage()
    tune(tiny_scenario(), SPACE, n_trials=2, storage=storage, study_name="o")
    assert len(optuna.load_study(study_name="o", storage=storage).trials) == 2
