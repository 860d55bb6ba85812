"""Phasor's compiled decision rules against :mod:`pdopt.freeness`: identical answers.

The Python functions are the reference; their twins (``pdopt.sim._compiled._freeness``) must
pick the same member, destination and moves on every tie and compare the same floats. Inputs
are drawn small so that ties are common: equal means, member times exactly at the end of T_cool,
equal block counts and reserves, destinations with equal room.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.freeness import (
    flow_control,
    plan_defrag,
    spatial_freeness,
    starved_pool,
    stranded_blocks,
)
from pdopt.sim._compiled._freeness import (
    _drop_covered,
    flow_decision,
    plan_defrag_into,
    spatial_phi,
    stranded,
)

ROLES = ("prefill", "decode", "mixed")  # index = role code (pdopt.sim._compiled._state)
POOLS = ("prefill", "decode", "mixed")  # index = pool code (POOL_LABELS)
SETTINGS = {"max_examples": 300, "deadline": None}
PAD = 3  # extra array entries past n / m / n_members, which the twins must not read

# Φ means: a few exact values (ties, θ·d boundaries, negatives) or any in [-2, 2]
means = st.one_of(
    st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.31, 0.5, 0.62, 1.0, 2.0]),
    st.floats(-2.0, 2.0, allow_nan=False),
)


# =============================================================================================
# flow_control
# =============================================================================================
def compiled_flow(mean_p, mean_d, roles, homes, moved_at, now, n_p, n_d, theta, cool, release):
    """flow_decision on string roles, its answer as flow_control's (member, to_role, to_pool)."""
    n = len(roles)
    role_codes = np.array([ROLES.index(r) for r in roles] + [0] * PAD, dtype=np.int64)
    home_codes = np.array([ROLES.index(h) for h in homes] + [1] * PAD, dtype=np.int64)
    times = np.array([*moved_at, 0.0] + [now] * (PAD - 1), dtype=np.float64)
    member, to_role, to_pool = flow_decision(
        float(mean_p), float(mean_d), role_codes, home_codes, times, n, float(now),
        n_p, n_d, float(theta), float(cool), release,
    )  # fmt: skip
    if member < 0:
        return -1, "", ""
    return member, ROLES[to_role], POOLS[to_pool]


def python_flow(mean_p, mean_d, roles, homes, moved_at, now, n_p, n_d, theta, cool, release):
    d = flow_control(
        mean_p, mean_d, roles, homes, moved_at, now, n_prefill=n_p, n_decode=n_d,
        theta_flow=theta, cool_s=cool, release=release,
    )  # fmt: skip
    return d.member, d.to_role, d.to_pool


@st.composite
def flow_inputs(draw, role_names=ROLES[:2]):
    """Means, 0–5 members, their move times (NaN, or about T_cool ago: exactly, one ulp either
    side, or well inside/outside), the pools' sizes, θ_flow, T_cool and the release flag."""
    roles = st.sampled_from(role_names)
    now = draw(st.sampled_from([0.0, 0.35, 1.0, 2.0, 7.3]))
    cool = draw(st.sampled_from([0.0, 0.05, 1.0, 0.7]))
    n = draw(st.integers(0, 5))

    def moved_at():
        kind = draw(st.sampled_from(["nan", "edge", "before", "after", "far", "now"]))
        edge = now - cool
        return {
            "nan": math.nan,
            "edge": edge,
            "before": math.nextafter(edge, -math.inf),
            "after": math.nextafter(edge, math.inf),
            "far": edge - 1.0,
            "now": now,
        }[kind]

    mean_p = draw(means)
    mean_d = draw(st.one_of(st.just(mean_p), means))
    return (
        mean_p,
        mean_d,
        [draw(roles) for _ in range(n)],
        [draw(roles) for _ in range(n)],
        [moved_at() for _ in range(n)],
        now,
        draw(st.integers(0, 4)),
        draw(st.integers(0, 4)),
        draw(st.sampled_from([0.62, 0.5, 1.0, 1.5])),
        cool,
        draw(st.booleans()),
    )


@settings(**SETTINGS)
@given(args=flow_inputs())
def test_flow_decision_matches_flow_control(args):
    """Prefill/decode members (the runs' case), release on and off."""
    assert compiled_flow(*args) == python_flow(*args)


@settings(max_examples=150, deadline=None)
@given(args=flow_inputs(role_names=ROLES))
def test_flow_decision_matches_flow_control_with_mixed_roles(args):
    """Members whose role or home is ``"mixed"`` (code 2), which flow_control accepts."""
    assert compiled_flow(*args) == python_flow(*args)


def test_flow_decision_docstring_examples():
    nan = math.nan
    cases = [
        ((0.1, 0.9, ["decode"], ["decode"], [nan], 0.0, 2, 3, 0.62, 1.0, False), (0, 0, 0)),
        ((0.9, 0.9, ["prefill"], ["decode"], [0.0], 2.0, 3, 2, 0.62, 1.0, False), (-1, -1, -1)),
        ((0.9, 0.9, ["prefill"], ["decode"], [0.0], 2.0, 3, 2, 0.62, 1.0, True), (0, 1, 2)),
    ]
    for args, codes in cases:
        assert compiled_flow(*args) == python_flow(*args)
        member, to_role, to_pool = codes
        expect = (-1, "", "") if member < 0 else (member, ROLES[to_role], POOLS[to_pool])
        assert compiled_flow(*args) == expect


def test_flow_decision_both_pools_starved_picks_smaller_phi():
    """Negative means: both tests hold, the smaller Φ is starved; a tie starves prefill."""
    members = (["decode", "prefill"], ["decode", "prefill"], [math.nan, math.nan])
    for p, d in [(-1.0, -0.5), (-0.5, -1.0), (-1.0, -1.0)]:
        assert starved_pool(p, d, 0.62)
        args = (p, d, *members, 0.0, 3, 3, 0.62, 1.0, False)
        assert compiled_flow(*args) == python_flow(*args)
        assert compiled_flow(*args)[1] == ("prefill" if p <= d else "decode")


def test_flow_decision_release_projects_a_home_pool_of_one():
    """A return projects the home pool with the member back (``_mean_with``, n = 1): Φ_S 0.4
    becomes 0.7, and prefill without the member (0.25) would then be starved: no return."""
    args = (0.5, 0.4, ["prefill"], ["decode"], [math.nan], 0.0, 3, 1, 0.62, 1.0, True)
    assert compiled_flow(*args) == python_flow(*args) == (-1, "", "")
    args = (0.5, 0.4, ["prefill"], ["decode"], [math.nan], 0.0, 3, 0, 0.62, 1.0, True)
    assert compiled_flow(*args) == python_flow(*args) == (0, "decode", "mixed")


def test_flow_decision_at_theta_exactly():
    """Means where ``p == θ·d`` holds exactly in float64 (found by search), and where ``d`` is
    one ulp higher: no pool is starved, then prefill is. The release projection is held to the
    same bit: Φ_T 0.69 over 3 workers projects to 0.5349999999999999 without the member, which
    is exactly 0.62 × Φ_S 0.794354838709677 projected over 2 + 1 workers (the member returns);
    from Φ_S 0.7943548387096774 (3 ulps up: the first whose projection differs) prefill would
    be starved without it (it stays)."""
    member = (["decode"], ["decode"], [math.nan], 0.0, 3, 3, 0.62, 1.0, False)
    p, d = 0.5499999999999999, 0.8870967741935483
    assert p == 0.62 * d
    for d_ulp, moves in [(d, False), (math.nextafter(d, 2.0), True)]:
        args = (p, d_ulp, *member)
        assert compiled_flow(*args) == python_flow(*args)
        assert (compiled_flow(*args)[0] >= 0) is moves
    promoted = (["prefill"], ["decode"], [math.nan], 0.0, 3, 2, 0.62, 1.0, True)
    for d, returns in [(0.794354838709677, True), (0.7943548387096774, False)]:
        args = (0.69, d, *promoted)
        assert compiled_flow(*args) == python_flow(*args)
        assert (compiled_flow(*args)[0] >= 0) is returns


def test_flow_decision_cool_down_ends_exactly_at_t_cool():
    """``now − moved_at >= cool_s``: a member moved exactly T_cool ago may move again."""
    for moved, moves in [(1.0, True), (math.nextafter(1.0, 2.0), False)]:
        args = (0.1, 0.9, ["decode"], ["decode"], [moved], 2.0, 2, 3, 0.62, 1.0, False)
        assert (compiled_flow(*args)[0] >= 0) is moves
        assert compiled_flow(*args) == python_flow(*args)


# =============================================================================================
# plan_defrag
# =============================================================================================
def compiled_plan(
    need, src_free, ids, blocks, reserve, dst, dst_free, max_moves, peak=None, cap=None, res=None
):
    """plan_defrag_into on padded arrays, its moves as (request_id, dst_worker, kv_blocks);
    without ``peak`` and ``cap`` every destination holds every peak, without ``res`` none
    reserves."""
    n, m = len(ids), len(dst)
    peak = [0] * n if peak is None else peak
    cap = [0] * m if cap is None else cap
    res = [0] * m if res is None else [int(r) for r in res]

    def padded(values, fill):
        return np.array([*values] + [fill] * PAD, dtype=np.int64)

    # padding that would change the answer if read: huge blocks, roomy destinations
    args = (
        padded(ids, -7), padded(blocks, 10**6), padded(reserve, 10**6), padded(peak, 0), n,
        padded(dst, -9), padded(dst_free, 10**7), padded(cap, 10**7), padded(res, 0), m,
    )  # fmt: skip
    dst_free_before = args[6].copy()
    out = np.full((3, max_moves + PAD), -5, dtype=np.int64)
    free, order = np.full(m + PAD, -3, np.int64), np.full(n + PAD, -3, np.int64)
    count = plan_defrag_into(need, src_free, *args, max_moves, *out, free, order)
    np.testing.assert_array_equal(args[6], dst_free_before)  # plan_defrag copies it too
    assert (out[:, max_moves:] == -5).all()
    return [tuple(int(v) for v in out[:, k]) for k in range(count)]


def python_plan(
    need, src_free, ids, blocks, reserve, dst, dst_free, max_moves, peak=None, cap=None, res=None
):
    plan = plan_defrag(
        need, src_free, ids, blocks, reserve, dst, dst_free, max_moves=max_moves,
        peak_blocks=peak, dst_capacity_blocks=cap, dst_reserve_output=res,
    )  # fmt: skip
    return [(mv.request_id, mv.dst_worker, mv.kv_blocks) for mv in plan]


@st.composite
def defrag_inputs(draw, greedy=False):
    """Up to 7 candidates (small blocks and growth: ties), up to 4 destinations (their free
    blocks may be negative), a deficit from none to beyond every candidate, 1–5 moves. With
    ``greedy``, at least two candidates and a destination and a deficit no candidate covers
    alone: the greedy and its removal pass."""

    def rarely(value, otherwise):  # ``value`` about one draw in ten
        return otherwise if draw(st.integers(0, 9)) else value

    n = draw(st.integers(2, 7)) if greedy else rarely(0, draw(st.integers(1, 7)))
    m = draw(st.integers(1, 4)) if greedy else rarely(0, draw(st.integers(1, 4)))
    blocks = [draw(st.integers(0, 6)) for _ in range(n)]
    reserve = [b + draw(st.integers(0, 3)) for b in blocks]
    src_free = draw(st.integers(0, 8))
    # a deficit up to just beyond all candidates' blocks (the greedy's range), rarely none
    low = max(blocks) + 1 if greedy else 1
    deficit = draw(st.integers(low, max(low, sum(blocks) + 2)))
    if not greedy:
        deficit = rarely(draw(st.integers(-3, 0)), deficit)
    # half the time workers of unequal KV: peaks past the reserve, capacities around them
    uneven = draw(st.booleans())
    peak = [r + draw(st.integers(0, 4)) for r in reserve] if uneven else None
    cap = [draw(st.integers(0, 12)) for _ in range(m)] if uneven else None
    # and some of them reserve KV at admission (a request needs its whole peak there)
    res = [draw(st.booleans()) for _ in range(m)] if uneven and draw(st.booleans()) else None
    return (
        src_free + deficit,
        src_free,
        [draw(st.integers(0, 9)) for _ in range(n)],  # ids may repeat: plan_defrag allows it
        blocks,
        reserve,
        [draw(st.integers(0, 9)) for _ in range(m)],
        [draw(st.integers(-2, 24)) for _ in range(m)],
        draw(st.integers(1, 5)),
        peak,
        cap,
        res,
    )


@settings(**SETTINGS)
@given(args=defrag_inputs())
def test_plan_defrag_into_matches_plan_defrag(args):
    """As drawn (ids and workers may repeat), then with distinct ids and workers, so that each
    move names which candidate and destination won a tie."""
    assert compiled_plan(*args) == python_plan(*args)
    need, src_free, ids, blocks, reserve, dst, dst_free, max_moves, peak, cap, res = args
    ids, dst = list(range(100, 100 + len(ids))), list(range(len(dst)))
    args = (need, src_free, ids, blocks, reserve, dst, dst_free, max_moves, peak, cap, res)
    assert compiled_plan(*args) == python_plan(*args)


@settings(**SETTINGS)
@given(args=defrag_inputs(greedy=True))
def test_plan_defrag_into_matches_plan_defrag_greedy(args):
    """No single move covers the deficit; distinct ids and workers, so each move names which
    candidate and destination won."""
    need, src_free, ids, blocks, reserve, dst, dst_free, max_moves, peak, cap, res = args
    ids, dst = list(range(100, 100 + len(ids))), list(range(len(dst)))
    args = (need, src_free, ids, blocks, reserve, dst, dst_free, max_moves, peak, cap, res)
    assert compiled_plan(*args) == python_plan(*args)


def test_plan_defrag_into_examples():
    """Each rule of plan_defrag once, with the moves it plans."""
    cases = [
        # plan_defrag's docstring: request 8 alone covers the deficit of 6, best fit worker 2
        ((10, 4, [7, 8, 9], [3, 6, 9], [3, 6, 9], [1, 2], [20, 7], 4), [(8, 2, 6)]),
        # single moves: the smaller reserve wins a tie on blocks, the lower index a full tie
        ((5, 0, [1, 2, 3], [5, 5, 6], [7, 6, 6], [0], [9], 4), [(2, 0, 5)]),
        ((5, 0, [1, 2, 3], [5, 5, 6], [6, 6, 6], [0], [9], 4), [(1, 0, 5)]),
        # no single request covers 7: largest first, each to its best fit (a tie: worker 0)
        ((9, 2, [1, 2, 3], [5, 4, 2], [5, 4, 2], [0, 1], [6, 6], 4), [(1, 0, 5), (2, 1, 4)]),
        # 4 + 3 cover 6 in two moves; with one move allowed nothing does: no partial plan
        ((6, 0, [1, 2, 3], [4, 3, 2], [4, 3, 2], [0], [9], 4), [(1, 0, 4), (2, 0, 3)]),
        ((6, 0, [1, 2, 3], [4, 3, 2], [4, 3, 2], [0], [9], 1), []),
        # no room anywhere, nothing to move, no destination, no deficit
        ((6, 0, [1], [9], [9], [0], [3], 4), []),
        ((6, 0, [], [], [], [0], [9], 4), []),
        ((6, 0, [1], [9], [9], [], [], 4), []),
        ((6, 6, [1], [9], [9], [0], [9], 4), []),
    ]
    for args, moves in cases:
        assert compiled_plan(*args) == python_plan(*args) == moves


def test_plan_defrag_into_capacity_per_destination():
    """Workers of unequal KV: request 8 (peak 12) goes to worker 2 (capacity 16) though worker
    1 (capacity 8) fits its reserve best; a plan that needs a request no destination holds at
    its peak is none."""
    single = (10, 4, [7, 8, 9], [3, 6, 9], [3, 6, 9], [1, 2], [7, 20], 4)
    assert python_plan(*single) == [(8, 1, 6)]  # every destination holds every peak
    uneven = (*single, [6, 12, 16], [8, 16])
    assert compiled_plan(*uneven) == python_plan(*uneven) == [(8, 2, 6)]
    # no destination holds request 9's peak (20), and 7 and 8 together fall short of 8
    greedy = (12, 4, [7, 8, 9], [3, 4, 9], [3, 4, 9], [1, 2], [20, 20], 4, [6, 12, 20], [8, 16])
    assert compiled_plan(*greedy) == python_plan(*greedy) == []
    assert python_plan(*greedy[:8]) == [(9, 1, 9)]
    # worker 1 reserves: request 8 needs its whole peak (12) there, more than its 10 free;
    # worker 2 (capacity 16, on demand) takes it
    reserving = (10, 4, [7, 8, 9], [3, 6, 9], [3, 6, 9], [1, 2], [10, 20], 4, [6, 12, 16])
    assert python_plan(*reserving, [16, 16]) == [(8, 1, 6)]
    both = (*reserving, [16, 16], [True, False])
    assert compiled_plan(*both) == python_plan(*both) == [(8, 2, 6)]
    # greedy: worker 1 reserves and is charged request 10's peak (21), so 13 goes to worker 0
    greedy = (
        29, 5, [10, 11, 12, 13, 14], [15, 13, 1, 8, 0], [17, 15, 7, 11, 1], [0, 1], [25, 30], 3,
        [21, 22, 10, 12, 2], [20, 24], [False, True],
    )  # fmt: skip
    assert compiled_plan(*greedy) == python_plan(*greedy) == [(10, 1, 15), (13, 0, 8), (12, 0, 1)]


def test_plan_defrag_into_greedy_by_deficit():
    """Blocks 5, 3, 3, 2 to workers with 5 and 20 free: the 5 fills worker 0 exactly, the rest
    go to worker 1 until the deficit is covered; 14 is beyond all of them."""
    ids, blocks, dst, dst_free = [1, 2, 3, 4], [5, 3, 3, 2], [0, 1], [5, 20]
    moves = [(1, 0, 5), (2, 1, 3), (3, 1, 3), (4, 1, 2)]
    for need, count in [(8, 2), (9, 3), (11, 3), (13, 4), (14, 0)]:
        args = (need, 0, ids, blocks, blocks, dst, dst_free, 4)
        assert compiled_plan(*args) == python_plan(*args) == moves[:count]


def python_drop_covered(deficit, blocks, chosen):
    """``_greedy_moves``' removal pass as written there, on ``chosen`` (candidate, destination)
    pairs."""
    covered = sum(int(blocks[i]) for i, _ in chosen)
    for pick in sorted(chosen, key=lambda c: (blocks[c[0]], c[0])):
        if covered - int(blocks[pick[0]]) >= deficit:
            chosen.remove(pick)
            covered -= int(blocks[pick[0]])
    return chosen


@settings(**SETTINGS)
@given(
    blocks=st.lists(st.integers(0, 6), min_size=1, max_size=7),
    data=st.data(),
    deficit=st.integers(-2, 20),
)
def test_drop_covered_matches_the_removal_pass(blocks, data, deficit):
    """The removal pass on chosen moves in any order. NOTE: plan_defrag chooses largest first
    and stops once the deficit is covered, so there every move is needed and none drops (the
    pass cannot fire); its twin is held to the Python loop here directly."""
    picks = data.draw(st.permutations(range(len(blocks))))[: data.draw(st.integers(0, 5))]
    chosen = [(i, 10 + i) for i in picks]
    pick = np.array([*picks, -4], dtype=np.int64)
    to = np.array([j for _, j in chosen] + [-4], dtype=np.int64)
    covered = sum(blocks[i] for i in picks)
    _drop_covered(deficit, covered, np.array(blocks, dtype=np.int64), len(picks), pick, to)
    kept = [(int(i), int(j)) for i, j in zip(pick[:-1], to[:-1], strict=True) if j >= 0]
    assert kept == python_drop_covered(deficit, blocks, chosen)


# =============================================================================================
# Φ_S
# =============================================================================================
@settings(**SETTINGS)
@given(
    used=st.one_of(st.integers(0, 10**6), st.integers(0, 2**61)),
    free=st.one_of(st.integers(0, 10**6), st.integers(0, 2**61)),
    need=st.one_of(st.integers(-3, 5000), st.integers(1, 2**61)),
)
def test_stranded_and_spatial_phi_match_python(used, free, need):
    """Up to 2**61 blocks (see the next test for random ones)."""
    h_frag = stranded(free, need)
    assert h_frag == int(stranded_blocks([free], need)[0])
    cap = used + free + 1
    phi = spatial_phi(used, h_frag, cap)
    assert phi == float(spatial_freeness([used], [h_frag], [cap])[0])


def test_spatial_phi_adds_after_the_float_conversion():
    """Beyond 2**53 blocks, adding after the conversion to float64 (as spatial_freeness does)
    and before it differ (about one draw in five here); hypothesis draws few such integers."""
    rng = np.random.default_rng(7)
    used, free, need = rng.integers(2**53, 2**61, size=(3, 2000), dtype=np.int64)
    h_frag = stranded_blocks(free, need)
    cap = used + free + 1
    expected = spatial_freeness(used, h_frag, cap)
    got = [spatial_phi(*values) for values in zip(used, h_frag, cap, strict=True)]
    assert [stranded(*values) for values in zip(free, need, strict=True)] == h_frag.tolist()
    assert got == expected.tolist()
