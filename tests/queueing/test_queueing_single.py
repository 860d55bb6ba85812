"""M/M/1, M/D/1, M/G/1 and Kingman: textbook identities, reductions and parameter errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import ParameterError
from pdopt.queueing import (
    kingman_wait_s,
    md1,
    md1_wait_cdf,
    mg1,
    mg1_wait_quantile_s,
    mm1,
    mm1_wait_quantile_s,
)


@pytest.mark.parametrize(("lam", "mu"), [(0.5, 1.0), (0.8, 1.0), (3.0, 4.0), (0.0, 2.0)])
def test_mm1_textbook_identities(lam: float, mu: float) -> None:
    m = mm1(lam, mu)
    rho = lam / mu
    # Kleinrock §3.2: L = rho/(1-rho), T = 1/(mu - lambda), W = rho/(mu - lambda).
    assert m.utilization == pytest.approx(rho)
    assert m.prob_wait == pytest.approx(rho)
    assert m.mean_in_system == pytest.approx(rho / (1 - rho))
    assert m.mean_response_s == pytest.approx(1 / (mu - lam))
    assert m.mean_queue_length == pytest.approx(rho**2 / (1 - rho))
    assert m.mean_wait_s == pytest.approx(rho / (mu - lam))


def test_md1_textbook_value() -> None:
    # M/D/1 with S = 1 s at rho = 0.5: W = rho S / (2 (1 - rho)) = 0.5 s, half the M/M/1 wait.
    assert md1(0.5, 1.0).mean_wait_s == pytest.approx(0.5)
    assert md1(0.5, 1.0).mean_wait_s == pytest.approx(mm1(0.5, 1.0).mean_wait_s / 2)


@given(rho=st.floats(0.01, 0.99), mean=st.floats(1e-3, 1e3))
def test_pk_reduces_to_mm1_and_md1(rho: float, mean: float) -> None:
    lam = rho / mean
    assert mg1(lam, mean, 1.0).mean_wait_s == pytest.approx(mm1(lam, 1 / mean).mean_wait_s)
    assert mg1(lam, mean, 0.0).mean_wait_s == pytest.approx(md1(lam, mean).mean_wait_s)
    # Kingman's G/G/1 with Poisson arrivals (c_a^2 = 1) is P-K exactly.
    assert kingman_wait_s(lam, mean, 1.0, 2.5) == pytest.approx(mg1(lam, mean, 2.5).mean_wait_s)


@given(rho=st.floats(0.01, 0.95), scv1=st.floats(0, 10), scv2=st.floats(0, 10))
def test_pk_wait_increases_with_service_variability(rho: float, scv1: float, scv2: float) -> None:
    lo, hi = sorted((scv1, scv2))
    assert mg1(rho, 1.0, lo).mean_wait_s <= mg1(rho, 1.0, hi).mean_wait_s


def test_mm1_quantiles_exact() -> None:
    lam, mu = 0.8, 1.0
    q = np.array([0.1, 0.2, 0.5, 0.9, 0.99])
    t = mm1_wait_quantile_s(lam, mu, q)
    # q <= 1 - rho: the atom of arrivals finding the server idle.
    assert t[0] == 0.0 and t[1] == 0.0
    tail = (lam / mu) * np.exp(-mu * (1 - lam / mu) * t[2:])
    np.testing.assert_allclose(tail, 1 - q[2:], rtol=1e-12)


@settings(deadline=None)  # the first call imports scipy.stats
@given(rho=st.floats(0.05, 0.95))
def test_mg1_quantiles_exact_at_exponential_service(rho: float) -> None:
    q = np.array([0.5, 0.9, 0.99, 0.999])
    exact = mm1_wait_quantile_s(rho, 1.0, q)
    np.testing.assert_allclose(mg1_wait_quantile_s(rho, 1.0, 1.0, q), exact, rtol=1e-9, atol=1e-12)
    # Gamma fit through Takács' second moment with E[S^3] = 6 for Exp(1): exponential again.
    gamma = mg1_wait_quantile_s(rho, 1.0, 1.0, q, service_third_moment_s3=6.0)
    np.testing.assert_allclose(gamma, exact, rtol=1e-6, atol=1e-9)


@settings(deadline=None)
@given(q1=st.floats(0, 0.999), q2=st.floats(0, 0.999))
def test_mg1_quantiles_monotone(q1: float, q2: float) -> None:
    lo, hi = sorted((q1, q2))
    t = mg1_wait_quantile_s(0.7, 1.0, 0.4, [lo, hi], service_third_moment_s3=2.5)
    assert 0 <= t[0] <= t[1]


def test_unstable_queue_is_a_clear_parameter_error() -> None:
    with pytest.raises(ParameterError, match=r"unstable: ρ = 1\.12 ≥ 1; add servers or lower"):
        mm1(1.12, 1.0)
    with pytest.raises(ParameterError, match=r"unstable: ρ = 1 ≥ 1"):
        mg1(2.0, 0.5, 0.3)
    with pytest.raises(ParameterError, match="kingman_wait_s"):
        kingman_wait_s(1.0, 1.0, 2.0, 1.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: mm1(-1.0, 1.0), "The 'arrival_rate_per_s' parameter of mm1 must be"),
        (lambda: mm1(0.5, 0.0), "The 'service_rate_per_s' parameter of mm1 must be"),
        (lambda: mg1(0.5, 1.0, -0.1), "The 'service_scv' parameter of mg1 must be"),
        (lambda: mg1(0.5, math.nan, 1.0), "The 'service_mean_s' parameter of mg1 must be"),
        (lambda: mm1_wait_quantile_s(0.5, 1.0, [1.0]), "The 'q' parameter"),
        (
            lambda: mg1_wait_quantile_s(0.5, 1.0, 1.0, 0.5, service_third_moment_s3=-1.0),
            "The 'service_third_moment_s3' parameter",
        ),
    ],
)
def test_bad_parameters_use_the_one_format(call: object, message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        call()  # type: ignore[operator]


@pytest.mark.parametrize("rho", [0.3, 0.8, 0.95])
def test_md1_exact_cdf_agrees_with_its_dominant_pole_asymptote(rho: float) -> None:
    from pdopt.queueing._single import md1_wait_tail_asymptote

    # Two independent evaluations of the same law: the decimal sum and the pole asymptote.
    for u in (20.0, 60.0, 99.0):
        tail = 1 - float(md1_wait_cdf(rho / 2.0, 2.0, 2.0 * u))
        asym = md1_wait_tail_asymptote(rho, u)
        assert tail == pytest.approx(asym, rel=1e-6, abs=1e-15)
    # Continuity at the switch to the asymptote (u = 100), and a CDF's shape.
    cdf = md1_wait_cdf(rho, 1.0, [0.0, 1.0, 99.999, 100.001, 500.0])
    assert cdf[0] == pytest.approx(1 - rho)
    assert np.all(np.diff(cdf) >= -1e-15) and cdf[-1] == pytest.approx(1.0)
    assert cdf[3] - cdf[2] < 1e-8  # the density there is below 2e-6 per unit


def test_mg1_gamma_quantiles_near_exact_md1() -> None:
    """The gamma approximation at SCV 0 against the exact M/D/1 law (measured: within 3%)."""
    q = np.array([0.9, 0.99])
    approx = mg1_wait_quantile_s(0.8, 1.0, 0.0, q, service_third_moment_s3=1.0)
    np.testing.assert_allclose(md1_wait_cdf(0.8, 1.0, approx), q, atol=0.01)
