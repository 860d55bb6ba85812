"""``pdopt profile import-aic``: composing a profile from AIConfigurator's per-op tables.

The synthetic database is written in AIConfigurator's on-disk layout
(``systems/data/<system>/<family>/<backend>/<version>/<table>.csv`` and ``systems/<system>.yaml``)
with latencies that are multilinear in their keys, so that AIConfigurator-style interpolation and
extrapolation reproduce them exactly and every profile latency has a closed form.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pdopt.cli import main
from pdopt.errors import InputError, ParameterError
from pdopt.model_spec import ModelSpec, get_model, param_count
from pdopt.profile import import_aic, read_profile

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelSpec("tiny", 2, 64, 4, 2, 96, 256, "bfloat16")
GEMM_MS = 1e-9  # per m·n·k
CONTEXT_MS = 1e-4  # per batch · isl
GENERATION_MS = 2e-6  # per batch · step
AR_MS = (0.01, 1e-6)  # fixed + per element
MEM = (1e12, 0.5, 2e-6)  # mem_bw, scaling factor, constant latency


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)


def _database(root: Path) -> Path:
    """A tiny AIConfigurator tree: GEMM and attention at vllm 1.0, the all-reduce only at 0.9
    (backward fill) and, with wrong values, at 1.1 (must never be used for 1.0)."""
    data = root / "systems" / "data" / "tiny_gpu"
    _write(
        data / "gemm" / "vllm" / "1.0" / "gemm_perf.csv",
        [
            {
                "kernel_source": "linear",
                "gemm_dtype": dtype,
                "m": m,
                "n": n,
                "k": k,
                "latency": GEMM_MS * m * n * k * (0.5 if dtype == "fp8" else 1.0),
            }
            for dtype in ("bfloat16", "fp8")
            for m in (1, 16, 256)
            for n in (32, 512)
            for k in (32, 512)
        ],
    )
    for table, column, scale in (
        ("context_attention_perf", "isl", CONTEXT_MS),
        ("generation_attention_perf", "step", GENERATION_MS),
    ):
        _write(
            data / "attention" / "vllm" / "1.0" / f"{table}.csv",
            [
                {
                    "kernel_source": kernel,
                    "num_heads": q,
                    "num_key_value_heads": q // 2,
                    "head_dim": 16,
                    "window_size": 0,
                    "kv_cache_dtype": kv,
                    "batch_size": b,
                    column: s,
                    "latency": scale * b * s * (3.0 if kernel == "slow" else 1.0),
                }
                for kernel, repeat in (("fast", 2), ("slow", 1))
                for _ in range(repeat)
                for q in (2, 4)  # the shards of TINY at tp 2 and 1
                for kv in ("bfloat16", "fp8")
                for b in (1, 4)
                for s in (64, 1024)
            ],
        )
    for version, offset in (("0.9", 0.0), ("1.1", 5.0)):
        _write(
            data / "comm" / "vllm" / version / "custom_allreduce_perf.csv",
            [
                {
                    "kernel_source": kernel,
                    "num_gpus": gpus,
                    "message_size": size,
                    "latency": AR_MS[0]
                    + offset
                    + AR_MS[1] * size * (2 if "eager" in kernel else 1),
                }
                for kernel in ("custom_graph", "custom_eager", "custom_eager2")
                for gpus in (2, 4)
                for size in (128, 65536)
            ],
        )
    (root / "systems" / "tiny_gpu.yaml").write_text(
        f"gpu:\n  mem_bw: {MEM[0]:g}\n  mem_bw_empirical_scaling_factor: {MEM[1]}\n"
        f"  mem_empirical_constant_latency: {MEM[2]}\n"
    )
    return root


@pytest.fixture
def aic_root(tmp_path: Path) -> Path:
    return _database(tmp_path / "aic")


def _expected_s(tokens: int, rows: int, attention_ms: float, tp: int, gemm_scale: float) -> float:
    """The documented composition (pdopt.profile._aic) in closed form for TINY."""
    h, inter, q, kv, d = 64, 96, 4 // tp, max(1, 2 // tp), 16
    gemms = [(d * (q + 2 * kv), h), (h, d * q), (2 * inter // tp, h), (h, inter // tp)]
    gemm_ms = sum(GEMM_MS * gemm_scale * tokens * n * k for n, k in gemms)

    def mem_s(bytes_: float) -> float:
        return bytes_ / (MEM[0] * MEM[1]) + MEM[2]

    ar_s = (AR_MS[0] + AR_MS[1] * tokens * h) / 1e3 if tp > 1 else 0.0
    layer = (
        (gemm_ms + attention_ms) / 1e3
        + 2 * mem_s(tokens * 4 * h * 2)
        + mem_s(tokens * 3 * inter // tp * 2)
        + 2 * ar_s
    )
    logits = GEMM_MS * rows * (256 // tp) * h / 1e3
    return 2 * layer + mem_s(tokens * h * 2) + ar_s + logits


@pytest.mark.parametrize(("tp", "precision", "gemm_scale"), [(1, "bf16", 1.0), (2, "fp8", 0.5)])
def test_latencies_follow_the_composition(
    aic_root: Path, tp: int, precision: str, gemm_scale: float
) -> None:
    profile = import_aic(aic_root, "tiny_gpu", "vllm", TINY, tp, precision=precision)
    rows = profile.rows
    prefill = rows[rows["kind"] == "prefill"]
    decode = rows[rows["kind"] == "decode"]
    assert len(prefill) == 28 and len(decode) == 63  # uncatalogued GPU: no capacity filter
    for row in prefill.itertuples():
        b, length = int(row.batch_size), int(row.input_tokens)
        want = _expected_s(b * length, b, CONTEXT_MS * b * length, tp, gemm_scale)
        assert row.latency_s == pytest.approx(want, rel=1e-9)
    for row in decode.itertuples():
        b, context = int(row.batch_size), int(row.total_context_tokens) // int(row.batch_size)
        want = _expected_s(b, b, GENERATION_MS * b * context, tp, gemm_scale)
        assert row.latency_s == pytest.approx(want, rel=1e-9)
    gemm = rows[rows["kind"] == "gemm"]
    want = GEMM_MS * gemm_scale * gemm["m"] * gemm["n"] * gemm["k"] / 1e3
    assert gemm["latency_s"].to_numpy() == pytest.approx(want.to_numpy(), rel=1e-9)
    meta = profile.meta
    assert meta.gpu == "tiny_gpu" and meta.tp == tp
    assert "aiconfigurator:" in meta.source and "system=tiny_gpu" in meta.source
    assert "backend=vllm/1.0" in meta.source
    assert "kernel fast" in meta.notes  # the kernel measured at the most points
    if tp > 1:  # the all-reduce came from 0.9 (backward fill), its CUDA-graph kernel
        assert "comm/vllm/0.9/custom_allreduce_perf.csv: kernel custom_graph" in meta.notes


def test_decode_grows_with_context_and_prefill_with_tokens(aic_root: Path) -> None:
    rows = import_aic(aic_root, "tiny_gpu", "vllm", TINY).rows
    decode = rows[(rows["kind"] == "decode") & (rows["batch_size"] == 4)]
    assert decode.sort_values("total_context_tokens")["latency_s"].is_monotonic_increasing
    prefill = rows[(rows["kind"] == "prefill") & (rows["batch_size"] == 1)]
    assert prefill.sort_values("input_tokens")["latency_s"].is_monotonic_increasing


def test_missing_pieces_name_what_is_available(aic_root: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no system 'h200_sxm'.*\n  tiny_gpu: vllm 1.0"):
        import_aic(aic_root, "h200_sxm", "vllm", TINY)
    with pytest.raises(InputError, match=r"backend 'trtllm'.*\n  tiny_gpu: vllm 1.0"):
        import_aic(aic_root, "tiny_gpu", "trtllm", TINY)
    with pytest.raises(InputError, match=r"no version '0.5'; available: 1.0"):
        import_aic(aic_root, "tiny_gpu", "vllm", TINY, version="0.5")
    with pytest.raises(InputError, match=r"num_heads takes 2, 4"):
        import_aic(aic_root, "tiny_gpu", "vllm", ModelSpec("wide", 2, 128, 8, 2, 96, 256))
    with pytest.raises(InputError, match="no AIConfigurator data folder"):
        import_aic(tmp_path / "nothing", "tiny_gpu", "vllm", TINY)
    with pytest.raises(ParameterError, match="precision"):
        import_aic(aic_root, "tiny_gpu", "vllm", TINY, precision="int3")
    with pytest.raises(InputError, match=r"no moe_perf table .*on tiny_gpu: no backend"):
        moe = ModelSpec("m", 2, 64, 4, 2, 96, 256, num_experts=4, experts_per_token=2,
                        moe_intermediate_size=32)  # fmt: skip
        import_aic(aic_root, "tiny_gpu", "vllm", moe, 2)
    with pytest.raises(
        InputError, match=r"no all-reduce measured among tp=8 GPUs \(measured GPU counts: 2, 4\)"
    ):
        import_aic(aic_root, "tiny_gpu", "vllm", ModelSpec("w8", 2, 256, 16, 8, 96, 256), 8)


def test_cli_writes_the_profile(
    aic_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny.csv"
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 96,
                "vocab_size": 256,
                "torch_dtype": "bfloat16",
                "max_position_embeddings": 4096,
            }
        )
    )
    argv = [
        "profile",
        "import-aic",
        "--aic-dir",
        str(aic_root / "systems"),
        "--gpu",
        "tiny_gpu",
        "--model-config",
        str(config),
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == {"gemm": 24, "prefill": 28, "decode": 63}
    assert read_profile(out).meta.source == summary["meta"]["source"]


def _installed() -> bool:
    try:
        importlib.metadata.distribution("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(_installed(), reason="aiconfigurator-core is installed")
def test_cli_without_the_extra_names_it(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdopt",
            "profile",
            "import-aic",
            "--gpu",
            "h200_sxm",
            "--model",
            "Llama-3.1-8B",
            "--out",
            str(tmp_path / "x.csv"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode != 0
    assert "pip install pdopt[aic]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.skipif(not _installed(), reason="aiconfigurator-core not installed (pdopt[aic])")
def test_real_database_respects_hardware_bounds() -> None:
    """Llama-3.1-8B on H200 from the measured vLLM tables: a batch-1 decode cannot beat reading
    the weights at the data-sheet bandwidth, nor a long prefill the data-sheet BF16 peak."""
    from pdopt.hardware import get_gpu

    profile = import_aic("auto", "h200_sxm", "vllm", "Llama-3.1-8B")
    gpu, params = get_gpu("H200"), param_count(get_model("Llama-3.1-8B"))
    rows = profile.rows
    decode = rows[(rows["kind"] == "decode") & (rows["batch_size"] == 1)]["latency_s"]
    floor = 2 * params / gpu.hbm_bw_bytes_per_s
    assert (decode > floor).all() and (decode < 2 * floor).all()
    prefill = rows[(rows["kind"] == "prefill") & (rows["input_tokens"] == 8192)]
    flops = 2 * params * prefill["batch_size"] * 8192
    assert (flops / prefill["latency_s"] < gpu.peak_flops).all()
    assert profile.meta.source.startswith("aiconfigurator:aiconfigurator-core=")


def test_a_quantised_gemm_floor_is_flagged(aic_root: Path) -> None:
    """FP8 GEMMs at half the BF16 time pass silently; a flat FP8 floor (the same time whatever
    the shape, as vLLM 0.24.0's FP8 block-scaled tables measure) gets a warning naming the ratio,
    and the profile is still composed from the table as measured."""
    assert (
        "WARNING" not in import_aic(aic_root, "tiny_gpu", "vllm", TINY, precision="fp8").meta.notes
    )
    gemm = aic_root / "systems" / "data" / "tiny_gpu" / "gemm" / "vllm" / "1.0" / "gemm_perf.csv"
    table = pd.read_csv(gemm)
    floor_ms = 0.05
    table.loc[table["gemm_dtype"] == "fp8", "latency"] = floor_ms
    table.to_csv(gemm, index=False)
    profile = import_aic(aic_root, "tiny_gpu", "vllm", TINY, precision="fp8")
    warning = [note for note in profile.meta.notes.splitlines() if note.startswith("WARNING")]
    bf16 = sorted(GEMM_MS * n * k for n, k in ((16 * 8, 64), (64, 16 * 4), (192, 64), (64, 96)))
    ratio = sorted(floor_ms / b for b in bf16)
    want = (ratio[1] + ratio[2]) / 2  # the median over the model's four shard shapes
    assert len(warning) == 1 and f"{want:.1f}x the BF16 ones" in warning[0]
    gemm_rows = profile.rows[profile.rows["kind"] == "gemm"]
    assert gemm_rows["latency_s"].to_numpy() == pytest.approx(floor_ms / 1e3)


@pytest.mark.parametrize(("backend", "flagged"), [("vllm", True), ("sglang", False)])
def test_real_fp8_block_tables_flagged_only_where_floored(
    aic_dir: str, backend: str, flagged: bool
) -> None:
    """AIConfigurator's H200 FP8 block-scaled GEMMs for DeepSeek-V3 TP8: vLLM 0.24.0's sit on
    a ~60 µs floor at m = 1 (about 10x BF16), SGLang's do not."""
    notes = import_aic(
        aic_dir, "h200_sxm", backend, "DeepSeek-V3", 8, precision="fp8_block"
    ).meta.notes
    assert ("WARNING: at m=1 the fp8_block GEMMs" in notes) is flagged
