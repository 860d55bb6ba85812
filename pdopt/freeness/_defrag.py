"""Defragmentation planning: which running requests to migrate where so that a decode worker can
host the request waiting at its head (DESIGN.md "Fragmentation", "Migration"; Phasor §"Meso").

The source is short of ``deficit = need − free`` blocks. Moving running request ``i`` frees its
``kv_blocks[i]`` blocks on the source and needs ``reserve_blocks[i]`` free blocks on its
destination (its blocks now plus the growth it will still do). Choosing the requests and their
destinations is online bin packing; the rule here is a greedy that is exact in the common case:

1. If one request alone covers the deficit and fits a destination, move the smallest such one
   (fewest bytes on the link, one stop-and-copy).
2. Otherwise take requests largest first, each to its best-fit destination (the one left with
   the least room), until the deficit is covered or ``max_moves`` is reached; then drop every
   chosen move the others already cover (smallest first).
3. If the deficit cannot be covered, plan nothing: a partial defragmentation pays migration
   cost and still does not admit the waiting request.

On workers of unequal KV capacity a request may also need a destination that holds it at its
peak (``peak_blocks``, the blocks of its last iteration's context), and on one that reserves KV
at admission (``dst_reserve_output``) its whole peak free: a destination "fits" a request when
it has the free blocks the request needs there and the capacity its peak needs. Without
``peak_blocks`` every destination holds every peak and asks the reserve (a uniform cluster).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_int_at_least, param_error

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class DefragMove:
    """Migrate running request ``request_id`` (``kv_blocks`` blocks now) to ``dst_worker``."""

    request_id: int
    dst_worker: int
    kv_blocks: int


def _arrays(*values: npt.ArrayLike) -> list[IntArray]:
    out = [np.asarray(v, dtype=np.int64).reshape(-1) for v in values]
    return out


def _best_fit(free: list[int], needs: list[int], holds: list[bool]) -> int:
    """Index of the destination left with the least room after taking its ``needs`` entry,
    among those whose ``holds`` is True; -1 if none.

    NOTE: plain Python over a handful of destinations beats numpy's per-call overhead.
    """
    best, best_room = -1, -1
    for j, f in enumerate(free):
        room = f - needs[j]
        if room >= 0 and (best < 0 or room < best_room) and holds[j]:
            best, best_room = j, room
    return best


@dataclass(frozen=True)
class _Limits:
    """What the destinations ask of a request beyond its reserve (workers of unequal KV or
    allocation): a capacity that holds its peak, and on a destination that reserves KV at
    admission its whole peak free (``peak_blocks``, ``dst_capacity_blocks``,
    ``dst_reserve_output``; without them every destination holds every peak and asks the
    request's reserve)."""

    reserve: IntArray
    peak: IntArray | None = None
    capacity: IntArray | None = None
    reserving: npt.NDArray[np.bool_] | None = None

    def needs(self, i: int, m: int) -> list[int]:
        """The free blocks request ``i`` needs on each of the ``m`` destinations."""
        if self.peak is None or self.reserving is None:
            return [int(self.reserve[i])] * m
        out: list[int] = np.where(self.reserving, self.peak[i], self.reserve[i]).tolist()
        return out

    def holds(self, i: int, m: int) -> list[bool]:
        """Whether each destination's capacity holds request ``i``'s peak."""
        if self.peak is None or self.capacity is None:
            return [True] * m
        out: list[bool] = (self.capacity >= self.peak[i]).tolist()
        return out

    def fits_somewhere(self, free: list[int]) -> npt.NDArray[np.bool_]:
        """Whether each request fits some destination: its need free there and its peak
        held."""
        need = self.reserve[:, None]
        if self.peak is not None and self.reserving is not None:
            need = np.where(self.reserving[None, :], self.peak[:, None], need)
        room = np.asarray(free, dtype=np.int64)[None, :] >= need
        if self.peak is not None and self.capacity is not None:
            room &= self.capacity[None, :] >= self.peak[:, None]
        out: npt.NDArray[np.bool_] = np.any(room, axis=1)
        return out


def _check(
    ids: IntArray, blocks: IntArray, reserve: IntArray, dst: IntArray, dst_free: IntArray
) -> None:
    owner = "plan_defrag"
    if not len(ids) == len(blocks) == len(reserve):
        raise param_error("request_ids", owner, "as long as kv_blocks and reserve_blocks", ids)
    if len(dst) != len(dst_free):
        raise param_error("dst_workers", owner, "as long as dst_free_blocks", dst)
    if np.any(blocks < 0) or np.any(reserve < blocks):
        raise param_error("reserve_blocks", owner, ">= kv_blocks >= 0 for every request", reserve)


def plan_defrag(
    need_blocks: int,
    src_free_blocks: int,
    request_ids: npt.ArrayLike,
    kv_blocks: npt.ArrayLike,
    reserve_blocks: npt.ArrayLike,
    dst_workers: npt.ArrayLike,
    dst_free_blocks: npt.ArrayLike,
    *,
    max_moves: int = 4,
    peak_blocks: npt.ArrayLike | None = None,
    dst_capacity_blocks: npt.ArrayLike | None = None,
    dst_reserve_output: npt.ArrayLike | None = None,
) -> tuple[DefragMove, ...]:
    """Migrations that free ``need_blocks − src_free_blocks`` blocks on the source.

    Parameters
    ----------
    need_blocks : int
        Blocks the waiting request needs on the source.
    src_free_blocks : int
        The source's free blocks now.
    request_ids, kv_blocks, reserve_blocks : array_like of int, shape (n,)
        Candidate running requests on the source, the blocks each holds now, and the free blocks
        each needs on a destination (>= kv_blocks: now plus its remaining growth).
    dst_workers, dst_free_blocks : array_like of int, shape (m,)
        Candidate destinations and the free blocks each can give to migrated requests.
    max_moves : int
        Most migrations in one plan.
    peak_blocks, dst_capacity_blocks : array_like of int, optional
        Given together: the blocks each request holds at its last iteration, shape (n,), and
        each destination's KV capacity, shape (m,); a request moves only to a destination whose
        capacity holds its peak (workers of unequal KV). Without them every destination does.
    dst_reserve_output : array_like of bool, shape (m,), optional
        With ``peak_blocks``: the destinations that reserve KV at admission
        (``kv_allocation="reserve_output"``), where a request needs its whole peak free rather
        than its reserve. Without it none does.

    Returns
    -------
    tuple of DefragMove
        Empty when nothing needs to move or the deficit cannot be covered; otherwise moves whose
        ``kv_blocks`` sum to at least the deficit and whose needs (reserves, or peaks where
        the destination reserves) fit their destinations.

    Examples
    --------
    >>> plan_defrag(10, 4, [7, 8, 9], [3, 6, 9], [3, 6, 9], [1, 2], [20, 7])
    (DefragMove(request_id=8, dst_worker=2, kv_blocks=6),)
    """
    ids, blocks, reserve, dst, dst_free = _arrays(
        request_ids, kv_blocks, reserve_blocks, dst_workers, dst_free_blocks
    )
    _check(ids, blocks, reserve, dst, dst_free)
    limits = _limits(reserve, peak_blocks, dst_capacity_blocks, dst_reserve_output, len(dst))
    max_moves = check_int_at_least(max_moves, 1, "max_moves", "plan_defrag")
    deficit = int(need_blocks) - int(src_free_blocks)
    if deficit <= 0 or not len(ids) or not len(dst):
        return ()
    single = _single_move(deficit, ids, blocks, limits, dst, dst_free)
    if single is not None:
        return (single,)
    return _greedy_moves(deficit, ids, blocks, limits, dst, dst_free, max_moves)


def _limits(
    reserve: IntArray,
    peak_blocks: npt.ArrayLike | None,
    dst_capacity_blocks: npt.ArrayLike | None,
    dst_reserve_output: npt.ArrayLike | None,
    m: int,
) -> _Limits:
    """The destinations' limits, checked: ``peak_blocks`` and ``dst_capacity_blocks`` both
    None or both given, ``dst_reserve_output`` only with them, each of the candidates' or the
    destinations' length."""
    owner = "plan_defrag"
    if (peak_blocks is None) != (dst_capacity_blocks is None):
        raise param_error(
            "peak_blocks", owner, "given together with dst_capacity_blocks", peak_blocks
        )
    if peak_blocks is None or dst_capacity_blocks is None:
        if dst_reserve_output is not None:
            raise param_error(
                "dst_reserve_output", owner, "given with peak_blocks", dst_reserve_output
            )
        return _Limits(reserve)
    peak, capacity = _arrays(peak_blocks, dst_capacity_blocks)
    if len(peak) != len(reserve):
        raise param_error("peak_blocks", owner, "as long as request_ids", peak)
    if len(capacity) != m:
        raise param_error("dst_capacity_blocks", owner, "as long as dst_workers", capacity)
    reserving = None
    if dst_reserve_output is not None:
        reserving = np.asarray(dst_reserve_output, dtype=bool).reshape(-1)
        if len(reserving) != m:
            raise param_error("dst_reserve_output", owner, "as long as dst_workers", reserving)
    return _Limits(reserve, peak, capacity, reserving)


def _single_move(
    deficit: int,
    ids: IntArray,
    blocks: IntArray,
    limits: _Limits,
    dst: IntArray,
    dst_free: IntArray,
) -> DefragMove | None:
    free = dst_free.tolist()
    ok = np.flatnonzero((blocks >= deficit) & limits.fits_somewhere(free))
    if not len(ok):
        return None
    i = int(ok[np.lexsort((ok, limits.reserve[ok], blocks[ok]))[0]])
    m = len(free)
    j = _best_fit(free, limits.needs(i, m), limits.holds(i, m))
    return DefragMove(int(ids[i]), int(dst[j]), int(blocks[i]))


def _greedy_moves(
    deficit: int,
    ids: IntArray,
    blocks: IntArray,
    limits: _Limits,
    dst: IntArray,
    dst_free: IntArray,
    max_moves: int,
) -> tuple[DefragMove, ...]:
    free = dst_free.tolist()
    m = len(free)
    fits = limits.fits_somewhere(free) & (blocks > 0)
    if int(blocks[fits].sum()) < deficit:
        return ()  # even every request that fits somewhere alone cannot cover the deficit
    chosen: list[tuple[int, int]] = []  # (candidate index, destination index)
    covered = 0
    order = np.flatnonzero(fits)
    for i in order[np.lexsort((order, -blocks[order]))].tolist():
        if covered >= deficit or len(chosen) == max_moves:
            break
        needs = limits.needs(i, m)
        j = _best_fit(free, needs, limits.holds(i, m))
        if j < 0:
            continue
        free[j] -= needs[j]
        chosen.append((i, j))
        covered += int(blocks[i])
    if covered < deficit:
        return ()
    for pick in sorted(chosen, key=lambda c: (blocks[c[0]], c[0])):
        if covered - int(blocks[pick[0]]) >= deficit:
            chosen.remove(pick)
            covered -= int(blocks[pick[0]])
    return tuple(DefragMove(int(ids[i]), int(dst[j]), int(blocks[i])) for i, j in chosen)
