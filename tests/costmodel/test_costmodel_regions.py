"""The decode fit's error per batch-size region (issue 18, item 5), checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdopt.costmodel import (
    BATCH_REGION_EDGES,
    DecodeModel,
    FitReport,
    error_by_batch_region,
    fit_decode,
    fit_prefill,
)
from tests.costmodel.test_costmodel_fit import D0, D1, D2, make_profile


def test_regions_by_hand() -> None:
    # Six points: B = 1, 8 | 9, 32 | 100 | 300. Predictions 10 % high, 10 % low, exact, ...
    batch = np.array([1.0, 8.0, 9.0, 32.0, 100.0, 300.0])
    measured = np.array([1.0, 2.0, 4.0, 4.0, 5.0, 10.0])
    predicted = np.array([1.1, 2.2, 3.6, 4.0, 5.0, 12.0])
    cv = np.array([1.0, 3.0, 5.0, 7.0, 0.0, 40.0])
    frame = error_by_batch_region(measured, predicted, batch, cv)
    assert list(frame["region"]) == ["1-8", "9-32", "33-128", ">128"]
    assert list(frame["n_points"]) == [2, 2, 1, 1]
    # 1-8: +10 %, +10 %; 9-32: -10 %, 0 %; 33-128: 0 %; >128: +20 %.
    np.testing.assert_allclose(frame["bias_pct"], [10.0, -5.0, 0.0, 20.0], atol=1e-12)
    np.testing.assert_allclose(frame["mape_pct"], [10.0, 5.0, 0.0, 20.0], atol=1e-12)
    np.testing.assert_allclose(frame["max_abs_pct_error"], [10.0, 10.0, 0.0, 20.0], atol=1e-12)
    np.testing.assert_allclose(frame["cv_mape_pct"], [2.0, 6.0, 0.0, 40.0])
    assert list(frame["b_low"]) == list(BATCH_REGION_EDGES[:-1])
    # Regions without points are left out; without CV errors the column is NaN.
    small = error_by_batch_region(measured[:2], predicted[:2], batch[:2])
    assert list(small["region"]) == ["1-8"]
    assert math.isnan(float(small["cv_mape_pct"].iloc[0]))


def test_a_model_with_a_known_error_shows_it_per_region() -> None:
    # Measured rows follow τ exactly; a model with d0 25 % too high is high by 25·d0/τ %,
    # most at small B (where d0 dominates), least at B = 256.
    profile = make_profile()
    rows = profile.of_kind("decode")
    batch = rows["batch_size"].to_numpy()
    context = rows["total_context_tokens"].to_numpy()
    measured = rows["latency_s"].to_numpy()
    wrong = DecodeModel(1.25 * D0, D1, D2)
    frame = error_by_batch_region(measured, wrong.iteration_time_s(batch, context), batch)
    expected = 100.0 * 0.25 * D0 / measured
    for row in frame.itertuples():
        inside = (batch > row.b_low) & (batch <= row.b_high)
        assert row.bias_pct == pytest.approx(float(np.mean(expected[inside])), rel=1e-9)
        assert row.mape_pct == pytest.approx(row.bias_pct, rel=1e-12)
    assert frame["bias_pct"].is_monotonic_decreasing


def test_decode_report_carries_regions_and_they_agree_with_the_totals() -> None:
    _, report = fit_decode(make_profile(noise=0.02, seed=5))
    regions = report.by_batch_region
    assert regions is not None
    # make_profile's decode points: B 1, 4 (6 rows) | 16 (3) | 64 (3) | 256 (3).
    assert list(regions["region"]) == ["1-8", "9-32", "33-128", ">128"]
    assert list(regions["n_points"]) == [6, 3, 3, 3]
    weights = regions["n_points"] / report.n_points
    assert float((weights * regions["mape_pct"]).sum()) == pytest.approx(report.mape)
    assert float((weights * regions["cv_mape_pct"]).sum()) == pytest.approx(report.cv_mape)
    assert float(regions["max_abs_pct_error"].max()) == pytest.approx(report.max_abs_pct_error)
    signed = -report.as_frame()["pct_error"].to_numpy()  # bias is predicted − measured
    assert float((weights * regions["bias_pct"]).sum()) == pytest.approx(float(signed.mean()))
    records = report.to_dict(residuals=False)["by_batch_region"]
    assert [r["region"] for r in records] == ["1-8", "9-32", "33-128", ">128"]
    # Exact rows: every region's error, in and out of sample, vanishes.
    _, exact = fit_decode(make_profile())
    assert exact.by_batch_region is not None
    assert float(exact.by_batch_region[["mape_pct", "cv_mape_pct"]].max().max()) < 1e-6


def test_other_reports_have_no_regions() -> None:
    _, report = fit_prefill(make_profile())
    assert report.by_batch_region is None
    assert "by_batch_region" not in report.to_dict()
    nan_cv = FitReport.from_predictions("x", np.ones(3), np.ones(3), float("nan"))
    assert math.isnan(nan_cv.cv_mape)
