"""Φ_T, Φ_S, fragmentation and the macro flow-control rule (pdopt.freeness)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdopt.costmodel import PrefillModel
from pdopt.errors import ParameterError
from pdopt.freeness import (
    FlowDecision,
    flow_control,
    fragmentation_pct,
    fragmentation_pct_of_totals,
    queued_work_flop,
    spatial_freeness,
    starved_pool,
    stranded_blocks,
    temporal_freeness,
    temporal_freeness_of_queues,
)

NAN = float("nan")
# Phasor's published V100 + Qwen2.5-7B constants in SI units (profiles/README.md).
V100 = PrefillModel(4.25e-5 * 1e12, 6.8e-3 * 1e12, 121e12)


def test_temporal_freeness_matches_equation_2_by_hand() -> None:
    # one 1024-token prompt: 4.25e7·1024² + 6.8e9·1024 = 4.4564e13 + 6.9632e12 FLOP
    work = 4.25e7 * 1024**2 + 6.8e9 * 1024
    phi = temporal_freeness_of_queues([[], [1024], [1024, 1024]], V100, 0.5)
    expected = [1.0, 1 - work / (121e12 * 0.5), 1 - 2 * work / (121e12 * 0.5)]
    np.testing.assert_allclose(phi, expected, rtol=1e-12)
    assert phi[2] < 0  # two long prompts overrun a 0.5 s budget: Φ goes negative


def test_queued_work_equals_prefill_model_batch_time() -> None:
    queues = [[128, 4096], [2048]]
    work = queued_work_flop(queues, V100)
    for q, w in zip(queues, work, strict=True):
        assert w / V100.p_peak_flops == pytest.approx(V100.batch_time_s(q))


def test_temporal_freeness_per_worker_peak() -> None:
    phi = temporal_freeness([1e14, 1e14], [1e14, 2e14], 1.0)
    np.testing.assert_allclose(phi, [0.0, 0.5])


@given(
    st.lists(st.integers(1, 8192), max_size=20),
    st.integers(1, 8192),
    st.floats(0.05, 10.0),
)
def test_temporal_freeness_decreases_when_work_is_queued(
    queue: list[int], extra: int, slo: float
) -> None:
    before = temporal_freeness_of_queues([queue], V100, slo)[0]
    after = temporal_freeness_of_queues([[*queue, extra]], V100, slo)[0]
    assert after < before <= 1.0


def test_argmax_picks_least_overloaded_even_when_all_negative() -> None:
    phi = temporal_freeness([5e14, 3e14, 9e14], 1e14, 1.0)
    assert (phi < 0).all()
    assert int(np.argmax(phi)) == 1


def test_spatial_freeness_and_stranded_blocks_by_hand() -> None:
    cap = np.array([100, 100, 100, 100])
    used = np.array([90, 40, 100, 35])
    free = cap - used
    # 20-block requests: none fits worker 0 (all 10 stranded), three fit worker 1 exactly,
    # three fit worker 3 with 5 blocks left over (graded H_frag)
    stranded = stranded_blocks(free, 20)
    assert stranded.tolist() == [10, 0, 0, 5]
    np.testing.assert_allclose(spatial_freeness(used, stranded, cap), [0.0, 0.6, 0.0, 0.6])
    assert fragmentation_pct(free, stranded) == pytest.approx(100 * 15 / 135)
    assert fragmentation_pct([0, 0], [0, 0]) == 0.0


@given(st.lists(st.integers(0, 500), min_size=1, max_size=8), st.integers(0, 600))
def test_stranded_blocks_property(free: list[int], need: int) -> None:
    out = stranded_blocks(free, need)
    for f, s in zip(free, out, strict=True):
        # what no whole request of ``need`` can use: all of it below need, the remainder above
        assert s == (f % need if need > 0 else 0)
        assert s <= f and (need <= 0 or s < need)
    assert 0.0 <= fragmentation_pct(free, out) <= 100.0


def test_fragmentation_per_tick_and_per_row_need() -> None:
    # per tick totals: one statement of the percentage for the metric and the series
    np.testing.assert_array_equal(
        fragmentation_pct_of_totals([70, 0, 40], [10, 0, 40]), [100 * 10 / 70, 0.0, 100.0]
    )
    assert fragmentation_pct([30, 40], [10, 0]) == fragmentation_pct_of_totals(70, 10)
    # a need per entry (time-series rows of different ticks)
    assert stranded_blocks([10, 10, 5], [20, 5, 0]).tolist() == [10, 0, 0]


def test_phi_rejects_bad_inputs() -> None:
    with pytest.raises(ParameterError, match="queued_work_flop"):
        temporal_freeness([-1.0], 1e14, 1.0)
    with pytest.raises(ParameterError, match="ttft_slo_s"):
        temporal_freeness([1.0], 1e14, 0.0)
    with pytest.raises(ParameterError, match="capacity_blocks"):
        spatial_freeness([1], [0], [0])
    with pytest.raises(ParameterError, match="free_blocks"):
        stranded_blocks([-1], 3)


# -- macro flow control -----------------------------------------------------------------------


def test_starved_pool_threshold_is_strict() -> None:
    assert starved_pool(0.62 * 0.5, 0.5, 0.62) == ""  # equal to θ·other: not starved
    assert starved_pool(0.3, 0.5, 0.62) == "prefill"
    assert starved_pool(0.5, 0.3, 0.62) == "decode"
    # both negative: both tests hold, the smaller Φ is the starved pool
    assert starved_pool(-2.0, -1.0, 0.62) == "prefill"
    assert starved_pool(-1.0, -3.0, 0.62) == "decode"


def _flow(
    p: float,
    d: float,
    roles: list[str],
    homes: list[str],
    at: list[float],
    now: float,
    n_p: int = 2,
    n_d: int = 2,
    cool: float = 1.0,
    release: bool = False,
) -> FlowDecision:
    return flow_control(
        p, d, roles, homes, at, now, n_prefill=n_p, n_decode=n_d, theta_flow=0.62, cool_s=cool,
        release=release,
    )  # fmt: skip


def test_promotes_first_member_at_home_into_starved_pool() -> None:
    dec = _flow(0.1, 0.9, ["decode", "decode"], ["decode", "decode"], [NAN, NAN], 0.0)
    assert dec == FlowDecision(0, "prefill", "prefill", "promote")
    assert dec.moves


def test_member_already_serving_starved_role_is_skipped() -> None:
    dec = _flow(0.9, 0.1, ["decode", "prefill"], ["decode", "prefill"], [NAN, NAN], 0.0)
    assert dec == FlowDecision(1, "decode", "decode", "promote")


def test_cool_down_blocks_repurposing_until_it_ends() -> None:
    roles, homes = ["prefill"], ["decode"]
    # decode starved, the member went to prefill at t=0: it keeps its role until t = cool
    assert not _flow(0.9, 0.1, roles, homes, [0.0], 0.99).moves
    dec = _flow(0.9, 0.1, roles, homes, [0.0], 1.0)
    assert dec == FlowDecision(0, "decode", "mixed", "return")


def test_never_moves_the_last_worker_of_a_pool() -> None:
    dec = _flow(0.9, 0.1, ["prefill"], ["prefill"], [NAN], 0.0, n_p=1, n_d=3)
    assert not dec.moves


def test_paper_rule_moves_members_only_into_a_starved_pool() -> None:
    # Alg. 1: with neither pool starved nothing moves, however long ago the member was promoted
    assert not _flow(0.9, 0.9, ["prefill"], ["decode"], [0.0], 500.0, n_p=3, n_d=2).moves
    # it goes home only when its home pool starves (and it has cooled down)
    dec = _flow(0.9, 0.1, ["prefill"], ["decode"], [0.0], 5.0, n_p=3, n_d=2)
    assert dec == FlowDecision(0, "decode", "mixed", "return")


def test_release_ablation_uses_projected_means() -> None:
    # release=True (not in the paper): prefill pool of 3 (one promoted member) at mean 0.9 →
    # without it 1 − 3·0.1/2 = 0.85; decode pool of 2 at 0.9 gains it → 1 − 2·0.1/3 ≈ 0.933:
    # unstarved, so it goes home
    dec = _flow(0.9, 0.9, ["prefill"], ["decode"], [0.0], 5.0, n_p=3, n_d=2, release=True)
    assert dec == FlowDecision(0, "decode", "mixed", "return")
    # prefill at 0.7 → without it 1 − 3·0.3/2 = 0.55 < 0.62·0.933: it stays
    assert not _flow(
        0.7, 0.9, ["prefill"], ["decode"], [0.0], 5.0, n_p=3, n_d=2, release=True
    ).moves
    # still cooling: it stays whatever the means say
    assert not _flow(
        0.9, 0.9, ["prefill"], ["decode"], [4.5], 5.0, n_p=3, n_d=2, release=True
    ).moves


def test_no_members_no_move_and_bad_inputs() -> None:
    assert _flow(0.0, 1.0, [], [], [], 0.0) == FlowDecision()
    with pytest.raises(ParameterError, match="member_roles"):
        _flow(0.0, 1.0, ["decode"], [], [], 0.0)
    with pytest.raises(ParameterError, match="member_roles"):
        _flow(0.0, 1.0, ["gpu"], ["decode"], [NAN], 0.0)
    with pytest.raises(ParameterError, match="theta_flow"):
        flow_control(0.0, 1.0, [], [], [], 0.0, n_prefill=1, n_decode=1, theta_flow=0.0)


@given(
    st.floats(-5, 1),
    st.floats(-5, 1),
    st.lists(
        st.tuples(
            st.sampled_from(["prefill", "decode"]),
            st.sampled_from(["prefill", "decode"]),
            st.one_of(st.just(NAN), st.floats(0, 10)),
        ),
        max_size=5,
    ),
    st.floats(0, 12),
)
def test_flow_decision_is_always_valid(
    p: float, d: float, members: list[tuple[str, str, float]], now: float
) -> None:
    roles = [m[0] for m in members]
    homes = [m[1] for m in members]
    at = [m[2] for m in members]
    dec = _flow(p, d, roles, homes, at, now, n_p=3, n_d=3)
    if not dec.moves:
        return
    i = dec.member
    assert roles[i] != dec.to_role  # a move always changes the role
    assert math.isnan(at[i]) or now - at[i] >= 1.0  # cool-down respected
    if dec.reason == "promote":
        assert starved_pool(p, d, 0.62) == dec.to_role == dec.to_pool
    else:
        assert dec.to_pool == "mixed" and dec.to_role == homes[i]
