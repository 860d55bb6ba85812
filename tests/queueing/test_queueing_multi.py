"""M/M/c Erlang C against a brute-force CTMC solve, and Allen–Cunneen's reductions."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdopt.errors import ParameterError
from pdopt.queueing import (
    allen_cunneen,
    allen_cunneen_wait_quantile_s,
    erlang_c,
    kingman_wait_s,
    mg1,
    mm1,
    mmc,
    mmc_wait_quantile_s,
)


def ctmc_mmc(lam: float, mu: float, c: int, states: int = 400) -> tuple[float, float]:
    """P(wait) and E[W] of M/M/c from the stationary law of its truncated generator (numpy)."""
    q = np.zeros((states, states))
    for n in range(states - 1):
        q[n, n + 1] = lam
        q[n + 1, n] = min(n + 1, c) * mu
    np.fill_diagonal(q, -q.sum(axis=1))
    # pi Q = 0 with one (redundant) balance equation replaced by sum pi = 1.
    a = q.T.copy()
    a[-1, :] = 1.0
    b = np.zeros(states)
    b[-1] = 1.0
    pi = np.linalg.solve(a, b)
    n = np.arange(states)
    p_wait = float(pi[n >= c].sum())  # PASTA: an arrival sees the time-stationary law
    lq = float(np.sum(np.maximum(n - c, 0) * pi))
    return p_wait, lq / lam


def test_erlang_c_textbook_value() -> None:
    # c = 2, lambda = 1, mu = 0.75: a = 4/3, P0 = 1/5, C = a^2/(2(1 - rho)) P0 = 8/15.
    assert erlang_c(2, 1 / 0.75) == pytest.approx(8 / 15, rel=1e-12)
    m = mmc(1.0, 0.75, 2)
    assert m.mean_wait_s == pytest.approx((8 / 15) / (1.5 - 1.0))


def erlang_c_exact(c: int, a: float) -> float:
    """Erlang C in exact rational arithmetic: ``B = (a^c/c!) / Σ_{k<=c} a^k/k!`` (Kleinrock Eq.
    3.40's Erlang B form), for a float ``a`` taken exactly."""
    x = Fraction(a)
    terms = [Fraction(1)]
    for k in range(1, c + 1):
        terms.append(terms[-1] * x / k)
    b = terms[-1] / sum(terms)
    return float(b / (1 - (x / c) * (1 - b)))


def test_erlang_c_vectorised_equals_the_exact_value_and_the_scalar_call() -> None:
    servers = np.array([1, 2, 5, 40, 400, 2000], dtype=float)
    loads = servers * np.array([0.3, 0.5, 0.7, 0.9, 0.95, 0.99])
    exact = [erlang_c_exact(int(c), a) for c, a in zip(servers, loads, strict=True)]
    vec = erlang_c(servers, loads)
    np.testing.assert_allclose(vec, exact, rtol=1e-13)
    scalar = [erlang_c(int(c), float(a)) for c, a in zip(servers, loads, strict=True)]
    np.testing.assert_array_equal(vec, scalar)  # one recursion, the same floating-point steps
    grid = erlang_c(40, 40 * np.linspace(0.0, 0.98, 50))  # one pool size, many loads
    assert grid[0] == 0.0 and np.all(np.diff(grid) > 0)
    with pytest.raises(ParameterError):
        erlang_c(np.array([2.0, 3.0]), np.array([1.0, 3.0]))  # unstable: a >= c
    with pytest.raises(ParameterError):
        erlang_c(np.array([2.5]), np.array([1.0]))


@pytest.mark.parametrize("c", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("rho", [0.3, 0.5, 0.8, 0.9])
def test_erlang_c_matches_ctmc(c: int, rho: float) -> None:
    mu = 0.75
    lam = rho * c * mu
    p_wait, wait = ctmc_mmc(lam, mu, c)
    m = mmc(lam, mu, c)
    assert m.prob_wait == pytest.approx(p_wait, rel=1e-8)
    assert m.mean_wait_s == pytest.approx(wait, rel=1e-8)


def test_mmc_one_server_is_mm1_and_quantiles_exact() -> None:
    assert mmc(0.6, 1.0, 1).mean_wait_s == pytest.approx(mm1(0.6, 1.0).mean_wait_s)
    lam, mu, c = 3.0, 1.0, 4
    q = np.array([0.3, 0.9, 0.99])
    t = mmc_wait_quantile_s(lam, mu, c, q)
    p = erlang_c(c, lam / mu)
    expected = np.where(1 - q >= p, 0.0, np.log(p / (1 - q)) / (c * mu - lam))
    np.testing.assert_allclose(t, expected, rtol=1e-12)


@given(c=st.integers(1, 200), rho=st.floats(0.01, 0.99))
def test_erlang_c_is_a_probability_increasing_in_load(c: int, rho: float) -> None:
    lo = erlang_c(c, rho * c * 0.9)
    hi = erlang_c(c, rho * c)
    assert 0.0 <= lo <= hi <= 1.0


@given(rho=st.floats(0.05, 0.95), ca2=st.floats(0, 5), cs2=st.floats(0, 5))
def test_allen_cunneen_reductions(rho: float, ca2: float, cs2: float) -> None:
    # One server: Kingman; Poisson arrivals and one server: P-K; c_a^2 = c_s^2 = 1: M/M/c.
    ac = allen_cunneen(rho, 1.0, 1, arrival_scv=ca2, service_scv=cs2)
    assert ac.mean_wait_s == pytest.approx(kingman_wait_s(rho, 1.0, ca2, cs2))
    ac1 = allen_cunneen(rho, 1.0, 1, arrival_scv=1.0, service_scv=cs2)
    assert ac1.mean_wait_s == pytest.approx(mg1(rho, 1.0, cs2).mean_wait_s)
    assert allen_cunneen(3 * rho, 1.0, 3).mean_wait_s == pytest.approx(
        mmc(3 * rho, 1.0, 3).mean_wait_s
    )


def test_allen_cunneen_quantiles_exact_for_mmc() -> None:
    q = [0.5, 0.95, 0.999]
    np.testing.assert_allclose(
        allen_cunneen_wait_quantile_s(3.2, 1.0, 4, q), mmc_wait_quantile_s(3.2, 1.0, 4, q)
    )


def test_multi_server_errors() -> None:
    with pytest.raises(ParameterError, match=r"unstable: ρ = 1\.12 ≥ 1"):
        mmc(2.24, 1.0, 2)
    with pytest.raises(ParameterError, match="The 'servers' parameter of mmc must be an integer"):
        mmc(0.5, 1.0, 0)
    with pytest.raises(ParameterError, match="The 'arrival_scv' parameter of allen_cunneen"):
        allen_cunneen(0.5, 1.0, 2, arrival_scv=-1.0)


@pytest.mark.parametrize("c", [513, 600, 1000])
@pytest.mark.parametrize("rho", [0.1, 0.8, 0.97, 0.999])
def test_erlang_c_past_the_recursion_equals_the_exact_value(c: int, rho: float) -> None:
    # c > RECURSION_MAX_SERVERS takes the log-space closed form: exact rationals as ground truth
    assert erlang_c(c, rho * c) == pytest.approx(erlang_c_exact(c, rho * c), rel=1e-11)


def test_erlang_b_closed_form_equals_the_recursion_where_both_apply() -> None:
    from pdopt.queueing._multi import _erlang_b_log, _erlang_b_recursion

    for c in (101, 200, 512, 5000):
        for rho in (0.01, 0.5, 0.9, 0.999, 0.99999):
            exact = _erlang_b_recursion(c, rho * c, None)
            assert _erlang_b_log(c, rho * c) == pytest.approx(exact, rel=1e-11)


def test_erlang_c_huge_pools_are_quick_and_right() -> None:
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50

    def exact(c: int, a: float) -> float:
        pmf = mpmath.exp(c * mpmath.log(a) - a - mpmath.loggamma(c + 1))
        b = pmf / mpmath.gammainc(c + 1, a, mpmath.inf, regularized=True)
        return float(b / (1 - (mpmath.mpf(a) / c) * (1 - b)))

    for c, a in ((10**6, 0.999 * 10**6), (10**6, 0.99995 * 10**6), (10**9, 10**9 - 3e4)):
        assert erlang_c(c, a) == pytest.approx(exact(c, a), rel=1e-9)
    # mixed pool sizes in one call, up to 10^300 (no overflow, no O(c) loop)
    got = erlang_c(np.array([2.0, 700.0, 1e300]), np.array([1.0, 600.0, 0.5e300]))
    assert got[0] == pytest.approx(1 / 3) and got[1] == pytest.approx(erlang_c(700, 600.0))
    assert got[2] == 0.0
