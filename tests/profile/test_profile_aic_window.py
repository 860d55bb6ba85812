"""``import_aic`` for sliding-window models: full layers read the attention rows at
``window_size`` 0, sliding layers those at the model's window, each iteration equal to the hand
sum of the lookups; a table without the window is an error naming the windows it has (one
without the column holds full attention only); the
KV-capacity filter counts the window. On the real database (when installed), gpt-oss-20b's
windowed layers are read from AIConfigurator's ``window_size=128`` rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

import pdopt.profile._aic as aic
from pdopt.errors import InputError
from pdopt.model_spec import get_model
from pdopt.profile import import_aic
from tests.profile.test_profile_aic import (
    CONTEXT_MS,
    GENERATION_MS,
    TINY,
    _database,
    _expected_s,
    _installed,
)

WINDOW = 64
WINDOW_SCALE = 0.25  # windowed kernels' latency relative to full attention (synthetic)
TINY_SWA = dataclasses.replace(
    TINY, name="tiny-swa", sliding_window_tokens=WINDOW, sliding_window_layers=1
)  # 2 layers: one full, one sliding


def _add_window_rows(root: Path, window: int) -> None:
    """Copies of the synthetic attention rows at ``window_size=window``, WINDOW_SCALE as slow."""
    folder = root / "systems" / "data" / "tiny_gpu" / "attention" / "vllm" / "1.0"
    for table in ("context_attention_perf", "generation_attention_perf"):
        path = folder / f"{table}.csv"
        frame = pd.read_csv(path)
        windowed = frame.assign(window_size=window, latency=frame["latency"] * WINDOW_SCALE)
        pd.concat([frame, windowed]).to_csv(path, index=False)


@pytest.fixture
def window_root(tmp_path: Path) -> Path:
    root = _database(tmp_path / "aic")
    _add_window_rows(root, WINDOW)
    return root


@pytest.mark.parametrize("tp", [1, 2])
def test_sliding_layers_read_the_window_rows(window_root: Path, tp: int) -> None:
    profile = import_aic(window_root, "tiny_gpu", "vllm", TINY_SWA, tp)
    rows = profile.rows
    for row in rows[rows["kind"] == "prefill"].itertuples():
        b, length = int(row.batch_size), int(row.input_tokens)
        full = CONTEXT_MS * b * length
        # _expected_s counts its attention_ms in each of TINY's 2 layers: 1 full + 1 sliding
        mean_ms = (full + WINDOW_SCALE * full) / 2
        want = _expected_s(b * length, b, mean_ms, tp, 1.0)
        assert row.latency_s == pytest.approx(want, rel=1e-9)
    for row in rows[rows["kind"] == "decode"].itertuples():
        b, context = int(row.batch_size), int(row.total_context_tokens) // int(row.batch_size)
        full = GENERATION_MS * b * context
        want = _expected_s(b, b, (full + WINDOW_SCALE * full) / 2, tp, 1.0)
        assert row.latency_s == pytest.approx(want, rel=1e-9)
    assert "window_size=0" in profile.meta.notes
    assert f"window_size={WINDOW}" in profile.meta.notes


def test_every_layer_sliding_reads_only_the_window_rows(window_root: Path) -> None:
    every = dataclasses.replace(TINY_SWA, name="all-swa", sliding_window_layers=2)
    rows = import_aic(window_root, "tiny_gpu", "vllm", every).rows
    row = rows[(rows["kind"] == "decode") & (rows["batch_size"] == 4)].iloc[0]
    context = int(row["total_context_tokens"]) // 4
    want = _expected_s(4, 4, WINDOW_SCALE * GENERATION_MS * 4 * context, 1, 1.0)
    assert row["latency_s"] == pytest.approx(want, rel=1e-9)


def test_full_attention_models_ignore_the_window_rows(window_root: Path, tmp_path: Path) -> None:
    """TINY reads the same rows whether or not the table holds windowed ones."""
    plain = import_aic(_database(tmp_path / "plain"), "tiny_gpu", "vllm", TINY).rows
    mixed = import_aic(window_root, "tiny_gpu", "vllm", TINY).rows
    pd.testing.assert_frame_equal(plain, mixed)


def test_a_missing_window_is_an_error_naming_the_windows(tmp_path: Path) -> None:
    root = _database(tmp_path / "aic")
    _add_window_rows(root, 128)
    with pytest.raises(
        InputError,
        match=r"tiny-swa has 1 sliding-window layers of 64 tokens.*window_size takes 0, 128",
    ):
        import_aic(root, "tiny_gpu", "vllm", TINY_SWA)


def _drop_window_column(root: Path) -> None:
    folder = root / "systems" / "data" / "tiny_gpu" / "attention" / "vllm" / "1.0"
    for table in ("context_attention_perf", "generation_attention_perf"):
        path = folder / f"{table}.csv"
        pd.read_csv(path).drop(columns="window_size").to_csv(path, index=False)


def test_a_table_without_the_window_column_holds_full_attention(tmp_path: Path) -> None:
    """Older collections (AIConfigurator's A100 vLLM and SGLang tables) have no
    ``window_size`` column: their rows are full attention, read as the window-0 rows are; a
    sliding-window model still needs windowed rows and gets the error naming the column."""
    plain = import_aic(_database(tmp_path / "plain"), "tiny_gpu", "vllm", TINY).rows
    root = _database(tmp_path / "old")
    _drop_window_column(root)
    pd.testing.assert_frame_equal(import_aic(root, "tiny_gpu", "vllm", TINY).rows, plain)
    with pytest.raises(InputError, match=r"tiny-swa has 1 sliding-window layers.*'window_size'"):
        import_aic(root, "tiny_gpu", "vllm", TINY_SWA)


def test_capacity_filter_counts_the_window(
    window_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a capacity of C tokens held in every layer, a decode point of B requests at
    context L is kept iff B · (L + min(L, W)) / 2 <= C (one of two layers sliding); a prefill
    point iff B · L <= C (every prompt token is written)."""
    capacity = 4200
    monkeypatch.setitem(aic.AIC_SYSTEM_GPUS, "tiny_gpu", "H200")
    monkeypatch.setattr(aic, "kv_capacity_tokens", lambda *args, **kwargs: capacity)
    profile = import_aic(window_root, "tiny_gpu", "vllm", TINY_SWA)
    rows = profile.rows
    decode = rows[rows["kind"] == "decode"]
    kept = {(int(r.batch_size), int(r.total_context_tokens)) for r in decode.itertuples()}
    want = {
        (b, b * length)
        for b in aic.DECODE_BATCH_SIZES
        for length in aic.DECODE_CONTEXT_TOKENS
        if b * (length + min(length, WINDOW)) / 2 <= capacity
    }
    assert kept == want
    # beyond the capacity as full attention, within it with the window:
    assert (1, 8192) in kept and (2, 2 * 4096) in kept  # 4128 and 4160 tokens held
    prefill = rows[rows["kind"] == "prefill"]
    assert (prefill["batch_size"] * prefill["input_tokens"]).max() == 4096
    assert f"KV capacity {capacity} tokens" in profile.meta.notes


@pytest.mark.skipif(not _installed(), reason="aiconfigurator-core not installed (pdopt[aic])")
def test_real_gpt_oss_reads_the_window_rows() -> None:
    """gpt-oss-20b on H200 (vLLM, TP1): a prefill of one 8192-token prompt (a measured point,
    no interpolation) is faster than an all-full-attention copy's by exactly its 12 sliding
    layers × (full − windowed) attention, read from the measured table by hand; at 8k context
    decode is faster too."""
    from pdopt.profile._aic_data import find_database, load_table, versions

    spec = get_model("gpt-oss-20b")
    full = dataclasses.replace(
        spec, name="gpt-oss-20b-full", sliding_window_tokens=None, sliding_window_layers=0
    )
    windowed = import_aic("auto", "h200_sxm", "vllm", spec).rows
    unwindowed = import_aic("auto", "h200_sxm", "vllm", full).rows
    db = find_database("auto")
    version = versions(db, "h200_sxm", "attention", "vllm")[-1]
    frame = load_table(db, "h200_sxm", "attention", "vllm", version, "context_attention_perf")
    table = frame.frame
    point = table[
        (table["num_heads"] == 64)
        & (table["num_key_value_heads"] == 8)
        & (table["head_dim"] == 64)
        & (table["kv_cache_dtype"] == "bfloat16")
        & (table["batch_size"] == 1)
        & (table["isl"] == 8192)
    ]
    assert point["kernel_source"].nunique() == 1  # one kernel: no choice to reproduce
    by_window = point.groupby("window_size")["latency"].mean() / 1e3
    saved = 12 * (by_window[0] - by_window[128])

    def latency(rows: pd.DataFrame, kind: str, batch: int, key: str, value: int) -> float:
        hit = rows[(rows["kind"] == kind) & (rows["batch_size"] == batch) & (rows[key] == value)]
        assert len(hit) == 1
        return float(hit["latency_s"].iloc[0])

    got = latency(unwindowed, "prefill", 1, "input_tokens", 8192) - latency(
        windowed, "prefill", 1, "input_tokens", 8192
    )
    assert saved > 0 and got == pytest.approx(saved, rel=1e-9)
    fast = latency(windowed, "decode", 8, "total_context_tokens", 8 * 8192)
    slow = latency(unwindowed, "decode", 8, "total_context_tokens", 8 * 8192)
    assert fast < slow
