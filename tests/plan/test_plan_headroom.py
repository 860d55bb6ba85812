"""Headroom of a verified plan (issue 37, deliver 2): the largest load factor at which it still
meets, by a crossing that the plan's own checks confirm on both sides."""

from __future__ import annotations

from pdopt.cluster import Slo
from pdopt.model_spec import get_model, kv_bytes_per_token
from pdopt.plan import capacities_for, demand_from_workload, solve_verified, worker_options
from pdopt.plan._headroom import plan_headroom
from pdopt.plan._verify import check_plan
from pdopt.workload import archetype_workload


def test_the_crossing_meets_below_and_misses_above() -> None:
    draws = [archetype_workload("sharegpt", 40.0, n_requests=400, seed=0)]
    demand = demand_from_workload(draws[0], ttft_slo_s=0.5, tpot_slo_s=0.03, rate_per_s=40.0,
                                  arrival_cv=1.0)  # fmt: skip
    options = worker_options(["H100-SXM"], "Qwen2.5-7B", [1])
    kv = kv_bytes_per_token(get_model("Qwen2.5-7B"))
    out = solve_verified(demand, options, draws, kv)
    assert out.meets
    caps = capacities_for(options, demand)
    found = plan_headroom(out.final.plan, caps, demand, draws, kv, tolerance=0.1)
    assert found.met >= 1.0 and found.simulations >= 2
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)

    def meets(factor: float) -> bool:
        check = check_plan(out.final.plan, caps, demand, draws[0].scale_rate(factor), kv)
        return check.meets(slo)

    assert meets(found.met)
    if found.missed is not None:
        assert found.missed > found.met and not meets(found.missed)
        assert found.missed / found.met <= 1.1 + 1e-9
