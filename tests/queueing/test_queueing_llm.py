"""Prefill service moments, the decode batch model and the P/D prediction."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pdopt.costmodel import DecodeModel, PrefillModel
from pdopt.errors import ParameterError
from pdopt.queueing import (
    decode_load,
    decode_throughput_tokens_per_s,
    max_decode_batch,
    mm1,
    predict_pd,
    prefill_service_moments,
    service_moments,
)

LINEAR = PrefillModel(alpha_flop_per_token2=0.0, beta_flop_per_token=2e9, p_peak_flops=1e14)
DECODE = DecodeModel(d0_s=0.01, d1_s_per_request=2e-4, d2_s_per_token=1e-7)


def test_prefill_moments_of_a_linear_model_scale_the_length_moments() -> None:
    lengths = np.random.default_rng(0).integers(1, 4000, 10_000)
    m = prefill_service_moments(LINEAR, lengths)
    per_token_s = 2e9 / 1e14
    assert m.mean_s == pytest.approx(per_token_s * lengths.mean())
    assert m.scv == pytest.approx(lengths.var() / lengths.mean() ** 2)
    assert m.third_moment_s3 == pytest.approx(per_token_s**3 * np.mean(lengths.astype(float) ** 3))
    assert m.second_moment_s2 == pytest.approx(per_token_s**2 * np.mean(lengths.astype(float) ** 2))


def test_prefill_moments_include_quadratic_term_and_intercept() -> None:
    model = PrefillModel(1e5, 2e9, 1e14, p_m=2.0, intercept_s=0.003)
    lengths = np.array([100, 1000, 3000])
    times = 0.003 + (1e5 * lengths**2.0 + 2e9 * 2.0 * lengths) / 1e14
    m = prefill_service_moments(model, lengths)
    assert m.mean_s == pytest.approx(times.mean())
    assert m.scv == pytest.approx(times.var() / times.mean() ** 2)


def test_service_moments_errors() -> None:
    with pytest.raises(ParameterError, match="The 'samples_s' parameter of service_moments"):
        service_moments([1.0, -1.0])
    with pytest.raises(ParameterError, match="The 'input_tokens' parameter"):
        prefill_service_moments(LINEAR, [0, 10])


def test_decode_throughput_is_b_over_tau() -> None:
    b = np.array([1, 8, 64])
    tau = 0.01 + 2e-4 * b + 1e-7 * b * 500
    np.testing.assert_allclose(decode_throughput_tokens_per_s(DECODE, b, 500), b / tau)


@settings(deadline=None)
@given(
    slo=st.floats(0.005, 0.2),
    c_bar=st.floats(0, 8000),
    capacity=st.floats(0, 2e6),
)
@example(slo=0.125, c_bar=5.960464477539063e-08, capacity=575.0)  # found under a random seed
def test_max_decode_batch_is_the_largest_feasible_batch(
    slo: float, c_bar: float, capacity: float
) -> None:
    per_req = max(c_bar, 1.0)
    limit = max_decode_batch(
        DECODE,
        tpot_slo_s=slo,
        mean_context_tokens=c_bar,
        kv_capacity_tokens=capacity,
        kv_tokens_per_request=per_req,
    )

    def feasible(b: int) -> bool:
        tau = float(DECODE.iteration_time_s(b, b * c_bar))
        return tau <= slo * (1 + 1e-9) and b * per_req <= capacity * (1 + 1e-9)

    def strictly_feasible(b: int) -> bool:
        # Exact rational arithmetic: the limit's own rounding tolerance (1e-9 of a request) is
        # far tighter than a relative 1e-9 of the SLO, so the next batch must fail exactly
        # (e.g. SLO 0.125 s, c̄ ≈ 0: τ(575) exceeds it by 3.4e-12 s, and 574 is the answer).
        d = DECODE
        tau = Fraction(d.d0_s) + b * (
            Fraction(d.d1_s_per_request) + Fraction(d.d2_s_per_token) * Fraction(c_bar)
        )
        return tau <= Fraction(slo) and b * Fraction(per_req) <= Fraction(capacity)

    b = limit.batch_size
    assert b == 0 or feasible(b)
    assert not strictly_feasible(b + 1)
    if b > 0:
        assert limit.iteration_time_s <= slo * (1 + 1e-9)
        assert limit.throughput_tokens_per_s == pytest.approx(b / limit.iteration_time_s)


def test_max_decode_batch_names_the_binding_constraint() -> None:
    tpot = max_decode_batch(
        DECODE, tpot_slo_s=0.05, mean_context_tokens=1000, kv_capacity_tokens=1e9
    )
    # (0.05 - 0.01) / (2e-4 + 1e-4) = 133.3
    assert (tpot.batch_size, tpot.limited_by) == (133, "tpot")
    kv = max_decode_batch(
        DECODE, tpot_slo_s=0.05, mean_context_tokens=1000, kv_capacity_tokens=50_500
    )
    assert (kv.batch_size, kv.limited_by) == (50, "kv")


@given(rate=st.floats(0.1, 20), o_bar=st.floats(1, 500), c_bar=st.floats(0, 4000))
def test_decode_load_is_a_littles_law_fixed_point(rate: float, o_bar: float, c_bar: float) -> None:
    slope = DECODE.d1_s_per_request + DECODE.d2_s_per_token * c_bar
    if rate * (o_bar - 1) * slope >= 1:
        with pytest.raises(ParameterError, match="unstable"):
            decode_load(DECODE, rate, o_bar, c_bar)
        return
    load = decode_load(DECODE, rate, o_bar, c_bar)
    tau = float(DECODE.iteration_time_s(load.mean_batch_size, load.mean_batch_size * c_bar))
    assert load.iteration_time_s == pytest.approx(tau)
    # Little: B = rate x time in decode, with (o - 1) iterations per request.
    assert load.mean_batch_size == pytest.approx(rate * (o_bar - 1) * tau, rel=1e-9, abs=1e-12)
    assert load.mean_decode_time_s == pytest.approx((o_bar - 1) * tau)


def test_predict_pd_single_prefill_worker_is_mm1_response_time() -> None:
    """Exponential prefill times, batch 1, one P worker: TTFT = M/M/1 response, Exp(mu - lambda)."""
    rng = np.random.default_rng(3)
    lengths = np.maximum(np.round(rng.exponential(20_000.0, 200_000)), 1)
    mean_s = float(LINEAR.request_time_s(lengths).mean())
    rate = 0.8 / mean_s
    p = predict_pd(
        LINEAR,
        DECODE,
        lengths,
        np.ones_like(lengths),
        rate,
        1,
        1,
        ttft_slo_s=5 * mean_s,
        tpot_slo_s=0.1,
    )
    mu = 1 / mean_s
    assert p.stable
    assert p.ttft_mean_s == pytest.approx(mm1(rate, mu).mean_response_s, rel=0.02)
    assert p.ttft_p99_s == pytest.approx(math.log(100) / (mu - rate), rel=0.02)
    assert p.ttft_p50_s == pytest.approx(math.log(2) / (mu - rate), rel=0.02)
    assert p.ttft_attainment == pytest.approx(1 - math.exp(-(mu - rate) * 5 * mean_s), rel=0.02)
    assert p.attainment == p.ttft_attainment  # one output token: no TPOT to meet
    assert p.decode_batch_size == 0.0


def test_predict_pd_decode_and_attainment() -> None:
    lengths = np.full(1000, 1000)
    outputs = np.full(1000, 101)
    p = predict_pd(
        LINEAR,
        DECODE,
        lengths,
        outputs,
        5.0,
        2,
        2,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        kv_capacity_tokens=1e6,
    )
    # 2.5 req/s per decode worker, 100 iterations each, c_bar = 1000 + 50.5.
    load = decode_load(DECODE, 2.5, 101, 1050.5)
    assert p.decode_batch_size == pytest.approx(load.mean_batch_size)
    assert p.tpot_s == pytest.approx(load.iteration_time_s)
    assert p.kv_ok and p.attainment == pytest.approx(p.ttft_attainment)
    strict = predict_pd(
        LINEAR, DECODE, lengths, outputs, 5.0, 2, 2, ttft_slo_s=1.0, tpot_slo_s=0.001
    )
    assert strict.attainment == 0.0


def test_predict_pd_unstable_returns_inf_and_zero_attainment() -> None:
    lengths = np.full(10, 1000)  # 0.02 s each: one worker saturates at 50 req/s
    p = predict_pd(LINEAR, DECODE, lengths, lengths, 60.0, 1, 4, ttft_slo_s=1, tpot_slo_s=1)
    assert not p.stable
    assert p.ttft_p99_s == math.inf and p.attainment == 0.0


def test_predict_pd_counts_kv_per_request_when_given() -> None:
    # sliding-window layers hold less than the context: the KV check uses what a request holds
    lengths, outputs = np.full(100, 1000), np.full(100, 101)
    args = (LINEAR, DECODE, lengths, outputs, 5.0, 2, 2)
    full = predict_pd(*args, ttft_slo_s=1.0, tpot_slo_s=0.1, kv_capacity_tokens=2000)
    held = predict_pd(
        *args, ttft_slo_s=1.0, tpot_slo_s=0.1, kv_capacity_tokens=2000, kv_tokens_per_request=500
    )
    assert held.decode_kv_tokens == pytest.approx(held.decode_batch_size * 500)
    assert full.decode_kv_tokens == pytest.approx(full.decode_batch_size * 1050.5)  # l + o/2
    assert held.decode_batch_size == full.decode_batch_size
    assert held.kv_ok and not full.kv_ok


def test_moe_decode_batch_limit_and_load_against_brute_force() -> None:
    """With the MoE expert term τ is concave in B: the TPOT bound is the largest integer B with
    τ(B, B·c̄) <= SLO (checked by scanning B), and the load is Little's law's fixed point."""
    from pdopt.costmodel import DecodeModel
    from pdopt.queueing import decode_load, max_decode_batch

    model = DecodeModel(0.004, 2e-5, 3e-8, 1.2e-4, 128, 8)
    limit = max_decode_batch(
        model, tpot_slo_s=0.03, mean_context_tokens=1000, kv_capacity_tokens=1e9
    )
    scan = [b for b in range(1, 5000) if model.iteration_time_s(b, b * 1000) <= 0.03]
    assert limit.batch_size == max(scan) and limit.limited_by == "tpot"
    load = decode_load(model, 20.0, 101.0, 1000.0)
    assert load.mean_batch_size == pytest.approx(20.0 * 100 * load.iteration_time_s, rel=1e-9)
