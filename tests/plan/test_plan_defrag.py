"""Defragmentation packing: the MILP moves the fewest KV blocks (brute force over every set of
moves), never more than pdopt.freeness.plan_defrag's greedy, and explains when nothing helps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pdopt.errors import InfeasiblePlanError
from pdopt.freeness import plan_defrag
from pdopt.plan import build_defrag_packing, solve_defrag_packing


def brute_fewest_blocks(
    free: np.ndarray, src: np.ndarray, blocks: np.ndarray, reserve: np.ndarray, need: int,
    host: int | None,
) -> float:  # fmt: skip
    """Every destination (or stay, -1) per request and every host: fewest blocks moved."""
    n_w = len(free)
    best = np.inf
    hosts = range(n_w) if host is None else [host]
    for dests in itertools.product(range(-1, n_w), repeat=len(src)):
        if any(d == s for d, s in zip(dests, src, strict=True)):
            continue
        room = free.astype(float).copy()
        for i, d in enumerate(dests):
            if d >= 0:
                room[src[i]] += blocks[i]
                room[d] -= reserve[i]
        if np.any(room < 0):
            continue
        moved = sum(blocks[i] for i, d in enumerate(dests) if d >= 0)
        if any(room[h] >= need for h in hosts):
            best = min(best, moved)
    return best


def random_instance(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    rng = np.random.default_rng(seed)
    free = rng.integers(0, 8, 3)
    src = rng.integers(0, 3, 5)
    blocks = rng.integers(1, 8, 5)
    reserve = blocks + rng.integers(0, 3, 5)
    need = int(free.max() + rng.integers(1, 8))
    return free, src, blocks, reserve, need


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("fixed_host", [False, True])
def test_defrag_milp_equals_brute_force(seed: int, fixed_host: bool) -> None:
    free, src, blocks, reserve, need = random_instance(seed)
    host = int(np.argmax(free)) if fixed_host else None
    expected = brute_fewest_blocks(free, src, blocks, reserve, need, host)
    if not np.isfinite(expected):
        with pytest.raises(InfeasiblePlanError, match="binding"):
            solve_defrag_packing(free, src, blocks, reserve, need_blocks=need, host=host)
        return
    plan = solve_defrag_packing(free, src, blocks, reserve, need_blocks=need, host=host,
                                block_bytes=16 * 131072.0)  # fmt: skip
    assert plan.moved_blocks == expected
    assert plan.moved_bytes == expected * 16 * 131072.0
    # The plan really makes room: replay it.
    room = free.astype(float).copy()
    for m in plan.migrations:
        assert m.src == src[m.request] and m.dst != m.src
        room[m.src] += blocks[m.request]
        room[m.dst] -= reserve[m.request]
    assert np.all(room >= 0) and room[plan.host] >= need


@pytest.mark.parametrize("seed", range(10))
def test_defrag_milp_never_moves_more_than_the_greedy(seed: int) -> None:
    free, src, blocks, reserve, need = random_instance(seed)
    host = int(np.argmax(free))
    on_host = np.flatnonzero(src == host)
    others = np.array([w for w in range(len(free)) if w != host])
    moves = plan_defrag(need, int(free[host]), on_host, blocks[on_host], reserve[on_host],
                        others, free[others], max_moves=5)  # fmt: skip
    if not moves:
        return
    greedy_blocks = sum(m.kv_blocks for m in moves)
    plan = solve_defrag_packing(free, src, blocks, reserve, need_blocks=need, host=host)
    assert plan.moved_blocks <= greedy_blocks


def test_defrag_nothing_moves_when_a_worker_has_room() -> None:
    plan = solve_defrag_packing([4, 9], [0, 1], [2, 2], need_blocks=8)
    assert plan.migrations == () and plan.host == 1


def test_defrag_true_oom_is_explained() -> None:
    with pytest.raises(InfeasiblePlanError, match="only 9 blocks are free"):
        solve_defrag_packing([4, 5], [0, 0, 1], [3, 6, 2], need_blocks=10)


def test_defrag_build_is_unsolved_and_parameterised() -> None:
    problem = build_defrag_packing([4, 5], [0, 1], [2, 2], need_blocks=6)
    assert problem.status is None and "free_blocks" in problem.param_dict
