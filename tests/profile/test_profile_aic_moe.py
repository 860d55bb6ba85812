"""``import_aic`` for MoE and MLA models: each iteration equals the hand sum of its table
lookups (synthetic AIConfigurator tables, multilinear so that lookups are exact), and missing
tables or shapes are errors that list what exists; on the real database (when installed),
hardware bounds hold."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from pdopt.errors import InputError
from pdopt.model_spec import ModelSpec, get_model
from pdopt.profile import import_aic
from tests.profile.test_profile_aic import (
    AR_MS,
    CONTEXT_MS,
    GEMM_MS,
    GENERATION_MS,
    MEM,
    _database,
    _installed,
    _write,
)

TINY_MOE = ModelSpec(
    "tiny-moe", 3, 64, 4, 2, 96, 256, "bfloat16", num_experts=4, experts_per_token=2,
    moe_intermediate_size=32, num_shared_experts=1, first_dense_layers=1,
)  # fmt: skip
MOE_MS = 3e-4  # per token entering the routed experts
MLA_MS = 2e-5  # per batch · isl (or step) of the MLA module
DSV3 = get_model("DeepSeek-V3")


def _moe_rows(model: ModelSpec, dtype: str, distribution: str) -> list[dict[str, object]]:
    """Rows at the model's shape; other distributions, dtypes and shardings are 10x slower,
    so reading a wrong row shows in the latencies."""
    return [
        {
            "kernel_source": "fused",
            "hidden_size": model.hidden_size,
            "inter_size": model.moe_intermediate_size,
            "num_experts": model.num_experts,
            "topk": model.experts_per_token,
            "moe_dtype": d,
            "distribution": dist,
            "moe_tp_size": mtp,
            "moe_ep_size": mep,
            "num_tokens": t,
            "latency": MOE_MS * t * (1 if (d, dist, mtp) == (dtype, distribution, 2) else 10),
        }
        for d in (dtype, "fp8")
        for dist in (distribution, "balanced")
        for mtp, mep in ((2, 1), (1, 2))
        for t in (1, 64, 4096)
    ]


@pytest.fixture
def moe_root(tmp_path: Path) -> Path:
    root = _database(tmp_path / "aic")
    data = root / "systems" / "data" / "tiny_gpu"
    rows = _moe_rows(TINY_MOE, "bfloat16", "power_law_1.2") + _moe_rows(
        DSV3, "bfloat16", "power_law_1.01"
    )
    _write(data / "moe" / "vllm" / "1.0" / "moe_perf.csv", rows)
    for table, column in (
        ("mla_context_module_perf", "isl"),
        ("mla_generation_module_perf", "step"),
    ):
        _write(
            data / "mla" / "vllm" / "1.0" / f"{table}.csv",
            [
                {
                    "kernel_source": "FLASHMLA",
                    "num_heads": heads,
                    "kv_cache_dtype": "bfloat16",
                    "gemm_type": gemm,
                    "batch_size": b,
                    column: s,
                    "latency": MLA_MS * b * s * (1 if (heads, gemm) == (64, "bfloat16") else 10),
                }
                for heads in (64, 128)
                for gemm in ("bfloat16", "fp8_block")
                for b in (1, 4)
                for s in (64, 1024)
            ],
        )
    return root


def _gemm_s(m: float, n: float, k: float) -> float:
    return GEMM_MS * m * n * k / 1e3


def _mem_s(bytes_: float) -> float:
    return bytes_ / (MEM[0] * MEM[1]) + MEM[2]


def _mlp_s(tokens: int, h: int, width: int, tp: int) -> float:
    """Gate/up and down GEMMs plus the gated activation (reads 2w/tp, writes w/tp)."""
    return (
        _gemm_s(tokens, 2 * width // tp, h)
        + _gemm_s(tokens, h, width // tp)
        + _mem_s(tokens * 3 * width // tp * 2)
    )


def _hand_sum(
    model: ModelSpec, tokens: int, rows: int, attention_s: float, decode: bool, tp: int = 2
) -> float:
    """One iteration as the documented op list, written out independently of _aic."""
    h = model.hidden_size
    ar = (AR_MS[0] + AR_MS[1] * tokens * h) / 1e3
    common = attention_s + 2 * _mem_s(tokens * 4 * h * 2) + 2 * ar
    dense = _mlp_s(tokens, h, model.intermediate_size, tp)
    routed = _gemm_s(tokens, model.num_experts, h) + MOE_MS * tokens / 1e3
    shared = _mlp_s(tokens, h, model.num_shared_experts * model.moe_intermediate_size, tp)
    moe = max(routed, shared) if decode else routed + shared
    moe_layers = model.num_layers - model.first_dense_layers
    logits = _gemm_s(rows, model.vocab_size // tp, h)
    return (
        model.num_layers * common
        + model.first_dense_layers * dense
        + moe_layers * moe
        + _mem_s(tokens * h * 2)
        + ar
        + logits
    )


def _row(profile_rows: object, kind: str, batch: int, key: str, value: int) -> float:
    rows = profile_rows  # a DataFrame
    hit = rows[(rows["kind"] == kind) & (rows["batch_size"] == batch) & (rows[key] == value)]  # type: ignore[index]
    assert len(hit) == 1
    return float(hit["latency_s"].iloc[0])


def test_moe_iterations_equal_the_hand_sum(moe_root: Path) -> None:
    """TINY_MOE at TP 2: one dense first layer, two MoE layers with a shared expert."""
    profile = import_aic(moe_root, "tiny_gpu", "vllm", TINY_MOE, 2)
    rows = profile.rows
    q, kv, d, h = 2, 1, 16, 64
    qkv_o = _gemm_s(4 * 512, d * (q + 2 * kv), h) + _gemm_s(4 * 512, h, d * q)
    prefill_attn = CONTEXT_MS * 4 * 512 / 1e3 + qkv_o
    want = _hand_sum(TINY_MOE, 4 * 512, 4, prefill_attn, decode=False)
    assert _row(rows, "prefill", 4, "input_tokens", 512) == pytest.approx(want, rel=1e-9)
    decode_attn = GENERATION_MS * 8 * 1024 / 1e3 + _gemm_s(8, d * 4, h) + _gemm_s(8, h, d * 2)
    want = _hand_sum(TINY_MOE, 8, 8, decode_attn, decode=True)
    assert _row(rows, "decode", 8, "total_context_tokens", 8 * 1024) == pytest.approx(
        want, rel=1e-9
    )
    assert "moe=bfloat16/power_law_1.2" in profile.meta.source
    assert "moe_tp_size=2 moe_ep_size=1" in profile.meta.notes


def test_expert_parallel_reads_the_ep_rows(moe_root: Path) -> None:
    split = import_aic(moe_root, "tiny_gpu", "vllm", TINY_MOE, 2).rows
    ep = import_aic(moe_root, "tiny_gpu", "vllm", TINY_MOE, 2, expert_parallel=True).rows
    assert (ep["latency_s"] > split["latency_s"]).sum() == (ep["kind"] != "gemm").sum()


def test_mla_prefill_equals_the_hand_sum(moe_root: Path) -> None:
    """DeepSeek-V3 at TP 2, BF16: the MLA module (projections included), 3 dense layers,
    58 MoE layers with one shared expert."""
    spec = dataclasses.replace(DSV3, dtype="bfloat16")
    profile = import_aic(moe_root, "tiny_gpu", "vllm", spec, 2)
    attention = MLA_MS * 2 * 1024 / 1e3
    want = _hand_sum(spec, 2 * 1024, 2, attention, decode=False)
    assert _row(profile.rows, "prefill", 2, "input_tokens", 1024) == pytest.approx(want, rel=1e-9)
    attention = MLA_MS * 4 * 2048 / 1e3
    want = _hand_sum(spec, 4, 4, attention, decode=True)
    assert _row(profile.rows, "decode", 4, "total_context_tokens", 4 * 2048) == pytest.approx(
        want, rel=1e-9
    )
    assert "moe=bfloat16/power_law_1.01" in profile.meta.source


def test_missing_moe_and_mla_pieces_list_what_exists(moe_root: Path) -> None:
    wide = dataclasses.replace(TINY_MOE, name="wide-moe", moe_intermediate_size=48)
    with pytest.raises(InputError, match=r"no MoE rows for wide-moe .*inter_size=32"):
        import_aic(moe_root, "tiny_gpu", "vllm", wide, 2)
    with pytest.raises(InputError, match=r"moe_dtype takes bfloat16, fp8"):
        mxfp4 = dataclasses.replace(TINY_MOE, expert_dtype="mxfp4")  # reads w4a16_mxfp4 rows
        import_aic(moe_root, "tiny_gpu", "vllm", mxfp4, 2)
    with pytest.raises(InputError, match=r"distribution takes balanced, power_law_1.2"):
        import_aic(moe_root, "tiny_gpu", "vllm", TINY_MOE, 2, moe_distribution="power_law_1.01")
    other = dataclasses.replace(DSV3, name="small-mla", kv_lora_rank=256, dtype="bfloat16")
    with pytest.raises(InputError, match=r"DeepSeek-V3's shape only; small-mla differs: kv_lora"):
        import_aic(moe_root, "tiny_gpu", "vllm", other, 2)
    with pytest.raises(InputError, match=r"gemm_type takes bfloat16, fp8_block"):
        import_aic(moe_root, "tiny_gpu", "vllm", DSV3, 2, precision="fp8")


def test_a_model_missing_from_the_newest_moe_table_names_the_versions_that_have_it(
    moe_root: Path,
) -> None:
    """The newest version (2.0) measures only DeepSeek-V3's experts: importing TINY_MOE by
    default names 1.0, and ``version="1.0"`` then imports it."""
    data = moe_root / "systems" / "data" / "tiny_gpu"
    for old in data.glob("*/vllm/1.0"):
        shutil.copytree(old, old.parent / "2.0")
    _write(data / "moe" / "vllm" / "2.0" / "moe_perf.csv",
           _moe_rows(DSV3, "bfloat16", "power_law_1.01"))  # fmt: skip
    with pytest.raises(
        InputError, match=r"no MoE rows for tiny-moe .*at version 1\.0: give --version 1\.0$"
    ):
        import_aic(moe_root, "tiny_gpu", "vllm", TINY_MOE, 2)
    assert len(import_aic(moe_root, "tiny_gpu", "vllm", TINY_MOE, 2, version="1.0").rows)


@pytest.mark.skipif(not _installed(), reason="aiconfigurator-core not installed (pdopt[aic])")
def test_real_moe_and_mla_respect_hardware_bounds() -> None:
    """Qwen3-30B-A3B (H200, TP1, BF16) and DeepSeek-V3 (H200, TP8, FP8 block): a batch-1 decode
    is no faster than reading the active weights at the data-sheet bandwidth."""
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import active_param_count

    gpu = get_gpu("H200")
    for model, tp, precision, weight_bytes in (
        ("Qwen3-30B-A3B", 1, "bf16", 2),
        ("DeepSeek-V3", 8, "fp8_block", 1),
    ):
        rows = import_aic("auto", "h200_sxm", "vllm", model, tp, precision=precision).rows
        decode = rows[(rows["kind"] == "decode") & (rows["batch_size"] == 1)]["latency_s"]
        active = active_param_count(get_model(model), include_embedding=False)
        assert (decode > weight_bytes * active / tp / gpu.hbm_bw_bytes_per_s).all()
