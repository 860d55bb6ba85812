"""Limits on the GPU types of one deployment (issue 37, deliver 2): ``--max-gpu-types`` and
``--one-type-per-role``, met by enumerating the allowed type assignments."""

from __future__ import annotations

import json

import pytest

from pdopt.cli import main
from pdopt.plan import capacities_for, demand_from_workload, worker_options
from pdopt.plan._types import restrict_roles, type_choices
from pdopt.workload import archetype_workload

# unconstrained, the cheapest plan here is H100 prefill + A100 decode (2 types)
MIXED = ["plan", "--model", "Qwen2.5-7B", "--gpus", "H100-SXM=inf,A100-80GB=inf", "--prices",
         "H100-SXM=4,A100-80GB=1.5", "--workload", "sharegpt", "--rate", "60", "--requests",
         "500", "--ttft-slo", "0.3", "--tpot-slo", "0.02", "--no-sim", "--json"]  # fmt: skip


def _types(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, set[str]]:
    assert main([*MIXED, *extra]) == 0
    payload = json.loads(capsys.readouterr().out)
    out: dict[str, set[str]] = {}
    for c in payload["recommendation"]["counts"]:
        out.setdefault(c["role"], set()).add(c["gpu"])
    return out


def test_the_limits_hold_and_cost_what_they_cost(capsys: pytest.CaptureFixture[str]) -> None:
    free = _types(capsys)
    assert free["prefill"] | free["decode"] == {"H100-SXM", "A100-80GB"}
    one = _types(capsys, "--max-gpu-types", "1")
    assert len(one["prefill"] | one["decode"]) == 1
    per_role = _types(capsys, "--one-type-per-role")
    assert len(per_role["prefill"]) == 1 and len(per_role["decode"]) == 1


def test_type_choices_enumerate_the_allowed_assignments() -> None:
    types = ["A", "B", "C"]
    assert len(type_choices(types, 1, False)) == 3
    assert len(type_choices(types, 2, False)) == 3 + 3
    assert len(type_choices(types, None, True)) == 9
    assert all(c["prefill"] == c["decode"] for c in type_choices(types, 1, True))


def test_restrict_roles_removes_capacity_outside_a_roles_types() -> None:
    wl = archetype_workload("sharegpt", 5.0, n_requests=100, seed=0)
    demand = demand_from_workload(wl, ttft_slo_s=1.0, tpot_slo_s=0.1)
    caps = capacities_for(worker_options(["H100-SXM", "A100-80GB"], "Qwen2.5-7B", [1]), demand)
    out = restrict_roles(caps, {"prefill": {"H100-SXM"}, "decode": {"A100-80GB"}})
    for c in out:
        if c.option.gpu == "H100-SXM":
            assert c.decode_rate_per_worker == 0 and max(c.prefill_rate_per_worker) > 0
        else:
            assert max(c.prefill_rate_per_worker) == 0 and c.decode_rate_per_worker > 0
