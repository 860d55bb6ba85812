"""EcoServe's phases under ``phases="activation"`` (Du et al. 2025, §4.2.2.1: an activated
instance "commits to processing only prefill tasks for a certain period"; Alg. 2: the decodes
that existed before ``t_switch`` "will be paused"): when an instance enters and leaves its
prefill phase, which prompts it holds, and the C1/C2 terms that phase adds.
:class:`pdopt.policies.ecoserve.EcoServe` calls these with itself; its module docstring states
the rules.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import TYPE_CHECKING

from pdopt.cluster import Role
from pdopt.policies._ecoserve_macros import BOTH, DECODE, PREFILL
from pdopt.policies._ecoserve_slo import saved_tpot_s
from pdopt.sim import Action, ClusterView, RequestInfo, SetPhase

if TYPE_CHECKING:
    from pdopt.policies.ecoserve import EcoServe


def held_late(p: EcoServe, w: int, request: RequestInfo, view: ClusterView) -> bool:
    """``phases="activation"``, ``hold="deadline"`` (pdopt's assumption, not the paper's):
    whether ``w``'s prefill phase, ending at the first tick after its outstanding prefill
    work and ``request``'s, would end past the TTFT SLO of its oldest held prompt (whose
    decoding, so TTFT (§4.4), waits for that end). Never under ``hold="prefilled"``."""
    held = p._held[w]
    if p.phases != "activation" or p.hold != "deadline" or not held:
        return False
    work_s = float(p._m.prefill_wait_s(view)[w]) + p._prefill_s(w, request)
    end_s = view.now_s + work_s + p._tick_s
    return end_s > min(held.values()) + p._ttft_slo_s


def not_decoding(p: EcoServe, w: int, batch: dict[int, float]) -> Collection[int]:
    """The prompts of ``w``'s activation ``batch`` C2 leaves out: all of them (assumption
    (d)), or with ``phases="activation"`` those not decoding yet (held, or not yet
    prefilled); one that began decoding before a tick could start the phase pauses with
    the existed decodes and is protected as one."""
    if p.phases != "activation":
        return batch.keys()
    return p._held[w].keys() | {r for r in batch if r not in p._first_token}


def activation_phases(p: EcoServe, view: ClusterView) -> list[Action]:
    """An instance whose current activation has a prompt in prefill, and no decode waiting
    for admission (the prompts its last phase held), enters a prefill phase (its decodes
    pause, none is admitted); it leaves it on a tick when :func:`phase_over` says so: to
    ``"both"`` (vLLM's prefill-first schedule) when no prompt is left to prefill, else (a
    forced end, prompts still queued) to a *decode stretch* (phase ``"decode"``: §4.2.2.1's
    instance "then switches to processing only decode tasks"), which admits the held
    prompts at once where prefill-first would prefill the queued ones first, until a tick
    sees them admitted (no decode waiting, or nothing running that could make room)."""
    out: list[Action] = []
    phase = p._instances.phase
    cursors = p._cursors() if p.rolling else set()
    for w in range(view.n_workers):
        if p._instances.macro_of[w] < 0 or view.roles[w] is not Role.MIXED:
            continue
        busy = p._has_prefill(w, view)
        if phase[w] == PREFILL:
            if phase_over(p, w, view, busy=busy, on_cursor=w in cursors):
                phase[w] = DECODE if busy else BOTH
                out.append(SetPhase(w, phase[w]))
                release(p, w, view)
            continue
        # prompts prefilled before a tick could start the phase (or in a decode stretch)
        # already decode
        p._held[w] = {r: a for r, a in p._held[w].items() if p._src.get(r) == w}
        if phase[w] == DECODE and view.decode_queue_len[w] and view.running[w]:
            continue  # a forced end's decode stretch: held prompts still wait for admission
        start = (
            busy
            and p._activation[w]
            and p._instances.ready(w, view.now_s)
            and not view.decode_queue_len[w]  # the last phase's prompts all decode
        )
        new = PREFILL if start else BOTH
        if new != phase[w]:
            phase[w] = new
            out.append(SetPhase(w, new))
    return out


def phase_over(p: EcoServe, w: int, view: ClusterView, *, busy: bool, on_cursor: bool) -> bool:
    """Whether ``w``'s prefill phase ends now. With no prompt left to prefill (not
    ``busy``) it ends (``hold="prefilled"``, the default: the issue's "phases that last
    until the pending batch is done", no forced idling). ``hold="deadline"`` (pdopt's
    reading, not the paper's) ends it then only when its activation is over (the cursor
    left it), when it holds no prompt, or when it has existed decodes (idling in the phase
    would spend saved TPOT that C2 granted only for the prefill work ``t_total``): it idles
    to gather the activation's next prompts before its held ones decode. In any case it ends when
    waiting another tick would take its oldest held prompt past the TTFT SLO (the
    paper's TTFT ends when decoding begins, §4.4), when the saved TPOT of its existed
    decodes (C2's aggregate) is below a tick, or when its held prompts fill its running
    slots (``max_num_seqs``: no prompt could start before a decode ends)."""
    held = p._held[w]
    saved = saved_tpot_s(
        p._m,
        w,
        view,
        p._first_token,
        p._tpot_slo_s,
        p.saved_tpot,
        exclude=not_decoding(p, w, p._activation[w]),
        margin=p.saved_tpot_margin,
    )
    if not busy and (p.hold != "deadline" or not on_cursor or not held or saved is not None):
        return True
    if busy and p._slots_full(w, view):
        return True
    deadline_s = min(held.values(), default=math.inf) + p._ttft_slo_s
    if view.now_s + p._tick_s >= deadline_s - 1e-9:
        return True
    return saved is not None and saved < p._tick_s


def decode_start_s(p: EcoServe, w: int, view: ClusterView) -> float:
    """When the phase after ``w``'s prefill phase, set now, admits its held prompts,
    seconds: now, or, with a prefill batch in service (the engine does not interrupt one),
    its predicted end: ``w``'s outstanding prefill work less that of the prompts queued
    behind it (each predicted alone, less the predictor's intercept, which is no work).
    Held prompts that fill the running slots wait for a decode to end besides: not
    predicted (the end of the batch, or now, stands for it)."""
    now = view.now_s
    if not p._prefill_in_service(w, view):
        return now
    ahead = view.prefill_waiting(w).tolist()
    t0 = p._m.ttft[w].c_s
    queued_s = math.fsum(max(0.0, p._activation[w].get(r, t0) - t0) for r in ahead)
    return now + max(0.0, float(p._m.prefill_wait_s(view)[w]) - queued_s)


def release(p: EcoServe, w: int, view: ClusterView) -> None:
    """``w``'s prefill phase ends now and its next phase (``"both"``, or a forced end's
    decode stretch) admits the held prompts it prefilled, at :func:`decode_start_s`: they
    begin decoding then (their TPOT, and the saved TPOT C2 counts for them, start then; one
    whose TTFT, so counted, is over the SLO is an observed miss for mitosis). A new
    activation starts (``t_switch`` = now) and takes over the activation's prompts still to
    prefill (a forced end with prompts queued or in service): they prefill in its phase, so
    C1 counts them there, and those held stay held (their decoding begins when that phase
    ends; one that finishes prefill in the decode stretch decodes at once,
    :meth:`EcoServe.route_decode` stamps its first token and checks its TTFT)."""
    m = p._instances.macro_of[w]
    now_s = view.now_s
    start_s = decode_start_s(p, w, view)
    left = {r: a for r, a in p._held[w].items() if p._src.get(r) == w}
    for rid, arrival_s in p._held[w].items():
        if rid in left:
            continue
        if rid in p._first_token:
            p._first_token[rid] = (start_s, p._first_token[rid][1])
        if m >= 0 and start_s - arrival_s > p._ttft_slo_s:
            p._instances.miss(p._instances.macros[m], now_s)
    carried = {r: s for r, s in p._activation[w].items() if p._src.get(r) == w}
    p._held[w] = left
    p._activate(w, now_s)
    p._activation[w].update(carried)
