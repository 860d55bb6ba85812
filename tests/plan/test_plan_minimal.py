"""Minimal verified plans (issue 37, deliver 2): after the loop meets, the smaller neighbours
(one worker fewer in one count) are tried and the cheapest that meets is kept, so a plan one
worker smaller that also meets is never left unreported."""

from __future__ import annotations

import pytest

from pdopt.cluster import Slo
from pdopt.model_spec import get_model, kv_bytes_per_token
from pdopt.plan import (
    Demand,
    WorkerOption,
    capacities_for,
    demand_from_workload,
    solve_verified,
    worker_options,
)
from pdopt.plan._minimal import smaller_neighbours, with_counts
from pdopt.plan._verify import check_plan
from pdopt.workload import Workload, archetype_workload

MODEL = "Qwen2.5-7B"
Setup = tuple[Demand, list[WorkerOption], list[Workload], float]


@pytest.fixture(scope="module")
def setup() -> Setup:
    # the MILP's first plan here (2 P + 2 D) is twice what the simulation needs
    draws = [archetype_workload("sharegpt", 100.0, n_requests=600, seed=s) for s in range(2)]
    demand = demand_from_workload(draws[0], ttft_slo_s=0.5, tpot_slo_s=0.03, rate_per_s=100.0,
                                  arrival_cv=1.0)  # fmt: skip
    options = list(worker_options(["H100-SXM"], MODEL, [1]))
    return demand, options, draws, kv_bytes_per_token(get_model(MODEL))


def test_no_smaller_neighbour_of_the_plan_meets(setup: Setup) -> None:
    demand, options, draws, kv = setup
    out = solve_verified(demand, options, draws, kv)
    assert out.meets
    first, final = out.iterations[0], out.final
    assert final.step == "trim" and final.plan.cost_per_hour < first.plan.cost_per_hour
    caps = capacities_for(options, demand)
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)
    reported = {tuple(n.plan.counts): n.meets for n in out.neighbours}
    for neighbour, _ in smaller_neighbours(final.plan, caps):
        # checked independently of the search, on every draw
        meets = all(
            check_plan(neighbour, caps, demand, d, kv, seed=i).meets(slo)
            for i, d in enumerate(draws)
        )
        assert not meets, neighbour.describe()
        assert reported[tuple(neighbour.counts)] is False


def test_with_counts_prices_a_plan_as_the_milp_does(setup: Setup) -> None:
    from pdopt.plan import solve_pd_sizing

    demand, options, _, _ = setup
    plan = solve_pd_sizing(demand, options)
    caps = capacities_for(options, demand)
    again = with_counts(plan, plan.counts, caps)
    assert again.n_gpus == plan.n_gpus and again.cost_per_hour == pytest.approx(plan.cost_per_hour)
    assert again.prefill_capacity_rps == pytest.approx(plan.prefill_capacity_rps)
    assert again.decode_capacity_rps == pytest.approx(plan.decode_capacity_rps)
    for neighbour, removed in smaller_neighbours(plan, caps):
        assert neighbour.n_gpus == plan.n_gpus - 1 and removed.startswith("1 × ")
        assert neighbour.workers("prefill") >= 1 and neighbour.workers("decode") >= 1
