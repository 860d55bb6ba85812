"""The measured H100/H200 profiles in ``profiles/measured/`` (eager and CUDA-graph runs, and the
graph run's mixed batches) and their comparison script."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from calibration import compare_measured
from pdopt.costmodel import fit_cost_model, gemm_peak_flops, roofline_cost_model
from pdopt.errors import ParameterError
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model
from pdopt.profile import read_profile

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "profiles" / "measured"
MODELS = ("llama-3-8b", "llama-2-7b", "qwen2.5-7b", "codellama-34b")
GPUS = {"h100-sxm": ("H100-SXM", "NVIDIA H100 80GB HBM3"), "h200": ("H200", "NVIDIA H200")}
EXPECTED = sorted(f"{gpu}_{model}_measured.csv" for gpu in GPUS for model in MODELS)
PATHS = [MEASURED / name for name in EXPECTED]
GRAPH_MODELS = ("llama-3-8b", "llama-2-7b", "qwen2.5-7b")
GRAPHS_EXPECTED = sorted(f"{gpu}_{model}_graphs.csv" for gpu in GPUS for model in GRAPH_MODELS)
MIXED_EXPECTED = sorted(f"{gpu}_{model}_graphs_mixed.csv" for gpu in GPUS for model in GRAPH_MODELS)
GRAPH_PATHS = [MEASURED / name for name in GRAPHS_EXPECTED]
MIXED_PATHS = [MEASURED / name for name in MIXED_EXPECTED]


def test_the_files_are_shipped() -> None:
    assert [p.name for p in compare_measured.measured_paths()] == EXPECTED
    assert [p.name for p in compare_measured.graphs_paths()] == GRAPHS_EXPECTED
    assert [p.name for p in compare_measured.mixed_paths()] == MIXED_EXPECTED
    every = [p.name for p in compare_measured.profile_paths()]
    assert sorted(every) == sorted(EXPECTED + GRAPHS_EXPECTED)
    # each model's eager file comes right before its graphs file
    for name in GRAPHS_EXPECTED:
        assert every[every.index(name) - 1] == name.replace("_graphs.csv", "_measured.csv")
    for gpu in GPUS:  # each graph run's gpu.txt and logs.txt, verbatim
        for name in (f"{gpu}_graphs_gpu.txt", f"{gpu}_graphs_logs.txt"):
            assert (MEASURED / name).is_file()
        assert GPUS[gpu][1] in (MEASURED / f"{gpu}_graphs_gpu.txt").read_text(encoding="utf-8")


def test_roofline_globs_do_not_see_them() -> None:
    """generate.py --check and the roofline tests glob the top level only."""
    top = {p.name for p in (ROOT / "profiles").glob("*.csv")}
    assert top.isdisjoint(EXPECTED + GRAPHS_EXPECTED + MIXED_EXPECTED)
    assert not list(MEASURED.glob("*_roofline.csv"))


@pytest.mark.parametrize("path", PATHS + GRAPH_PATHS, ids=lambda p: p.name)
def test_measured_profile(path: Path) -> None:
    profile = read_profile(path)
    gpu, device_name = GPUS[path.name.split("_", 1)[0]]
    meta = profile.meta
    assert compare_measured.catalogue_gpu(path) == gpu
    assert meta.gpu == device_name  # verbatim: the torch device name, not the catalogue's
    assert meta.model.lower() == path.name.split("_")[1]
    assert meta.tp == 1
    assert meta.source == "measured:calibration.profile_gpu"
    assert meta.dtype == get_model(meta.model).dtype
    assert "median of 5 repeats after 2 warm-up runs" in meta.notes
    assert "layers (memory); latency = t_head + (t_" in meta.notes
    graphs = compare_measured.harness(path) == compare_measured.GRAPHS
    assert ("CUDA graphs: every prefill, decode and mixed forward pass" in meta.notes) == graphs
    assert "CUDA graph capture failed" not in meta.notes  # no pass fell back to eager
    counts = profile.rows["kind"].value_counts().to_dict()
    assert counts == {"gemm": 16, "prefill": 28, "decode": 63}
    assert (profile.rows["latency_s"] > 0).all()
    prefill = profile.of_kind("prefill")
    assert sorted(set(prefill["batch_size"])) == [1, 2, 4, 8]
    assert sorted(set(prefill["input_tokens"])) == [2**i for i in range(7, 14)]
    decode = profile.of_kind("decode")
    assert sorted(set(decode["batch_size"])) == [2**i for i in range(9)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost, reports = fit_cost_model(profile)
    assert set(reports) == {"prefill", "decode", "ttft"}
    for value in (
        cost.prefill.p_peak_flops,
        cost.prefill.alpha_flop_per_token2,
        cost.prefill.beta_flop_per_token,
        cost.decode.d0_s,
        cost.decode.d2_s_per_token,
    ):
        assert math.isfinite(value) and value > 0
    peak = gemm_peak_flops(profile)
    assert 0.5 * get_gpu(gpu).peak_flops < peak < get_gpu(gpu).peak_flops


def test_matched_points_are_ratios_on_the_shared_grid() -> None:
    path = MEASURED / "h100-sxm_llama-2-7b_measured.csv"
    decode = compare_measured.matched_points(path, "decode")
    measured = read_profile(path).of_kind("decode")
    assert 0 < len(decode) <= len(measured)
    np.testing.assert_allclose(decode["ratio"], decode["roofline_s"] / decode["measured_s"])
    row = decode[(decode["batch_size"] == 1) & (decode["total_context_tokens"] == 128)].iloc[0]
    hit = measured[(measured["batch_size"] == 1) & (measured["total_context_tokens"] == 128)]
    assert row["measured_s"] == hit["latency_s"].iloc[0]
    assert len(compare_measured.matched_points(path, "prefill")) == 28


def test_a_board_the_catalogue_does_not_hold_is_an_error(tmp_path: Path) -> None:
    text = (MEASURED / "h100-sxm_llama-2-7b_measured.csv").read_text(encoding="utf-8")
    other = tmp_path / "gtx1080_llama-2-7b_measured.csv"
    other.write_text(text.replace("# gpu: NVIDIA H100 80GB HBM3", "# gpu: NVIDIA GeForce GTX 1080"))
    with pytest.raises(ParameterError, match="unknown GPU 'NVIDIA GeForce GTX 1080'"):
        compare_measured.catalogue_gpu(other)


def test_readme_table_is_current() -> None:
    """The README's generated tables equal compare_measured's output (its --check)."""
    assert compare_measured.main(["--check"]) == 0


def test_comparison_frame() -> None:
    table = compare_measured.compare()
    assert sorted(table["file"]) == sorted(EXPECTED + GRAPHS_EXPECTED)
    assert (table["gemm_peak_fraction"] < 1).all()
    assert (table["prefill_points"] >= 27).all()
    assert table[["prefill_ratio_median", "decode_ratio_median"]].notna().all().all()
    calibration = compare_measured.gemm_calibration()
    runs = calibration[["harness", "gpu", "profiles"]].itertuples(index=False, name=None)
    assert list(runs) == [
        (compare_measured.EAGER, "H100-SXM", 4),
        (compare_measured.EAGER, "H200", 4),
        (compare_measured.GRAPHS, "H100-SXM", 3),
        (compare_measured.GRAPHS, "H200", 3),
    ]
    assert (calibration["gemm_points"] > 0).all()


def test_eager_and_graph_rows_side_by_side() -> None:
    table = compare_measured.compare()
    assert list(table["file"]) == [p.name for p in compare_measured.profile_paths()]
    assert set(table["harness"]) == {compare_measured.EAGER, compare_measured.GRAPHS}
    gap = compare_measured.gap_closed(table)
    assert [(r.gpu, r.model) for r in gap.itertuples()] == [
        ("H100-SXM", "Llama-2-7B"),
        ("H100-SXM", "Llama-3-8B"),
        ("H100-SXM", "Qwen2.5-7B"),
        ("H200", "Llama-2-7B"),
        ("H200", "Llama-3-8B"),
        ("H200", "Qwen2.5-7B"),
    ]
    # the graph replays remove most of the eager host floor, not all of the gap to the roofline
    assert (gap["decode_floor_graphs_ms"] < 0.6 * gap["decode_floor_eager_ms"]).all()
    assert (gap["decode_floor_graphs_ms"] > gap["decode_floor_roofline_ms"]).all()
    column = "decode_ratio_small_median"
    closed = (gap[f"{column}_graphs"] - gap[f"{column}_eager"]) / (1 - gap[f"{column}_eager"])
    np.testing.assert_allclose(gap[f"{column}_gap_closed"], closed)


@pytest.mark.parametrize("path", MIXED_PATHS, ids=lambda p: p.name)
def test_mixed_file(path: Path) -> None:
    header, rows = compare_measured.read_mixed(path)
    assert tuple(rows.columns) == compare_measured.MIXED_COLUMNS
    profile_path = compare_measured.mixed_profile_path(path)
    assert profile_path.name == path.name.replace("_mixed.csv", ".csv")
    meta = read_profile(profile_path).meta
    assert (header["gpu"], header["model"], header["dtype"]) == (meta.gpu, meta.model, meta.dtype)
    assert int(header["tp"]) == 1 and header["source"] == meta.source
    assert header["notes"] == meta.notes
    grid = sorted(
        rows[["batch_size", "context_tokens", "chunk_tokens"]].itertuples(index=False, name=None)
    )
    assert grid == [(b, 1024, p) for b in (8, 32, 128) for p in (256, 1024, 2048)]
    assert (rows["modes"] == "graph/graph/graph").all()
    assert (rows[["latency_s", "decode_only_s", "prefill_only_s"]] > 0).all().all()
    # the harness wrote the ratio from unrounded times; the CSV holds 6 significant digits
    separate = rows["decode_only_s"] + rows["prefill_only_s"]
    np.testing.assert_allclose(rows["ratio"], rows["latency_s"] / separate, rtol=2e-5)
    assert (rows["ratio"] < 1).all()  # fusing saved time at every point


@pytest.mark.parametrize("prefix", sorted(GPUS))
def test_mixed_check_is_pdopts_fused_iteration(prefix: str) -> None:
    path = MEASURED / f"{prefix}_llama-3-8b_graphs_mixed.csv"
    check = compare_measured.mixed_check(path)
    assert len(check) == 9
    gpu = GPUS[prefix][0]
    assert (check["gpu"] == gpu).all()  # priced on the file's own GPU
    roofline = roofline_cost_model(gpu, "Llama-3-8B")
    fitted = compare_measured.fitted_cost_model(MEASURED / f"{prefix}_llama-3-8b_graphs.csv")
    assert fitted.hybrid is None  # no hybrid rows: the pass is composed from the two fits
    for row in check.itertuples():
        b, c, p = row.batch_size, row.context_tokens, row.chunk_tokens
        for cost, fused, ratio in (
            (roofline, row.roofline_fused_s, row.roofline_ratio),
            (fitted, row.fit_fused_s, row.fit_ratio),
        ):
            assert fused == cost.hybrid_iteration_time_s([p], b, b * c, [0])
            decode = float(cost.decode.iteration_time_s(b, b * c))
            prefill = float(cost.prefill.batch_time_s([p]))
            assert ratio == pytest.approx(fused / (decode + prefill), rel=1e-12)
            assert max(decode, prefill) / (decode + prefill) <= ratio <= 1
        separate = row.measured_decode_s + row.measured_prefill_s
        assert row.overlap_ratio <= row.form_ratio <= 1
        assert row.form_fused_s == pytest.approx(row.form_ratio * separate, rel=1e-12)
        assert row.measured_ratio == pytest.approx(row.measured_fused_s / separate, rel=2e-5)


def test_a_mixed_file_with_other_columns_is_refused(tmp_path: Path) -> None:
    text = (MEASURED / "h100-sxm_llama-2-7b_graphs_mixed.csv").read_text(encoding="utf-8")
    other = tmp_path / "x_graphs_mixed.csv"
    other.write_text(text.replace(",ratio,modes", ",fused_ratio,modes"), encoding="utf-8")
    with pytest.raises(ValueError, match="columns"):
        compare_measured.read_mixed(other)


def test_mixed_table_has_both_graph_runs() -> None:
    """Every mixed file (H100 and H200) enters the README's mixed tables, 9 points each."""
    table = compare_measured.mixed_table()
    counts = table.groupby(["gpu", "model"]).size().to_dict()
    assert counts == {
        (gpu, model): 9
        for gpu in ("H100-SXM", "H200")
        for model in ("Llama-2-7B", "Llama-3-8B", "Qwen2.5-7B")
    }
