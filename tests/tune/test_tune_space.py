"""Search space, objective and Pareto helpers of pdopt.tune (pure, no study)."""

from __future__ import annotations

import numpy as np
import optuna
import pandas as pd
import pytest

from pdopt.errors import ConfigError, ParameterError
from pdopt.tune import (
    PHASOR_SPACE,
    CategoricalParam,
    FloatParam,
    IntParam,
    Objective,
    SearchSpace,
    parse_constraint,
    parse_param,
    parse_target,
)
from pdopt.tune._results import pareto_mask


def test_parse_param_forms() -> None:
    assert parse_param("theta_flow=0.3:0.95") == FloatParam("theta_flow", 0.3, 0.95)
    assert parse_param("delta_t_s=0.01:0.5:log") == FloatParam("delta_t_s", 0.01, 0.5, log=True)
    assert parse_param("max_moves=1:8:int") == IntParam("max_moves", 1, 8)
    assert parse_param("r=free_kv|phi_s") == CategoricalParam("r", ("free_kv", "phi_s"))
    assert parse_param("flag=true|false").choices == (True, False)


@pytest.mark.parametrize(
    "text", ["theta", "theta=", "a=1", "a=1:2:cube", "a=x:y", "a=2:1", "a=0:1:log", "1a=0:1"]
)
def test_bad_param_text_raises(text: str) -> None:
    with pytest.raises((ConfigError, ParameterError)):
        parse_param(text)


def test_space_rejects_duplicates_and_empty() -> None:
    with pytest.raises(ConfigError, match="repeat"):
        SearchSpace((FloatParam("a", 0, 1), FloatParam("a", 1, 2)))
    with pytest.raises(ConfigError):
        SearchSpace(())


def test_suggest_stays_in_range() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(30):
        trial = study.ask()
        values = PHASOR_SPACE.suggest(trial)
        for p in PHASOR_SPACE.params:
            assert isinstance(p, FloatParam)
            assert p.low <= values[p.name] <= p.high
        study.tell(trial, 0.0)


def test_objective_parsing_values_and_violations() -> None:
    obj = Objective.parse(["min:e2e_p99_s", "max:goodput_rps"], ["slo_attainment>=0.9"])
    assert obj.directions == ["minimize", "maximize"] and obj.is_multi
    m = pd.Series({"e2e_p99_s": 3.0, "goodput_rps": float("nan"), "slo_attainment": 0.85})
    assert obj.values(m) == [3.0, -np.inf]
    assert obj.violations(m) == [pytest.approx(0.05)]
    assert parse_constraint("ttft_p99_s <= 2").violation(pd.Series({"ttft_p99_s": 1.0})) == 0.0
    assert parse_constraint("x>=1").violation(pd.Series(dtype=float)) == np.inf
    assert parse_target("max:goodput_rps").direction == "maximize"
    for bad in ("e2e", "best:e2e", "min:"):
        with pytest.raises(ConfigError):
            parse_target(bad)
    with pytest.raises(ConfigError):
        parse_constraint("x > 1")


def test_pareto_mask_equals_brute_force() -> None:
    rng = np.random.default_rng(4)
    values = rng.integers(0, 6, size=(40, 3)).astype(float)
    directions = ["minimize", "maximize", "minimize"]
    signs = np.array([1, -1, 1])
    expected = []
    for i in range(40):
        a = values[i] * signs
        dominated = any(
            np.all(values[j] * signs <= a) and np.any(values[j] * signs < a) for j in range(40)
        )
        expected.append(not dominated)
    np.testing.assert_array_equal(pareto_mask(values, directions), expected)
