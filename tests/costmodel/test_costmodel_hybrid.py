"""The fused hybrid iteration (issues 18, 34): fitted from measured mixed batches (recovery of known
coefficients by the alternating NNLS), composed from the prefill and decode fits (its special
cases exactly the fits, a mixed pass between the larger part and the sum), dict round trips,
errors."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    0.004,
)  # h0 s, h1 s/decode, h2 s/context token, h3 s/token, h4 s/token², h5 s
# B decodes, context per decode, chunk c, prefix d: each varied independently of the others
HYBRID_POINTS = [
    (b, b * ctx, c, d)
    for b in (1, 8, 64)
    for ctx in (256, 2048)
    for c in (64, 512, 2048)
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
    # both passes bind some rows (the decode pass up to c = 512, the chunks' pass at 2048)
    np.testing.assert_allclose(dataclasses.astuple(model), H, rtol=1e-9)
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
    assert model.h5_s == pytest.approx(H[5], rel=0.5, abs=2e-3)
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
    # two chunks, 3 decodes over 900 tokens: the decode pass h0 + 3 h1 = 0.02118 beats the chunks'
    # pass h5 + h3·(3 + 96) = 0.00796, so max(...) + 900 h2 + h4 Σ c (2d + c)
    hand = H[0] + 3 * H[1] + 900 * H[2] + H[4] * (64 * 320 + 32 * 32)
    assert cost.hybrid_iteration_time_s([64, 32], 3, 900, [128, 0]) == pytest.approx(hand, 1e-15)
    # a large chunk: the compute-bound pass binds
    hand = H[5] + H[3] * (3 + 2000) + 900 * H[2] + H[4] * 2000 * 2000
    assert cost.hybrid_iteration_time_s([2000], 3, 900, [0]) == pytest.approx(hand, 1e-15)
    # the endpoints the hybrid rows do not measure stay the decode and the prefill fits
    composed = CostModel(pre, dec)
    assert cost.hybrid_iteration_time_s([], 3, 900) == composed.hybrid_iteration_time_s([], 3, 900)
    assert cost.hybrid_iteration_time_s([64], 0, 0) == composed.hybrid_iteration_time_s([64], 0, 0)


def test_the_composed_pass_by_hand() -> None:
    cost = CostModel(PrefillModel(1.0, 100.0, 1e6, intercept_s=0.01), DecodeModel(0.02, 1e-3, 1e-6))
    # decode pass d0 + d1 B = 0.024 vs chunks' pass t0 + β·(B + c)/P = 0.01 + 100·68/1e6 = 0.0168:
    # the decode pass binds; + d2 C = 0.001 + the chunk's attention α·64·(2·128 + 64)/P = 0.02048
    assert cost.hybrid_iteration_time_s([64], 4, 1000, [128]) == pytest.approx(0.04548, 1e-12)
    # a 1000-token chunk: the chunks' pass 0.01 + 100·1004/1e6 = 0.1104 binds
    hand = 0.1104 + 0.001 + 1000 * 1000 / 1e6
    assert cost.hybrid_iteration_time_s([1000], 4, 1000, [0]) == pytest.approx(hand, 1e-12)


def test_moe_experts_are_streamed_once() -> None:
    # Mixtral-like: the prefill intercept t0 = 12.8 ms holds every expert's weights; the decode
    # pass d0 + d3·cover(B) holds those it touches. A small chunk adds its attention only.
    pre = PrefillModel(3e5, 1.4e10, 1e15, 1.0, 0.0128)
    dec = DecodeModel(0.0027, 1.7e-5, 2.2e-8, 0.0019, experts=8, experts_per_token=2)
    cost = CostModel(pre, dec)
    tau = float(dec.iteration_time_s(40, 40 * 700))
    mixed = cost.hybrid_iteration_time_s([20], 40, 40 * 700, [580])
    assert mixed == pytest.approx(tau + 3e5 * 20 * (2 * 580 + 20) / 1e15, rel=1e-12)
    # the additive composition paid the fixed cost and the experts twice
    assert mixed < tau + (pre.intercept_s - dec.d0_s)


@settings(max_examples=200, deadline=None)
@given(
    d=st.tuples(*(st.floats(0, 0.05) for _ in range(3)), st.floats(0, 0.01)),
    moe=st.booleans(),
    p=st.tuples(st.floats(0, 1e6), st.floats(0, 1e11), st.floats(1e13, 1e15), st.floats(0, 0.05)),
    batch=st.integers(1, 512),
    context=st.integers(0, 8192),
    chunks=st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), min_size=1, max_size=4),
)
def test_a_mixed_pass_costs_between_the_larger_part_and_the_sum(
    d: tuple[float, ...],
    moe: bool,
    p: tuple[float, ...],
    batch: int,
    context: int,
    chunks: list[tuple[int, int]],
) -> None:
    decode = DecodeModel(d[0], d[1] * 1e-3, d[2] * 1e-6, d[3] if moe else 0.0,
                         8 if moe else 0, 2 if moe else 0)  # fmt: skip
    prefill = PrefillModel(p[0], p[1], p[2], 1.0, p[3])
    cost = CostModel(prefill, decode)
    tokens, prefix = [c for c, _ in chunks], [q for _, q in chunks]
    total = batch * context
    decode_only = cost.hybrid_iteration_time_s([], batch, total)
    prefill_only = cost.hybrid_iteration_time_s(tokens, 0, 0, prefix)
    mixed = cost.hybrid_iteration_time_s(tokens, batch, total, prefix)
    # the special cases are the fits, bit for bit
    assert decode_only == float(decode.iteration_time_s(batch, total))
    work = sum(prefill.chunk_work_flop(q, c) for c, q in chunks)
    assert prefill_only == prefill.intercept_s + work / prefill.p_peak_flops
    eps = 1e-12 * (decode_only + prefill_only)
    assert max(decode_only, prefill_only) - eps <= mixed <= decode_only + prefill_only + eps


def test_an_equivalent_hybrid_model_reproduces_the_composed_formula() -> None:
    pre, dec = PrefillModel(3e5, 1.4e10, 1e14, 1.0, 0.004), DecodeModel(0.02, 5e-5, 7e-8)
    same = HybridModel(dec.d0_s, dec.d1_s_per_request, dec.d2_s_per_token,
                       pre.beta_flop_per_token * pre.p_m / pre.p_peak_flops,
                       pre.alpha_flop_per_token2 / pre.p_peak_flops, pre.intercept_s)  # fmt: skip
    for args in (([256, 100], 16, 30000, [512, 0]), ([2000], 16, 30000, [0])):
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
    # the additive form fitted before the fused one means something else: refused, not misread
    additive = {"type": "HybridModel", **{k: v for k, v in HybridModel(*H).to_dict().items()
                                          if k not in ("type", "h5_s")}}  # fmt: skip
    with pytest.raises(InputError, match="fit the profile's hybrid rows again"):
        HybridModel.from_dict(additive)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_profiles_fit_no_hybrid_part(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost, reports = fit_cost_model(read_profile(path))
    assert cost.hybrid is None and "hybrid" not in reports


def test_too_few_or_inseparable_rows_are_rejected_naming_the_profile() -> None:
    base = make_profile()
    with pytest.raises(InputError, match=r"^syn.csv: 0 hybrid rows; fitting needs at least 6"):
        fit_hybrid(base)
    rows = with_hybrid_rows(base).rows
    # one chunk size: the h3·c term is a constant, confounded with the fixed cost h0
    one_chunk = rows[(rows["kind"] != "hybrid") | (rows["input_tokens"] == 64)]
    with pytest.raises(InputError, match=r"^syn.csv: all 18 hybrid rows have input_tokens=64"):
        fit_hybrid(Profile(base.meta, one_chunk, "syn.csv"))
    # context always 256 per decode and every row decode-bound (no 2048-token chunk): h1 (per
    # decode) and h2 (per context token) are confounded
    tied = rows[
        (rows["kind"] != "hybrid")
        | (
            (rows["total_context_tokens"] == 256 * rows["batch_size"])
            & (rows["input_tokens"] < 2048)
        )
    ]
    with pytest.raises(InputError, match=r"the hybrid rows cannot separate the terms"):
        fit_hybrid(Profile(base.meta, tied, "syn.csv"))


def test_negative_coefficients_are_refused() -> None:
    with pytest.raises(ParameterError, match="h2_s_per_context_token"):
        HybridModel(0.01, 0.0, -1e-8, 0.0, 0.0, 0.0)


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
    assert "Hybrid   T = max(h0 + h1·B, h5 + h3·(B + c)) + h2·C + h4·((d + c)² − d²)" in table
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
