"""Expert parallelism places whole experts on the ``tp`` GPUs (``moe_ep_size = tp``): refused for
a dense model and where ``tp`` does not divide the experts (more GPUs than experts included),
in the library (``roofline_profile``, ``worker_options``) and on the command line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.errors import ParameterError
from pdopt.hardware import get_gpu
from pdopt.model_spec import ModelSpec
from pdopt.plan import worker_options
from pdopt.profile import roofline_profile

# 6 experts: on 4 GPUs an uneven split the per-GPU weights (num_experts / tp) do not model.
SIX_EXPERTS = ModelSpec(
    "moe6", 2, 768, 12, 12, 1024, 1000, num_experts=6, experts_per_token=2,
    moe_intermediate_size=256,
)  # fmt: skip


def test_roofline_refuses_a_tp_that_does_not_divide_the_experts() -> None:
    # Mixtral-8x7B: 8 experts; TP 16 (on a board whose node holds 16) would leave 8 GPUs
    # without one.
    wide = dataclasses.replace(get_gpu("H100-SXM"), gpus_per_node=16)
    with pytest.raises(ParameterError, match="divisor of num_experts=8"):
        roofline_profile(wide, "Mixtral-8x7B", 16, expert_parallel=True)
    # 6 experts on 4 GPUs: an uneven split the per-GPU weights (num_experts / tp) do not model.
    with pytest.raises(ParameterError, match="divisor of num_experts=6"):
        roofline_profile("H100-SXM", SIX_EXPERTS, 4, expert_parallel=True)
    assert len(roofline_profile("H100-SXM", SIX_EXPERTS, 2, expert_parallel=True).rows)


def test_roofline_refuses_expert_parallel_for_a_dense_model() -> None:
    with pytest.raises(ParameterError, match=r"Llama-3\.1-8B is dense"):
        roofline_profile("H100-SXM", "Llama-3.1-8B", 2, expert_parallel=True)


def test_worker_options_refuse_or_drop_the_expert_parallel_layout() -> None:
    with pytest.raises(ParameterError, match="divisor of num_experts=6"):
        worker_options(["H100-SXM"], SIX_EXPERTS, (4,), expert_parallel=(True,))
    both = worker_options(["H100-SXM"], SIX_EXPERTS, (2, 4), expert_parallel=(False, True))
    # beside the tensor-parallel layout, TP 4 just has no +ep option
    assert [o.name for o in both] == ["H100-SXM/tp2", "H100-SXM/tp2+ep", "H100-SXM/tp4"]
    with pytest.raises(ParameterError, match=r"Llama-3\.1-8B is dense"):
        worker_options(["H100-SXM"], "Llama-3.1-8B", (2,), expert_parallel=(True,))


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("Mixtral-8x7B", "divisor of num_experts=8"),
        ("Llama-3.1-8B", "Llama-3.1-8B is dense; --expert-parallel applies to MoE models"),
    ],
)
def test_profile_roofline_cli_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, message: str
) -> None:
    out = tmp_path / "x.csv"
    code = main([
        "profile", "roofline", "--gpu", "H100-SXM", "--model", model, "--tp", "16",
        "--expert-parallel", "--out", str(out),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and not out.exists()
    assert message in err and len(err.strip().splitlines()) == 1


def test_plan_cli_refuses_a_tp_wider_than_a_node(capsys: pytest.CaptureFixture[str]) -> None:
    # 16 GPUs of Mixtral-8x7B: two H100 nodes (and more GPUs than experts)
    code = main([
        "plan", "--model", "Mixtral-8x7B", "--gpus", "H100-SXM=32", "--tp", "16",
        "--expert-parallel", "on", "--workload", "sharegpt", "--rate", "2", "--requests", "200",
        "--ttft-slo", "3", "--tpot-slo", "0.1", "--no-sim",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "at most H100-SXM's gpus_per_node=8" in err and "Traceback" not in err
