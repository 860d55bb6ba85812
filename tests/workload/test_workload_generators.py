"""Generators and archetypes: determinism, statistics against their targets, properties.

Statistical tolerances are about five standard errors of the estimate at the sample size used
(noted per test), so a correct generator fails with negligible probability for any seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import ParameterError
from pdopt.workload import (
    ARCHETYPES,
    LONGBENCH_MAX_INPUT_TOKENS,
    ConstantLengths,
    EmpiricalLengths,
    LognormalLengths,
    RateSchedule,
    archetype_workload,
    gamma_arrivals,
    generate_workload,
    get_archetype,
    piecewise_rate_arrivals,
    poisson_arrivals,
    shock_recovery_schedule,
)


def _cv(arrival_s: np.ndarray) -> float:
    gaps = np.diff(arrival_s)
    return float(gaps.std(ddof=1) / gaps.mean())


def test_same_seed_same_workload_other_seed_differs() -> None:
    first = archetype_workload("sharegpt", 5.0, n_requests=200, cv=2.0, seed=11)
    again = archetype_workload("sharegpt", 5.0, n_requests=200, cv=2.0, seed=11)
    other = archetype_workload("sharegpt", 5.0, n_requests=200, cv=2.0, seed=12)
    assert first == again
    assert not np.array_equal(first.arrival_s, other.arrival_s)
    assert not np.array_equal(first.input_tokens, other.input_tokens)
    assert np.array_equal(
        piecewise_rate_arrivals(shock_recovery_schedule(), seed=3),
        piecewise_rate_arrivals(shock_recovery_schedule(), seed=3),
    )


def test_length_columns_use_independent_streams() -> None:
    # Same distribution, same seed: inputs and outputs still differ (separate child streams).
    same = LognormalLengths.from_mean_median(343.8, 148)
    w = generate_workload(poisson_arrivals(1.0, n_requests=1000, seed=5), same, same, seed=5)
    assert not np.array_equal(w.input_tokens, w.output_tokens)
    assert abs(np.corrcoef(np.log(w.input_tokens), np.log(w.output_tokens))[0, 1]) < 0.15


def test_poisson_rate_and_cv() -> None:
    # n = 100k: rate SE 0.3 %, CV SE about 0.3 %.
    arrival = poisson_arrivals(8.0, n_requests=100_000, seed=1)
    assert np.all(np.diff(arrival) >= 0) and arrival[0] > 0
    assert (len(arrival) - 1) / (arrival[-1] - arrival[0]) == pytest.approx(8.0, rel=0.02)
    assert _cv(arrival) == pytest.approx(1.0, rel=0.02)


def test_poisson_duration_mode_fills_the_window() -> None:
    # Count ~ Poisson(50 000): SE 0.45 %.
    arrival = poisson_arrivals(5.0, duration_s=10_000.0, seed=2)
    assert arrival.max() < 10_000.0 and arrival.min() >= 0.0
    assert len(arrival) == pytest.approx(50_000, rel=0.025)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_cv_and_rate_hit_targets(cv: float) -> None:
    # n = 200k; at cv = 3 (shape 1/9, kurtosis 57) the CV estimate has SE about 0.9 %.
    arrival = gamma_arrivals(4.0, cv, n_requests=200_000, seed=3)
    assert _cv(arrival) == pytest.approx(cv, rel=0.05)
    assert (len(arrival) - 1) / (arrival[-1] - arrival[0]) == pytest.approx(4.0, rel=0.05)


def test_gamma_cv3_is_micro_clustered() -> None:
    gaps = np.diff(gamma_arrivals(1.0, 3.0, n_requests=50_000, seed=4))
    # Shape 1/9: most gaps are far below the mean, a few are very long.
    assert np.median(gaps) < 0.05 * gaps.mean()
    assert gaps.max() > 20 * gaps.mean()


def test_gamma_duration_mode() -> None:
    arrival = gamma_arrivals(5.0, 3.0, duration_s=20_000.0, seed=1)
    assert arrival.max() < 20_000.0 and np.all(np.diff(arrival) >= 0)
    # Count SE for a renewal process: sqrt(rate * T) * cv = 949, i.e. 0.95 %.
    assert len(arrival) == pytest.approx(100_000, rel=0.05)


def test_shock_recovery_rate_per_window() -> None:
    schedule = shock_recovery_schedule(total_s=600.0)
    assert schedule.rate_at(50.0) == 5.0 and schedule.rate_at(100.0) == 25.0
    assert schedule.rate_at(120.0) == 5.0 and schedule.rate_at(600.0) == 0.0
    assert schedule.expected_requests() == pytest.approx(90 * 5 + 30 * 25 + 480 * 5)
    counts = np.zeros(3)
    seeds = range(20)
    for seed in seeds:
        arrival = piecewise_rate_arrivals(schedule, seed=seed)
        assert np.all(np.diff(arrival) >= 0) and arrival.max() < 600.0
        counts += np.histogram(arrival, bins=[0.0, 90.0, 120.0, 600.0])[0]
    rates = counts / len(seeds) / np.array([90.0, 30.0, 480.0])
    # 20 runs: SE of the peak-window rate is sqrt(25 / (30 * 20)) = 0.2 req/s.
    assert rates == pytest.approx([5.0, 25.0, 5.0], rel=0.05)


def test_rate_schedule_validation() -> None:
    with pytest.raises(
        ParameterError, match="'start_s' parameter of RateSchedule must be strictly increasing"
    ):
        RateSchedule((0.0, 5.0, 5.0), (1.0, 2.0, 3.0), 10.0)
    with pytest.raises(ParameterError, match="'end_s' parameter of RateSchedule"):
        RateSchedule((0.0, 5.0), (1.0, 2.0), 5.0)
    with pytest.raises(ParameterError, match="'start_s' parameter of RateSchedule"):
        RateSchedule((0.0,), (1.0, 2.0), 5.0)
    with pytest.raises(ParameterError, match="'rate_per_s' parameter of RateSchedule"):
        RateSchedule((0.0,), (-1.0,), 5.0)
    # A zero-rate segment is an idle period.
    idle = RateSchedule((0.0, 10.0), (0.0, 3.0), 20.0)
    assert piecewise_rate_arrivals(idle, seed=0).min() >= 10.0


def test_arrival_parameter_errors() -> None:
    with pytest.raises(ParameterError, match="The 'n_requests' parameter of poisson_arrivals"):
        poisson_arrivals(1.0)
    with pytest.raises(ParameterError, match="but not both"):
        poisson_arrivals(1.0, n_requests=3, duration_s=2.0)
    with pytest.raises(ParameterError, match="The 'rate_per_s' parameter of gamma_arrivals"):
        gamma_arrivals(0.0, 2.0, n_requests=3)
    with pytest.raises(ParameterError, match="The 'cv' parameter of gamma_arrivals"):
        gamma_arrivals(1.0, -1.0, n_requests=3)
    with pytest.raises(ParameterError, match="The 'seed' parameter of poisson_arrivals"):
        poisson_arrivals(1.0, n_requests=3, seed=-1)
    assert len(poisson_arrivals(1.0, n_requests=0, seed=0)) == 0


@pytest.mark.parametrize(
    ("mean", "median", "cap", "n", "rel_mean"),
    [
        (20.6, 17, None, 200_000, 0.01),  # Alpaca in: sigma 0.62, mean SE 0.15 %
        (343.8, 148, None, 200_000, 0.03),  # ShareGPT in: sigma 1.30, mean SE 0.5 %
        (101.8, 19, None, 400_000, 0.05),  # LongBench out: sigma 1.83, mean SE 0.8 %
        (2686.9, 2736.5, 4096, 200_000, 0.01),  # LongBench in, clipped: mean below median
    ],
)
def test_lognormal_hits_mean_and_median(
    mean: float, median: float, cap: int | None, n: int, rel_mean: float
) -> None:
    lengths = LognormalLengths.from_mean_median(mean, median, max_tokens=cap)
    assert lengths.clipped_mean() == pytest.approx(mean, rel=1e-9)
    x = lengths.sample(n, np.random.default_rng(0))
    assert x.dtype == np.int64 and x.min() >= 1
    assert x.mean() == pytest.approx(mean, rel=rel_mean)
    assert np.median(x) == pytest.approx(median, rel=0.02, abs=1.0)
    if cap is not None:
        assert x.max() == cap


def test_lognormal_closed_form_and_errors() -> None:
    lengths = LognormalLengths.from_mean_median(343.8, 148)
    assert lengths.mu == pytest.approx(math.log(148))
    assert lengths.sigma == pytest.approx(math.sqrt(2 * math.log(343.8 / 148)))
    assert LognormalLengths.from_mean_median(100, 100).sigma == 0.0
    with pytest.raises(ParameterError, match="give max_tokens"):
        LognormalLengths.from_mean_median(2686.9, 2736.5)
    with pytest.raises(ParameterError, match=r"'max_tokens' parameter .* must be > the median"):
        LognormalLengths.from_mean_median(2686.9, 2736.5, max_tokens=2000)
    with pytest.raises(ParameterError, match=r"must be in \(1500"):
        LognormalLengths.from_mean_median(1000.0, 2736.5, max_tokens=3000)
    with pytest.raises(ParameterError, match="'sigma' parameter of LognormalLengths"):
        LognormalLengths(1.0, -0.5)


def test_constant_and_empirical_lengths() -> None:
    rng = np.random.default_rng(0)
    assert ConstantLengths(64).sample(3, rng).tolist() == [64, 64, 64]
    with pytest.raises(ParameterError, match="'tokens' parameter of ConstantLengths"):
        ConstantLengths(0)
    empirical = EmpiricalLengths([3, 7, 7, 100])
    draws = empirical.sample(20_000, rng)
    assert set(draws.tolist()) == {3, 7, 100}
    assert np.mean(draws == 7) == pytest.approx(0.5, abs=0.02)
    with pytest.raises(ParameterError, match="'values' parameter of EmpiricalLengths"):
        EmpiricalLengths([5, 0])
    with pytest.raises(ParameterError, match="'values' parameter of EmpiricalLengths"):
        EmpiricalLengths([])


@pytest.mark.parametrize(
    ("name", "tokens"),
    [
        ("short_short", (128, 128)),
        ("long_short", (2048, 128)),
        ("short_long", (128, 2048)),
        ("medium_medium", (1024, 1024)),
        ("long_long", (2048, 512)),
        ("production_mix", (1024, 256)),
    ],
)
def test_fixed_archetype_lengths(name: str, tokens: tuple[int, int]) -> None:
    w = archetype_workload(name, 2.0, n_requests=50, seed=0)
    assert w.name == name and len(w) == 50
    assert set(w.input_tokens.tolist()) == {tokens[0]}
    assert set(w.output_tokens.tolist()) == {tokens[1]}


@pytest.mark.parametrize(
    ("name", "means", "medians"),
    [
        ("alpaca", (20.6, 163.8), (17, 119)),
        ("sharegpt", (343.8, 237.2), (148, 152)),
        ("longbench", (2686.9, 101.8), (2736.5, 19)),
    ],
)
def test_dataset_archetype_lengths(
    name: str, means: tuple[float, float], medians: tuple[float, float]
) -> None:
    archetype = get_archetype(name)
    for dist, mean, median in zip(
        (archetype.input_lengths, archetype.output_lengths), means, medians, strict=True
    ):
        assert isinstance(dist, LognormalLengths)
        assert dist.clipped_mean() == pytest.approx(mean, rel=1e-9)
        assert math.exp(dist.mu) == pytest.approx(median)
    assert get_archetype("longbench").input_lengths == LognormalLengths.from_mean_median(
        2686.9, 2736.5, max_tokens=LONGBENCH_MAX_INPUT_TOKENS
    )
    w = archetype_workload(name, 2.0, n_requests=100_000, seed=1)
    assert np.median(w.input_tokens) == pytest.approx(medians[0], rel=0.03, abs=1.0)
    assert np.median(w.output_tokens) == pytest.approx(medians[1], rel=0.03, abs=1.0)
    assert w.input_tokens.mean() == pytest.approx(means[0], rel=0.05)


@pytest.mark.parametrize(
    ("name", "means", "slo_s"),
    [
        ("phasor_s_s", (128, 128), (0.30, 0.15)),
        ("phasor_m_m", (1024, 1024), (0.40, 0.20)),
        ("phasor_mix", (1024, 256), (0.40, 0.20)),
        ("phasor_s_l", (128, 2048), (0.125, 0.20)),
        ("phasor_l_s", (2048, 128), (2.25, 0.13)),
        ("phasor_l_l", (2048, 512), (3.00, 0.18)),
    ],
)
def test_phasor_archetypes_are_distributions_with_the_papers_means_and_slos(
    name: str, means: tuple[int, int], slo_s: tuple[float, float]
) -> None:
    """Phasor Table 1 means and Table 3 SLOs, with the Azure conversation trace's spread."""
    archetype = get_archetype(name)
    assert archetype.slo_s == slo_s
    for dist, mean, sigma in zip(
        (archetype.input_lengths, archetype.output_lengths), means, (0.985, 0.859), strict=True
    ):
        assert isinstance(dist, LognormalLengths)
        assert dist.sigma == sigma and dist.max_tokens == 8192
        assert dist.clipped_mean() == pytest.approx(mean, rel=1e-9)
    w = archetype_workload(name, 2.0, n_requests=100_000, seed=1)
    assert w.input_tokens.mean() == pytest.approx(means[0], rel=0.02)
    assert w.output_tokens.mean() == pytest.approx(means[1], rel=0.02)
    assert len(np.unique(w.input_tokens)) > 100  # lengths vary (not a constant archetype)
    assert w.input_tokens.max() <= 8192 and w.output_tokens.max() <= 8192


def test_lognormal_from_mean_and_sigma() -> None:
    free = LognormalLengths.from_mean_sigma(1024.0, 0.5)
    assert math.exp(free.mu + 0.125) == pytest.approx(1024.0) and free.max_tokens is None
    capped = LognormalLengths.from_mean_sigma(2048.0, 1.0, max_tokens=4096)
    assert capped.clipped_mean() == pytest.approx(2048.0, rel=1e-9)
    with pytest.raises(ParameterError, match="max_tokens"):
        LognormalLengths.from_mean_sigma(5000.0, 1.0, max_tokens=4096)


def test_archetype_cv_and_unknown_name() -> None:
    bursty = archetype_workload("short_short", 10.0, n_requests=50_000, cv=3.0, seed=2)
    assert bursty.stats()["interarrival_cv"] == pytest.approx(3.0, rel=0.08)
    timed = archetype_workload("alpaca", 10.0, duration_s=60.0, seed=2)
    assert timed.arrival_s.max() < 60.0
    assert sorted(ARCHETYPES) == [
        "alpaca",
        "long_long",
        "long_short",
        "longbench",
        "medium_medium",
        "phasor_l_l",
        "phasor_l_s",
        "phasor_m_m",
        "phasor_mix",
        "phasor_s_l",
        "phasor_s_s",
        "production_mix",
        "sharegpt",
        "short_long",
        "short_short",
    ]
    with pytest.raises(ParameterError) as info:
        archetype_workload("chat", 1.0, n_requests=1)
    assert str(info.value) == (
        f"The 'name' parameter of archetype_workload must be one of {sorted(ARCHETYPES)}. "
        "Got 'chat'."
    )
    with pytest.raises(ParameterError, match="'name' parameter of get_archetype"):
        get_archetype("chat")


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(ARCHETYPES)),
    rate=st.floats(0.01, 1000.0),
    cv=st.sampled_from([0.3, 1.0, 2.0, 3.0, 5.0]),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**32),
)
def test_generated_workloads_are_always_valid(
    name: str, rate: float, cv: float, n: int, seed: int
) -> None:
    w = archetype_workload(name, rate, n_requests=n, cv=cv, seed=seed)
    assert len(w) == n
    assert np.all(np.diff(w.arrival_s) >= 0) and np.all(w.arrival_s >= 0)
    assert np.all(w.input_tokens >= 1) and np.all(w.output_tokens >= 1)
    assert w == archetype_workload(name, rate, n_requests=n, cv=cv, seed=seed)


@settings(max_examples=30, deadline=None)
@given(
    base=st.floats(0.0, 50.0),
    peak=st.floats(0.0, 200.0),
    start=st.floats(0.0, 50.0),
    length=st.floats(0.1, 50.0),
    seed=st.integers(0, 2**32),
)
def test_piecewise_arrivals_stay_in_schedule(
    base: float, peak: float, start: float, length: float, seed: int
) -> None:
    schedule = shock_recovery_schedule(
        base, peak, start + 0.5, start + 0.5 + length, start + 1.0 + length
    )
    arrival = piecewise_rate_arrivals(schedule, seed=seed)
    assert np.all(np.diff(arrival) >= 0)
    assert np.all((arrival >= 0) & (arrival < schedule.end_s))
    if peak == 0.0:
        assert not np.any((arrival >= schedule.start_s[1]) & (arrival < schedule.start_s[2]))
