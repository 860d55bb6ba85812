"""Calibrating the roofline prior's compute efficiency on measured GEMMs (by hand, and on
Vidur's real A100 where ``../shared`` is present)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from pdopt.cli import main
from pdopt.errors import InputError, ParameterError
from pdopt.hardware import GPU_GENERATIONS, get_gpu
from pdopt.profile import (
    PRESET_GEMM_EFFICIENCY,
    ROOFLINE_PRESETS,
    Profile,
    ProfileMeta,
    calibrate_compute_efficiency,
    gemm_compute_efficiency,
    import_vidur,
    profile_from_records,
    read_profile,
    roofline_profile,
    write_profile,
)

A100 = get_gpu("A100-80GB")
VIDUR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "vidur-profiling"
BIG_SHAPES = ((8192, 8192), (28672, 8192), (8192, 28672), (10240, 8192))


def _gemm_profile(
    efficiency: float,
    *,
    gpu: str = "A100-80GB",
    dtype: str = "bfloat16",
    small_latency_s: float = 1e-3,
    shapes: tuple[tuple[int, int], ...] = BIG_SHAPES,
) -> Profile:
    """GEMM rows of ``shapes`` at m = 4096 running exactly at ``efficiency`` of the A100's
    16-bit peak, and at m = 16 (memory-bound) taking ``small_latency_s``."""
    records = []
    for n, k in shapes:
        flops = 2.0 * 4096 * n * k
        latency = flops / (efficiency * A100.peak_flops)
        records.append({"kind": "gemm", "m": 4096, "n": n, "k": k, "latency_s": latency})
        records.append({"kind": "gemm", "m": 16, "n": n, "k": k, "latency_s": small_latency_s})
    return profile_from_records(ProfileMeta(gpu, "Llama-3.1-70B", dtype, 1, "test"), records)


def test_the_preset_is_scaled_by_measured_over_reference_gemm_speed() -> None:
    result = calibrate_compute_efficiency(_gemm_profile(0.6))
    preset = ROOFLINE_PRESETS["ampere"].compute_efficiency
    assert result.gemm_efficiency == pytest.approx(0.6)
    assert result.reference_gemm_efficiency == PRESET_GEMM_EFFICIENCY["ampere"]
    assert result.compute_efficiency == pytest.approx(preset * 0.6 / 0.834)
    assert result.gemm_points == len(BIG_SHAPES)  # the m = 16 rows are memory-bound
    assert f"= {result.compute_efficiency:.4g}" in result.describe()


def test_memory_bound_rows_do_not_move_it_and_the_median_ignores_one_outlier() -> None:
    base = calibrate_compute_efficiency(_gemm_profile(0.6))
    slow_small = calibrate_compute_efficiency(_gemm_profile(0.6, small_latency_s=1.0))
    assert slow_small.compute_efficiency == base.compute_efficiency
    outlier = _gemm_profile(0.05, shapes=((8192, 8192),))
    pooled = calibrate_compute_efficiency([_gemm_profile(0.6), outlier])
    assert pooled.gemm_efficiency == pytest.approx(0.6)
    assert pooled.gemm_points == len(BIG_SHAPES) + 1


def test_estimator_counts_only_rows_past_the_ridge() -> None:
    gemm = _gemm_profile(0.7).of_kind("gemm")
    efficiency, points = gemm_compute_efficiency(gemm, A100)
    assert (efficiency, points) == (pytest.approx(0.7), len(BIG_SHAPES))
    efficiency, points = gemm_compute_efficiency(gemm[gemm["m"] == 16], A100)
    assert np.isnan(efficiency) and points == 0


def test_a_roofline_profile_calibrates_back_near_its_own_knob() -> None:
    # its compute-bound rows run at the knob, slowed only by the smooth roofline's bend
    slow = roofline_profile("A100-80GB", "Llama-3.1-70B", 4, compute_efficiency=0.6)
    result = calibrate_compute_efficiency(slow)
    assert 0.55 < result.gemm_efficiency <= 0.6
    assert result.compute_efficiency < ROOFLINE_PRESETS["ampere"].compute_efficiency


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (_gemm_profile(0.6, gpu="H100-SXM"), "not A100-80GB: calibrate each GPU"),
        (_gemm_profile(0.6, dtype="fp8"), "16-bit GEMMs"),
        (_gemm_profile(0.6, shapes=((8192, 8192),)), "1 compute-bound gemm rows"),
        (_gemm_profile(1.1), "> 1: check that the profiles were measured"),
    ],
)
def test_bad_profiles_are_refused_with_the_file_and_what_to_do(
    profile: Profile, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        calibrate_compute_efficiency(profile, "A100-80GB")


def test_no_gemm_rows_no_profiles_and_an_uncatalogued_gpu_are_refused() -> None:
    steps = roofline_profile("A100-80GB", "Llama-3.1-8B")
    no_gemm = dataclasses.replace(steps, rows=steps.rows[steps.rows["kind"] != "gemm"])
    with pytest.raises(InputError, match="no gemm rows"):
        calibrate_compute_efficiency(no_gemm)
    with pytest.raises(ParameterError, match="at least one profile"):
        calibrate_compute_efficiency([])
    with pytest.raises(InputError, match="not catalogued"):
        calibrate_compute_efficiency(_gemm_profile(0.6, gpu="a100_sxm"))


def test_generations_that_borrow_a_preset_borrow_its_reference() -> None:
    assert set(PRESET_GEMM_EFFICIENCY) == set(GPU_GENERATIONS)
    for generation in GPU_GENERATIONS:
        owner = next(
            g
            for g in ("hopper", "ampere", "ada", "blackwell")
            if ROOFLINE_PRESETS[g].compute_efficiency
            == ROOFLINE_PRESETS[generation].compute_efficiency
        )
        assert PRESET_GEMM_EFFICIENCY[generation] == PRESET_GEMM_EFFICIENCY[owner]


def test_cli_roofline_calibrated_on_a_gemm_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = tmp_path / "measured.csv"
    write_profile(_gemm_profile(0.6), measured)
    out = tmp_path / "prior.csv"
    argv = ["profile", "roofline", "--gpu", "A100-80GB", "--model", "Llama-3.1-8B"]
    assert main([*argv, "--calibrate-gemm", str(measured), "--out", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    calibration = payload["calibration"]
    assert calibration["gemm_efficiency"] == pytest.approx(0.6)
    assert calibration["sources"] == [str(measured)]
    written = read_profile(out)
    assert "calibrated on 4 compute-bound GEMMs" in written.meta.notes
    preset = roofline_profile("A100-80GB", "Llama-3.1-8B").of_kind("prefill")
    slower = written.of_kind("prefill")["latency_s"].to_numpy() > preset["latency_s"].to_numpy()
    assert slower.all()
    both = [*argv, "--calibrate-gemm", str(measured), "--compute-efficiency", "0.5"]
    assert main([*both, "--out", str(out)]) != 0
    assert "not both" in capsys.readouterr().err


@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared/data/vidur-profiling not present")
def test_vidur_a100_calibrated_on_other_models_gemms_fits_its_70b_prefill() -> None:
    """The real A100 (Vidur, Llama-2-70B TP2): the preset is 11% fast at the median prefill
    point; calibrated on the same machine's GEMMs of Llama-2-7B and Llama-3-8B, within 5% at
    the median and 11% at every point, decode unchanged (README table)."""
    validation = pytest.importorskip("calibration.roofline_validation")
    others = [
        import_vidur(VIDUR / "a100" / folder, model, tp)
        for folder, model in validation.VIDUR_CALIBRATION_MODELS
        for tp in (1, 2, 4, 8)
    ]
    result = calibrate_compute_efficiency(others)
    assert 0.68 < result.gemm_efficiency < 0.72  # against 0.834 on AIConfigurator's A100
    source = next(s for s in validation.SOURCES if s.kind == "vidur")
    truth = validation.measured(source, "auto", VIDUR).rows
    knobs, _ = validation.source_knobs(source, VIDUR)
    preset = validation.log_errors(source, truth, knobs)
    calibrated = validation.log_errors(
        source, truth, dataclasses.replace(knobs, compute_efficiency=result.compute_efficiency)
    )
    pct = {name: 100 * np.abs(np.expm1(e["prefill"])) for name, e in
           (("preset", preset), ("calibrated", calibrated))}  # fmt: skip
    assert np.median(pct["preset"]) > 10.0
    assert np.median(pct["calibrated"]) < 5.0
    assert pct["calibrated"].max() < 11.0
    assert np.abs(np.expm1(calibrated["decode"])).max() < 0.06


def test_references_are_the_fit_gemms_and_calibration_is_neutral_on_aic_rows(
    aic_dir: str,
) -> None:
    """The shipped references are ``--fit``'s; on every AIConfigurator row, calibrating on the
    same system's other sources moves the compute efficiency by under 3% and no row's maximum
    error by more than 2.5 points (the machine is the one the presets know)."""
    validation = pytest.importorskip("calibration.roofline_validation")
    profiles = {
        s: validation.measured(s, aic_dir, VIDUR) for s in validation.SOURCES if s.kind != "vidur"
    }
    truths = {s: p.rows for s, p in profiles.items()}
    for generation in ("hopper", "ampere", "ada", "blackwell"):
        reference = validation.preset_gemm_efficiency(truths, generation)
        assert PRESET_GEMM_EFFICIENCY[generation] == pytest.approx(reference, abs=5e-4)
    table = validation.calibrated_table(profiles, VIDUR)
    ratio = table["compute_efficiency"] / table["preset_compute_efficiency"]
    assert ratio.between(0.97, 1.03).all(), table
    for kind in ("prefill", "decode"):
        moved = (table[f"{kind}_max_pct"] - table[f"preset_{kind}_max_pct"]).abs()
        assert moved.max() <= 2.5, table


def test_cli_plan_prices_the_calibrated_gpu_with_its_own_gemm_speed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = tmp_path / "a100-gemms.csv"
    write_profile(_gemm_profile(0.4), measured)
    argv = ["plan", "--model", "Llama-3.1-8B", "--gpus", "A100-80GB=8,H100-SXM=8", "--tp", "1",
            "--workload", "sharegpt", "--rate", "4", "--requests", "300", "--ttft-slo", "1",
            "--tpot-slo", "0.1", "--no-sim", "--json"]  # fmt: skip
    runs = []
    for extra in ([], ["--calibrate-gemm", str(measured)]):
        assert main([*argv, *extra]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    before, after = ({o["gpu"]: o for o in run["options"]} for run in runs)
    assert after["A100-80GB"]["cost_model"].startswith("roofline prior (compute efficiency")
    assert after["H100-SXM"] == before["H100-SXM"]  # another GPU keeps its preset
    slower = after["A100-80GB"]["prefill_rps_per_worker_alone"]
    assert slower < before["A100-80GB"]["prefill_rps_per_worker_alone"]
    (calibration,) = runs[1]["calibration"]
    assert calibration["gpu"] == "A100-80GB" and calibration["gemm_efficiency"] == 0.4
    assert any("calibrated on 4 compute-bound GEMMs" in note for note in runs[1]["notes"])
    unused = [*argv[:4], "H100-SXM=8", *argv[5:], "--calibrate-gemm", str(measured)]
    assert main(unused) == 1
    assert "which the plan does not consider" in capsys.readouterr().err
