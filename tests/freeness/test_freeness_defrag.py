"""plan_defrag: valid, minimal plans; exact against brute force on small instances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import ParameterError
from pdopt.freeness import DefragMove, plan_defrag


def _brute_force(need, free, blocks, reserve, dst_free, max_moves, peak=None, cap=None, res=None):
    """Smallest migrated blocks over every subset and every assignment (None: infeasible);
    with ``peak`` and ``cap``, a request only where the capacity holds its peak, and its whole
    peak where ``res`` (the destination reserves)."""
    best = None
    n, m = len(blocks), len(dst_free)
    peak = [0] * n if peak is None else peak
    cap = [0] * m if cap is None else cap
    res = [False] * m if res is None else res
    for k in range(1, min(n, max_moves) + 1):
        for subset in itertools.combinations(range(n), k):
            if free + sum(blocks[i] for i in subset) < need:
                continue
            for assign in itertools.product(range(m), repeat=k):
                load = [0] * m
                for i, j in zip(subset, assign, strict=True):
                    load[j] += peak[i] if res[j] else reserve[i]
                holds = all(cap[j] >= peak[i] for i, j in zip(subset, assign, strict=True))
                if holds and all(load[j] <= dst_free[j] for j in range(m)):
                    moved = sum(blocks[i] for i in subset)
                    best = moved if best is None else min(best, moved)
                    break
    return best


def _valid(plan, need, free, ids, blocks, reserve, dst, dst_free, peak=None, res=None):
    """A valid, minimal plan; with ``peak`` and ``res``, a request takes its whole peak on a
    destination that reserves."""
    peak = reserve if peak is None else peak
    by_id = {r: (b, s, p) for r, b, s, p in zip(ids, blocks, reserve, peak, strict=True)}
    reserving = dict(zip(dst, [False] * len(dst) if res is None else res, strict=True))
    load = dict.fromkeys(dst, 0)
    for mv in plan:
        blocks_now, request_reserve, request_peak = by_id[mv.request_id]
        assert mv.kv_blocks == blocks_now
        load[mv.dst_worker] += request_peak if reserving[mv.dst_worker] else request_reserve
    assert len({mv.request_id for mv in plan}) == len(plan)
    assert all(load[d] <= f for d, f in zip(dst, dst_free, strict=True))
    assert free + sum(mv.kv_blocks for mv in plan) >= need
    # minimal: no single move can be dropped
    for mv in plan:
        assert free + sum(o.kv_blocks for o in plan) - mv.kv_blocks < need


def test_nothing_to_do_when_the_request_already_fits() -> None:
    assert plan_defrag(5, 5, [1], [3], [3], [2], [10]) == ()
    assert plan_defrag(5, 4, [], [], [], [2], [10]) == ()
    assert plan_defrag(5, 4, [1], [3], [3], [], []) == ()


def test_single_smallest_sufficient_request_moves() -> None:
    # deficit 5: requests of 4, 5, 9 blocks; the 5-block one is enough and cheapest
    plan = plan_defrag(12, 7, [10, 11, 12], [4, 5, 9], [4, 8, 9], [1, 2], [30, 8])
    assert plan == (DefragMove(11, 2, 5),)  # best fit: worker 2 is left with 0 blocks


def test_several_moves_when_no_single_one_suffices() -> None:
    args = (20, 2, [1, 2, 3, 4], [6, 7, 8, 2], [6, 7, 8, 2], [9, 8])
    plan = plan_defrag(*args, [14, 10])
    # largest first, best fit: 8 → worker 8 (10 − 8 = 2 left), 7 → worker 9 (7 left),
    # 6 → worker 9; 2 + 21 ≥ 20 and no move can be dropped
    assert plan == (DefragMove(3, 8, 8), DefragMove(2, 9, 7), DefragMove(1, 9, 6))
    _valid(plan, *args, [14, 10])
    # with two 10-block destinations no packing frees 18 blocks (brute force agrees)
    assert plan_defrag(*args, [10, 10]) == ()
    assert _brute_force(20, 2, [6, 7, 8, 2], [6, 7, 8, 2], [10, 10], 4) is None


def test_infeasible_deficit_plans_nothing() -> None:
    # all running blocks together (10) cannot cover a deficit of 11
    assert plan_defrag(20, 9, [1, 2], [5, 5], [5, 5], [3], [100]) == ()
    # destinations too small for the reserves
    assert plan_defrag(10, 5, [1], [6], [9], [3], [8]) == ()


def test_bad_inputs() -> None:
    with pytest.raises(ParameterError, match="request_ids"):
        plan_defrag(10, 1, [1, 2], [3], [3], [1], [5])
    with pytest.raises(ParameterError, match="reserve_blocks"):
        plan_defrag(10, 1, [1], [3], [2], [1], [5])
    with pytest.raises(ParameterError, match="max_moves"):
        plan_defrag(10, 1, [1], [3], [3], [1], [5], max_moves=0)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(0, 20),
    st.lists(st.tuples(st.integers(0, 15), st.integers(0, 6)), max_size=5),
    st.lists(st.integers(0, 30), max_size=3),
)
def test_plans_are_valid_and_match_brute_force_when_found(need, free, reqs, dst_free) -> None:
    blocks = [b for b, _ in reqs]
    reserve = [b + g for b, g in reqs]
    ids = list(range(100, 100 + len(reqs)))
    dst = list(range(len(dst_free)))
    plan = plan_defrag(need, free, ids, blocks, reserve, dst, dst_free, max_moves=3)
    best = _brute_force(need, free, blocks, reserve, dst_free, 3)
    if need <= free:
        assert plan == ()
        return
    if plan:
        _valid(plan, need, free, ids, blocks, reserve, dst, dst_free)
        assert best is not None
        if len(plan) == 1:  # the single-move case is exact
            singles = [
                b
                for b, s in zip(blocks, reserve, strict=True)
                if free + b >= need and any(s <= f for f in dst_free)
            ]
            assert plan[0].kv_blocks == min(singles)
    elif best is not None:
        # greedy may miss a multi-move packing, but never one that a single move solves
        assert not any(
            free + b >= need and any(s <= f for f in dst_free)
            for b, s in zip(blocks, reserve, strict=True)
        )


@st.composite
def uneven_instances(draw):
    """Up to 5 candidates and 3 destinations whose capacities sit around the candidates'
    peaks (so that the capacity rules out some destinations for some requests), and a deficit
    from one block to just beyond every candidate's."""
    reqs = draw(
        st.lists(
            st.tuples(st.integers(0, 15), st.integers(0, 6), st.integers(0, 8)),
            min_size=1, max_size=5,
        )
    )  # fmt: skip
    peaks = [b + g + p for b, g, p in reqs]
    dsts = draw(
        st.lists(
            st.tuples(st.integers(0, 30), st.sampled_from(peaks), st.integers(-2, 2)),
            min_size=1, max_size=3,
        )
    )  # fmt: skip
    free = draw(st.integers(0, 20))
    deficit = draw(st.integers(1, sum(b for b, _, _ in reqs) + 2))
    res = [draw(st.booleans()) for _ in dsts] if draw(st.booleans()) else None
    return free + deficit, free, reqs, [(f, c + d) for f, c, d in dsts], res


@settings(max_examples=300, deadline=None)
@given(uneven_instances())
def test_plans_hold_each_peak_on_workers_of_unequal_kv(instance) -> None:
    """With peaks and capacities (and, half the time, destinations that reserve KV, where a
    request needs its whole peak): every move lands where its peak fits, the plan is valid
    and minimal, a single move is the smallest one any destination holds, and a plan is
    missed only where no single move would do (against brute force)."""
    need, free, reqs, dsts, res = instance
    blocks = [b for b, _, _ in reqs]
    reserve = [b + g for b, g, _ in reqs]
    peak = [s + p for s, (_, _, p) in zip(reserve, reqs, strict=True)]
    ids = list(range(100, 100 + len(reqs)))
    dst = list(range(len(dsts)))
    dst_free, cap = [f for f, _ in dsts], [c for _, c in dsts]
    plan = plan_defrag(
        need, free, ids, blocks, reserve, dst, dst_free, max_moves=3,
        peak_blocks=peak, dst_capacity_blocks=cap, dst_reserve_output=res,
    )  # fmt: skip
    best = _brute_force(need, free, blocks, reserve, dst_free, 3, peak, cap, res)
    reserving = [False] * len(dsts) if res is None else res
    by_id = dict(zip(ids, peak, strict=True))
    assert all(cap[mv.dst_worker] >= by_id[mv.request_id] for mv in plan)
    singles = [
        b
        for b, s, p in zip(blocks, reserve, peak, strict=True)
        if free + b >= need
        and any((p if r else s) <= f and p <= c for (f, c), r in zip(dsts, reserving, strict=True))
    ]
    if need <= free:
        assert plan == ()
    elif plan:
        _valid(plan, need, free, ids, blocks, reserve, dst, dst_free, peak, res)
        assert best is not None
        if len(plan) == 1:
            assert plan[0].kv_blocks == min(singles)
    else:
        assert not singles
    if res is not None:
        return
    # capacities that hold every peak change nothing
    roomy = [max(peak, default=0)] * len(dst)
    assert plan_defrag(
        need, free, ids, blocks, reserve, dst, dst_free, max_moves=3,
        peak_blocks=peak, dst_capacity_blocks=roomy,
    ) == plan_defrag(need, free, ids, blocks, reserve, dst, dst_free, max_moves=3)  # fmt: skip


def test_a_request_goes_only_where_its_peak_and_its_reserve_both_fit() -> None:
    """Request 7 (6 blocks, peak 12) fits worker 1's free blocks, not its capacity; worker 2
    holds its peak but has no room: nothing can move. With room on worker 2, it goes there."""
    args = (10, 4, [7], [6], [6], [1, 2])
    uneven = {"peak_blocks": [12], "dst_capacity_blocks": [8, 16]}
    assert plan_defrag(*args, [6, 0], **uneven) == ()
    assert plan_defrag(*args, [6, 0]) == (DefragMove(7, 1, 6),)
    assert plan_defrag(*args, [6, 7], **uneven) == (DefragMove(7, 2, 6),)


def test_a_destination_that_reserves_takes_the_whole_peak() -> None:
    """Request 8 (6 blocks now, reserve 6, peak 12): worker 1 (10 free) fits its reserve but
    reserves KV at admission, where it needs 12; worker 2 (20 free) takes it."""
    args = (10, 4, [8], [6], [6], [1, 2], [10, 20])
    uneven = {"peak_blocks": [12], "dst_capacity_blocks": [16, 16]}
    assert plan_defrag(*args, **uneven) == (DefragMove(8, 1, 6),)
    reserving = plan_defrag(*args, **uneven, dst_reserve_output=[True, False])
    assert reserving == (DefragMove(8, 2, 6),)
    with pytest.raises(ParameterError, match="dst_reserve_output"):
        plan_defrag(*args, dst_reserve_output=[True, False])


def test_a_reserving_destination_is_charged_each_request_s_peak() -> None:
    """Greedy over two destinations, worker 1 reserving: request 10 takes 21 of its 30 free
    blocks (its peak, not its reserve of 17), so request 13 (peak 12) no longer fits there and
    goes to worker 0; charging worker 1 the reserves would put both there (33 > 30)."""
    ids, blocks = [10, 11, 12, 13, 14], [15, 13, 1, 8, 0]
    reserve, peak, dst, free = [17, 15, 7, 11, 1], [21, 22, 10, 12, 2], [0, 1], [25, 30]
    plan = plan_defrag(
        29, 5, ids, blocks, reserve, dst, free, max_moves=3,
        peak_blocks=peak, dst_capacity_blocks=[20, 24], dst_reserve_output=[False, True],
    )  # fmt: skip
    assert plan == (DefragMove(10, 1, 15), DefragMove(13, 0, 8), DefragMove(12, 0, 1))
    _valid(plan, 29, 5, ids, blocks, reserve, dst, free, peak, [False, True])


def test_peaks_and_capacities_go_together() -> None:
    with pytest.raises(ParameterError, match="peak_blocks"):
        plan_defrag(10, 1, [1], [3], [3], [1], [5], peak_blocks=[4])
    with pytest.raises(ParameterError, match="dst_capacity_blocks"):
        plan_defrag(10, 1, [1], [3], [3], [1], [5], peak_blocks=[4], dst_capacity_blocks=[])


def test_greedy_finds_a_plan_whenever_destinations_are_roomy() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 7))
        blocks = rng.integers(1, 20, n)
        need = int(rng.integers(1, 60))
        free = int(rng.integers(0, need))
        # every destination can take every request at once: feasibility = coverage by count
        dst_free = [int(blocks.sum()) * 2] * 2
        plan = plan_defrag(need, free, np.arange(n), blocks, blocks, [0, 1], dst_free, max_moves=n)
        feasible = free + int(blocks.sum()) >= need
        assert bool(plan) == feasible
        if len(plan) > 1:
            # several moves only when no single request covers the deficit
            assert free + int(blocks.max()) < need
