"""The decode-form study script (calibration/decode_form.py): candidates, CV schemes, tables."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration import decode_form
from calibration.decode_form import (
    DESIGNS,
    VIDUR,
    DataSet,
    candidates,
    cross_validate,
    markdown,
    nnls_predictor,
    roofline_predict,
    segments,
    study,
)
from pdopt.costmodel import fit_decode
from tests.costmodel.test_costmodel_fit import make_profile

BATCH = np.repeat([1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0], 4)
CONTEXT = BATCH * np.tile([256.0, 512.0, 1024.0, 2048.0], 12)


def test_segments_are_a_monotone_piecewise_linear_basis() -> None:
    b = np.array([1.0, 16.0, 20.0, 64.0, 100.0])
    np.testing.assert_array_equal(
        np.column_stack(segments(b, (16.0, 64.0))),
        [[1, 0, 0], [16, 0, 0], [16, 4, 0], [16, 48, 0], [16, 48, 36]],
    )


def test_piecewise_fit_recovers_known_parameters() -> None:
    # τ = 30 ms + 0.1 ms·B up to 16, then 0.4 ms per request to 64, 0.2 ms beyond; 80 ns/token.
    truth = np.array([0.030, 1e-4, 4e-4, 2e-4, 8e-8])
    design = DESIGNS["piecewise-B(16,64)"]
    latency = design(BATCH, CONTEXT) @ truth
    np.testing.assert_allclose(decode_form._nnls(design(BATCH, CONTEXT), latency), truth, rtol=1e-6)
    data = DataSet("syn", True, BATCH, CONTEXT, latency)
    candidate = next(c for c in candidates(with_context=True) if c.name == "piecewise-B(16,64)")
    assert candidate.engine_compatible and candidate.n_params == 5
    # Leaving any batch size out, the others still pin every segment: predictions exact.
    np.testing.assert_allclose(cross_validate(data, candidate, "lobo"), latency, rtol=1e-6)
    # The linear form cannot bend: its leave-one-batch-size-out error is visible.
    linear = next(c for c in candidates(with_context=True) if c.name == "linear")
    assert np.max(np.abs(cross_validate(data, linear, "lobo") / latency - 1.0)) > 0.02


def test_roofline_fit_recovers_known_parameters() -> None:
    d0, a, w, k = 0.02, 6e-4, 0.015, 1e-7
    latency = d0 + np.maximum(a * BATCH, w + k * CONTEXT)
    predicted = roofline_predict(BATCH, CONTEXT, latency, BATCH, CONTEXT)
    np.testing.assert_allclose(predicted, latency, rtol=1e-4)


def test_linear_candidate_is_pdopts_fit() -> None:
    profile = make_profile(noise=0.03, seed=2)
    _, report = fit_decode(profile)
    rows = profile.of_kind("decode")
    b = rows["batch_size"].to_numpy(dtype=np.float64)
    c = rows["total_context_tokens"].to_numpy(dtype=np.float64)
    y = rows["latency_s"].to_numpy(dtype=np.float64)
    predicted = nnls_predictor(DESIGNS["linear"])(b, c, y, b, c)
    np.testing.assert_allclose(predicted, report.predicted_s, rtol=1e-12)
    data = DataSet("syn", True, b, c, y)
    table = study([data])
    linear = table[(table["form"] == "linear") & (table["region"] == "all")].set_index("scheme")
    assert linear.at["insample", "mape_pct"] == pytest.approx(report.mape)
    assert linear.at["kfold", "mape_pct"] == pytest.approx(report.cv_mape)


def test_study_table_and_markdown() -> None:
    rng = np.random.default_rng(0)
    latency = (0.03 + 2e-4 * BATCH + 8e-8 * CONTEXT) * rng.lognormal(0.0, 0.01, BATCH.size)
    full = DataSet("full", True, BATCH, CONTEXT, latency)
    ops = DataSet("ops", False, BATCH, np.zeros_like(BATCH), 0.03 + 2e-4 * BATCH)
    table = study([full, ops])
    assert set(table["scheme"]) == {"insample", "kfold", "lobo"}
    assert set(table["region"]) == {"1-8", "9-32", "33-128", ">128", "all"}
    # The h(B)·C form is not compared where C is absent; the roofline is marked incompatible.
    assert "piecewise-B,C(16,64)" not in set(table.loc[table["data_set"] == "ops", "form"])
    assert not table.loc[table["form"] == "roofline max", "engine_compatible"].any()
    text = markdown(table)
    assert "| full | linear | yes |" in text
    assert "Linear ops only (1 model/TP profiles" in text
    assert "| roofline max |" in text


@pytest.mark.skipif(not (VIDUR / "a100").is_dir(), reason="shared/data/vidur-profiling absent")
def test_study_on_the_a100_measurements(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert decode_form.main(["--full-only", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "decode_form.csv")
    assert set(table["data_set"]) == {"Llama-2-70B TP2 +all-reduce", "Llama-2-70B TP2"}
    linear = table[
        (table["data_set"] == "Llama-2-70B TP2 +all-reduce")
        & (table["form"] == "linear")
        & (table["region"] == "all")
    ].set_index("scheme")
    # The shipped fit's numbers (tests/costmodel/test_costmodel_real.py): MAPE 2.23 %.
    assert linear.at["insample", "mape_pct"] == pytest.approx(2.23, abs=0.01)
    assert (tmp_path / "decode_form.md").read_text(encoding="utf-8").startswith("| data set |")
