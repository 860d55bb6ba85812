"""EcoServe's SLO arithmetic for CheckConstraints (Du et al. 2025, Alg. 2) and the phase schedule:
the saved TPOT of an instance's decodes, and how long a prefill phase, bounded by control ticks,
lasts. Used by :class:`pdopt.policies.ecoserve.EcoServe`.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np
import numpy.typing as npt

from pdopt.policies._slo_predict import WorkerModels
from pdopt.sim import ClusterView

IntArray = npt.NDArray[np.int64]


def decode_iteration_s(
    models: WorkerModels, w: int, view: ClusterView, run: dict[str, IntArray] | None = None
) -> float:
    """Predicted decode iteration of ``w`` with its running and waiting decodes, seconds
    (``run``: ``view.running_contexts(w)`` when the caller already holds it)."""
    run = view.running_contexts(w) if run is None else run
    batch = len(run["request_id"]) + int(view.decode_queue_len[w])
    return models.decode_iteration_s(w, max(batch, 1), float(np.sum(run["context_tokens"])))


def saved_tpot_s(
    models: WorkerModels,
    w: int,
    view: ClusterView,
    first_token: dict[int, tuple[float, int]],
    tpot_slo_s: float,
    aggregate: str,
    *,
    exclude: Collection[int] = (),
    margin: bool = False,
) -> float | None:
    """Saved TPOT of the decodes of ``w`` (running, or waiting for admission) other than
    ``exclude``, their mean (EcoServe Alg. 2 line 16, ``aggregate="mean"``, the default) or
    minimum (``"min"``, EcoServe's ``saved_tpot="min"``), seconds; None when there are none.
    ``first_token``: request id -> (time, context then) of its first token. ``exclude``: the
    prompts of the instance's current activation (Alg. 2 line 10 keeps the decodes that
    arrived before ``t_switch``).

    Alg. 2 lines 13-15: ``saved = L·TPOT_SLO − (now − r.first_token_time)`` with ``L =
    r.output_length``, which pdopt reads as the tokens output so far: ``k + 1`` after ``k``
    tokens since the first one (the paper does not say whether ``L`` is the final length,
    which no serving system knows in advance, or the length so far; only the latter makes
    ``saved`` the slack accumulated so far). A decode stalled ``x`` seconds then meets its
    TPOT SLO after its next token iff ``x <= (k + 1)·TPOT_SLO − elapsed − τ`` (``τ`` the
    worker's decode iteration): ``margin=True`` (EcoServe's ``saved_tpot_margin``, pdopt's
    earlier rule) subtracts that ``τ``; the paper does not.

    Why ``"min"`` exists (measured in issue 5): with the mean, long-running decodes with a
    large saving pay for short ones that have none, so decodes with few output tokens
    absorbed whole prefill phases and missed TPOT; on the V100 / Qwen2.5-7B goodput run
    EcoServe's P90 goodput was then 0.05-0.18x the baselines'. ``"min"`` also counts the
    prompts already routed to ``w`` as decodes with nothing saved (:meth:`EcoServe._check`)."""
    run = view.running_contexts(w)
    ids = run["request_id"].tolist()
    ctxs = run["context_tokens"].tolist()
    waiting = view.waiting_requests(w).tolist()
    now = view.now_s
    saved: list[float] = []
    for rid, ctx in zip(ids + waiting, ctxs + [-1] * len(waiting), strict=True):
        if rid in exclude:
            continue
        t0, c0 = first_token.get(rid, (now, ctx))
        decoded = max(0, ctx - c0) if ctx >= 0 else 0
        saved.append((decoded + 1) * tpot_slo_s - (now - t0))
    if not saved:
        return None
    agg = min(saved) if aggregate == "min" else math.fsum(saved) / len(saved)
    return agg - decode_iteration_s(models, w, view, run) if margin else agg


def ticks_s(work_s: float, tick_s: float) -> float:
    """A prefill phase of ``work_s`` seconds of prompts started on a tick stalls decodes
    until the first tick after the work (phases change on ticks only), seconds."""
    return math.ceil(work_s / tick_s - 1e-9) * tick_s
