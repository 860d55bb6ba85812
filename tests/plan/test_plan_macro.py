"""EcoServe macro-instance sizing: the instance model's closed forms, and the MILP against
enumeration of instances and macro instances per period."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import InfeasiblePlanError
from pdopt.model_spec import get_model
from pdopt.plan import Demand, instance_model, solve_macro_sizing

COST = CostModel(PrefillModel(0.0, 2e9, 1e14, 1.0, 2e-3), DecodeModel(0.01, 1e-4, 1e-7))
DEMAND = Demand(1.0, np.full(8, 512.0), np.full(8, 128.0), 1.0, 0.1)


def test_instance_rate_meets_tpot_with_equality_when_tpot_binds() -> None:
    inst = instance_model(COST, DEMAND, kv_capacity_tokens=1e9, overhead_share=0.05)
    assert inst.limited_by == "tpot"
    # At mu, the stretched iteration time equals the TPOT SLO: d0/(1 − f − h − slope·mu·(ō−1)).
    work_s = 512 * 2e9 / 1e14
    slope = 1e-4 + 1e-7 * (512 + 64)
    f = inst.rate_per_s * work_s
    stretched = 0.01 / (1 - f - 0.05 - slope * inst.rate_per_s * 127)
    assert stretched == pytest.approx(0.1, rel=1e-9)
    assert inst.cycle_s == pytest.approx(2 * (2e-3 + 0.01) / 0.05)
    # N_l is the fewest staggered instances keeping C/N + f·C within the TTFT SLO.
    n = inst.n_lower
    assert inst.cycle_s / n + f * inst.cycle_s <= 1.0
    assert n == 1 or inst.cycle_s / (n - 1) + f * inst.cycle_s > 1.0
    assert inst.n_upper == 2 * n


def test_tighter_ttft_needs_larger_macro_instances() -> None:
    loose = instance_model(COST, DEMAND, kv_capacity_tokens=1e9)
    tight = instance_model(COST, DEMAND.with_slo(ttft_slo_s=0.2), kv_capacity_tokens=1e9)
    assert tight.n_lower > loose.n_lower


def brute(rates: list[float], mu: float, n_l: int, n_u: int) -> int:
    """Fewest instance-periods: per period the fewest n >= rate/mu that some M can hold."""
    total = 0
    for r in rates:
        n = math.ceil(r / mu - 1e-9)
        while n > 0 and not any(n_l * m <= n <= n_u * m for m in range(1, n + 1)):
            n += 1
        total += n
    return total


@pytest.mark.parametrize("ttft", [1.0, 0.3, 0.2])
def test_macro_milp_equals_enumeration(ttft: float) -> None:
    demand = DEMAND.with_slo(ttft_slo_s=ttft)
    rates = [0.0, 30.0, 170.0, 400.0, 90.0, 20.0]
    plan = solve_macro_sizing(COST, demand, rates, kv_capacity_tokens=1e9, tp=2)
    inst = plan.instance
    assert sum(plan.instances) == brute(rates, inst.rate_per_s, plan.n_lower, plan.n_upper)
    for n, m, r in zip(plan.instances, plan.macro_instances, rates, strict=True):
        assert n >= r / inst.rate_per_s - 1e-9
        assert plan.n_lower * m <= n <= plan.n_upper * m
    assert plan.gpus == tuple(2 * n for n in plan.instances)


def test_macro_infeasible_ttft_and_cap_explain_themselves() -> None:
    with pytest.raises(InfeasiblePlanError, match="binding: TTFT SLO"):
        instance_model(COST, DEMAND.with_slo(ttft_slo_s=0.01), kv_capacity_tokens=1e9)
    with pytest.raises(InfeasiblePlanError, match="binding: TPOT SLO"):
        instance_model(COST, DEMAND.with_slo(tpot_slo_s=0.005), kv_capacity_tokens=1e9)
    demand = DEMAND.with_slo(ttft_slo_s=0.2)
    with pytest.raises(InfeasiblePlanError, match="max_instances_per_macro"):
        instance_model(COST, demand, kv_capacity_tokens=1e9, max_instances_per_macro=1)


def test_kv_bound_counts_a_sliding_window() -> None:
    """gpt-oss-120b (18 of 36 layers keep a 128-token window): a request at its midpoint context
    512 + 128/2 = 576 holds (18·576 + 18·128)/36 = 352 tokens of every layer, so the KV-bound
    rate is K / 352 / ((ō − 1)·SLO); without the model K / 576 / ((ō − 1)·SLO)."""
    model = get_model("gpt-oss-120b")
    kv = 1000.0
    windowed = instance_model(COST, DEMAND, kv_capacity_tokens=kv, model=model)
    full = instance_model(COST, DEMAND, kv_capacity_tokens=kv)
    assert windowed.limited_by == full.limited_by == "kv"
    assert windowed.rate_per_s == pytest.approx(kv / 352 / (127 * 0.1), rel=1e-12)
    assert full.rate_per_s == pytest.approx(kv / 576 / (127 * 0.1), rel=1e-12)
    # a full-attention model is the same as no model, bit for bit
    dense = instance_model(COST, DEMAND, kv_capacity_tokens=kv, model=get_model("Llama-2-7B"))
    assert dense == full
    plan = solve_macro_sizing(COST, DEMAND, [0.5, 2.0], kv_capacity_tokens=kv, model=model)
    assert plan.instance == windowed
