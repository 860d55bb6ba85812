"""P/D sizing: the MILP optimum equals brute-force enumeration; capacities follow the queueing
model they linearise; infeasible demands explain themselves."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import InfeasiblePlanError
from pdopt.plan import (
    Demand,
    SizingInfeasibleError,
    WorkerCapacity,
    WorkerOption,
    build_pd_sizing,
    capacities_for,
    max_prefill_rate_per_worker,
    predict_plan,
    prefill_workers_needed,
    read_plan,
    set_limits,
    solve_highs,
    solve_pd_sizing,
    ttft_attainment,
    worker_capacity,
    worker_options,
)
from pdopt.queueing import allen_cunneen, predict_pd

COST = CostModel(PrefillModel(0.0, 2e9, 1e14, 1.0, 2e-3), DecodeModel(0.01, 1e-4, 1e-7))


def synthetic(gpu: str, tp: int, price: float, rates: list[float], decode: float) -> WorkerCapacity:
    """A capacity with a hand-made prefill grid 1..len(rates) and a decode rate per worker."""
    option = WorkerOption(gpu, tp, COST, 1e6, price)
    sizes = tuple(range(1, len(rates) + 1))
    return WorkerCapacity(option, sizes, tuple(rates), decode, 10.0, "tpot", 0.1, True)


def random_caps(seed: int, n_opts: int) -> list[WorkerCapacity]:
    rng = np.random.default_rng(seed)
    caps = []
    for k in range(n_opts):
        base = rng.uniform(1.0, 5.0)
        grid = np.maximum.accumulate(base * (1 + np.cumsum(rng.uniform(0, 0.15, 6))))
        gpu = ["G0", "G1"][k % 2]
        caps.append(synthetic(gpu, 1 + k % 2, rng.uniform(1, 8), list(grid), rng.uniform(1, 9)))
    return caps


def brute_min_cost(
    caps: list[WorkerCapacity], rate: float, peak: float, inventory: dict[str, int]
) -> float:
    """Cheapest (prefill, decode, mixed) counts by enumeration, same capacity model.

    Each count runs to the most ever useful alone: ceil(peak / per-worker rate)."""
    best = math.inf
    p_ranges = [range(math.ceil(peak / c.prefill_rate_per_worker[0]) + 1) for c in caps]
    d_ranges = [range(math.ceil(peak / c.decode_rate_per_worker) + 1) for c in caps]
    mixed_ranges = [range(4) if peak > rate else range(1)] * len(caps)
    for n_p in itertools.product(*p_ranges):
        p_cap = sum(c.prefill_capacity_rps(n) for c, n in zip(caps, n_p, strict=True))
        if p_cap < rate - 1e-9:
            continue
        for n_d in itertools.product(*d_ranges):
            d_cap = sum(c.decode_rate_per_worker * n for c, n in zip(caps, n_d, strict=True))
            if d_cap < rate - 1e-9:
                continue
            for n_m in itertools.product(*mixed_ranges):
                pairs = list(zip(caps, n_m, strict=True))
                p_peak = p_cap + sum(c.prefill_rate_per_worker[0] * m for c, m in pairs)
                d_peak = d_cap + sum(c.decode_rate_per_worker * m for c, m in pairs)
                if min(p_peak, d_peak) < peak - 1e-9:
                    continue
                used: dict[str, int] = {}
                cost = 0.0
                for c, a, b, m in zip(caps, n_p, n_d, n_m, strict=True):
                    used[c.option.gpu] = used.get(c.option.gpu, 0) + (a + b + m) * c.option.tp
                    cost += (a + b + m) * c.option.price_per_hour
                if all(used.get(g, 0) <= lim for g, lim in inventory.items()):
                    best = min(best, cost)
    return best


def milp_min_cost(
    caps: list[WorkerCapacity], rate: float, peak: float, inventory: dict[str, int]
) -> float:
    problem = build_pd_sizing(caps, peak_rate_per_s=peak, mixed=peak > rate)
    set_limits(problem, caps, rate_per_s=rate, peak_rate_per_s=peak, inventory=inventory)
    plan = read_plan(problem, caps, solve_highs(problem), "min_cost")
    return plan.cost_per_hour if plan.is_ok else math.inf


@pytest.mark.parametrize("seed", range(6))
def test_sizing_milp_equals_brute_force(seed: int) -> None:
    caps = random_caps(seed, 2)
    rate = float(np.random.default_rng(100 + seed).uniform(3.0, 12.0))
    inventory = {"G0": 9} if seed % 2 else {}
    expected = brute_min_cost(caps, rate, rate, inventory)
    assert math.isfinite(expected)
    assert milp_min_cost(caps, rate, rate, inventory) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_sizing_with_mixed_pool_equals_brute_force(seed: int) -> None:
    caps = random_caps(10 + seed, 2)
    rate = 5.0
    peak = 9.0
    expected = brute_min_cost(caps, rate, peak, {})
    assert milp_min_cost(caps, rate, peak, {}) == pytest.approx(expected, rel=1e-9)


def test_sizing_mixed_pool_pays_off_when_peaks_alternate() -> None:
    """Both peaks need 2 extra workers; one Mixed pool of 2 covers them at different times."""
    caps = [synthetic("G0", 1, 1.0, [1.0] * 8, 1.0)]
    problem = build_pd_sizing(caps, peak_rate_per_s=5.0, mixed=True)
    set_limits(problem, caps, rate_per_s=3.0, peak_rate_per_s=5.0)
    plan = read_plan(problem, caps, solve_highs(problem), "min_cost")
    assert (plan.workers("prefill"), plan.workers("decode"), plan.workers("mixed")) == (3, 3, 2)
    assert plan.cost_per_hour == pytest.approx(8.0)


def test_sizing_max_goodput_under_budget_equals_brute_force() -> None:
    caps = random_caps(3, 2)
    budget = 20.0
    best = 0.0
    most = [range(int(budget // c.option.price_per_hour) + 1) for c in caps]
    for counts in itertools.product(*most, *most):
        n_p, n_d = counts[:2], counts[2:]
        triples = zip(caps, n_p, n_d, strict=True)
        cost = sum((a + b) * c.option.price_per_hour for c, a, b in triples)
        if cost > budget:
            continue
        p_cap = sum(c.prefill_capacity_rps(n) for c, n in zip(caps, n_p, strict=True))
        d_cap = sum(c.decode_rate_per_worker * n for c, n in zip(caps, n_d, strict=True))
        best = max(best, min(p_cap, d_cap, 100.0))
    problem = build_pd_sizing(caps, peak_rate_per_s=100.0, objective="max_goodput")
    set_limits(problem, caps, rate_per_s=100.0, budget_per_hour=budget)
    plan = read_plan(problem, caps, solve_highs(problem), "max_goodput")
    assert plan.served_rate_per_s == pytest.approx(best, rel=1e-7)
    assert plan.cost_per_hour <= budget + 1e-9


def lognormal_demand(rate: float, ttft: float, tpot: float, scv: float = 1.0) -> Demand:
    rng = np.random.default_rng(0)
    inputs = np.round(rng.lognormal(6.5, 0.8, 1500)) + 1
    outputs = np.round(rng.lognormal(5.0, 0.8, 1500)) + 1
    return Demand(rate, inputs, outputs, ttft, tpot, arrival_scv=scv)


@pytest.mark.parametrize("scv", [1.0, 4.0])
def test_prefill_capacity_is_the_largest_rate_meeting_the_quantile(scv: float) -> None:
    demand = lognormal_demand(10.0, 0.8, 0.05, scv)
    service = COST.prefill.request_time_s(demand.input_tokens)
    pools = np.array([1.0, 3.0, 20.0])
    rates = max_prefill_rate_per_worker(service, pools, 0.8, 0.99, scv)
    at = ttft_attainment(service, rates * pools, pools, 0.8, scv)
    above = ttft_attainment(service, rates * pools * 1.001, pools, 0.8, scv)
    assert np.all(at >= 0.99) and np.all(above < 0.99)
    assert np.all(np.diff(rates) > 0)  # pooling raises the per-worker rate
    # The attainment is the one predict_pd reports for the same queue (Allen–Cunneen).
    if scv == 1.0:
        ones = np.ones_like(demand.input_tokens)  # prefill only: no decode stage to saturate
        pred = predict_pd(COST.prefill, COST.decode, demand.input_tokens, ones,
                          rates[1] * 3, 3, 1, ttft_slo_s=0.8, tpot_slo_s=10.0)  # fmt: skip
        assert pred.ttft_attainment == pytest.approx(float(at[1]), abs=1e-9)


def test_burstier_arrivals_need_more_prefill_workers() -> None:
    option = WorkerOption("A", 1, COST, 1e6, 1.0)
    calm = lognormal_demand(30.0, 0.6, 0.05, 1.0)
    bursty = lognormal_demand(30.0, 0.6, 0.05, 9.0)
    n_calm = prefill_workers_needed(worker_capacity(option, calm), 30.0, calm)
    n_bursty = prefill_workers_needed(worker_capacity(option, bursty), 30.0, bursty)
    assert n_bursty > n_calm
    # n is the fewest: n − 1 workers miss the quantile, n meet it.
    service = COST.prefill.request_time_s(bursty.input_tokens)
    for n, ok in ((n_bursty, True), (n_bursty - 1, False)):
        if n * (1 / service.mean()) <= 30.0:
            assert not ok
            continue
        att = ttft_attainment(service, np.array([30.0]), np.array([float(n)]), 0.6, 9.0)[0]
        assert (att >= 0.99) == ok


def test_sized_plan_meets_the_slo_in_its_own_model_and_is_minimal() -> None:
    demand = lognormal_demand(40.0, 0.5, 0.05)
    options = worker_options(["A100-80GB"], "Llama-3-8B", tps=[1])
    plan = solve_pd_sizing(demand, options)
    caps = capacities_for(options, demand)
    pred = predict_plan(plan, caps, demand)
    assert pred.stable and pred.ttft_attainment >= 0.99 and pred.tpot_s <= 0.05
    # One prefill worker fewer misses the TTFT quantile (allen_cunneen on the same samples).
    service = options[0].cost.prefill.request_time_s(demand.input_tokens)
    n = plan.workers("prefill")
    if n > 1:
        fewer = ttft_attainment(service, np.array([40.0]), np.array([n - 1.0]), 0.5, 1.0)[0]
        mean = float(service.mean())
        assert fewer < 0.99 or 40.0 * mean >= n - 1
        assert allen_cunneen(40.0, mean, n).utilization < 1


def test_heterogeneous_plan_uses_the_cheaper_type_per_stage() -> None:
    """Long prompts, short outputs: H100 is cheaper per prefill; A100 is cheaper per decode."""
    demand = Demand(30.0, np.full(64, 4000.0), np.full(64, 64.0), 1.0, 0.1)
    options = worker_options(["A100-80GB", "H100-SXM"], "Llama-3-8B", tps=[1])
    plan = solve_pd_sizing(demand, options)
    roles = {(c.gpu, c.role) for c in plan.counts}
    assert ("H100-SXM", "prefill") in roles and ("A100-80GB", "decode") in roles


def test_infeasible_inventory_names_the_binding_limit_and_the_closest_plan() -> None:
    demand = lognormal_demand(40.0, 0.5, 0.05)
    options = worker_options(["A100-80GB"], "Llama-3-8B", tps=[1])
    with pytest.raises(SizingInfeasibleError) as info:
        solve_pd_sizing(demand, options, inventory={"A100-80GB": 3})
    err = info.value
    assert isinstance(err, InfeasiblePlanError)
    assert err.binding == "inventory"
    assert "binding: GPU inventory" in str(err) and "A100-80GB=3" in str(err)
    assert err.closest is not None and err.closest.n_gpus <= 3
    assert 0 < err.closest.served_rate_per_s < 40.0
    assert f"{err.closest.served_rate_per_s:.4g} req/s" in str(err)


def test_infeasible_ttft_slo_reports_the_idle_time_and_a_relaxed_plan() -> None:
    demand = lognormal_demand(10.0, 0.01, 0.05)
    options = worker_options(["A100-80GB"], "Llama-3-8B", tps=[1])
    with pytest.raises(SizingInfeasibleError, match="binding: TTFT SLO") as info:
        solve_pd_sizing(demand, options)
    err = info.value
    service = options[0].cost.prefill.request_time_s(demand.input_tokens)
    assert err.closest_slo_s == pytest.approx(float(np.quantile(service, 0.99)) * 1.25)
    assert err.closest is not None and err.closest.served_rate_per_s == pytest.approx(10.0)


def test_infeasible_tpot_and_kv_name_their_constraint() -> None:
    options = worker_options(["A100-80GB"], "Llama-3-8B", tps=[1])
    with pytest.raises(SizingInfeasibleError, match="binding: TPOT SLO") as info:
        solve_pd_sizing(lognormal_demand(10.0, 1.0, 0.001), options)
    assert info.value.binding == "tpot_slo"
    huge = Demand(1.0, np.full(4, 3e6), np.full(4, 8.0), 1e4, 1.0)
    with pytest.raises(SizingInfeasibleError, match="binding: KV capacity") as info:
        solve_pd_sizing(huge, options)
    assert info.value.binding == "kv_capacity"


def test_build_returns_an_unsolved_parameterised_problem() -> None:
    caps = random_caps(0, 2)
    problem = build_pd_sizing(caps, peak_rate_per_s=10.0)
    assert problem.status is None
    assert {"rate_per_s", "inventory_gpus", "max_gpus"} <= set(problem.param_dict)
    # Sweeping the rate parameter re-solves without rebuilding.
    costs = []
    for rate in (2.0, 6.0, 10.0):
        set_limits(problem, caps, rate_per_s=rate)
        costs.append(read_plan(problem, caps, solve_highs(problem), "min_cost").cost_per_hour)
    assert costs == sorted(costs)
    for rate, cost in zip((2.0, 6.0, 10.0), costs, strict=True):
        assert cost == pytest.approx(brute_min_cost(caps, rate, rate, {}), rel=1e-9)
