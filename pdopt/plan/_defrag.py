"""Defragmentation packing: the migrations moving the fewest KV bytes so a waiting heavy request
fits on some decode worker (DESIGN.md "Fragmentation", "Migration").

Data: decode workers ``d`` with ``free[d]`` free blocks; running requests ``i`` on worker
``src[i]`` holding ``blocks[i]`` blocks and needing ``reserve[i] >= blocks[i]`` free blocks on a
destination (now plus their remaining growth); the waiting request needs ``need`` blocks.

MILP: binaries ``x[i, d]`` (move ``i`` to ``d != src[i]``) and ``y[d]`` (host the waiting
request on ``d``; ``Σ y = 1``, or a fixed host). For every worker,
``free[d] + Σ_{i: src=d} blocks[i]·moved[i] − Σ_i reserve[i]·x[i, d] >= need·y[d]`` (the host has
room for the request, every destination for what it receives). Minimise the bytes moved,
``block_bytes · Σ_i blocks[i]·moved[i]`` (the link time of the pre-copy), breaking ties by fewer
moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cvxpy as cp
import numpy as np
import numpy.typing as npt

from pdopt._validation import check_int_at_least, check_positive, param_error
from pdopt.errors import InfeasiblePlanError
from pdopt.plan._solve import DEFAULT_TIME_LIMIT_S, solve_highs

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Migration:
    """Move running request ``request`` (index into the inputs) from ``src`` to ``dst``."""

    request: int
    src: int
    dst: int
    kv_blocks: int


@dataclass(frozen=True, slots=True)
class DefragPlan:
    """Which requests to migrate where, and the worker that then hosts the waiting request."""

    status: str
    gap: float
    runtime_s: float
    host: int
    migrations: tuple[Migration, ...]
    moved_blocks: int
    moved_bytes: float

    @property
    def is_ok(self) -> bool:
        return self.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)


@dataclass(frozen=True, slots=True)
class _Packing:
    free: IntArray
    src: IntArray
    blocks: IntArray
    reserve: IntArray
    need: int


def _packing(
    free_blocks: npt.ArrayLike,
    request_worker: npt.ArrayLike,
    kv_blocks: npt.ArrayLike,
    reserve_blocks: npt.ArrayLike | None,
    need_blocks: int,
    owner: str,
) -> _Packing:
    free = np.asarray(free_blocks, dtype=np.int64).ravel()
    src = np.asarray(request_worker, dtype=np.int64).ravel()
    blocks = np.asarray(kv_blocks, dtype=np.int64).ravel()
    reserve = blocks if reserve_blocks is None else np.asarray(reserve_blocks, np.int64).ravel()
    if free.size == 0 or np.any(free < 0):
        raise param_error("free_blocks", owner, "a non-empty array of counts >= 0", free_blocks)
    if not len(src) == len(blocks) == len(reserve):
        raise param_error("kv_blocks", owner, "as long as request_worker", kv_blocks)
    if len(src) and (src.min() < 0 or src.max() >= len(free)):
        raise param_error("request_worker", owner, f"indices in [0, {len(free)})", request_worker)
    if np.any(blocks < 0) or np.any(reserve < blocks):
        raise param_error("reserve_blocks", owner, ">= kv_blocks >= 0", reserve_blocks)
    need = check_int_at_least(need_blocks, 1, "need_blocks", owner)
    return _Packing(free, src, blocks, reserve, need)


def build_defrag_packing(
    free_blocks: npt.ArrayLike,
    request_worker: npt.ArrayLike,
    kv_blocks: npt.ArrayLike,
    reserve_blocks: npt.ArrayLike | None = None,
    *,
    need_blocks: int,
    host: int | None = None,
) -> cp.Problem:
    """The unsolved packing MILP (module docstring). Parameter ``free_blocks`` (per worker);
    variables ``move`` (requests × workers) and ``host`` (per worker)."""
    p = _packing(free_blocks, request_worker, kv_blocks, reserve_blocks, need_blocks,
                 "build_defrag_packing")  # fmt: skip
    n_req, n_w = len(p.src), len(p.free)
    free = cp.Parameter(n_w, nonneg=True, name="free_blocks", value=p.free.astype(float))
    y = cp.Variable(n_w, boolean=True, name="host")
    cons: list[Any] = [np.ones(n_w) @ y == 1]
    if host is not None:
        if not 0 <= host < n_w:
            raise param_error("host", "build_defrag_packing", f"in [0, {n_w})", host)
        cons.append(y[host] == 1)
    if n_req == 0:
        cons.append(free >= p.need * y)
        return cp.Problem(cp.Minimize(0), cons)
    x = cp.Variable((n_req, n_w), boolean=True, name="move")
    moved = x @ np.ones(n_w)
    owned = np.zeros((n_w, n_req))
    owned[p.src, np.arange(n_req)] = p.blocks
    freed = owned @ moved
    incoming = p.reserve.astype(float) @ x
    cons += [moved <= 1, x[np.arange(n_req), p.src] == 0, free + freed - incoming >= p.need * y]
    # Bytes first; among equal bytes, fewer moves (each move costs a stop-and-copy).
    tie = 1.0 / (n_req + 1.0)
    objective = p.blocks.astype(float) @ moved + tie * (np.ones(n_req) @ moved)
    return cp.Problem(cp.Minimize(objective), cons)


def solve_defrag_packing(
    free_blocks: npt.ArrayLike,
    request_worker: npt.ArrayLike,
    kv_blocks: npt.ArrayLike,
    reserve_blocks: npt.ArrayLike | None = None,
    *,
    need_blocks: int,
    block_bytes: float = 1.0,
    host: int | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> DefragPlan:
    """The fewest-bytes migrations letting a request of ``need_blocks`` blocks in.

    ``block_bytes`` converts blocks to bytes (``block_tokens · kv_bytes_per_token``). ``host``
    fixes the worker that must take the request (Phasor's source worker); ``None`` lets the
    plan choose it. No migration is planned when a worker already has room.

    Raises
    ------
    InfeasiblePlanError
        When no set of migrations makes room; the message gives the most free blocks any worker
        can reach and the total free blocks.

    Examples
    --------
    >>> plan = solve_defrag_packing([4, 8], [0, 0, 1], [3, 6, 2], need_blocks=10, host=0)
    >>> [(m.request, m.dst) for m in plan.migrations]
    [(1, 1)]
    """
    p = _packing(free_blocks, request_worker, kv_blocks, reserve_blocks, need_blocks,
                 "solve_defrag_packing")  # fmt: skip
    check_positive(block_bytes, "block_bytes", "solve_defrag_packing")
    problem = build_defrag_packing(p.free, p.src, p.blocks, p.reserve, need_blocks=p.need,
                                   host=host)  # fmt: skip
    info = solve_highs(problem, time_limit_s=time_limit_s)
    if not info.is_ok:
        raise _why(p, host, info.status)
    chosen = int(np.argmax(np.asarray(problem.var_dict["host"].value)))
    moves: list[Migration] = []
    if "move" in problem.var_dict:
        x = np.rint(np.asarray(problem.var_dict["move"].value)).astype(np.int64)
        for i, d in zip(*np.nonzero(x), strict=True):
            moves.append(Migration(int(i), int(p.src[i]), int(d), int(p.blocks[i])))
    moved = sum(m.kv_blocks for m in moves)
    return DefragPlan(info.status, info.gap, info.runtime_s, chosen, tuple(moves), moved,
                      moved * float(block_bytes))  # fmt: skip


def _why(p: _Packing, host: int | None, status: str) -> InfeasiblePlanError:
    total_free = int(p.free.sum())
    head = f"no migration plan lets a request of {p.need} KV blocks in (solver status {status})"
    if total_free < p.need:
        return InfeasiblePlanError(
            f"{head}: binding: cluster KV: only {total_free} blocks are free on all workers "
            "together, so no packing helps (this is a true OOM, not fragmentation); the closest "
            f"is to admit requests of at most {total_free} blocks, or wait for requests to finish"
        )
    if host is None:
        reach = int((p.free + np.bincount(p.src, p.blocks, len(p.free))).max())
        where = "any one worker"
    else:
        reach = int(p.free[host] + p.blocks[p.src == host].sum())
        where = f"worker {host}"
    return InfeasiblePlanError(
        f"{head}: binding: destination room: {total_free} blocks are free in all, but the "
        f"moves that would free {where} do not fit elsewhere (emptying it entirely would reach "
        f"{reach}); the closest is to let the request in elsewhere (host=None), wait for "
        "running requests to finish, or add a decode worker"
    )
