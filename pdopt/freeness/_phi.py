"""Virtual Freeness Φ (DESIGN.md "Virtual Freeness", "Fragmentation"; Phasor Eq. 2 and 3).

Temporal freeness of a prefill worker ``w``::

    Φ_T(w) = 1 − Σ_{r ∈ Q_w} (α·l_r² + β·P_m·l_r) / (P_peak · T_TTFT_SLO)

over the work queued and running (not yet done) on ``w``. Spatial freeness of a decode worker
``d``::

    Φ_S(d) = 1 − (N_used + H_frag) / M_total

in KV blocks, where ``H_frag`` is the free capacity stranded on ``d``. Both may be negative (an
overloaded worker); ``argmax`` still picks the least overloaded one.

All functions are vectorised over workers and pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_positive, param_error
from pdopt.costmodel import PrefillModel

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _non_negative_array(values: npt.ArrayLike, name: str, owner: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise param_error(name, owner, "finite and >= 0 everywhere", values)
    return arr


def temporal_freeness(
    queued_work_flop: npt.ArrayLike, p_peak_flops: npt.ArrayLike, ttft_slo_s: float
) -> FloatArray:
    """Φ_T per prefill worker from its outstanding prefill work (Phasor Eq. 2).

    Parameters
    ----------
    queued_work_flop : array_like, shape (n_workers,)
        Σ (α·l² + β·P_m·l) over each worker's queued and running prefill work not yet done,
        FLOP-equivalent (:attr:`pdopt.sim.ClusterView.queued_prefill_flop`).
    p_peak_flops : float or array_like, shape (n_workers,)
        Effective peak of each worker, FLOP/s.
    ttft_slo_s : float
        TTFT SLO, seconds: the time budget the queue is measured against.

    Returns
    -------
    ndarray of float, shape (n_workers,)
        ``1 − work / (P_peak · T_TTFT_SLO)``; 1 when idle, 0 when the queue alone takes the whole
        SLO, negative beyond.

    Examples
    --------
    >>> temporal_freeness([0.0, 1e14, 3e14], 1e14, 2.0).tolist()
    [1.0, 0.5, -0.5]
    """
    owner = "temporal_freeness"
    work = _non_negative_array(queued_work_flop, "queued_work_flop", owner)
    peak = np.asarray(p_peak_flops, dtype=np.float64)
    if not np.all(np.isfinite(peak)) or np.any(peak <= 0):
        raise param_error("p_peak_flops", owner, "finite and > 0 everywhere", p_peak_flops)
    slo = check_positive(ttft_slo_s, "ttft_slo_s", owner)
    out: FloatArray = 1.0 - work / (peak * slo)
    return out


def queued_work_flop(queues: Sequence[npt.ArrayLike], model: PrefillModel) -> FloatArray:
    """Σ (α·l² + β·P_m·l) over each queue of prompt lengths ``l`` (tokens), FLOP-equivalent."""
    return np.array([float(np.sum(model.work_flop(q))) for q in queues], dtype=np.float64)


def temporal_freeness_of_queues(
    queues: Sequence[npt.ArrayLike], model: PrefillModel, ttft_slo_s: float
) -> FloatArray:
    """Φ_T per worker from its queue of prompt lengths (tokens) and its prefill model.

    >>> m = PrefillModel(1.0, 0.0, 100.0)
    >>> temporal_freeness_of_queues([[], [10], [5, 5]], m, 1.0).tolist()
    [1.0, 0.0, 0.5]
    """
    return temporal_freeness(queued_work_flop(queues, model), model.p_peak_flops, ttft_slo_s)


def stranded_blocks(free_blocks: npt.ArrayLike, need_blocks: npt.ArrayLike) -> IntArray:
    """Free KV blocks stranded per decode worker, H_frag (DESIGN.md "Fragmentation").

    Graded: the free blocks that cannot host a whole upcoming request of ``need_blocks`` (the
    next waiting request, or the reference large request) without consolidation,
    ``free mod need`` — all of them while one such request does not fit, the remainder once
    some do. So Φ_S = 1 − (N_used + H_frag)/M_total varies continuously with the free space and
    θ_frag is a real threshold (Phasor Eq. 2, Alg. 1 line 8). Where ``need <= 0`` (no demand
    known yet) nothing is stranded. ``need_blocks`` is one int, or one per entry of
    ``free_blocks`` (e.g. per time-series row).

    >>> stranded_blocks([10, 50, 0, 40], 20).tolist()
    [10, 10, 0, 0]
    >>> stranded_blocks([10, 10, 7], [20, 4, 0]).tolist()
    [10, 2, 0]
    """
    free = np.asarray(free_blocks, dtype=np.int64)
    if np.any(free < 0):
        raise param_error("free_blocks", "stranded_blocks", ">= 0 everywhere", free_blocks)
    need = np.asarray(need_blocks, dtype=np.int64)
    out: IntArray = np.where(need > 0, free % np.maximum(need, 1), 0).astype(np.int64)
    return out


def fragmentation_pct(free_blocks: npt.ArrayLike, stranded: npt.ArrayLike) -> float:
    """Cluster fragmentation ``100 · Σ stranded / Σ free`` (0 when nothing is free).

    ``free_blocks`` and ``stranded`` are per worker (or per worker and tick: everything is
    summed), see :func:`fragmentation_pct_of_totals`.

    >>> fragmentation_pct([10, 50, 0], [10, 0, 0])
    16.666666666666668
    """
    return float(fragmentation_pct_of_totals(np.sum(free_blocks), np.sum(stranded)))


def fragmentation_pct_of_totals(
    free_total: npt.ArrayLike, stranded_total: npt.ArrayLike
) -> FloatArray:
    """Fragmentation ``100 · stranded_total / free_total`` element by element (0 where nothing
    is free), from totals already summed over workers (e.g. one per control tick).

    This is the one statement of the fragmentation percentage (DESIGN.md "Fragmentation"):
    :func:`fragmentation_pct`, the simulator's metrics and per-tick series use it.

    >>> fragmentation_pct_of_totals([60, 0, 40], [10, 0, 40]).tolist()
    [16.666666666666668, 0.0, 100.0]
    """
    free = np.asarray(free_total, dtype=np.float64)
    stranded = np.asarray(stranded_total, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: FloatArray = np.where(free > 0, 100.0 * stranded / free, 0.0)
    return out


def spatial_freeness(
    used_blocks: npt.ArrayLike, stranded: npt.ArrayLike, capacity_blocks: npt.ArrayLike
) -> FloatArray:
    """Φ_S per decode worker: ``1 − (N_used + H_frag) / M_total`` (Phasor Eq. 3), in blocks.

    Parameters
    ----------
    used_blocks : array_like, shape (n_workers,)
        KV blocks held (N_used).
    stranded : array_like, shape (n_workers,)
        Stranded free blocks (H_frag), see :func:`stranded_blocks`.
    capacity_blocks : array_like, shape (n_workers,)
        KV capacity (M_total), > 0.

    Examples
    --------
    >>> spatial_freeness([50, 50], [0, 25], [100, 100]).tolist()
    [0.5, 0.25]
    """
    owner = "spatial_freeness"
    used = _non_negative_array(used_blocks, "used_blocks", owner)
    frag = _non_negative_array(stranded, "stranded", owner)
    cap = np.asarray(capacity_blocks, dtype=np.float64)
    if not np.all(np.isfinite(cap)) or np.any(cap <= 0):
        raise param_error("capacity_blocks", owner, "finite and > 0 everywhere", capacity_blocks)
    out: FloatArray = 1.0 - (used + frag) / cap
    return out
