"""``pdopt calibrate`` end to end, on the shipped roofline profile and on a temporary one."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest

from pdopt.cli import main
from pdopt.costmodel import CostModel, fit_cost_model
from pdopt.errors import FitQualityWarning
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model, param_count
from pdopt.profile import (
    ProfileMeta,
    profile_from_records,
    read_profile,
    roofline_knobs,
    roofline_profile,
    write_profile,
)

SHIPPED = Path(__file__).resolve().parents[2] / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv"


def _run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0
    payload: dict[str, Any] = json.loads(capsys.readouterr().out)
    return payload


def test_calibrate_shipped_profile_json(capsys: pytest.CaptureFixture[str]) -> None:
    payload = _run_json(capsys, ["calibrate", str(SHIPPED), "--json"])
    assert payload["meta"]["gpu"] == "V100-32GB"
    model = CostModel.from_dict(payload["cost_model"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FitQualityWarning)  # the shipped profile fits cleanly
        expected, reports = fit_cost_model(read_profile(SHIPPED))
    assert model == expected
    assert payload["warnings"] == []
    assert set(payload["reports"]) == {"prefill", "decode", "ttft"}
    for name, report in reports.items():
        assert payload["reports"][name] == report.to_dict(residuals=False)
    # The roofline's prefill is compute-bound: the linear model fits it closely, with P_peak near
    # the generation preset's GEMM efficiency × the V100's 125 TFLOP/s (the smooth roofline's
    # ridge and the fixed overhead move it slightly).
    efficiency = roofline_knobs(get_gpu("V100-32GB")).compute_efficiency
    assert payload["reports"]["prefill"]["r2"] > 0.999
    assert model.prefill.p_peak_flops == pytest.approx(efficiency * 125e12, rel=0.02)
    # Its decode time is a smooth max of memory and compute, which d0 + d1·B + d2·C follows
    # well but not exactly.
    assert 0.95 < payload["reports"]["decode"]["r2"] < 1.0


def test_calibrate_table_and_warning_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", str(SHIPPED)]) == 0
    captured = capsys.readouterr()
    model, _ = fit_cost_model(read_profile(SHIPPED))
    assert f"P_peak {model.prefill.p_peak_flops / 1e12:13.2f} TFLOP/s" in captured.out
    for label in ("prefill", "decode", "ttft", "CV MAPE %", "d2", "α", "β", "t0"):
        assert label in captured.out
    assert captured.err == ""
    # A hard-max roofline's decode bends where the linear τ(B, C) cannot: the warning goes to
    # stderr, the table still to stdout.
    hard = tmp_path / "hard.csv"
    write_profile(roofline_profile("V100-32GB", "Qwen2.5-7B", ridge_exponent=math.inf), hard)
    assert main(["calibrate", str(hard)]) == 0
    captured = capsys.readouterr()
    assert "Decode   τ(B, C)" in captured.out
    assert captured.err.startswith("pdopt: warning: decode fit (d0 + d1·B + d2·C) on ")


def test_calibrate_tmp_profile_with_reference_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha, beta, peak, t0 = 2.0e5, 1.4e10, 2.0e14, 0.003
    records: list[dict[str, Any]] = [
        {"kind": "gemm", "m": 4096, "n": 4096, "k": 4096, "latency_s": 2 * 4096**3 / peak}
    ]
    for batch in (1, 2, 4):
        for length in (128, 512, 1024, 2048, 4096):
            latency = t0 + batch * (alpha * length**2 + beta * length) / peak
            records.append(
                {
                    "kind": "prefill",
                    "batch_size": batch,
                    "input_tokens": length,
                    "latency_s": latency,
                }
            )
    for batch in (1, 8, 64):
        for context in (256, 2048):
            latency = 0.01 + 2e-5 * batch + 5e-8 * batch * context
            records.append(
                {
                    "kind": "decode",
                    "batch_size": batch,
                    "total_context_tokens": batch * context,
                    "latency_s": latency,
                }
            )
    meta = ProfileMeta(gpu="A100-80GB", model="Llama-3-8B", source="test")
    path = write_profile(profile_from_records(meta, records), tmp_path / "tiny.csv")

    payload = _run_json(
        capsys, ["calibrate", str(path), "--reference-model", "Llama-2-7B", "--json", "--residuals"]
    )
    p_m = param_count(get_model("Llama-3-8B")) / param_count(get_model("Llama-2-7B"))
    prefill = payload["cost_model"]["prefill"]
    assert prefill["p_m"] == pytest.approx(p_m)
    assert prefill["beta_flop_per_token"] * p_m == pytest.approx(beta, rel=1e-6)
    assert prefill["alpha_flop_per_token2"] == pytest.approx(alpha, rel=1e-6)
    assert prefill["intercept_s"] == pytest.approx(t0, rel=1e-6)
    decode = payload["cost_model"]["decode"]
    assert (decode["d0_s"], decode["d1_s_per_request"], decode["d2_s_per_token"]) == (
        pytest.approx(0.01, rel=1e-6),
        pytest.approx(2e-5, rel=1e-6),
        pytest.approx(5e-8, rel=1e-6),
    )
    assert len(payload["reports"]["prefill"]["residuals_s"]) == 15
    assert payload["warnings"] == []
    assert not math.isnan(payload["reports"]["decode"]["cv_mape_pct"])


def test_calibrate_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(tmp_path / "missing.csv"), "--json"]) == 1
    assert "cannot read profile file" in capsys.readouterr().err
    meta = ProfileMeta(gpu="A100-80GB", model="Llama-2-7B")
    records = [{"kind": "gemm", "m": 64, "n": 64, "k": 64, "latency_s": 1e-5}]
    path = write_profile(profile_from_records(meta, records), tmp_path / "gemm_only.csv")
    assert main(["calibrate", str(path)]) == 1
    assert "gemm_only.csv: 0 prefill rows; fitting needs at least 3" in capsys.readouterr().err


VIDUR_7B = Path(__file__).resolve().parents[3] / "shared/data/vidur-profiling/a100/Llama-2-7b-hf"


@pytest.mark.skipif(
    not VIDUR_7B.is_dir(), reason="shared/data/vidur-profiling is not beside the repo"
)
def test_readme_import_then_calibrate_fits_what_the_data_supports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's path: an MLP-only Vidur import fits prefill (and TTFT); decode is reported
    as not fitted, with the reason, instead of failing the whole command."""
    out = tmp_path / "a100_llama2_7b.csv"
    assert main(["profile", "import-vidur", str(VIDUR_7B), "--model", "Llama-2-7B",
                 "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    payload = _run_json(capsys, ["calibrate", str(out), "--json"])
    assert payload["meta"]["gpu"] == "A100-80GB"
    assert payload["cost_model"]["decode"] is None and payload["cost_model"]["prefill"]
    assert set(payload["reports"]) == {"prefill", "ttft"}
    assert "cannot be separated" in payload["not_fitted"]["decode"]
    # the README's table: R² 0.9987, MAPE 5.09% on these measurements
    assert payload["reports"]["prefill"]["r2"] == pytest.approx(0.9987, abs=5e-5)
    assert payload["reports"]["prefill"]["mape_pct"] == pytest.approx(5.09, abs=5e-3)
    assert any(w.startswith("decode not fitted: ") for w in payload["warnings"])


def test_calibrate_shows_the_decode_error_by_batch_region(
    capsys: pytest.CaptureFixture[str],
) -> None:
    payload = _run_json(capsys, ["calibrate", str(SHIPPED), "--json"])
    regions = payload["reports"]["decode"]["by_batch_region"]
    assert [r["region"] for r in regions] == ["1-8", "9-32", "33-128", ">128"]
    assert regions[-1]["b_high"] is None  # the open region, valid JSON
    assert "by_batch_region" not in payload["reports"]["prefill"]
    assert main(["calibrate", str(SHIPPED)]) == 0
    table = capsys.readouterr().out
    assert "Decode error by batch region" in table
    first = next(line for line in table.splitlines() if line.strip().startswith("1-8"))
    assert f"{regions[0]['bias_pct']:+.2f}" in first and f"{regions[0]['mape_pct']:.2f}" in first
