"""Every catalogued model × GPU × precision gets a roofline profile, and the CLI and planner
run on the 2025 catalogue (DeepSeek-V3 FP8 on H200, Qwen3-30B-A3B on L40S)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.errors import ConfigError
from pdopt.hardware import GPUS, GpuSpec, get_gpu
from pdopt.model_spec import (
    MODELS,
    ModelSpec,
    activation_peak_bytes,
    get_model,
    kv_bytes_per_token,
    prefill_cost,
    weight_bytes,
    with_precision,
)
from pdopt.profile import ROOFLINE_PRESETS, roofline_profile

PRECISIONS = [(None, None), ("fp8", "fp8"), ("int8", None), ("int4", "int4")]


def _valid_tps(spec: ModelSpec) -> list[int]:
    heads, kv = spec.num_heads, spec.num_kv_heads
    return [t for t in (1, 2, 4, 8) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]


def _fits(gpu: GpuSpec, spec: ModelSpec, tp: int) -> bool:
    """One 16-token KV block fits beside the weights and the activation peak (vLLM's rule)."""
    usable = gpu.memory_bytes * 0.9 - activation_peak_bytes(spec, tp)
    return weight_bytes(spec, tp) + 16 * kv_bytes_per_token(spec, tp) <= usable


@pytest.mark.parametrize("name", list(MODELS))
def test_every_gpu_and_precision_profiles_or_says_why_not(name: str) -> None:
    tps = _valid_tps(MODELS[name])
    for gpu_name in GPUS:
        gpu = get_gpu(gpu_name)
        for weights, kv in PRECISIONS:
            spec = with_precision(MODELS[name], weights, kv) if weights else MODELS[name]
            if not _fits(gpu, spec, tps[-1]):
                with pytest.raises(ConfigError, match="Raise tp or use a larger GPU"):
                    roofline_profile(gpu, spec, tps[-1])
                continue
            tp = next(t for t in tps if _fits(gpu, spec, t))
            rows = roofline_profile(gpu, spec, tp).rows
            assert (rows["latency_s"] > 0).all() and rows["latency_s"].notna().all()
            assert {"gemm", "decode"} <= set(rows["kind"])


def test_fp8_runs_at_the_fp8_peak_where_the_gpu_has_one() -> None:
    bf16, fp8 = get_model("Llama-3.1-8B"), get_model("Llama-3.1-8B@fp8")

    def largest_prefill_s(gpu: str, spec: object) -> float:
        rows = roofline_profile(gpu, spec, 1).rows  # type: ignore[arg-type]
        prefill = rows[(rows["kind"] == "prefill") & (rows["input_tokens"] == 8192)]
        return float(prefill["latency_s"].max())

    # H100: the compute-bound prefill's weight GEMMs run at 2 x fp8_peak_fraction the BF16
    # speed, its attention at the BF16 speed (the fixed step costs aside).
    bf16_s, fp8_s = largest_prefill_s("H100-SXM", bf16), largest_prefill_s("H100-SXM", fp8)
    cost = prefill_cost(fp8, 8192, 8)
    weights, attention = cost.gemm_flops + cost.lm_head_flops, cost.attention_flops
    speed = 2.0 * ROOFLINE_PRESETS["hopper"].fp8_peak_fraction
    ratio = (bf16_s - 1e-3) / (fp8_s - 1e-3)
    assert ratio == pytest.approx((weights + attention) / (weights / speed + attention), rel=0.05)
    assert 1.2 < ratio < 2.0
    # A100 has no FP8 tensor cores: FP8 weights only save bytes, prefill stays as slow.
    assert largest_prefill_s("A100-80GB", fp8) == pytest.approx(
        largest_prefill_s("A100-80GB", bf16), rel=0.02
    )


def test_expert_parallel_changes_only_communication() -> None:
    spec = get_model("Qwen3-30B-A3B")
    tp = roofline_profile("H100-SXM", spec, 2).rows
    ep = roofline_profile("H100-SXM", spec, 2, expert_parallel=True).rows
    assert (tp["kind"] == ep["kind"]).all()
    gemm = tp["kind"] == "gemm"
    assert (tp.loc[gemm, "latency_s"] == ep.loc[gemm, "latency_s"]).all()
    assert not (tp.loc[~gemm, "latency_s"] == ep.loc[~gemm, "latency_s"]).all()


def test_cli_roofline_from_a_config_with_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
        "max_position_embeddings": 32768, "_name_or_path": "my/mixtral",
    }))  # fmt: skip
    out = tmp_path / "p.csv"
    code = main([
        "profile", "roofline", "--gpu", "H100", "--model-config", str(config), "--tp", "2",
        "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--expert-parallel", "--out", str(out),
        "--json",
    ])  # fmt: skip
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    assert payload["meta"]["model"] == "my/mixtral@fp8/fp8" and payload["meta"]["dtype"] == "fp8"
    assert "expert_parallel=True" in payload["meta"]["notes"]


def test_cli_catalog_lists_context_windows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "catalog", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    models = {m["name"]: m for m in payload["models"]}
    assert models["DeepSeek-V3"]["max_context_tokens"] == 163840
    assert models["Qwen3-30B-A3B"]["active_param_count"] < models["Qwen3-30B-A3B"]["param_count"]
    gpus = {g["name"]: g for g in payload["gpus"]}
    assert gpus["B200"]["fp8_peak_flops"] == 2 * gpus["B200"]["peak_flops"]
    assert main(["profile", "catalog"]) == 0
    text = capsys.readouterr().out
    assert "163840" in text and "MI300X" in text


@pytest.mark.parametrize(
    ("model", "gpus", "tps"),
    [("DeepSeek-V3@fp8/fp8", "H200=32", "8"), ("Qwen3-30B-A3B", "L40S=16", "1,2,4")],
)
def test_plan_runs_for_moe_models(
    model: str, gpus: str, tps: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "plan", "--model", model, "--gpus", gpus, "--tp", tps, "--workload", "sharegpt",
        "--rate", "2", "--requests", "300", "--ttft-slo", "3", "--tpot-slo", "0.1", "--json",
    ])  # fmt: skip
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    assert payload["model"] == model
    milp = payload["milp"]
    assert milp["status"] == "optimal" and milp["n_gpus"] >= 2
    assert payload["check"]["sim_requests"] == 300


@pytest.mark.parametrize(
    "model",
    # one of each architecture: dense GQA, too large for any one node, MoE, MLA + MoE,
    # sliding-window + MXFP4 MoE
    ["Llama-3.1-8B", "Llama-3.1-405B", "Qwen3-30B-A3B", "DeepSeek-V3", "gpt-oss-20b"],
)
def test_plan_sizes_on_every_gpu_or_says_why_not(
    model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On each catalogue GPU the plan sizes a deployment exactly where some TP of 1–8 holds
    the model (the capacity rule above), else exits 1 saying so; never a traceback."""
    spec = MODELS[model]
    for gpu_name in GPUS:
        code = main(["plan", "--model", model, "--gpus", f"{gpu_name}=64", "--workload",
                     "sharegpt", "--rate", "1", "--requests", "50", "--ttft-slo", "5",
                     "--tpot-slo", "0.5", "--no-sim", "--json"])  # fmt: skip
        out, err = capsys.readouterr()
        held = any(_fits(get_gpu(gpu_name), spec, t) for t in _valid_tps(spec))
        assert code == (0 if held else 1), (gpu_name, err)
        if held:
            assert json.loads(out)["milp"]["status"] == "optimal"
        else:
            assert f"{model} fits on none of ['{gpu_name}']" in err and "try " in err
