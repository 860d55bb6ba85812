"""``import_aic`` for MLA through the per-op tables (SGLang: no module tables), and the options
it refuses (pipeline parallelism, attention data parallelism, MTP): on synthetic tables each
iteration equals the hand sum of its lookups; on the real database (when installed) the SGLang
DeepSeek-V3 profiles respect hardware bounds."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.errors import InputError, ParameterError
from pdopt.model_spec import get_model
from pdopt.profile import import_aic
from tests.profile.test_profile_aic import GEMM_MS, ROOT, _write
from tests.profile.test_profile_aic_moe import DSV3, _hand_sum, _installed, _row, moe_root

__all__ = ["moe_root"]  # the fixture, imported for pytest

CONTEXT_MLA_MS = 3e-5  # per batch · isl
GENERATION_MLA_MS = 4e-7  # per batch · step
BMM_MS = {"mla_gen_pre": 5e-4, "mla_gen_post": 7e-4}  # per token
SPEC = dataclasses.replace(DSV3, dtype="bfloat16")  # BF16 GEMMs and BMMs at TP 2: 64 heads


@pytest.fixture
def sglang_root(moe_root: Path) -> Path:
    """``moe_root`` plus an ``sglang`` backend: the vLLM GEMM, all-reduce and MoE tables, and
    per-op MLA tables only (no module tables). Rows at other heads or dtypes are 10x slower."""
    data = moe_root / "systems" / "data" / "tiny_gpu"
    for family in ("gemm", "comm", "moe"):
        shutil.copytree(data / family / "vllm", data / family / "sglang")
    for table, column, scale in (
        ("context_mla_perf", "isl", CONTEXT_MLA_MS),
        ("generation_mla_perf", "step", GENERATION_MLA_MS),
    ):
        _write(
            data / "mla" / "sglang" / "1.0" / f"{table}.csv",
            [
                {
                    "kernel_source": "flash_attention",
                    "mla_dtype": "bfloat16",
                    "num_heads": heads,
                    "kv_cache_dtype": kv,
                    "batch_size": b,
                    column: s,
                    "latency": scale * b * s * (1 if (heads, kv) == (64, "bfloat16") else 10),
                }
                for heads in (32, 64)
                for kv in ("bfloat16", "fp8")
                for b in (1, 4)
                for s in (64, 1024)
            ],
        )
    _write(
        data / "mla_bmm" / "sglang" / "1.0" / "mla_bmm_perf.csv",
        [
            {
                "kernel_source": "bmm",
                "op_name": op,
                "bmm_dtype": dtype,
                "num_heads": heads,
                "num_tokens": t,
                "latency": BMM_MS[op] * t * (1 if (heads, dtype) == (64, "bfloat16") else 10),
            }
            for op in BMM_MS
            for dtype in ("bfloat16", "fp8")
            for heads in (32, 64)
            for t in (1, 64)
        ],
    )
    return moe_root


def _gemms_s(tokens: int, *shapes: tuple[int, int]) -> float:
    return sum(GEMM_MS * tokens * n * k for n, k in shapes) / 1e3


# DeepSeek-V3's projections on one of 2 GPUs (64 heads): fused down (1536 + 512 + 64), Q up
# (64 · 192 from 1536), KV up (64 · (128 + 128) from 512), output (7168 from 64 · 128)
DOWN, Q_UP, KV_UP, OUT = (2112, 7168), (64 * 192, 1536), (64 * 256, 512), (7168, 64 * 128)


def test_sglang_mla_iterations_equal_the_hand_sum(sglang_root: Path) -> None:
    profile = import_aic(sglang_root, "tiny_gpu", "sglang", SPEC, 2)
    tokens = 2 * 1024
    attention = _gemms_s(tokens, DOWN, Q_UP, KV_UP, OUT) + CONTEXT_MLA_MS * 2 * 1024 / 1e3
    want = _hand_sum(SPEC, tokens, 2, attention, decode=False)
    assert _row(profile.rows, "prefill", 2, "input_tokens", 1024) == pytest.approx(want, rel=1e-9)
    batch, context = 4, 2048
    attention = (
        _gemms_s(batch, DOWN, Q_UP, OUT)
        + (BMM_MS["mla_gen_pre"] * batch + BMM_MS["mla_gen_post"] * batch) / 1e3
        + GENERATION_MLA_MS * batch * context / 1e3
    )
    want = _hand_sum(SPEC, batch, batch, attention, decode=True)
    got = _row(profile.rows, "decode", batch, "total_context_tokens", batch * context)
    assert got == pytest.approx(want, rel=1e-9)
    assert "MLA attention: per-op tables" in profile.meta.notes
    assert "mla_gen_pre num_heads=64 bmm_dtype=bfloat16" in profile.meta.notes


def test_module_tables_win_where_measured(sglang_root: Path) -> None:
    """The vLLM backend of the same tree has both kinds: the module is read (as AIConfigurator's
    FallbackOp prefers it)."""
    notes = import_aic(sglang_root, "tiny_gpu", "vllm", SPEC, 2).meta.notes
    assert "MLA attention: module tables" in notes
    assert "context_mla_perf" not in notes


def test_missing_per_op_pieces_name_both_lookups(sglang_root: Path) -> None:
    data = sglang_root / "systems" / "data" / "tiny_gpu"
    with pytest.raises(InputError, match=r"kv_cache_dtype takes bfloat16, fp8"):
        import_aic(sglang_root, "tiny_gpu", "sglang", SPEC, 2, kv_dtype="fp16")
    shutil.rmtree(data / "mla_bmm")
    with pytest.raises(
        InputError, match=r"no MLA module tables .*per-op MLA tables instead: .*no mla_bmm_perf"
    ):
        import_aic(sglang_root, "tiny_gpu", "sglang", SPEC, 2)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("pp", 2, "no pipeline-parallel concept"),
        ("attention_dp", 8, "--expert-parallel to place whole experts"),
        ("mtp", 1, "import without --mtp"),
    ],
)
def test_uncomposed_options_are_refused_with_the_reason(
    sglang_root: Path, option: str, value: int, says: str
) -> None:
    with pytest.raises(ParameterError, match=rf"{option}={value} \(--.*{says}"):
        import_aic(sglang_root, "tiny_gpu", "sglang", SPEC, 2, **{option: value})  # type: ignore[arg-type]


def test_cli_refuses_pp_without_a_traceback(sglang_root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable, "-m", "pdopt", "profile", "import-aic", "--aic-dir",
            str(sglang_root), "--gpu", "tiny_gpu", "--model", "Llama-3.1-8B", "--pp", "2",
            "--out", str(tmp_path / "x.csv"),
        ],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "--pp 2" in done.stderr and "no pipeline-parallel concept" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.skipif(not _installed(), reason="aiconfigurator-core not installed (pdopt[aic])")
@pytest.mark.parametrize(("system", "gpu_name"), [("h200_sxm", "H200"), ("b200_sxm", "B200")])
def test_real_sglang_deepseek_respects_hardware_bounds(system: str, gpu_name: str) -> None:
    """DeepSeek-V3 on SGLang, TP 8, FP8 block: read through the per-op MLA tables; a batch-1
    decode is no faster than reading the active weights at the data-sheet bandwidth, nor a
    long prefill faster than the data-sheet FP8 peak on the active parameters."""
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import active_param_count

    profile = import_aic("auto", system, "sglang", "DeepSeek-V3", 8, precision="fp8_block")
    assert "MLA attention: per-op tables" in profile.meta.notes
    gpu, rows = get_gpu(gpu_name), profile.rows
    active = active_param_count(get_model("DeepSeek-V3"), include_embedding=False)
    decode = rows[(rows["kind"] == "decode") & (rows["batch_size"] == 1)]["latency_s"]
    assert (decode > active / 8 / gpu.hbm_bw_bytes_per_s).all()
    prefill = rows[(rows["kind"] == "prefill") & (rows["input_tokens"] == 8192)]
    flops = 2 * active / 8 * prefill["batch_size"] * 8192
    assert (flops / prefill["latency_s"] < gpu.fp8_peak_flops).all()
