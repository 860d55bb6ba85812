"""The measured H100/H200 profiles in ``profiles/measured/`` and their comparison script."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from calibration import compare_measured
from pdopt.costmodel import fit_cost_model, gemm_peak_flops
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


def test_the_eight_files_are_shipped() -> None:
    assert [p.name for p in compare_measured.measured_paths()] == EXPECTED


def test_roofline_globs_do_not_see_them() -> None:
    """generate.py --check and the roofline tests glob the top level only."""
    top = {p.name for p in (ROOT / "profiles").glob("*.csv")}
    assert top.isdisjoint(EXPECTED)
    assert not list(MEASURED.glob("*_roofline.csv"))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
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
    assert list(table["file"]) == EXPECTED
    assert (table["gemm_peak_fraction"] < 1).all()
    assert (table["prefill_points"] >= 27).all()
    assert table[["prefill_ratio_median", "decode_ratio_median"]].notna().all().all()
    calibration = compare_measured.gemm_calibration()
    assert list(calibration["gpu"]) == ["H100-SXM", "H200"]
    assert (calibration["gemm_points"] > 0).all()
