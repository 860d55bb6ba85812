"""The fused hybrid iteration fitted directly from measured mixed batches (issue 18): recovery of
known coefficients, the composed formula unchanged without hybrid rows, dict round trips, errors."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pdopt.cli import main
from pdopt.costmodel import (
    CostModel,
    DecodeModel,
    HybridModel,
    PrefillModel,
    fit_cost_model,
    fit_hybrid,
)
from pdopt.errors import InputError, ParameterError
from pdopt.profile import PROFILE_COLUMNS, Profile, read_profile, write_profile
from tests.costmodel.test_costmodel_fit import make_profile

H = (
    0.021,
    6e-5,
    8e-8,
    4e-5,
    2e-9,
)  # h0 s, h1 s/decode, h2 s/context token, h3 s/token, h4 s/token²
# B decodes, context per decode, chunk c, prefix d: each varied independently of the others
HYBRID_POINTS = [
    (b, b * ctx, c, d)
    for b in (1, 8, 64)
    for ctx in (256, 2048)
    for c in (64, 512)
    for d in (0, 1024, 4096)
]
SHIPPED = sorted((Path(__file__).parents[2] / "profiles").glob("*_roofline.csv"))


def with_hybrid_rows(
    profile: Profile, h: tuple[float, ...] = H, noise: float = 0.0, seed: int = 0
) -> Profile:
    """``profile`` plus hybrid rows timed by ``HybridModel(*h)`` (times lognormal noise)."""
    model = HybridModel(*h)
    rng = np.random.default_rng(seed)
    records = []
    for b, ctx, c, d in HYBRID_POINTS:
        t = model.iteration_time_s(b, ctx, [c], [d]) * (rng.lognormal(0.0, noise) if noise else 1)
        records.append(
            {"kind": "hybrid", "batch_size": b, "total_context_tokens": ctx,
             "input_tokens": c, "prefix_tokens": d, "latency_s": t}
        )  # fmt: skip
    extra = pd.DataFrame.from_records(records, columns=list(PROFILE_COLUMNS)).astype(
        {c: np.float64 for c in PROFILE_COLUMNS[1:]}
    )
    rows = pd.concat([profile.rows, extra], ignore_index=True)
    return Profile(profile.meta, rows, profile.path)


def test_exact_rows_give_back_the_coefficients() -> None:
    model, report = fit_hybrid(with_hybrid_rows(make_profile()))
    np.testing.assert_allclose(model.coefficients(), H, rtol=1e-9)
    assert report.kind == "hybrid"
    assert report.n_points == len(HYBRID_POINTS)
    assert report.r2 == pytest.approx(1.0, abs=1e-12)
    assert report.mape < 1e-7
    assert report.cv_mape < 1e-6
    assert report.by_batch_region is not None  # error per number of running decodes


def test_noisy_rows_recover_the_coefficients_within_the_noise() -> None:
    model, report = fit_hybrid(with_hybrid_rows(make_profile(), noise=0.01, seed=4))
    assert model.h0_s == pytest.approx(H[0], rel=0.03)
    assert model.h2_s_per_context_token == pytest.approx(H[2], rel=0.05)
    assert model.h3_s_per_chunk_token == pytest.approx(H[3], rel=0.1)
    assert model.h4_s_per_token2 == pytest.approx(H[4], rel=0.05)
    assert report.r2 > 0.99
    assert 0.2 < report.mape < 2.0
    assert report.cv_mape >= 0.9 * report.mape


def test_fit_cost_model_adds_the_hybrid_part_when_rows_exist() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, plain_reports = fit_cost_model(make_profile())
        mixed, reports = fit_cost_model(with_hybrid_rows(make_profile()))
    assert plain.hybrid is None and "hybrid" not in plain_reports
    assert mixed.hybrid is not None and reports["hybrid"].n_points == len(HYBRID_POINTS)
    # the other parts are fitted from their own rows only: unchanged by hybrid rows
    assert (mixed.prefill, mixed.decode, mixed.ttft) == (plain.prefill, plain.decode, plain.ttft)


def test_the_cost_model_charges_the_fitted_pass_by_hand() -> None:
    pre, dec = PrefillModel(1.0, 100.0, 1e6, intercept_s=0.01), DecodeModel(0.02, 0.001, 1e-6)
    cost = CostModel(pre, dec, hybrid=HybridModel(*H))
    # two chunks, 3 decodes over 900 tokens: h0 + 3 h1 + 900 h2 + Σ (h3 c + h4 c (2d + c))
    hand = H[0] + 3 * H[1] + 900 * H[2] + H[3] * (64 + 32) + H[4] * (64 * 320 + 32 * 32)
    assert cost.hybrid_iteration_time_s([64, 32], 3, 900, [128, 0]) == pytest.approx(hand, 1e-15)
    # the endpoints the hybrid rows do not measure stay the decode and the prefill fits
    composed = CostModel(pre, dec)
    assert cost.hybrid_iteration_time_s([], 3, 900) == composed.hybrid_iteration_time_s([], 3, 900)
    assert cost.hybrid_iteration_time_s([64], 0, 0) == composed.hybrid_iteration_time_s([64], 0, 0)


def test_without_a_hybrid_model_the_composed_formula_is_unchanged() -> None:
    cost = CostModel(PrefillModel(1.0, 100.0, 1e6, intercept_s=0.01), DecodeModel(0.02, 1e-3, 1e-6))
    # max(d0, t0) + d1 B + d2 C + (α((d + c)² − d²) + β c) / P = 0.025 + 0.02688 (docstring)
    assert cost.hybrid_iteration_time_s([64], 4, 1000, [128]) == pytest.approx(0.05188, 1e-12)


def test_an_equivalent_hybrid_model_reproduces_the_composed_formula() -> None:
    pre, dec = PrefillModel(3e5, 1.4e10, 1e14, 1.0, 0.004), DecodeModel(0.02, 5e-5, 7e-8)
    same = HybridModel(max(dec.d0_s, pre.intercept_s), dec.d1_s_per_request, dec.d2_s_per_token,
                       pre.beta_flop_per_token * pre.p_m / pre.p_peak_flops,
                       pre.alpha_flop_per_token2 / pre.p_peak_flops)  # fmt: skip
    args = ([256, 100], 16, 30000, [512, 0])
    assert CostModel(pre, dec, hybrid=same).hybrid_iteration_time_s(*args) == pytest.approx(
        CostModel(pre, dec).hybrid_iteration_time_s(*args), rel=1e-12
    )


def test_dict_round_trip_and_old_dicts_load() -> None:
    pre, dec = PrefillModel(1.0, 100.0, 1e6, intercept_s=0.01), DecodeModel(0.02, 0.001, 1e-6)
    cost = CostModel(pre, dec, hybrid=HybridModel(*H))
    assert CostModel.from_dict(cost.to_dict()) == cost
    old = CostModel(pre, dec).to_dict()
    assert "hybrid" not in old  # a cost model without one writes the dict it always did
    assert CostModel.from_dict(old).hybrid is None


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_profiles_fit_no_hybrid_part(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost, reports = fit_cost_model(read_profile(path))
    assert cost.hybrid is None and "hybrid" not in reports


def test_too_few_or_inseparable_rows_are_rejected_naming_the_profile() -> None:
    base = make_profile()
    with pytest.raises(InputError, match=r"^syn.csv: 0 hybrid rows; fitting needs at least 5"):
        fit_hybrid(base)
    rows = with_hybrid_rows(base).rows
    # one chunk size: the h3·c term is a constant, confounded with the fixed cost h0
    one_chunk = rows[(rows["kind"] != "hybrid") | (rows["input_tokens"] == 64)]
    with pytest.raises(InputError, match=r"^syn.csv: all 18 hybrid rows have input_tokens=64"):
        fit_hybrid(Profile(base.meta, one_chunk, "syn.csv"))
    # context always 256 per decode: h1 (per decode) and h2 (per context token) are confounded
    tied = rows[
        (rows["kind"] != "hybrid") | (rows["total_context_tokens"] == 256 * rows["batch_size"])
    ]
    with pytest.raises(InputError, match=r"the hybrid rows cannot separate the terms"):
        fit_hybrid(Profile(base.meta, tied, "syn.csv"))


def test_negative_coefficients_are_refused() -> None:
    with pytest.raises(ParameterError, match="h2_s_per_context_token"):
        HybridModel(0.01, 0.0, -1e-8, 0.0, 0.0)


def test_calibrate_shows_the_hybrid_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_profile(with_hybrid_rows(make_profile(), noise=0.01, seed=4), tmp_path / "h.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, reports = fit_cost_model(read_profile(path))
    assert main(["calibrate", str(path), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert CostModel.from_dict(payload["cost_model"]) == expected
    assert expected.hybrid is not None
    assert payload["cost_model"]["hybrid"] == expected.hybrid.to_dict()
    assert payload["reports"]["hybrid"] == reports["hybrid"].to_dict(residuals=False)
    assert main(["calibrate", str(path)]) == 0
    table = capsys.readouterr().out
    assert "Hybrid   T = h0 + h1·B + h2·C + h3·c + h4·((d + c)² − d²)" in table
    assert f"  h0      {expected.hybrid.h0_s * 1e3:12.4f} ms" in table
    report = reports["hybrid"]
    assert (
        f"  hybrid   {report.n_points:>6d} {report.r2:>8.4f} {report.mape:>8.2f} "
        f"{report.cv_mape:>10.2f}" in table
    )


def test_profile_show_counts_hybrid_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_profile(with_hybrid_rows(make_profile()), tmp_path / "h.csv")
    assert main(["profile", "show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["rows"]["hybrid"] == len(HYBRID_POINTS)
    assert shown["ranges"]["hybrid"]["prefix_tokens_max"] == 4096
    assert main(["profile", "show", str(path)]) == 0
    assert f"15 decode, {len(HYBRID_POINTS)} hybrid" in capsys.readouterr().out
