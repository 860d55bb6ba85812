"""pdopt's earlier EcoServe rules, kept as named departures from the paper (Du et al. 2025):
the per-request CheckConstraints (``check="request"``) and the tick-bounded phase schedule
(``phases="ticks"``, with ``prefill_slots``). :class:`pdopt.policies.ecoserve.EcoServe` calls
these with itself; its module docstring states the rules. The compiled engine's twins of these
rules are :func:`pdopt.sim._compiled._ecoserve._check_request` and ``_tick_phases`` (with their
helpers of the same names), written in the same floating-point order: a change here needs the
same change there (``tests/sim/test_sim_compiled_ecoserve.py`` compares the two engines).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pdopt.cluster import Role
from pdopt.policies._ecoserve_macros import DECODE, PREFILL
from pdopt.policies._ecoserve_slo import decode_iteration_s, ticks_s
from pdopt.sim import Action, ClusterView, RequestInfo, SetPhase

if TYPE_CHECKING:
    from pdopt.policies.ecoserve import EcoServe


def check_request(p: EcoServe, w: int, request: RequestInfo, view: ClusterView) -> bool:
    """pdopt's earlier per-request CheckConstraints (``check="request"``)."""
    prefill_s = float(p._m.predicted_ttft_s(view, np.array([w]), request.prefill_tokens)[0])
    if switch_s(p, w, view) + prefill_s > p._ttft_slo_s:
        return False
    saved = p._saved_tpot_s(w, view)
    if p.saved_tpot == "min" and p._pending[w] and not joins_batch(p, w, request):
        # the prompts routed before ``request`` decode, with nothing saved yet, while it
        # prefills in a later batch of the same phase
        fresh = p._tpot_slo_s - decode_iteration_s(p._m, w, view)
        saved = fresh if saved is None else min(saved, fresh)
    if saved is not None and saved < stall_s(p, w, view.now_s, prefill_s):
        return False
    return p._kv_fits(w, request, view)


def joins_batch(p: EcoServe, w: int, request: RequestInfo) -> bool:
    """Whether ``request`` would be prefilled in the same batch as the prompts already
    routed to ``w``: ``w`` is not prefilling yet (its queue forms one batch when the phase
    starts) and they and it fit one batch (``max_batch_size`` prompts, ``max_batch_tokens``
    tokens)."""
    if p._instances.phase[w] == PREFILL:
        return False
    if len(p._pending[w]) + 1 > p._batch_size[w]:
        return False
    tokens = sum(t for _, t in p._pending[w].values()) + request.prefill_tokens
    return tokens <= p._batch_tokens[w]


def to_next_tick(p: EcoServe, now_s: float) -> float:
    """Seconds from ``now_s`` to the next control tick."""
    return max(0.0, p._last_tick_s + p._tick_s - now_s)


def switch_s(p: EcoServe, w: int, view: ClusterView) -> float:
    """Time until ``w`` can be in a prefill phase: 0 if it is; else the next tick, or with
    every prefill slot of its macro instance taken, the tick after the first of those
    instances runs out of prefill work."""
    if p._instances.phase[w] == PREFILL or p.phases != "ticks":
        return 0.0
    wait = to_next_tick(p, view.now_s)
    m = p._instances.macro_of[w]
    if not p.prefill_slots or m < 0:
        return wait
    busy = [v for v in p._instances.macros[m].members if p._instances.phase[v] == PREFILL]
    if len(busy) < p.prefill_slots:
        return wait
    left = float(np.min(p._m.prefill_wait_s(view)[busy]))
    ticks = math.ceil(max(0.0, left - wait) / p._tick_s)
    return wait + ticks * p._tick_s


def stall_s(p: EcoServe, w: int, now_s: float, work_s: float) -> float:
    """How long ``work_s`` seconds of prefill on ``w`` stall its decodes, counted from
    ``now_s`` if it is in a prefill phase (to the first tick after the work), else from the
    phase's start at the next tick (other phase rules: ``work_s``, no tick)."""
    if p.phases != "ticks":
        return work_s
    if p._instances.phase[w] != PREFILL:
        return ticks_s(work_s, p._tick_s)
    elapsed_s = now_s - p._last_tick_s
    return ticks_s(elapsed_s + work_s, p._tick_s) - elapsed_s


def tick_phases(p: EcoServe, view: ClusterView) -> list[Action]:
    """Temporal disaggregation with bounded prefill phases (see the module docstring)."""
    out: list[Action] = []
    work_s = p._m.prefill_wait_s(view)
    for macro in p._instances.macros:
        mixed = [w for w in macro.members if view.roles[w] is Role.MIXED]
        busy = 0
        for w in mixed:
            if p._instances.phase[w] != PREFILL:
                continue
            if prefills(p, w, view, float(work_s[w])):
                busy += 1
            else:
                p._instances.phase[w] = DECODE
                out.append(SetPhase(w, DECODE))
        slots = p.prefill_slots or len(mixed)
        ready = [
            w
            for w in mixed
            if p._instances.phase[w] != PREFILL
            and p._instances.ready(w, view.now_s)
            and prefills(p, w, view, float(work_s[w]))
        ]
        ready.sort(key=lambda w: (oldest_s(p, w, view.now_s), w))
        for w in ready[: max(0, slots - busy)]:
            p._instances.phase[w] = PREFILL
            out.append(SetPhase(w, PREFILL))
    return out


def prefills(p: EcoServe, w: int, view: ClusterView, work_s: float) -> bool:
    """Whether ``w`` is (or goes) in a prefill phase this tick: it has prefill work, a running
    slot for a prompt (:meth:`EcoServe._slots_full`: else no prompt starts, and the requests
    waiting for decode admission, which a prefill phase does not admit, keep their slots: the
    instance would stay in that phase for good) and it may prefill ``work_s`` seconds of it
    (:func:`may_prefill`)."""
    return (
        p._has_prefill(w, view) and not p._slots_full(w, view) and may_prefill(p, w, view, work_s)
    )


def may_prefill(p: EcoServe, w: int, view: ClusterView, work_s: float) -> bool:
    """Whether ``w`` may (go on) prefill ``work_s`` seconds of queued prompts: the smallest
    saved TPOT of its decodes covers it, or its oldest prompt would otherwise miss the TTFT
    SLO (waiting longer cannot help it; the decodes pay instead)."""
    if not p.constraints:
        return True
    saved = p._saved_tpot_s(w, view)
    if saved is None or saved >= ticks_s(work_s, p._tick_s):
        return True
    waited_s = view.now_s - oldest_s(p, w, view.now_s)
    return waited_s + work_s + p._tick_s >= p._ttft_slo_s


def oldest_s(p: EcoServe, w: int, now_s: float) -> float:
    """Arrival of the oldest prompt routed to ``w`` and not yet prefilled (``now_s`` if
    none)."""
    return min(p._queued[w].values(), default=now_s)
