"""One "without limits" answer for one demand, whatever inventory binds (issue 37, deliver 3):
the unconstrained optimum is solved on capacities computed without any limit."""

from __future__ import annotations

import re

import pytest

from pdopt.plan import SizingInfeasibleError, demand_from_workload, solve_pd_sizing, worker_options
from pdopt.plan._pd import unconstrained_plan
from pdopt.workload import archetype_workload


def test_the_same_demand_gives_one_without_limits_answer_whatever_the_inventory() -> None:
    wl = archetype_workload("sharegpt", 400.0, n_requests=500, seed=0)
    demand = demand_from_workload(wl, ttft_slo_s=0.3, tpot_slo_s=0.05)
    options = worker_options(["H100-SXM", "A100-80GB"], "Qwen2.5-7B", [1, 2])
    free = unconstrained_plan(options, demand)
    assert free is not None
    answers = set()
    # a capped prefill grid (1 H100) once made this 10 GPUs, and 9 with 6 H100s
    for inventory in ({"H100-SXM": 1, "A100-80GB": 1}, {"H100-SXM": 6, "A100-80GB": 1}):
        with pytest.raises(SizingInfeasibleError) as info:
            solve_pd_sizing(demand, options, inventory=inventory)
        assert info.value.binding == "inventory"
        unconstrained = info.value.unconstrained
        assert unconstrained is not None and unconstrained.n_gpus == free.n_gpus
        found = re.search(r"\(without limits [^)]*\)", str(info.value))
        assert found is not None
        answers.add(found.group(0))
    assert len(answers) == 1 and f"; {free.n_gpus} in all" in answers.pop()
