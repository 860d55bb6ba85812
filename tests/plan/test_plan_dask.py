"""Plan verification draws and the colocated modes on Dask give the serial results (issue 38,
item 3)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from pdopt.cli import main
from pdopt.model_spec import get_model, kv_bytes_per_token
from pdopt.plan import demand_from_workload, solve_verified, worker_options
from pdopt.plan._modes import size_colocated
from pdopt.plan._verified import VerifiedPlan
from pdopt.workload import archetype_workload


def _setup() -> tuple[Any, ...]:
    spec = get_model("Llama-2-7B")
    draws = [archetype_workload("sharegpt", 6.0, n_requests=250, seed=s) for s in range(2)]
    demand = demand_from_workload(draws[0], ttft_slo_s=1.0, tpot_slo_s=0.1)
    options = worker_options(["A100-80GB"], spec, [1])
    kv_bytes = max(kv_bytes_per_token(spec, o.tp) for o in options)
    return demand, options, draws, kv_bytes


TIMINGS = ("sim_wall_s", "wall_s", "runtime_s")
"""Fields that measure this machine's time: the only ones that may differ."""


def _without_wall(value: Any) -> str:
    """A result's text with every timing set to 0 (text, so NaN equals NaN)."""

    def strip(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            fields = [f for f in dataclasses.fields(v) if f.init and f.name != "scenario"]
            changes = {
                f.name: 0.0 if f.name in TIMINGS else strip(getattr(v, f.name)) for f in fields
            }
            return dataclasses.replace(v, **changes)
        if isinstance(v, tuple | list):
            return type(v)(strip(x) for x in v)
        return v

    return repr(strip(value))


def _key(out: VerifiedPlan) -> Any:
    return _without_wall(out.iterations), out.stop, out.seeds, _without_wall(out.neighbours)


@pytest.mark.slow
def test_verification_draws_and_modes_on_a_local_cluster_match_serial() -> None:
    pytest.importorskip("distributed")
    from pdopt.parallel import open_runs

    demand, options, draws, kv_bytes = _setup()
    serial = solve_verified(demand, options, draws, kv_bytes, inventory={"A100-80GB": 8})
    ticks: list[int] = []
    with open_runs("local", n_workers=2) as runs:
        on_dask = solve_verified(demand, options, draws, kv_bytes, inventory={"A100-80GB": 8},
                                 dask=runs, progress=lambda: ticks.append(1))  # fmt: skip
        mode = size_colocated("colocated", "vllm", options[0], demand, draws, kv_bytes, start=2,
                              most=8, dask=runs)  # fmt: skip
    assert _key(on_dask) == _key(serial)
    assert on_dask.scenario.seed == serial.scenario.seed
    assert len(ticks) >= len(draws)  # every simulation counted
    alone = size_colocated("colocated", "vllm", options[0], demand, draws, kv_bytes, start=2,
                           most=8)  # fmt: skip
    assert _without_wall(mode) == _without_wall(alone)


V100 = str(Path(__file__).resolve().parents[2] / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv")
PLAN = ["plan", "--profile", V100, "--ttft-slo", "1.0", "--tpot-slo", "0.1",
        "--workload", "short_short", "--rate", "4", "--requests", "300",
        "--gpus", "V100-32GB=16", "--tp", "1", "--quiet"]  # fmt: skip


def test_plan_names_the_option_for_a_bad_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--dask", "node7"]) == 1
    err = capsys.readouterr().err
    assert "pdopt: error: --dask 'node7'" in err and "tcp://HOST:8786" in err


@pytest.mark.slow
def test_plan_with_compare_modes_on_a_local_cluster_matches_serial(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("distributed")

    def payload(*extra: str) -> dict[str, Any]:
        assert main([*PLAN, "--compare-modes", "--json", *extra]) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        return out

    serial, on_dask = payload(), payload("--dask")
    assert on_dask["verdict"] == serial["verdict"]
    same = {k for k in serial["recommendation"] if k != "runtime_s"}  # the MILP's own time
    assert {k: on_dask["recommendation"][k] for k in same} == {
        k: serial["recommendation"][k] for k in same
    }
    keys = ("mode", "gpus", "meets", "ttft_q_s", "tpot_q_s", "simulations", "draws_met")
    assert [{k: m[k] for k in keys} for m in on_dask["modes"]] == [
        {k: m[k] for k in keys} for m in serial["modes"]
    ]
