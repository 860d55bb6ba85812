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
  decodes plus prefill chunks (prompts already started first, then new prompts whose whole KV
  fits) within the token budget ``chunk_tokens``: under ``chunk_budget="iteration"`` (the
  default, Sarathi-Serve's chunk size) the budget counts the iteration's decode tokens too, so
  the chunks get ``chunk_tokens − B`` tokens and, when ``B >= chunk_tokens``, the worker decodes
  only until a finish lowers ``B``; under ``"prefill"`` the chunks get ``chunk_tokens`` on top of
  all decodes. One iteration is one fused forward pass, timed by
  :meth:`pdopt.costmodel.CostModel.hybrid_iteration_time_s` (DESIGN.md "Cost model"):
  ``max(d0, t0) + d1·B + d2·C + Σ chunk work / P_peak``, chunk work
  ``alpha·((d + c)² − d²) + beta·P_m·c`` so a prompt's chunks sum to its whole prefill. With no
  decodes running an iteration is chunks only (``t0 + work / P_peak``). With no prefill waiting
  the worker decodes exactly like a decode worker (closed-form segments).

The first token of a prompt is emitted at the end of the step that finishes it; the request then
goes through ``route_decode``: to the same worker there is no transfer (it joins the admission
queue and is admitted at that same boundary if its KV fits), elsewhere the normal link transfer
happens. Decode admission, block growth and recompute preemption are the decode worker's rules;
the decode side's capacity is the worker's capacity minus the KV reserved by prompts in prefill
(whole prompts, from their first chunk), so prefill and decode share one cache and never exceed it
(the worker's :class:`pdopt.sim._kv.KvBlocks` counts both; this scheduler tells it when the
worker's prompts share the decode side's capacity, :meth:`pdopt.sim._kv.KvBlocks.share_prompts`).

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

The :class:`Colocated` component owns each worker's step state (:class:`pdopt.sim._enums.Step`),
phase, stall flag and schedule; it reaches the engine's core through
:class:`pdopt.sim._core.Core`. The core hands it the prefill ends and decode boundaries of mixed
workers, and it answers with the next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdopt.cluster._spec import PHASES, ClusterSpec, Role
from pdopt.sim._enums import Event, Step
from pdopt.sim._policy import PolicyDecisionError, PolicyTraits, SetPhase, action_worker

if TYPE_CHECKING:
    from pdopt.sim._core import Core

# A stalled decode side keeps its segment start but never reaches its next boundary; its closed
# forms (time_at, used_blocks, counter_at) then stay at the current boundary.
_FROZEN_S = 1e300
# Control ticks a run may idle with work held back only by phases before it is declared stuck.
MAX_BLOCKED_TICKS = 100_000


class Colocated:
    """Scheduling of the run's mixed workers (see the module docstring)."""

    def __init__(self, core: Core, cluster: ClusterSpec, traits: PolicyTraits) -> None:
        self._core = core
        specs = cluster.workers
        forced = traits.colocated_schedule
        chunk = traits.chunk_tokens
        budget = traits.chunk_budget
        self._kv_blocks = cluster.block_counter()
        self._cost = [w.cost for w in specs]
        self._hybrid = [(forced or w.colocated_schedule) == "hybrid" for w in specs]
        self._chunk_tokens = [int(chunk or w.chunk_tokens) for w in specs]
        self._iteration_budget = [(budget or w.chunk_budget) == "iteration" for w in specs]
        self._phase = ["both"] * len(specs)
        self._stalled = [False] * len(specs)
        self._step = [Step.IDLE if w.role is Role.MIXED else Step.NONE for w in specs]
        self._blocked_ticks = 0

    # -- what the core asks ----------------------------------------------------------------------
    def stepping(self, w: int) -> bool:
        """Whether worker ``w`` has a mixed step (it is mixed, or its last mixed step is still
        in flight)."""
        return self._step[w] != Step.NONE

    def busy(self, w: int) -> None:
        """A step of mixed worker ``w`` ends now: arrivals wait for :meth:`next_step`."""
        self._step[w] = Step.BUSY

    def poke(self, w: int, now: float) -> None:
        """Something arrived for mixed worker ``w`` (a prefill, a decode, a phase change)."""
        state = self._step[w]
        if state == Step.IDLE:
            self.settle(w, now)
        elif state == Step.DECODE:
            core = self._core
            d = core.decode[w]
            p = core.prefill[w]
            phase = self._phase[w]
            if not (
                phase == "prefill" or (p.queue and phase != "decode") or (d.queue and d.accepting)
            ):
                return
            n = d.first_boundary_after(now)
            if n < d.next_n or d.next_n < 0:
                d.next_n = n
                d.event_seq = core.kernel.schedule(d.time_at(n), Event.DECODE, w)
        # PREFILL, HYBRID, BUSY: the step in flight decides when it ends

    def abort_decode(self, w: int, now: float) -> bool:
        """A running decode of ``w`` was aborted (:meth:`pdopt.sim._decode.DecodeSide.abort`):
        see that a boundary of ``w`` is visited to drop it. A stalled side's next boundary is
        the end of the step in flight (or ``now`` when idle); a decoding one's, its next
        iteration boundary; a hybrid iteration's end is one. False when ``w`` has no mixed step
        and its decode side is not stalled (the caller schedules the boundary)."""
        state = self._step[w]
        if self._stalled[w]:
            if state == Step.IDLE:
                self.settle(w, now)
            return True
        if state == Step.DECODE:
            core = self._core
            d = core.decode[w]
            n = d.first_boundary_after(now)
            if n < d.next_n or d.next_n < 0:
                d.next_n = n
                d.event_seq = core.kernel.schedule(d.time_at(n), Event.DECODE, w)
            return True
        return state != Step.NONE

    def settle(self, w: int, now: float) -> None:
        """Make ``now`` a decode boundary of ``w`` (admitting waiting decodes) and decide."""
        self._unstall(w, now)
        d = self._core.decode[w]
        d.accepting = self._core.roles[w] is not Role.PREFILL and self._phase[w] != "prefill"
        self._core.process_boundary(w, d.n_seg, now)

    def next_step(self, w: int, now: float) -> None:
        """Worker ``w`` is at a decode boundary at ``now`` with nothing in flight: choose its
        next step (see the module docstring)."""
        core = self._core
        p = core.prefill[w]
        d = core.decode[w]
        phase = self._phase[w]
        t = core.table
        if phase != "decode" and (p.queue or p.batch):
            free = core.kv[w].prompt_room()
            seats = self._seats(w)
            if self._hybrid[w]:
                with_decode = phase == "both" and d.b > 0
                budget = self._chunk_tokens[w]
                if with_decode and self._iteration_budget[w]:
                    budget -= d.b  # Sarathi-Serve: the decode tokens share the iteration budget
                head_fits = bool(p.queue) and seats > 0 and self._blocks(p.queue[0]) <= free
                if budget > 0 and (p.batch or head_fits):
                    self._start_hybrid(w, now, free, budget, seats, with_decode=with_decode)
                    return
            elif seats > 0 and self._blocks(p.queue[0]) <= free:
                self._stall(w, now)
                end = p.start_batch(now, t.prefill_tokens, t.prefill_flop, free, seats)
                self._mark_started(p.batch, now)
                self._sync_cap(w)
                core.kernel.schedule(end, Event.PREFILL_DONE, w)
                self._step[w] = Step.PREFILL
                return
            if d.b > 0:
                # the prefill waiting does not fit the KV: decode (in any phase) to free it; or
                # the decodes fill the iteration budget: decode until a finish lowers B
                self._step[w] = Step.DECODE
                return
        if d.b > 0 and phase != "prefill":
            self._step[w] = Step.DECODE
            return
        self._stall(w, now)
        self._step[w] = Step.IDLE

    def end_prefill(self, w: int) -> list[int]:
        """Close the prefill step in flight on ``w`` (a batch or a chunk-only iteration); return
        the requests whose prefill it completed."""
        p = self._core.prefill[w]
        if p.chunk:
            done = p.finish_chunks(self._core.table.prefill_tokens)
            self._release_dropped(w)
        else:
            done = p.finish_batch()
        self._sync_cap(w)
        return done

    def end_hybrid(self, w: int) -> list[int]:
        """The hybrid iteration of ``w`` (decodes plus chunks) ends at this boundary: return the
        prompts it completed (the core emits their first tokens before the boundary admits
        them)."""
        completed = self._core.prefill[w].finish_chunks(self._core.table.prefill_tokens)
        self._release_dropped(w)
        self._sync_cap(w)
        return completed

    def _release_dropped(self, w: int) -> None:
        """The chunked prompts whose clients gave up during the iteration that just ended on
        ``w`` (dropped by ``finish_chunks``) release their cached prefix blocks, as a prompt
        dropped outside an iteration does at once."""
        for rid in self._core.prefill[w].dropped:
            self._core.release_prefix(rid)

    # -- steps -----------------------------------------------------------------------------------
    def _blocks(self, rid: int) -> int:
        return self._kv_blocks(self._core.table.prefill_tokens[rid])

    def _seats(self, w: int) -> int:
        """Prompts ``w`` may start now: as vLLM counts ``max_num_seqs``, a prompt in prefill is
        a running sequence, and so is a prefilled one waiting for its decode slot here; the
        slots promised to incoming migrations are taken too (``run_limit``). Never negative:
        decodes routed here from other workers (or slots promised to migrations) can overfill
        the count, and a negative number would read as "no limit" in
        :meth:`PrefillSide.start_chunks`."""
        d = self._core.decode[w]
        return max(0, d.run_limit - d.b - len(d.queue) - len(self._core.prefill[w].batch))

    def _mark_started(self, rids: list[int], now: float) -> None:
        start = self._core.table.prefill_start_s
        for rid in rids:
            if start[rid] != start[rid]:
                start[rid] = now

    def _start_hybrid(
        self, w: int, now: float, free: int, budget: int, seats: int, *, with_decode: bool
    ) -> None:
        """Start one iteration of chunks (``budget`` prefill tokens at most, ``seats`` new
        prompts at most), with the running decodes when ``with_decode``."""
        core = self._core
        p = core.prefill[w]
        d = core.decode[w]
        t = core.table
        if not with_decode:
            self._stall(w, now)
        started = p.start_chunks(now, t.prefill_tokens, t.prefill_flop, budget, free, seats)
        self._mark_started(started, now)
        self._sync_cap(w)
        tokens, prefix = p.chunk_shape()
        b = d.b if with_decode else 0
        step_s = self._cost[w].hybrid_iteration_time_s(tokens, b, d.context_tokens(), prefix)
        if with_decode:
            # the decodes' iteration as one fused pass with the chunks: a one-iteration segment
            p.counted = False  # the decode side counts the whole iteration as busy
            d.a_seg = step_s
            n = d.n_seg + 1
            end = d.time_at(n)
            d.next_n = n
            d.event_seq = core.kernel.schedule(end, Event.DECODE, w)
            self._step[w] = Step.HYBRID
        else:
            p.counted = True
            end = now + step_s
            core.kernel.schedule(end, Event.PREFILL_DONE, w)
            self._step[w] = Step.PREFILL
        p.batch_end_s = end

    def _stall(self, w: int, now: float) -> None:
        """Freeze the decode side of ``w`` at its current boundary (running decodes wait)."""
        d = self._core.decode[w]
        d.accepting = False
        if d.b == 0 or self._stalled[w]:
            return
        d.event_seq = -1
        d.next_n = -1
        d.a_seg = _FROZEN_S
        d.half_d2b = 0.0
        self._core.prefill[w].stall_since = now
        self._stalled[w] = True

    def _unstall(self, w: int, now: float) -> None:
        """End a stall (the caller processes a boundary at ``now`` to restart the segment)."""
        if not self._stalled[w]:
            return
        p = self._core.prefill[w]
        p.busy_s -= now - p.stall_since
        p.stall_since = -1.0
        self._stalled[w] = False

    def _sync_cap(self, w: int) -> None:
        """Decode-side KV capacity: the worker's, minus the prompts reserved by its prefill side
        while it is mixed (one cache for both phases)."""
        core = self._core
        core.kv[w].share_prompts(core.roles[w] is Role.MIXED)

    # -- leaving the mixed role ------------------------------------------------------------------
    def leave(self, w: int, now: float) -> None:
        """Clean up after ``w`` stopped being mixed, once no mixed step is in flight."""
        core = self._core
        self._step[w] = Step.NONE
        p = core.prefill[w]
        if p.done:
            for rid in p.release_started(core.table.prefill_tokens):
                core.release_prefix(rid)
        self._sync_cap(w)
        if core.roles[w] is Role.DECODE and p.queue:
            queued = list(p.queue)
            p.queue.clear()
            p.queued_flop = 0.0
            for rid in queued:
                core.route_prefill(rid, now)
        d = core.decode[w]
        if self._stalled[w]:
            self._unstall(w, now)
            d.accepting = core.roles[w] is Role.DECODE
            core.process_boundary(w, d.n_seg, now)
        elif core.roles[w] is Role.DECODE and not p.batch:
            # e.g. a hybrid iteration ending after mixed → prefill → decode moves: nothing else
            # would let this decode worker admit again
            d.accepting = True

    def phase_blocked(self) -> bool:
        """Whether requests may be waiting only because a mixed worker's phase excludes their
        work (the policy can still unblock them by a later SetPhase): the engine then keeps
        ticking instead of declaring the run stuck, up to a limit."""
        roles = self._core.roles
        blocked = any(
            r is Role.MIXED and ph != "both" for r, ph in zip(roles, self._phase, strict=True)
        )
        if not blocked:
            self._blocked_ticks = 0
            return False
        self._blocked_ticks += 1
        if self._blocked_ticks > MAX_BLOCKED_TICKS:
            stuck = [
                f"{self._core.names[w]}={ph}"
                for w, ph in enumerate(self._phase)
                if roles[w] is Role.MIXED and ph != "both"
            ]
            raise PolicyDecisionError(
                f"policy {self._core.policy_name!r}: requests have waited {MAX_BLOCKED_TICKS} "
                f"control ticks with nothing to run but the phases of workers {stuck}; set their "
                "phase to 'both' (or the phase their waiting work needs)"
            )
        return True

    # -- actions ---------------------------------------------------------------------------------
    def set_phase(self, action: SetPhase, now: float) -> None:
        """Apply :class:`SetPhase` (see the module docstring)."""
        core = self._core
        name = core.policy_name
        w = action_worker(action, len(core.roles), name)
        if action.phase not in PHASES:
            raise PolicyDecisionError(
                f"policy {name!r}: SetPhase phase {action.phase!r} is not one of {list(PHASES)}"
            )
        if core.roles[w] is not Role.MIXED:
            raise PolicyDecisionError(
                f"policy {name!r}: SetPhase on worker {w} ({core.names[w]}), whose "
                f"role is {core.roles[w]}; only mixed workers have phases"
            )
        old = self._phase[w]
        if old == action.phase:
            return
        self._phase[w] = action.phase
        core.log(now, "phase", w, -1, f"{old}->{action.phase}")
        d = core.decode[w]
        if self._step[w] == Step.DECODE:
            d.accepting = action.phase != "prefill"
        self.poke(w, now)

    def move(self, w: int, new: Role, now: float) -> None:
        """MoveWorker to or from role mixed (role and pool already updated). Leaving the mixed
        role, this ends the mixed part only; the caller then applies its new role's rules."""
        self._phase[w] = "both"
        core = self._core
        p = core.prefill[w]
        d = core.decode[w]
        if new is Role.MIXED:
            self._sync_cap(w)
            # a chunk iteration with decodes (the prefill side does not count it) is a decode
            # iteration too: its end is a boundary that admits, as for a worker that stayed
            # mixed in phase "both" (a move to prefill and back closed admission; no step end
            # would open it again, and the prompts it completes would wait forever)
            hybrid = p.inflight and bool(p.chunk) and not p.counted
            d.accepting = hybrid or not p.inflight  # no admission while a prefill step runs
            if p.inflight:
                # a batch or chunk-only iteration, or a hybrid one: its end handler decides
                # the next step
                self._step[w] = Step.HYBRID if hybrid else Step.PREFILL
            elif d.b > 0 and not self._stalled[w]:
                self._step[w] = Step.DECODE
                self.poke(w, now)
            else:
                self._step[w] = Step.IDLE
                self.poke(w, now)
            return
        if self._step[w] not in (Step.PREFILL, Step.HYBRID):
            self.leave(w, now)
