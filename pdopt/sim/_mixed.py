"""Colocated (mixed) workers: both phases on one GPU with one KV cache (issue 3, item 5).

A worker whose role is ``mixed`` owns a prefill side and a decode side (:mod:`pdopt.sim._prefill`,
:mod:`pdopt.sim._decode`) and runs one *step* at a time, deciding what comes next at every step end
(a decode iteration boundary, or the end of a prefill step):

* ``prefill_first`` (vLLM, separate batches, prefill priority): when prefills wait and the queue
  head's KV fits what is free (capacity − decode KV), run a whole prefill batch (FCFS, token
  budget, batch cap; ``t0 + Σ work / P_peak``) while running decodes stall; otherwise one decode
  iteration τ(B, C). A prefill arriving during a decode segment is taken at the next iteration
  boundary.
* ``hybrid`` (Sarathi, decode priority, chunked prefill): every iteration carries all running
  decodes plus prefill chunks of at most ``chunk_tokens`` tokens (prompts already started first,
  then new prompts whose whole KV fits); it takes ``τ(B, C) + t0 + Σ chunk work / P_peak``
  (DESIGN.md "Hybrid iteration: prefill tokens and decode work add"; the structure of
  :meth:`pdopt.costmodel.CostModel.hybrid_iteration_time_s`, with chunk work
  ``alpha·((d + c)² − d²) + beta·P_m·c`` so a prompt's chunks sum to its whole prefill). With no
  decodes running an iteration is chunks only (``t0 + work / P_peak``). With no prefill waiting
  the worker decodes exactly like a decode worker (closed-form segments).

The first token of a prompt is emitted at the end of the step that finishes it; the request then
goes through ``route_decode``: to the same worker there is no transfer (it joins the admission
queue and is admitted at that same boundary if its KV fits), elsewhere the normal link transfer
happens. Decode admission, block growth and recompute preemption are the decode worker's rules;
the decode side's capacity is the worker's capacity minus the KV reserved by prompts in prefill
(whole prompts, from their first chunk), so prefill and decode share one cache and never exceed it.

Phase mode (:class:`pdopt.sim.SetPhase`, temporal disaggregation as in EcoServe): ``"prefill"``
runs prefill steps only (batches, or chunk-only iterations under ``hybrid``) while running decodes
wait and no decode is admitted, except that decodes run when the waiting prefill does not fit the
KV (so a full cache drains); ``"decode"`` runs decode iterations only while new prefills queue;
``"both"`` is the schedule above. A change takes effect at the next step end (a decode segment is
interrupted at its next iteration boundary).

Moves (:class:`pdopt.sim.MoveWorker`): to ``mixed``, a running prefill batch or decode segment
finishes its step and the worker then follows its schedule; from ``mixed``, the step in flight
ends first, chunked prompts not finished go back to the queue (restarting from scratch), and the
worker then follows the engine's rules for its new role (a prefill worker drains its decodes
first; a decode worker's queued prefills are routed again). The phase resets to ``"both"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdopt.sim._enums import Event, Step
from pdopt.sim._policy import PolicyDecisionError, SetPhase, action_worker
from pdopt.sim._spec import PHASES, Role
from pdopt.sim._state import EngineState

if TYPE_CHECKING:
    pass

NONE, IDLE, PREFILL, HYBRID, DECODE, BUSY = Step

# A stalled decode side keeps its segment start but never reaches its next boundary; its closed
# forms (time_at, used_blocks, counter_at) then stay at the current boundary.
_FROZEN_S = 1e300
# Control ticks a run may idle with work held back only by phases before it is declared stuck.
_MAX_BLOCKED_TICKS = 100_000


class Colocated(EngineState):
    """Mixed into :class:`pdopt.sim._engine.Engine`: scheduling of mixed workers."""

    if TYPE_CHECKING:  # methods the engine provides besides EngineState's

        def finish(self, rid: int, now: float) -> None: ...
        def _prefill_to_decode(self, w: int, now: float) -> None: ...
        def _decode_to_prefill(self, w: int, now: float) -> None: ...

    def __init__(self) -> None:
        specs = self.cluster.workers
        forced = self.traits.colocated_schedule
        chunk = self.traits.chunk_tokens
        self.hybrid = [(forced or w.colocated_schedule) == "hybrid" for w in specs]
        self.chunk_tokens = [int(chunk or w.chunk_tokens) for w in specs]
        self.kv_cap = [w.kv_capacity_blocks for w in specs]
        self.phase = ["both"] * len(specs)
        self.stalled = [False] * len(specs)
        self.mstate = [IDLE if w.role is Role.MIXED else NONE for w in specs]
        self.blocked_ticks = 0
        for w, spec in enumerate(specs):
            if spec.role is Role.MIXED:
                self.decode[w].accepting = True

    # -- entry points ----------------------------------------------------------------------------
    def mixed_poke(self, w: int, now: float) -> None:
        """Something arrived for mixed worker ``w`` (a prefill, a decode, a phase change)."""
        state = self.mstate[w]
        if state == IDLE:
            self.mixed_settle(w, now)
        elif state == DECODE:
            d = self.decode[w]
            p = self.prefill[w]
            phase = self.phase[w]
            if not (
                phase == "prefill" or (p.queue and phase != "decode") or (d.queue and d.accepting)
            ):
                return
            n = d.first_boundary_after(now)
            if n < d.next_n or d.next_n < 0:
                d.next_n = n
                d.event_seq = self.kernel.schedule(d.time_at(n), Event.DECODE, w)
        # PREFILL, HYBRID, BUSY: the step in flight decides when it ends

    def mixed_settle(self, w: int, now: float) -> None:
        """Make ``now`` a decode boundary of ``w`` (admitting waiting decodes) and decide."""
        self.unstall(w, now)
        d = self.decode[w]
        d.accepting = self.roles[w] is not Role.PREFILL and self.phase[w] != "prefill"
        self.process_boundary(w, d.n_seg, now)

    def mixed_next(self, w: int, now: float) -> None:
        """Worker ``w`` is at a decode boundary at ``now`` with nothing in flight: choose its
        next step (see the module docstring)."""
        p = self.prefill[w]
        d = self.decode[w]
        phase = self.phase[w]
        t = self.table
        if phase != "decode" and (p.queue or p.batch):
            reserved = p.reserved_blocks(t.prefill_tokens)
            free = self.kv_cap[w] - d.u_seg - reserved
            if self.hybrid[w]:
                head_fits = bool(p.queue) and self._blocks(p.queue[0]) <= free
                if p.batch or head_fits:
                    self._start_hybrid(w, now, free, with_decode=phase == "both" and d.b > 0)
                    return
            elif self._blocks(p.queue[0]) <= free:
                self.stall(w, now)
                end = p.start_batch(now, t.prefill_tokens, t.prefill_flop, free)
                self._mark_started(p.batch, now)
                self.sync_cap(w)
                self.kernel.schedule(end, Event.PREFILL_DONE, w)
                self.mstate[w] = PREFILL
                return
            if d.b > 0:
                # the prefill waiting does not fit the KV: decode (in any phase) to free it
                self.mstate[w] = DECODE
                return
        if d.b > 0 and phase != "prefill":
            self.mstate[w] = DECODE
            return
        self.stall(w, now)
        self.mstate[w] = IDLE

    def end_mixed_prefill(self, w: int, now: float) -> list[int]:
        """Close the prefill step in flight on ``w`` (a batch or a chunk-only iteration); return
        the requests whose prefill it completed."""
        p = self.prefill[w]
        done = p.finish_chunks(self.table.prefill_tokens) if p.chunk else p.finish_batch()
        self.sync_cap(w)
        return done

    def credit_hybrid(self, w: int, now: float) -> None:
        """The hybrid iteration of ``w`` (decodes plus chunks) ends at this boundary: emit first
        tokens of the prompts it completed (before the boundary admits them)."""
        completed = self.prefill[w].finish_chunks(self.table.prefill_tokens)
        self.sync_cap(w)
        self.prefill_completed(w, completed, now)

    def prefill_completed(self, w: int, rids: list[int], now: float) -> None:
        """First token (end of the step finishing the prompt), then finish or route to decode."""
        t = self.table
        for rid in rids:
            gen = t.generated[rid] + 1
            t.generated[rid] = gen
            if t.prefill_end_s[rid] != t.prefill_end_s[rid]:  # NaN: first pass
                t.prefill_end_s[rid] = now
                t.first_token_s[rid] = now
            if gen >= t.output_tokens[rid]:
                self.finish(rid, now)
            else:
                self.route_decode(rid, w, now)

    # -- steps -----------------------------------------------------------------------------------
    def _blocks(self, rid: int) -> int:
        bt = self.prefill[0].bt
        return (self.table.prefill_tokens[rid] + bt - 1) // bt

    def _mark_started(self, rids: list[int], now: float) -> None:
        start = self.table.prefill_start_s
        for rid in rids:
            if start[rid] != start[rid]:
                start[rid] = now

    def _start_hybrid(self, w: int, now: float, free: int, *, with_decode: bool) -> None:
        p = self.prefill[w]
        d = self.decode[w]
        t = self.table
        if not with_decode:
            self.stall(w, now)
        prefill_s, started = p.start_chunks(
            now, t.prefill_tokens, t.prefill_flop, self.chunk_tokens[w], free
        )
        self._mark_started(started, now)
        self.sync_cap(w)
        if with_decode:
            # one decode iteration made longer by the chunks: a one-iteration segment
            p.counted = False  # the decode side counts the whole iteration as busy
            d.a_seg += prefill_s
            n = d.n_seg + 1
            end = d.time_at(n)
            d.next_n = n
            d.event_seq = self.kernel.schedule(end, Event.DECODE, w)
            self.mstate[w] = HYBRID
        else:
            p.counted = True
            end = now + prefill_s
            self.kernel.schedule(end, Event.PREFILL_DONE, w)
            self.mstate[w] = PREFILL
        p.batch_end_s = end

    def stall(self, w: int, now: float) -> None:
        """Freeze the decode side of ``w`` at its current boundary (running decodes wait)."""
        d = self.decode[w]
        d.accepting = False
        if d.b == 0 or self.stalled[w]:
            return
        d.event_seq = -1
        d.next_n = -1
        d.a_seg = _FROZEN_S
        d.half_d2b = 0.0
        self.prefill[w].stall_since = now
        self.stalled[w] = True

    def unstall(self, w: int, now: float) -> None:
        """End a stall (the caller processes a boundary at ``now`` to restart the segment)."""
        if not self.stalled[w]:
            return
        p = self.prefill[w]
        p.busy_s -= now - p.stall_since
        p.stall_since = -1.0
        self.stalled[w] = False

    def sync_cap(self, w: int) -> None:
        """Decode-side KV capacity: the worker's, minus the prompts reserved by its prefill side."""
        reserved = self.prefill[w].reserved_blocks(self.table.prefill_tokens)
        mixed = self.roles[w] is Role.MIXED
        self.decode[w].cap = self.kv_cap[w] - reserved if mixed else self.kv_cap[w]

    # -- leaving the mixed role ------------------------------------------------------------------
    def leave_mixed(self, w: int, now: float) -> None:
        """Clean up after ``w`` stopped being mixed, once no mixed step is in flight."""
        self.mstate[w] = NONE
        p = self.prefill[w]
        if p.done:
            p.release_started()
        self.sync_cap(w)
        if self.roles[w] is Role.DECODE and p.queue:
            queued = list(p.queue)
            p.queue.clear()
            p.queued_flop = 0.0
            for rid in queued:
                self.route_prefill(rid, now)
        if self.stalled[w]:
            self.unstall(w, now)
            d = self.decode[w]
            d.accepting = self.roles[w] is Role.DECODE
            self.process_boundary(w, d.n_seg, now)

    def phase_blocked(self) -> bool:
        """Whether requests may be waiting only because a mixed worker's phase excludes their
        work (the policy can still unblock them by a later SetPhase): the engine then keeps
        ticking instead of declaring the run stuck, up to a limit."""
        blocked = any(
            r is Role.MIXED and ph != "both" for r, ph in zip(self.roles, self.phase, strict=True)
        )
        if not blocked:
            self.blocked_ticks = 0
            return False
        self.blocked_ticks += 1
        if self.blocked_ticks > _MAX_BLOCKED_TICKS:
            stuck = [
                f"{self.names[w]}={ph}"
                for w, ph in enumerate(self.phase)
                if self.roles[w] is Role.MIXED and ph != "both"
            ]
            raise PolicyDecisionError(
                f"policy {self.policy_name!r}: requests have waited {_MAX_BLOCKED_TICKS} control "
                f"ticks with nothing to run but the phases of workers {stuck}; set their phase "
                "to 'both' (or the phase their waiting work needs)"
            )
        return True

    # -- actions ---------------------------------------------------------------------------------
    def set_phase(self, action: SetPhase, now: float) -> None:
        """Apply :class:`SetPhase` (see the module docstring)."""
        w = action_worker(action, len(self.roles), self.policy_name)
        if action.phase not in PHASES:
            raise PolicyDecisionError(
                f"policy {self.policy_name!r}: SetPhase phase {action.phase!r} is not one of "
                f"{list(PHASES)}"
            )
        if self.roles[w] is not Role.MIXED:
            raise PolicyDecisionError(
                f"policy {self.policy_name!r}: SetPhase on worker {w} ({self.names[w]}), whose "
                f"role is {self.roles[w]}; only mixed workers have phases"
            )
        old = self.phase[w]
        if old == action.phase:
            return
        self.phase[w] = action.phase
        self.log(now, "phase", w, -1, f"{old}->{action.phase}")
        d = self.decode[w]
        if self.mstate[w] == DECODE:
            d.accepting = action.phase != "prefill"
        self.mixed_poke(w, now)

    def mixed_move(self, w: int, old: Role, new: Role, now: float) -> None:
        """MoveWorker to or from role mixed (roles and pools already updated)."""
        self.phase[w] = "both"
        p = self.prefill[w]
        d = self.decode[w]
        if new is Role.MIXED:
            self.sync_cap(w)
            d.accepting = not p.inflight  # no admission while a prefill step runs
            if p.inflight:
                # a batch, or a chunk iteration (with decodes when the prefill side does not
                # count it): its end handler decides the next step
                self.mstate[w] = HYBRID if p.chunk and not p.counted else PREFILL
            elif d.b > 0 and not self.stalled[w]:
                self.mstate[w] = DECODE
                self.mixed_poke(w, now)
            else:
                self.mstate[w] = IDLE
                self.mixed_poke(w, now)
            return
        if self.mstate[w] not in (PREFILL, HYBRID):
            self.leave_mixed(w, now)
        if new is Role.DECODE:
            self._prefill_to_decode(w, now)
        else:
            self._decode_to_prefill(w, now)
