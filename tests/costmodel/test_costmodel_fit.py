"""Fits on synthetic profiles generated from known parameters (plus seeded noise)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.costmodel import (
    PEAK_TOP_N,
    FitReport,
    fit_cost_model,
    fit_decode,
    fit_prefill,
    fit_ttft,
    gemm_peak_flops,
    transfer_error,
    transfer_prefill,
)
from pdopt.errors import FitQualityWarning, InputError, ParameterError
from pdopt.profile import PROFILE_COLUMNS, Profile, ProfileMeta

ALPHA, BETA, PEAK, T0 = 2.0e5, 1.4e10, 1.0e14, 0.002
D0, D1, D2 = 0.02, 5e-5, 7e-8
BATCHES = (1, 2, 4, 8)
LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
DECODE_POINTS = [(b, b * c) for b in (1, 4, 16, 64, 256) for c in (128, 1024, 4096)]


def _frame(records: list[dict[str, float | str]]) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(records, columns=list(PROFILE_COLUMNS))
    for column in PROFILE_COLUMNS[1:]:
        frame[column] = frame[column].astype(np.float64)
    return frame


def make_profile(
    *,
    alpha: float = ALPHA,
    beta: float = BETA,
    t0: float = T0,
    p_m: float = 1.0,
    decode: tuple[float, float, float] = (D0, D1, D2),
    noise: float = 0.0,
    seed: int = 0,
    prefill_points: list[tuple[int, int]] | None = None,
    decode_points: list[tuple[int, int]] | None = None,
    gemm: bool = True,
    model: str = "Llama-2-7B",
) -> Profile:
    """Rows from T = t0 + b·(α l² + β P_m l)/P and τ = d0 + d1 B + d2 C, times lognormal noise."""
    rng = np.random.default_rng(seed)
    records: list[dict[str, float | str]] = []
    if gemm:
        for m in (16, 256, 4096, 8192):
            # Small GEMMs run slower than the peak; the large ones reach it exactly.
            flop = 2.0 * m * 4096 * 4096
            speed = PEAK * min(1.0, m / 4096)
            records.append(
                {"kind": "gemm", "m": m, "n": 4096, "k": 4096, "latency_s": flop / speed}
            )
    if prefill_points is None:
        prefill_points = [(b, n) for b in BATCHES for n in LENGTHS]
    for b, n in prefill_points:
        t = t0 + b * (alpha * n * n + beta * p_m * n) / PEAK
        records.append({"kind": "prefill", "batch_size": b, "input_tokens": n, "latency_s": t})
    d0, d1, d2 = decode
    for b, c in DECODE_POINTS if decode_points is None else decode_points:
        t = d0 + d1 * b + d2 * c
        records.append(
            {"kind": "decode", "batch_size": b, "total_context_tokens": c, "latency_s": t}
        )
    frame = _frame(records)
    frame["latency_s"] *= rng.lognormal(0.0, noise, len(frame)) if noise else 1.0
    return Profile(ProfileMeta(gpu="A100-80GB", model=model, source="synthetic"), frame, "syn.csv")


@contextmanager
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_gemm_peak_is_the_median_of_the_fastest() -> None:
    profile = make_profile()
    assert gemm_peak_flops(profile) == pytest.approx(PEAK, rel=1e-12)
    # One mistimed (too fast) GEMM does not set P_peak on its own.
    rows = profile.rows.copy()
    rows.loc[0, "latency_s"] = rows.loc[0, "latency_s"] / 100.0
    assert PEAK_TOP_N >= 3
    assert gemm_peak_flops(Profile(profile.meta, rows)) == pytest.approx(PEAK, rel=1e-12)


def test_prefill_recovers_known_parameters_from_noisy_rows() -> None:
    with no_warnings():
        model, report = fit_prefill(make_profile(noise=0.005, seed=7))
    assert model.p_peak_flops == pytest.approx(PEAK, rel=0.02)  # the GEMM rows are noisy too
    assert model.p_m == 1.0
    assert model.beta_flop_per_token == pytest.approx(BETA, rel=0.03)
    # α is ~10 % of the work at 8192 tokens, so 0.5 % noise moves it more (±25 % over seeds 0-11).
    assert model.alpha_flop_per_token2 == pytest.approx(ALPHA, rel=0.25)
    # Absolute least squares is led by the long batches; t0 (2 ms of 20 ms-2 s) is loose.
    assert model.intercept_s == pytest.approx(T0, abs=0.005)
    assert report.kind == "prefill"
    assert report.n_points == len(BATCHES) * len(LENGTHS)
    assert report.r2 > 0.9999
    assert 0.1 < report.mape < 4.0
    assert report.cv_mape >= report.mape * 0.9
    assert report.max_abs_pct_error >= report.mape


def test_decode_and_ttft_recover_known_parameters() -> None:
    profile = make_profile(noise=0.01, seed=3)
    with no_warnings():
        decode, decode_report = fit_decode(profile)
        ttft, ttft_report = fit_ttft(profile)
    assert decode.d0_s == pytest.approx(D0, rel=0.03)
    assert decode.d1_s_per_request == pytest.approx(D1, rel=0.15)
    assert decode.d2_s_per_token == pytest.approx(D2, rel=0.05)
    assert decode_report.r2 > 0.99
    # TTFT uses only the batch-1 rows: a = α/P, b = β/P, c = t0 in the noiseless limit.
    assert ttft_report.n_points == len(LENGTHS)
    assert ttft.b_s_per_token == pytest.approx(BETA / PEAK, rel=0.05)
    assert ttft.a_s_per_token2 == pytest.approx(ALPHA / PEAK, rel=0.3)


def test_nnls_keeps_parameters_non_negative() -> None:
    # A downward-curving prefill (negative α would fit better) and a decode falling with B.
    profile = make_profile(alpha=-4.0e5, decode=(0.05, -5e-5, 7e-8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitQualityWarning)
        model, _ = fit_prefill(profile)
        decode, _ = fit_decode(profile)
        ttft, _ = fit_ttft(profile)
    assert model.alpha_flop_per_token2 == 0.0
    assert model.beta_flop_per_token > 0.0
    assert decode.d1_s_per_request == 0.0
    assert min(ttft.a_s_per_token2, ttft.b_s_per_token, ttft.c_s) >= 0.0


@settings(max_examples=40, deadline=None)
@given(
    alpha=st.floats(0.0, 1e6),
    beta=st.floats(1e8, 1e11),
    t0=st.floats(0.0, 0.05),
    p_m=st.floats(0.1, 10.0),
    d=st.tuples(st.floats(1e-4, 0.1), st.floats(0.0, 1e-3), st.floats(0.0, 1e-6)),
)
def test_noiseless_fit_reproduces_predictions(
    alpha: float, beta: float, t0: float, p_m: float, d: tuple[float, float, float]
) -> None:
    profile = make_profile(alpha=alpha, beta=beta, t0=t0, p_m=p_m, decode=d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitQualityWarning)  # α = 0 data can sit at R² edge
        model, reports = fit_cost_model(profile, reference_params=1.0, model_params=p_m)
    for report in reports.values():
        np.testing.assert_allclose(report.predicted_s, report.measured_s, rtol=1e-6)
    prefill = profile.of_kind("prefill")
    lengths = prefill["input_tokens"].to_numpy()
    np.testing.assert_allclose(
        model.prefill.request_time_s(lengths)[prefill["batch_size"].to_numpy() == 1],
        prefill["latency_s"].to_numpy()[prefill["batch_size"].to_numpy() == 1],
        rtol=1e-6,
    )
    assert model.prefill.p_m == pytest.approx(p_m)


def test_p_m_from_reference_puts_beta_in_reference_units() -> None:
    profile = make_profile(p_m=2.5)
    model, _ = fit_prefill(profile, reference_params=4.0e9, model_params=10.0e9)
    assert model.p_m == pytest.approx(2.5)
    assert model.beta_flop_per_token == pytest.approx(BETA, rel=1e-9)
    # Model parameters default to the catalogue's count of the profile's model.
    from pdopt.model_spec import get_model, param_count

    default, _ = fit_prefill(profile, reference_params=4.0e9)
    assert default.p_m == pytest.approx(param_count(get_model("Llama-2-7B")) / 4.0e9)


def test_fit_cost_model_bundles_three_reports() -> None:
    with no_warnings():
        model, reports = fit_cost_model(make_profile(noise=0.01))
    assert set(reports) == {"prefill", "decode", "ttft"}
    assert model.ttft is not None
    assert all(isinstance(r, FitReport) for r in reports.values())


def test_no_batch_one_rows_means_no_ttft_and_a_warning() -> None:
    points = [(b, n) for b in (2, 4) for n in LENGTHS]
    with pytest.warns(FitQualityWarning, match="no batch-1 prefill rows"):
        model, reports = fit_cost_model(make_profile(prefill_points=points))
    assert model.ttft is None
    assert "ttft" not in reports


def test_poor_fit_warns_with_model_r2_and_advice() -> None:
    profile = make_profile(noise=0.6, seed=1)
    with pytest.warns(FitQualityWarning) as record:
        _, report = fit_decode(profile)
    message = str(record[0].message)
    assert report.r2 < 0.95
    assert message.startswith("decode fit (d0 + d1·B + d2·C) on syn.csv: R² = ")
    assert f"R² = {report.r2:.3f} < 0.95" in message
    assert "check the profile for outliers" in message


def test_few_points_warn() -> None:
    points = [(1, 128), (1, 1024), (1, 4096), (2, 2048)]
    with pytest.warns(FitQualityWarning, match=r"prefill fit .* rests on 4 points \(< 5\)"):
        _, report = fit_prefill(make_profile(prefill_points=points))
    assert report.n_points == 4


@pytest.mark.parametrize(
    ("kwargs", "fit", "message"),
    [
        ({"prefill_points": []}, fit_prefill, "syn.csv: 0 prefill rows; fitting needs at least 3"),
        ({"prefill_points": [(1, 128), (1, 256)]}, fit_prefill, "2 prefill rows"),
        (
            {"prefill_points": [(1, 512), (2, 512), (4, 512)]},
            fit_prefill,
            "all 3 prefill rows have input_tokens=512",
        ),
        (
            {"prefill_points": [(2, 128), (2, 256), (2, 512)]},
            fit_ttft,
            "0 batch-1 prefill rows",
        ),
        ({"decode_points": [(4, 512), (4, 1024), (4, 4096)]}, fit_decode, "batch_size=4"),
        (
            {"decode_points": [(b, b) for b in (1, 2, 4, 8)]},
            fit_decode,
            "every decode row has total_context_tokens = 1 × batch_size",
        ),
        ({"gemm": False}, fit_prefill, "syn.csv: no gemm rows, so P_peak cannot be measured"),
    ],
)
def test_impossible_fits_raise_input_error(
    kwargs: dict[str, Any], fit: Callable[[Profile], object], message: str
) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        fit(make_profile(**kwargs))


def test_rank_deficient_rows_raise() -> None:
    # Two lengths at batch 1 only: 1, l², l cannot be separated by two distinct points.
    points = [(1, 128), (1, 256), (1, 128), (1, 256)]
    with pytest.raises(InputError, match="linearly dependent"):
        fit_prefill(make_profile(prefill_points=points))


def test_given_peak_skips_gemm_rows_and_bad_values_raise() -> None:
    model, _ = fit_prefill(make_profile(gemm=False), p_peak_flops=PEAK)
    assert model.beta_flop_per_token == pytest.approx(BETA, rel=1e-9)
    with pytest.raises(ParameterError, match="'p_peak_flops' parameter of fit_prefill"):
        fit_prefill(make_profile(), p_peak_flops=-1.0)
    with pytest.raises(ParameterError, match="'reference_params' parameter of fit_prefill"):
        fit_prefill(make_profile(), reference_params=0.0)


def test_unknown_model_needs_model_params() -> None:
    profile = make_profile(model="my-private-model")
    with pytest.raises(InputError, match="'my-private-model' is not in the catalogue"):
        fit_prefill(profile, reference_params=7e9)


def test_transfer_through_p_m_is_exact_when_only_size_changes() -> None:
    reference, target = 7.0e9, 13.0e9
    fitted, _ = fit_prefill(make_profile())
    moved = transfer_prefill(fitted, target, reference)
    assert moved.p_m == pytest.approx(target / reference)
    report = transfer_error(moved, make_profile(p_m=target / reference))
    assert report.kind == "prefill-transfer"
    assert np.isnan(report.cv_mape)
    assert report.mape < 1e-6
    # Transferring with the wrong size: the error reported is the error made.
    wrong = transfer_error(fitted, make_profile(p_m=target / reference))
    frame = wrong.as_frame()
    assert wrong.mape == pytest.approx(float(np.mean(np.abs(frame["pct_error"]))))
    assert wrong.mape > 10.0
    assert (frame["residual_s"] > 0).all()  # P_m = 1 under-predicts the bigger model
    with pytest.raises(ParameterError, match="'target_params' parameter of transfer_prefill"):
        transfer_prefill(fitted, -1.0, reference)


def test_report_to_dict_and_frame() -> None:
    _, report = fit_decode(make_profile(noise=0.01))
    data = report.to_dict()
    assert set(data) == {
        "kind",
        "n_points",
        "r2",
        "mape_pct",
        "cv_mape_pct",
        "max_abs_pct_error",
        "by_batch_region",
        "residuals_s",
    }
    assert len(data["residuals_s"]) == report.n_points
    assert "residuals_s" not in report.to_dict(residuals=False)
    frame = report.as_frame()
    np.testing.assert_allclose(frame["measured_s"] - frame["predicted_s"], frame["residual_s"])
    assert float(frame["pct_error"].abs().max()) == pytest.approx(report.max_abs_pct_error)


def test_same_profile_same_report() -> None:
    first = fit_prefill(make_profile(noise=0.05, seed=11))[1]
    second = fit_prefill(make_profile(noise=0.05, seed=11))[1]
    assert first.to_dict() == second.to_dict()


def test_cv_mape_is_nan_when_folds_are_too_small() -> None:
    points = [(1, 128), (1, 1024), (1, 4096)]
    with pytest.warns(FitQualityWarning):
        _, report = fit_prefill(make_profile(prefill_points=points))
    assert np.isnan(report.cv_mape)
    assert report.mape < 1e-6
