"""Vidur importer: the shared A100 measurements (when present) and tiny synthetic folders."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pdopt.errors import InputError
from pdopt.model_spec import ModelSpec
from pdopt.profile import import_vidur, read_profile, roofline_profile, write_profile
from pdopt.profile._vidur import GEMM_OPS, LINEAR_OPS

VIDUR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "vidur-profiling"
A100 = VIDUR / "a100"


def _needs_data() -> None:
    if not (A100 / "Llama-2-70b-hf" / "mlp.csv").is_file():
        pytest.skip("shared Vidur profiling data not present")


def _row(profile_rows: pd.DataFrame, kind: str, **where: float) -> float:
    rows = profile_rows[profile_rows["kind"] == kind]
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1
    return float(rows["latency_s"].iloc[0])


# Ground truth: the derived tables of shared/data/vidur-profiling/README.md (per-layer ms,
# rounded to 3 decimals there) without the TP all-reduce column (added only on request).
LLAMA70B_PREFILL = {128: 0.773 + 0.016, 1024: 4.370 + 0.216, 4096: 15.604 + 2.315}
LLAMA70B_DECODE_CTX1024 = {1: 0.563 + 0.017, 8: 0.574 + 0.036, 32: 0.605 + 0.064, 64: 0.628 + 0.122}


def test_llama2_70b_tp2_matches_the_readme_tables() -> None:
    _needs_data()
    profile = import_vidur(A100 / "Llama-2-70b-hf", "Llama-2-70B", tp=2)
    assert profile.meta.gpu == "A100-80GB" and profile.meta.tp == 2
    for length, ms in LLAMA70B_PREFILL.items():
        got = _row(profile.rows, "prefill", input_tokens=length)
        assert got == pytest.approx(80 * ms / 1e3, abs=80 * 0.001e-3)
    for batch, ms in LLAMA70B_DECODE_CTX1024.items():
        got = _row(profile.rows, "decode", batch_size=batch, total_context_tokens=batch * 1024)
        assert got == pytest.approx(80 * ms / 1e3, abs=80 * 0.001e-3)
    counts = profile.rows["kind"].value_counts().to_dict()
    assert counts == {"gemm": 4 * 259, "prefill": 81, "decode": 19 * 79}


# The README's "prefill total ms" and "decode iteration ms" columns: every term, all-reduce too.
LLAMA70B_TOTAL_PREFILL_MS = {
    128: 71.8,
    256: 103.0,
    512: 191.3,
    1024: 389.1,
    2048: 733.6,
    4096: 1502.3,
}
LLAMA70B_TOTAL_DECODE_MS = {1: 53.8, 8: 57.8, 32: 62.0, 64: 67.5}


def test_llama2_70b_with_all_reduce_matches_the_readme_totals() -> None:
    _needs_data()
    all_reduce = VIDUR / "network" / "a100_dgx" / "all_reduce.csv"
    profile = import_vidur(A100 / "Llama-2-70b-hf", "Llama-2-70B", 2, all_reduce_csv=all_reduce)
    for length, ms in LLAMA70B_TOTAL_PREFILL_MS.items():
        got = _row(profile.rows, "prefill", input_tokens=length)
        assert got * 1e3 == pytest.approx(ms, abs=0.05)
    for batch, ms in LLAMA70B_TOTAL_DECODE_MS.items():
        got = _row(profile.rows, "decode", batch_size=batch, total_context_tokens=batch * 1024)
        assert got * 1e3 == pytest.approx(ms, abs=0.05)
    assert "all_reduce.csv: 2 all-reduces per layer among 2 GPUs added" in profile.meta.notes


def test_llama2_7b_without_attention_says_so() -> None:
    _needs_data()
    profile = import_vidur(A100 / "Llama-2-7b-hf", "Llama-2-7B")
    assert "no attention file matches Llama-2-7B at tp=1" in profile.meta.notes
    # Linear ops only: README's "linear+norm ms/layer" column × 32 layers.
    for length, ms in {128: 0.383, 1024: 2.123, 4096: 8.123}.items():
        assert _row(profile.rows, "prefill", input_tokens=length) == pytest.approx(
            32 * ms / 1e3, abs=32 * 0.001e-3
        )
    decode = profile.rows[profile.rows["kind"] == "decode"]
    assert (decode["total_context_tokens"] == decode["batch_size"]).all()
    assert decode["batch_size"].max() == 256


def test_gemm_rows_use_the_projection_shapes() -> None:
    _needs_data()
    rows = import_vidur(A100 / "Meta-Llama-3-8B", "Llama-3.1-8B", tp=2).rows
    gemm = rows[rows["kind"] == "gemm"]
    shapes = {(int(n), int(k)) for n, k in gemm[["n", "k"]].itertuples(index=False)}
    # QKV (32+2·8)·128/2, O 4096←2048, gate+up 2·14336/2, down 4096←7168
    assert shapes == {(3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168)}
    achieved = 2 * gemm["m"] * gemm["n"] * gemm["k"] / gemm["latency_s"]
    assert 150e12 < achieved.max() < 312e12  # a real A100 below its 312 TFLOP/s data sheet


def test_cli_round_trip_of_real_import(tmp_path: Path) -> None:
    _needs_data()
    profile = import_vidur(A100 / "Llama-2-70b-hf", "Llama-2-70B", tp=2)
    again = read_profile(write_profile(profile, tmp_path / "v.csv"))
    pd.testing.assert_frame_equal(profile.rows, again.rows)
    assert again.meta == profile.meta


# --- tiny synthetic Vidur folders -------------------------------------------------------------

TINY = ModelSpec(
    "tiny",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    vocab_size=100,
)


def _mlp_frame(tokens: tuple[int, ...] = (1, 2, 4, 8), tp: int = 1) -> pd.DataFrame:
    data: dict[str, list[object]] = {}
    for op in ("emb", *LINEAR_OPS):
        for stat in ("min", "max", "mean", "median", "std"):
            data[f"time_stats.{op}.{stat}"] = [0.01 * n for n in tokens]
    data.update(
        n_head=[4] * len(tokens),
        n_kv_head=[2] * len(tokens),
        n_embd=[64] * len(tokens),
        n_expanded_embd=[128] * len(tokens),
        vocab_size=[100] * len(tokens),
        use_gated_mlp=[True] * len(tokens),
        num_tokens=list(tokens),
        num_tensor_parallel_workers=[tp] * len(tokens),
    )
    return pd.DataFrame(data)


def _attention_frame() -> pd.DataFrame:
    rows = []
    for chunk in (2, 4, 16):  # 16 is not in mlp.csv: left out
        rows.append(
            {
                "is_prefill": True,
                "batch_size": 1,
                "prefill_chunk_size": chunk,
                "kv_cache_size": 0,
                "time_stats.attn_prefill.median": 0.001 * chunk,
                "time_stats.attn_decode.median": "",
            }
        )
    for batch in (1, 2, 3):  # 3 is not in mlp.csv: left out
        rows.append(
            {
                "is_prefill": False,
                "batch_size": batch,
                "prefill_chunk_size": 0,
                "kv_cache_size": 32,
                "time_stats.attn_prefill.median": "",
                "time_stats.attn_decode.median": 0.002 * batch,
            }
        )
    frame = pd.DataFrame(rows)
    return frame.assign(n_embd=64, n_q_head=4, n_kv_head=2, num_tensor_parallel_workers=1)


def _folder(tmp_path: Path, mlp: pd.DataFrame, attention: pd.DataFrame | None = None) -> Path:
    folder = tmp_path / "a100" / "tiny"
    folder.mkdir(parents=True)
    mlp.to_csv(folder / "mlp.csv", index=False)
    if attention is not None:
        attention.to_csv(folder / "attention.csv", index=False)
    return folder


def test_synthetic_rows_are_exact(tmp_path: Path) -> None:
    profile = import_vidur(_folder(tmp_path, _mlp_frame(), _attention_frame()), TINY)
    lin = len(LINEAR_OPS) * 0.01  # ms per token per layer
    assert _row(profile.rows, "prefill", input_tokens=4) == pytest.approx(
        2 * (lin * 4 + 0.004) / 1e3
    )
    assert _row(profile.rows, "decode", batch_size=2, total_context_tokens=64) == pytest.approx(
        2 * (lin * 2 + 0.004) / 1e3
    )
    assert len(profile.of_kind("gemm")) == len(GEMM_OPS) * 4
    assert len(profile.of_kind("prefill")) == 2 and len(profile.of_kind("decode")) == 2
    assert "1 left out" in profile.meta.notes
    assert profile.meta.gpu == "A100-80GB"


def test_duplicates_are_merged_by_median(tmp_path: Path) -> None:
    mlp = _mlp_frame()
    duplicate = mlp.iloc[[0]].copy()
    duplicate["time_stats.attn_pre_proj.median"] = 1.0
    triple = pd.concat([mlp, duplicate, duplicate])
    profile = import_vidur(_folder(tmp_path, triple), TINY)
    gemm = profile.of_kind("gemm")
    qkv = gemm[(gemm["m"] == 1) & (gemm["n"] == 16 * (4 + 2 * 2))]
    assert qkv["latency_s"].tolist() == [pytest.approx(1.0 / 1e3)]


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        (
            "time_stats.mlp_act.median",
            "abc",
            "mlp.csv row 3 (line 4): time_stats.mlp_act.median=abc must be a finite number >= 0",
        ),
        (
            "time_stats.mlp_act.median",
            "-1",
            "mlp.csv row 3 (line 4): time_stats.mlp_act.median=-1 must be a finite number >= 0",
        ),
        (
            "time_stats.mlp_up_proj.median",
            "0",
            "mlp.csv row 3 (line 4): time_stats.mlp_up_proj.median=0 must be a finite number > 0",
        ),
        (
            "time_stats.add.median",
            "nan",
            "mlp.csv row 3 (line 4): time_stats.add.median=nan must be a finite number >= 0",
        ),
        (
            "n_embd",
            "4096",
            "mlp.csv row 3 (line 4): n_embd=4096 does not match tiny hidden_size=64",
        ),
    ],
)
def test_bad_mlp_values(tmp_path: Path, column: str, value: str, message: str) -> None:
    mlp = _mlp_frame().astype({column: object})
    mlp.loc[2, column] = value
    with pytest.raises(InputError) as info:
        import_vidur(_folder(tmp_path, mlp), TINY)
    assert str(info.value) == message


def test_missing_column_and_file(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _mlp_frame().drop(columns=["time_stats.add.median"]))
    with pytest.raises(
        InputError, match=r"^mlp.csv: missing column\(s\) \['time_stats.add.median'\]$"
    ):
        import_vidur(folder, TINY)
    with pytest.raises(InputError, match=r"mlp\.csv: file not found"):
        import_vidur(tmp_path / "nowhere", TINY)


def test_wrong_tp_lists_available(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _mlp_frame())
    with pytest.raises(
        InputError,
        match=r"^mlp.csv: no rows with num_tensor_parallel_workers=2 \(available: \[1\]\)$",
    ):
        import_vidur(folder, TINY, tp=2)


def test_bad_attention_value(tmp_path: Path) -> None:
    attention = _attention_frame().astype({"time_stats.attn_decode.median": object})
    attention.loc[4, "time_stats.attn_decode.median"] = "-2"
    folder = _folder(tmp_path, _mlp_frame(), attention)
    with pytest.raises(InputError) as info:
        import_vidur(folder, TINY)
    assert str(info.value) == (
        "attention.csv row 5 (line 6): time_stats.attn_decode.median=-2 must be a finite number > 0"
    )


def test_synthetic_all_reduce_is_interpolated_and_out_of_range_left_out(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _mlp_frame(tp=2))
    # Messages are n·64·2 bytes: 128, 256, 512, 1024 for n = 1, 2, 4, 8; measured 200…1024 B.
    network = pd.DataFrame(
        {
            "num_workers": [2, 2, 2],
            "devices_per_node": [2, 2, 2],
            "size": [200, 600, 1024],
            "time_stats.all_reduce.median": [0.1, 0.3, 0.5],
        }
    )
    network.to_csv(tmp_path / "all_reduce.csv", index=False)
    profile = import_vidur(folder, TINY, tp=2, all_reduce_csv=tmp_path / "all_reduce.csv")
    lin = len(LINEAR_OPS) * 0.01
    expected_ms = 2 * (lin * 4 + 2 * (0.1 + (512 - 200) / 400 * 0.2))
    assert _row(profile.rows, "prefill", input_tokens=4) == pytest.approx(expected_ms / 1e3)
    assert sorted(profile.of_kind("prefill")["input_tokens"]) == [2, 4, 8]  # n=1: 128 B < 200 B
    assert "1 num_tokens points outside the measured message sizes left out" in profile.meta.notes
    network.assign(num_workers=4).to_csv(tmp_path / "all_reduce.csv", index=False)
    with pytest.raises(InputError, match="no rows with num_workers=2 and devices_per_node=2"):
        import_vidur(folder, TINY, tp=2, all_reduce_csv=tmp_path / "all_reduce.csv")


def test_non_matching_attention_is_unused_and_noted(tmp_path: Path) -> None:
    attention = _attention_frame().assign(num_tensor_parallel_workers=2)
    profile = import_vidur(_folder(tmp_path, _mlp_frame(), attention), TINY)
    assert "attention.csv: attention shape does not match tiny tp=1; unused" in profile.meta.notes
    assert len(profile.of_kind("prefill")) == 4  # linear ops only, every num_tokens


# The knobs before the per-generation presets (efficiencies from Llama-2-7B's linear ops, hard
# max, no fixed terms), which the two tests below validate.
_BEFORE_PRESETS: dict[str, float] = {
    "compute_efficiency": 0.65,
    "bandwidth_efficiency": 0.7,
    "overhead_s": 0.0,
    "all_reduce_latency_s": 0.0,
    "elementwise_bytes": 0.0,
    "ridge_exponent": float("inf"),
    "kernel_latency_s": 0.0,
}


def test_roofline_prior_tracks_real_a100_measurements() -> None:
    """Out of sample: the roofline efficiencies come from Llama-2-7B linear ops; here Llama-2-70B
    at TP=2 with measured attention. All-reduce is removed from the roofline (Vidur has none)."""
    _needs_data()
    measured = import_vidur(A100 / "Llama-2-70b-hf", "Llama-2-70B", tp=2).rows
    prior = roofline_profile("A100-80GB", "Llama-2-70B", 2, **_BEFORE_PRESETS).rows
    message_s_per_token = 2 * 80 * 2 * (1 / 2) * 8192 * 2 / 300e9  # two all-reduces per layer
    for length in (256, 512, 1024, 2048, 4096):
        real = _row(measured, "prefill", input_tokens=length)
        model = _row(prior, "prefill", input_tokens=length, batch_size=1)
        assert model - message_s_per_token * length == pytest.approx(real, rel=0.10)
    for batch in (1, 8, 32):
        real = _row(measured, "decode", batch_size=batch, total_context_tokens=batch * 1024)
        model = _row(prior, "decode", batch_size=batch, total_context_tokens=batch * 1024)
        assert model - message_s_per_token * batch == pytest.approx(real, rel=0.10)


# Vidur's A100 DGX all_reduce.csv: median time of one all-reduce among 2 GPUs at 10-100 kB.
A100_ALL_REDUCE_LATENCY_S = 46e-6


def test_roofline_with_latency_and_elementwise_terms_tracks_real_totals() -> None:
    """Out of sample, against every measured term (all-reduce included): efficiencies from
    Llama-2-7B's linear ops, all-reduce latency from the network file, 20 B per token × layer ×
    hidden of elementwise traffic (issue 20's H100 figure), no fixed step overhead (Vidur's
    totals have none). Measured errors: prefill -19% at 128 tokens (fixed costs the roofline
    lacks), -4.3% to +2.1% at 256-4096; decode +3.5%, -2.0%, -3.5% at batch 1, 8, 32 (the
    bandwidth-only prior is -30% to -1% and -10% to -16%)."""
    _needs_data()
    all_reduce = VIDUR / "network" / "a100_dgx" / "all_reduce.csv"
    measured = import_vidur(A100 / "Llama-2-70b-hf", "Llama-2-70B", 2, all_reduce_csv=all_reduce)
    prior = roofline_profile(
        "A100-80GB",
        "Llama-2-70B",
        2,
        **{
            **_BEFORE_PRESETS,
            "all_reduce_latency_s": A100_ALL_REDUCE_LATENCY_S,
            "elementwise_bytes": 20.0,
        },
    ).rows
    for length in (256, 512, 1024, 2048, 4096):
        real = _row(measured.rows, "prefill", input_tokens=length)
        model = _row(prior, "prefill", input_tokens=length, batch_size=1)
        assert model == pytest.approx(real, rel=0.05)
    assert _row(prior, "prefill", input_tokens=128, batch_size=1) < _row(
        measured.rows, "prefill", input_tokens=128
    )
    for batch in (1, 8, 32):
        real = _row(measured.rows, "decode", batch_size=batch, total_context_tokens=batch * 1024)
        model = _row(prior, "decode", batch_size=batch, total_context_tokens=batch * 1024)
        assert model == pytest.approx(real, rel=0.05)


def test_gpu_comes_from_the_layout_or_must_be_given(tmp_path: Path) -> None:
    folder = tmp_path / "copied" / "tiny"
    folder.mkdir(parents=True)
    _mlp_frame().to_csv(folder / "mlp.csv", index=False)
    with pytest.raises(InputError, match="parent folder 'copied' is not a catalogued GPU"):
        import_vidur(folder, TINY)
    assert import_vidur(folder, TINY, gpu="A100-80GB").meta.gpu == "A100-80GB"


def test_ampere_preset_out_of_sample_on_real_a100_totals() -> None:
    """The Ampere preset is fitted on AIConfigurator's A100 TRT-LLM tables (Llama-3.1-8B TP1,
    70B TP4; calibration/roofline_validation.py); here Vidur's real A100 Llama-2-70B TP2 totals
    with all-reduce, every grid point both hold. As shipped (TRT-LLM's custom all-reduce, about
    5 µs per small call): prefill median 13%, max 17%; decode median 17%, max 20%, the preset
    faster. With the all-reduce law fitted on Vidur's own NCCL table at 4 and 8 GPUs (not the
    2 measured here; 26 µs + 0.6 µs per peer): prefill 12% / 17%, decode 11% / 14%. The rest is
    Vidur's slower kernels; the issue's 10% is NOT reached here."""
    _needs_data()
    validation = pytest.importorskip("calibration.roofline_validation")
    all_reduce = VIDUR / "network" / "a100_dgx" / "all_reduce.csv"
    measured = import_vidur(A100 / "Llama-2-70b-hf", "Llama-2-70B", 2, all_reduce_csv=all_reduce)
    nccl = validation.all_reduce_law(validation.vidur_all_reduce(VIDUR, (4, 8)), 300e9)
    keys = {
        "prefill": ["batch_size", "input_tokens"],
        "decode": ["batch_size", "total_context_tokens"],
    }
    cases = [
        (roofline_profile("A100-80GB", "Llama-2-70B", 2).rows, (0.14, 0.18), (0.18, 0.21)),
        (roofline_profile("A100-80GB", "Llama-2-70B", 2, **nccl).rows, (0.13, 0.18), (0.12, 0.15)),
    ]
    for prior, prefill, decode in cases:
        for kind, on in keys.items():
            both = measured.rows[measured.rows["kind"] == kind].merge(
                prior[prior["kind"] == kind], on=on, suffixes=("_real", "_prior")
            )
            error = (both["latency_s_prior"] / both["latency_s_real"] - 1).abs()
            median, most = prefill if kind == "prefill" else decode
            assert len(both) >= 6
            assert error.median() < median and error.max() < most, kind
