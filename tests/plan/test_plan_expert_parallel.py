"""Expert parallelism as a planner option next to TP (issue 20): MoE models at TP >= 2 get an
``+ep`` candidate priced by the expert-parallel roofline; dense models and TP 1 do not."""

from __future__ import annotations

import json

import pytest

from pdopt.cli import main
from pdopt.errors import ParameterError
from pdopt.plan import WorkerOption, worker_options
from pdopt.plan._sizing import WorkerCount
from pdopt.profile import roofline_profile

MOE = "Qwen3-30B-A3B"


def test_moe_gets_an_expert_parallel_option_at_each_tp_of_two_or_more() -> None:
    both = worker_options(["H200"], MOE, (1, 2, 4), expert_parallel=(False, True))
    names = [o.name for o in both]
    assert names == ["H200/tp1", "H200/tp2", "H200/tp2+ep", "H200/tp4", "H200/tp4+ep"]
    only = [o.name for o in worker_options(["H200"], MOE, (1, 2, 4), expert_parallel=(True,))]
    # "on" replaces the tensor-parallel layout; TP 1 has nothing to spread experts over
    assert only == ["H200/tp1", "H200/tp2+ep", "H200/tp4+ep"]


def test_dense_models_have_no_expert_parallel_option() -> None:
    both = worker_options(["H200"], "Llama-3.1-8B", (1, 2), expert_parallel=(False, True))
    assert [o.name for o in both] == ["H200/tp1", "H200/tp2"]
    assert not any(o.expert_parallel for o in both)


def test_expert_parallel_option_keeps_kv_and_prices_the_all_to_all() -> None:
    tp, ep = worker_options(["H200"], MOE, (4,), expert_parallel=(False, True))
    assert ep.key == ("H200", 4, True) and tp.key == ("H200", 4, False)
    # the same weights per GPU either way, so the same KV cache
    assert ep.kv_capacity_tokens == tp.kv_capacity_tokens
    # Qwen3-30B-A3B routes 8 experts per token: over 4 GPUs the dispatch + combine move more
    # than the MLP all-reduce they replace, so the roofline prices the EP prefill higher, by
    # exactly what the two profiles' prefill rows differ by (the fit follows the rows)
    rows = {
        flag: roofline_profile("H200", MOE, 4, expert_parallel=flag)
        .rows.query("kind == 'prefill' and batch_size == 1 and input_tokens == 2048")["latency_s"]
        .iloc[0]
        for flag in (False, True)
    }
    assert rows[True] > rows[False]
    fitted = ep.cost.prefill.request_time_s(2048) - tp.cost.prefill.request_time_s(2048)
    assert float(fitted) == pytest.approx(rows[True] - rows[False], rel=0.1)


def test_expert_parallel_needs_two_gpus() -> None:
    option = worker_options(["H200"], MOE, (1,))[0]
    with pytest.raises(ParameterError, match="expert_parallel needs tp >= 2"):
        WorkerOption("H200", 1, option.cost, 1e5, 1.0, expert_parallel=True)


def test_worker_count_names_its_layout() -> None:
    count = WorkerCount("H200", 4, "decode", 2, expert_parallel=True)
    assert count.option_name == "H200/tp4+ep" and count.key == ("H200", 4, True)
    assert WorkerCount("H200", 4, "decode", 2).option_name == "H200/tp4"


def test_plan_cli_considers_and_reports_expert_parallel_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main([
        "plan", "--model", MOE, "--gpus", "L40S=16", "--tp", "2", "--workload", "sharegpt",
        "--rate", "2", "--requests", "300", "--ttft-slo", "3", "--tpot-slo", "0.1",
        "--expert-parallel", "on", "--no-sim", "--json",
    ])  # fmt: skip
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [o["option"] for o in payload["options"]] == ["L40S/tp2+ep"]
    assert all(o["expert_parallel"] and o["cost_model"] == "roofline prior"
               for o in payload["options"])  # fmt: skip
    counts = payload["milp"]["counts"]
    assert counts and all(c["expert_parallel"] for c in counts)
