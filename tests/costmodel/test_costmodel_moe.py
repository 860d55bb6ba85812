"""The MoE expert-coverage term of the decode model: cover(B) against brute force, the fit,
the owner methods against their closed forms, serialisation, dense models unchanged."""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pdopt.costmodel import (
    CostModel,
    DecodeModel,
    PrefillModel,
    fit_decode,
    roofline_cost_model,
)
from pdopt.errors import FitQualityWarning, ParameterError
from pdopt.model_spec import expected_experts_touched, expert_coverage, get_model
from pdopt.profile import read_profile, roofline_profile
from tests.costmodel.test_costmodel_fit import make_profile

PROFILES = sorted(Path("profiles").glob("*.csv"))
D0, D1, D2, D3 = 0.004, 2e-5, 3e-8, 1.2e-4  # seconds; d3 per expected distinct expert
MOE = DecodeModel(D0, D1, D2, D3, 128, 8)


@pytest.mark.parametrize(("experts", "k"), [(4, 1), (4, 2), (5, 3), (6, 2)])
@pytest.mark.parametrize("tokens", [0, 1, 2, 3])
def test_cover_is_the_exact_expectation_over_every_routing(experts: int, k: int, tokens: int):
    """Enumerate every routing of ``tokens`` tokens, each to one of the C(E, k) expert subsets
    with equal probability, and average the distinct experts used."""
    subsets = list(itertools.combinations(range(experts), k))
    counts = [
        len(set().union(*routing)) if routing else 0
        for routing in itertools.product(subsets, repeat=tokens)
    ]
    assert expert_coverage(float(tokens), experts, k) == pytest.approx(np.mean(counts), rel=1e-12)


def test_cover_matches_simulated_uniform_routing_at_qwen3_moe_shape():
    """E = 128, k = 8: Monte Carlo over 4000 routings per batch size, within 4 standard errors."""
    rng = np.random.default_rng(0)
    for batch in (1, 4, 16, 64):
        distinct = [
            len({e for _ in range(batch) for e in rng.choice(128, 8, replace=False)})
            for _ in range(4000)
        ]
        error = np.std(distinct) / math.sqrt(len(distinct)) + 1e-9
        assert abs(np.mean(distinct) - expert_coverage(float(batch), 128, 8)) < 4 * error


def test_the_roofline_uses_the_same_coverage():
    spec = get_model("Mixtral-8x7B")
    for tokens in (0.0, 1.0, 3.0, 40.0):
        assert expected_experts_touched(spec, tokens) == expert_coverage(tokens, 8, 2)


def moe_profile(noise: float = 0.0, seed: int = 0, model: str = "Qwen3-30B-A3B"):
    """Decode rows from τ = d0 + d1 B + d2 C + d3 cover(B) (E = 128, k = 8) at B = 1..256."""
    points = [(b, b * c) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) for c in (256, 2048)]
    profile = make_profile(decode=(D0, D1, D2), decode_points=points, noise=0.0, model=model)
    rows = profile.rows.copy()
    decode = rows["kind"] == "decode"
    rows.loc[decode, "latency_s"] += D3 * expert_coverage(
        rows.loc[decode, "batch_size"].to_numpy(dtype=np.float64), 128, 8
    )
    rows["latency_s"] *= np.random.default_rng(seed).lognormal(0.0, noise, len(rows))
    return type(profile)(profile.meta, rows, profile.path)


def test_fit_recovers_known_moe_parameters_exactly_without_noise():
    decode, report = fit_decode(moe_profile())
    assert (decode.experts, decode.experts_per_token) == (128, 8)
    fitted = (decode.d0_s, decode.d1_s_per_request, decode.d2_s_per_token, decode.d3_s_per_expert)
    assert fitted == pytest.approx((D0, D1, D2, D3), rel=1e-6)
    assert report.mape < 1e-6


def test_fit_recovers_known_moe_parameters_from_noisy_rows_and_beats_the_linear_form():
    profile = moe_profile(noise=0.01, seed=4)
    decode, report = fit_decode(profile)
    assert decode.d0_s == pytest.approx(D0, rel=0.1)
    assert decode.d2_s_per_token == pytest.approx(D2, rel=0.1)
    assert decode.d3_s_per_expert == pytest.approx(D3, rel=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitQualityWarning)
        linear, linear_report = fit_decode(profile, expert_term=False)
    assert not linear.has_expert_term and linear.experts == 0
    assert report.mape < 1.5 < 5 * 1.5 < linear_report.mape
    assert set(report.by_batch_region["region"]) == {"1-8", "9-32", "33-128", ">128"}


def test_a_model_outside_the_catalogue_is_fitted_dense_unless_given_and_says_so():
    profile = moe_profile(model="my-moe")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FitQualityWarning)
        dense, _ = fit_decode(profile)
    said = [str(w.message) for w in caught]
    assert any("'my-moe' is neither catalogued" in m and "no expert term" in m for m in said)
    assert any("R² = " in m for m in said)  # and the dense form fits the MoE rows badly
    assert dense.experts == 0
    given, _ = fit_decode(profile, model=get_model("Qwen3-30B-A3B"))
    assert given.d3_s_per_expert == pytest.approx(D3, rel=1e-6)


def test_the_roofline_cost_model_of_a_users_moe_spec_keeps_its_expert_term():
    """A spec the catalogue does not hold (a Hugging Face config, a spec file) under its own
    name: the prior is fitted with the spec, not with a dense guess from the name."""
    catalogued = get_model("Qwen3-30B-A3B")
    users = replace(catalogued, name="me/my-moe")
    cost = roofline_cost_model("H100-SXM", users).decode
    assert (cost.experts, cost.experts_per_token) == (128, 8)
    assert cost == roofline_cost_model("H100-SXM", catalogued).decode


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_shipped_dense_profiles_fit_exactly_as_before(path: Path):
    """Dense models: no expert column, so the fit is the three-term fit, bit for bit, and the
    model's dict has no MoE keys."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitQualityWarning)
        decode, report = fit_decode(read_profile(path))
        linear, linear_report = fit_decode(read_profile(path), expert_term=False)
    assert decode == linear and not decode.has_expert_term
    assert np.array_equal(report.predicted_s, linear_report.predicted_s)
    assert set(decode.to_dict()) == {"type", "d0_s", "d1_s_per_request", "d2_s_per_token"}


def test_roofline_moe_profile_fits_better_with_the_expert_term():
    """The roofline prices the experts a batch touches with the same cover(B)."""
    profile = roofline_profile("H100-SXM", "Qwen3-30B-A3B")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitQualityWarning)
        _, linear = fit_decode(profile, expert_term=False)
        moe, report = fit_decode(profile)
    assert moe.has_expert_term
    assert report.mape < linear.mape


def test_iteration_time_is_the_equation():
    b, c = np.array([1.0, 8.0, 100.0]), np.array([500.0, 4000.0, 50000.0])
    want = D0 + D1 * b + D2 * c + D3 * 128 * (1 - (1 - 8 / 128) ** b)
    assert MOE.iteration_time_s(b, c) == pytest.approx(want, rel=1e-14)
    assert MOE.mean_context_time_s(b, 500.0) == pytest.approx(
        MOE.iteration_time_s(b, 500.0 * b), rel=1e-14
    )


def test_dense_methods_are_the_linear_closed_forms():
    dense = DecodeModel(0.01, 1e-4, 1e-7)
    slope = 1e-4 + 1e-7 * 800
    assert dense.max_batch_within(0.05, 800) == (0.05 - 0.01) / slope
    v = np.array([0.0, 10.0, 1.0 / slope, 1e9])
    with np.errstate(divide="ignore"):
        want = np.where(1 - v * slope > 0, v * 0.01 / (1 - v * slope), np.inf)
    assert np.array_equal(dense.mean_field_batch(v, 800), want)
    assert dense.context_budget_tokens(10, 0.05) == (0.05 - 0.01 - 1e-3) / 1e-7


def test_max_batch_within_is_the_root_of_tau_equals_slo():
    b = MOE.max_batch_within(0.03, 1000)
    assert float(MOE.mean_context_time_s(b, 1000)) == pytest.approx(0.03, rel=1e-12)
    assert MOE.max_batch_within(0.001, 1000) <= 0  # d0 alone misses it
    flat = DecodeModel(0.004, 0.0, 0.0, 1e-4, 128, 8)  # saturates at 0.004 + 0.0128 s
    assert flat.max_batch_within(0.02, 100) == math.inf
    b = flat.max_batch_within(0.01, 100)
    assert float(flat.mean_context_time_s(b, 100)) == pytest.approx(0.01, rel=1e-9)


def test_mean_field_batch_is_littles_law_fixed_point():
    v = np.array([0.0, 50.0, 500.0, 2000.0])
    batch = MOE.mean_field_batch(v, 1000)
    assert batch[0] == 0.0
    tau = MOE.mean_context_time_s(batch, 1000)
    assert v * tau == pytest.approx(batch, rel=1e-10)
    assert MOE.mean_field_batch(1.01 / MOE.per_request_slope_s(1000), 1000) == np.inf


def test_context_budget_meets_the_slo_exactly():
    budget = MOE.context_budget_tokens(16, 0.03)
    assert float(MOE.iteration_time_s(16, budget)) == pytest.approx(0.03, rel=1e-12)


def test_serialisation_round_trips_and_old_dicts_load():
    cost = CostModel(PrefillModel(1.0, 100.0, 1e6), MOE)
    assert CostModel.from_dict(cost.to_dict()) == cost
    old = {"type": "DecodeModel", "d0_s": 0.01, "d1_s_per_request": 1e-4, "d2_s_per_token": 1e-7}
    loaded = DecodeModel.from_dict(old)
    assert loaded == DecodeModel(0.01, 1e-4, 1e-7) and not loaded.has_expert_term
    assert loaded.to_dict() == old


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d3_s_per_expert": 1e-4}, "'experts' parameter"),
        ({"experts": 8, "experts_per_token": 9}, "'experts_per_token' parameter"),
        ({"experts": 8, "experts_per_token": 2, "d3_s_per_expert": -1.0}, "d3_s_per_expert"),
    ],
)
def test_invalid_expert_terms_say_what_to_fix(kwargs, match):
    with pytest.raises(ParameterError, match=match):
        DecodeModel(0.01, 1e-4, 1e-7, **kwargs)
