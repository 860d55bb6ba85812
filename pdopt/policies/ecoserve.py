"""EcoServe-style policy: partial disaggregation on colocated instances (Du et al., "EcoServe:
Enabling Cost-effective LLM Serving with Proactive Intra- and Inter-Instance Orchestration",
2025, §4: temporal disaggregation, rolling activation, InterSchedule/CheckConstraints, mitosis
scaling).

Every instance is a *mixed* worker (colocated prefill and decode, one KV cache); the policy
groups them into *macro instances* (simulator pools ``macro<k>``; idle spares sit in pool
``standby``). Workers of another role are moved to ``mixed`` at the first control tick (requests
arriving before it are routed by role).

* Temporal disaggregation (§4.2.2.1), ``phases="activation"`` (the default): the paper's
  instance "commits to processing only prefill tasks for a certain period" and the decodes
  that existed before ``t_switch`` "will be paused" (Alg. 2's C2). An instance runs on vLLM's
  prefill-first schedule (§5: EcoServe is built on vLLM; phase ``"both"``), so its
  activation's first prompt starts at the next decode boundary; at the first control tick
  while a prompt of its activation is in prefill (and no decode waits there for admission)
  it enters a *prefill phase* (:class:`pdopt.sim.SetPhase` ``"prefill"``): decodes pause,
  and the activation's prefilled prompts are *held* (not admitted to decode). The phase
  ends, on a tick, when no prompt is left to prefill (``hold="prefilled"``, the default: the
  issue's "phases that last until the pending batch is done", no forced idling); or, prompts
  left or not, when another tick would take its oldest held prompt past the TTFT SLO, when
  the existed decodes' saved TPOT (C2's aggregate) is below a tick, or when held prompts fill
  the running slots. At the end the held prompts decode: with no prompt left the instance
  goes back to ``"both"``; a forced end with prompts still queued switches it to
  ``"decode"`` (§4.2.2.1: it "then switches to processing only decode tasks"; under
  ``"both"``, vLLM's prefill-first, the queued prompts would be prefilled first and the held
  ones would go on waiting) until a tick sees the held prompts admitted. Their saved TPOT
  counts from their admission (the phase's end, or the end of the prefill batch then in
  service, which the engine does not interrupt; ``r.first_token_time`` read as the paper's
  first token, §4.4), and a TTFT miss is checked against it. A new activation starts
  (``t_switch`` = the phase's end) with the prompts still to prefill, whose C2 protects the
  released ones. A request preempted by recompute and prefilled again is not held (it
  decoded before), and its re-prefill is no new TTFT miss for mitosis.
  ``hold="deadline"`` (pdopt's reading, not the paper's; the default until ``hold``
  was added): with no prompt left to prefill the phase ends only when the activation is over
  (the cursor left the instance), it holds no prompt, or it has existed decodes (idling
  would spend saved TPOT C2 granted only for ``t_total``), else the instance idles in the
  phase until a tick before its oldest held prompt's TTFT deadline, so that its
  activation's prompts do not decode between spaced prompts (their decoding, the paper's
  TPOT, §4.4, then runs undisturbed) at the price of their TTFT; and C1 also refuses a
  prompt that would push the phase's end (now + the instance's outstanding prefill work +
  the prompt + a tick) past the oldest held prompt's TTFT SLO (``held_late``, assumption
  (g)). ``phases="batch"`` (a named departure, the default before the second review):
  phase ``"both"`` throughout, so a prefill phase is vLLM's prefill-first stretch and lasts
  only while prompts are pending; between spaced prompts the activation's own prompts
  decode, unprotected by C2 (assumption (d)) and unbounded by C1, so a later prompt of the
  same activation stalls them (they miss TPOT). What makes the phases long under either rule
  is routing: an instance gets prompts only while it is *activated* (the InterSchedule
  cursor is on it). ``phases="ticks"`` is pdopt's earlier rule (a named departure): on
  each control tick a prefill phase starts, or goes on, only while the saved TPOT of the
  instance's decodes covers the queued prefill work (rounded up to whole ticks); a prompt
  that would otherwise miss the TTFT SLO starts one anyway; the instance idles in a prefill
  phase with nothing queued until the next tick. Either way a phase needs a running slot
  free for a prompt, the requests waiting for decode admission counted (a prefill phase
  admits no decode, so with every slot taken or owed to them it would never end; under
  ``phases="activation"`` the same test ends a phase).
* Rolling activation (§4.2.2.2): new requests gather on one instance of a macro instance at a
  time (InterSchedule below) until CheckConstraints fails there, then on the next one, so the
  instances' prefill phases take turns. With ``phases="ticks"``, ``prefill_slots > 0`` also
  caps how many instances of a macro instance may be in a prefill phase at once.
* InterSchedule (Alg. 1, the default): the previous request's instance if CheckConstraints
  holds there, else ``(prev + 1) mod n`` *unconditionally* (a miss, for mitosis, when that one
  fails CheckConstraints too). Moving the cursor onto an instance starts its *activation*:
  ``t_switch`` = now, unless the instance is still in its prefill phase or has prompts to
  prefill: its activation then goes on (line 299: ``t_switch`` is "when it last switched
  and is currently in prefill"). The overall scheduler, which the paper leaves open, sends
  each request to the macro instance with the least mean outstanding prefill time (our
  assumption; ties to the oldest macro instance). Alg. 1's edge cases, which the paper leaves
  open (pdopt's reading): the instance list holds the members that take requests (an instance
  migrating between schedulers is not in it yet), so ``next`` is the first such member after
  ``prev`` in the macro instance's order, and a macro instance with none is skipped (the next
  one in the overall scheduler's order; with none anywhere the request is a miss and goes to the
  member with the least predicted TTFT, ties to the lowest index); when ``next`` is ``prev``
  itself (its only member that takes requests) and CheckConstraints fails, the request goes
  there as a miss and no new activation starts (the cursor did not move); when every instance
  fails CheckConstraints, Alg. 1 still routes to ``next`` (a miss, for mitosis). The cursor
  names an instance: when mitosis removes another member or splits the macro instance it stays
  on it (in its new macro instance after a split); when it removes that instance the cursor
  moves to the member that followed it.
  ``scan=True`` (pdopt's earlier variant): scan the members from the current one for the
  first that passes (one it would move to is checked as a fresh activation), then the other
  macro instances (by mean outstanding prefill time); a request no macro instance accepts is
  a miss and goes to the instance with the least predicted TTFT.
* CheckConstraints(w, r) (Alg. 2), ``check="activation"`` (the default, as written): (C1 TTFT)
  ``t_total`` = the predicted prefill times (each prompt alone, the quadratic TTFT predictor)
  of every prompt routed to ``w`` since its ``t_switch``, plus ``r``'s, <= TTFT SLO; (C2 TPOT)
  the mean saved TPOT ``L·TPOT_SLO − (now − first token)`` of the decodes that existed on
  ``w`` before ``t_switch`` (``L`` the tokens output so far) >= ``t_total`` (met when there is
  none); (C3 KV) its free blocks, less those of the prompts waiting in its prefill queue and
  of the prefilled requests waiting there for decode admission, hold ``r``'s prompt (the
  paper's ``remain_memsize``; pdopt reads it as what is left once the work already routed
  there is admitted; the queue is read in the engine's order, a request preempted by
  recompute rejoining it at the front under ``preempted_requeue="front"``). Named departures:
  ``saved_tpot="min"`` (the minimum saved TPOT instead of the mean), ``saved_tpot_margin=True``
  (each saved TPOT less the coming decode iteration τ), ``check="request"`` (pdopt's earlier
  per-request check: time to the instance's next prefill phase + its queued prefill work +
  ``r`` <= TTFT SLO, and the saved TPOT of *all* its decodes covers the stall ``r`` causes;
  with ``saved_tpot="min"`` it counts prompts already pending on ``w`` as decodes with nothing
  saved unless ``r`` joins their batch).

  Where Alg. 2 is vague, pdopt assumes: (a) ``t_switch`` is when the cursor last moved onto the
  instance (the paper: "phase switching timestamp"; an instance's prefill phase for an activation
  starts with its first prompt, and the paper's pending set is "requests arrived after t_switch"),
  except that a move onto an instance still in its prefill phase or with prompts to prefill keeps
  its ``t_switch`` and activation (line 299, "or when it last switched and is currently in
  prefill"; resetting them would drop the prompts it still prefills or holds from C1, and nothing
  would bound their TTFT), and, under ``phases="activation"``, also when the instance's prefill
  phase ends (its held prompts then decode as existed decodes of the next activation, whose C2
  protects them; the paper names no such reset; prompts a forced end leaves to prefill join the
  next activation); with ``rolling=False`` no cursor exists and an activation ends when the
  instance's pending batch is done and its prefill phase over; (b) ``L = r.output_length`` is
  the length so far (the final length is unknown to a server); (c) C1's condition, garbled in our
  copy, is ``t_total > SLO_TTFT`` -> NotSatisfied, and ``t_total`` (C1's and C2's) is the whole
  activation's, prompts already prefilled included. The paper's line 299 calls the pending set the
  requests "already waiting to be prefilled in this instance (arrived after t_switch)" and
  ``t_total`` "the total time the instance will spend in the prefill phase for this batch"; Alg. 2
  line 4 selects it from ``instance.reqs`` by arrival time, not by progress, and line 10 takes the
  existed decodes from the same set by the same time. pdopt follows the algorithm's filter: the
  prompts of an activation are prefilled in one phase and, held, begin decoding only when it ends,
  so the phase's whole prefill time is the first prompt's wait, which §4.4 counts in TTFT;
  counting only the prompts still to prefill would let a phase grow past the TTFT SLO of the ones
  it holds (test ``test_c1_counts_prompts_already_prefilled``). "Routed since ``t_switch``" stands
  for "arrived after": the same at arrival; a request preempted and prefilled again counts in the
  activation that re-prefills it (its prefill is in that phase). C2 compares the existed decodes'
  saved TPOT *now* with that whole ``t_total`` (the paper's literal ``mean_saved < t_total``, line
  307), under every phase rule: the part of the phase already run is charged twice, once in their
  lower saved TPOT (under ``phases="activation"`` they are paused for the whole phase; under
  ``"batch"`` stalled by each prompt) and once in ``t_total`` (with 0.27 s saved when a 0.2 s
  prompt is admitted, 0.1 s later 0.17 s are left, and a 0.05 s prompt is refused against
  ``t_total`` 0.25 s although the stall left is 0.15 s). ``c2_remaining=True`` (a named departure,
  default off) compares the saved TPOT with the prefill still to run instead (the instance's
  outstanding prefill work plus the request's), C1 keeping the whole activation; (d) decodes of
  the current activation are not protected by C2 (the paper's TPOT starts after the wait before
  decoding, §4.4, which C1 bounds); under ``phases="activation"`` an activation lasts one prefill
  phase, its prompts are held until it ends and one that began decoding before a tick could start
  the phase is protected as an existed decode; (e) the mean over no decode is "met"; (f) the phase
  reading above: the paper gives no rule for how long "a certain period" lasts; pdopt ends it as
  stated, on control ticks (the engine changes phases only there), so a phase may run up to a tick
  past its last prompt; (g) ``hold="deadline"`` only: C1 also refuses a prompt that would end the
  phase past the TTFT SLO of the oldest held prompt (``held_late``; Alg. 2 bounds only
  ``t_total``, the activation's predicted prefill time).
* Mitosis scaling (every tick, Fig. 7): each macro instance that missed (a request it could not take
  within CheckConstraints; a TTFT miss, observed when the first token is emitted (pdopt's TTFT; once
  per request: a re-prefill after preemption is none) and, under ``phases="activation"``, when a
  held prompt's decoding begins after its TTFT SLO (the paper's TTFT, §4.4); or more than 10% of the
  requests it finished in the last ``scale_idle_s`` over the TPOT SLO, counted once it finished at
  least 10 since an instance last joined or left it or it last brought one in, wherever that one
  went: "when the system fails to meet SLOs", §4.2.4.1) brings one standby instance in.
  ``refill="paper"`` (the default, Fig. 7 steps 1-4) adds it to the oldest macro instance below
  ``n_upper``, else to the newest: after a split the original refills to ``n_upper`` before the new
  one grows; ``refill="missing"`` (pdopt's earlier rule) adds it to the macro
  instance that missed. Past ``n_upper`` instances a macro instance
  splits off its last ``n_lower`` into a new one (its cursor on its first member, or on the
  old cursor's instance if that left with it; an instance a split or a removal moves a cursor
  onto starts an activation unless it is still in prefill); an instance idle for
  ``scale_idle_s`` while nothing missed goes back to standby, from the smallest macro
  instance while it is above ``n_lower``, then from the largest; the two smallest macro
  instances merge once together they are below ``n_upper``. Defaults ``n_lower=3,
  n_upper=6`` are the example of the paper's Fig. 7 (the values used for its Fig. 10 are not
  legible in our copy); ``n_upper >= 2·n_lower`` is required (pdopt's, so that a split
  leaves both parts at least ``n_lower``). Scaling starts at the second tick (the first one
  sets the instances up).
* Instance migration (§4.2.4.2): an instance that changes macro-instance scheduler (added
  from standby, split off, merged) takes no new request and starts no prefill phase for
  ``migration_s`` (0.1 s: the paper's "< 100 ms" bound) while its decodes go on;
  ``migration_s=0`` is free. The paper's Fig. 10 text has the scheduler route to a newly
  added instance "immediately"; pdopt charges instances from standby the same 0.1 s (an
  upper bound; ``migration_s=0`` reads it literally).
* Constants pdopt chose where the paper gives none: ``macro_size=4`` (initial macro-instance
  size), ``scale_idle_s=2.0`` s (idle time before a removal, and the window of finished
  requests for the TPOT trigger), the 10% / at-least-10 TPOT trigger above
  (:data:`pdopt.policies._ecoserve_macros.BEHIND_FRAC`), ``migration_s=0.1`` s; the
  overall scheduler's choice of macro instance (below).

Decodes stay on the instance that prefilled them (no KV transfer) when it can hold them.

Per-request records (pdopt's bookkeeping, not the paper's; the Policy interface has no finish
hook) are dropped when they can no longer matter: a prompt's routing records once it is
prefilled (:meth:`EcoServe.route_decode`) or, when it never reaches decode (one output token,
a client timeout), at the first tick its instance has nothing left to prefill; its first-token
time and KV blocks once it is seen on no instance at two sweeps :data:`SWEEP_S` apart.
Ablations: ``rolling=False`` (each request goes to the instance with the least predicted TTFT
among those meeting the constraints, so prefills spread and interrupt every instance's decodes),
``constraints=False`` (sticky routing without CheckConstraints), ``mitosis=False`` (fixed macro
instances).

TTFT/TPOT: the paper counts the wait between the first token and the start of decoding in
TTFT and starts TPOT after it (§4.4, Fig. 6); ``Slo(timing="decode_start")`` makes an SLO count
those (:func:`pdopt.sim.latency_by_timing`), and metrics report both. So the time a prompt is
held (prefilled, waiting for its instance's prefill phase to end) counts in TPOT under the
default ``Slo`` timing (``"first_token"``: the first token is emitted at the prefill's end)
and in TTFT under ``"decode_start"``; the policy itself (C2's saved TPOT, the mitosis
triggers) reads it the paper's way.

Layout: this module holds the policy (routing, InterSchedule, the paper's CheckConstraints);
:mod:`pdopt.policies._ecoserve_activation` the prefill phases of ``phases="activation"``;
:mod:`pdopt.policies._ecoserve_earlier` pdopt's earlier rules (``check="request"``,
``phases="ticks"``); :mod:`pdopt.policies._ecoserve_macros` the macro instances, the instances'
phases and migrations, and mitosis scaling; :mod:`pdopt.policies._ecoserve_slo` the SLO
arithmetic (saved TPOT, tick-bounded prefill stalls).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from pdopt._validation import (
    check_int_at_least,
    check_non_negative,
    check_one_of,
    check_positive_or_none,
    param_error,
)
from pdopt.cluster import Role
from pdopt.policies import _ecoserve_macros
from pdopt.policies._baselines import _feasible_decode, routes_as
from pdopt.policies._ecoserve_activation import activation_phases, held_late, not_decoding
from pdopt.policies._ecoserve_earlier import check_request, tick_phases
from pdopt.policies._ecoserve_macros import (
    BOTH,
    DECODE,
    PREFILL,
    Macro,
    MacroInstances,
)
from pdopt.policies._ecoserve_slo import saved_tpot_s
from pdopt.policies._registry import register_policy
from pdopt.policies._slo_predict import WorkerModels
from pdopt.sim import Action, ClusterView, Policy, PolicyTraits, RequestInfo, RunContext

SAVED_TPOT = ("mean", "min")
CHECKS = ("activation", "request")
PHASE_RULES = ("activation", "batch", "ticks")
REFILLS = ("paper", "missing")
HOLDS = ("prefilled", "deadline")
SWEEP_S = 1.0
"""Seconds between sweeps of the per-request records of decodes (first token, KV blocks): a
request seen on no instance (running, waiting for admission, migrating, or back in a prefill
queue) at two sweeps in a row has finished or was aborted, and its records go (pdopt's
bookkeeping; the Policy interface has no finish hook)."""


@register_policy("ecoserve")
class EcoServe(Policy):
    """Temporal disaggregation in macro instances (see the module docstring).

    Parameters
    ----------
    ttft_slo_s, tpot_slo_s : float or None
        The SLOs CheckConstraints protects, seconds. None: the run's (``RunContext.slo``); a
        value overrides it.
    n_lower, n_upper : int
        Mitosis bounds on a macro instance's size (Fig. 7: past ``n_upper`` split off
        ``n_lower``; merge two below ``n_upper`` together).
    macro_size : int
        Initial macro-instance size (active instances are cut into groups of about this size).
    initial_instances : int
        Instances active at start (0: all); the rest wait in standby for mitosis to add them.
    prefill_slots : int
        Most instances of one macro instance in a prefill phase at once (0: no cap).
    scale_idle_s : float
        Idle time after which an instance is removed (mitosis scale-down); also the window
        over which finished requests' TPOT misses are counted for scale-up.
    rolling, constraints, mitosis : bool
        Ablations (see the module docstring).
    scan : bool
        pdopt's InterSchedule variant instead of Alg. 1 (see the module docstring).
    saved_tpot : {"mean", "min"}
        How CheckConstraints C2 aggregates the decodes' saved TPOT (the paper: mean).
    saved_tpot_margin : bool
        Subtract the coming decode iteration τ from each saved TPOT (pdopt's earlier rule; the
        paper's ``L·SLO_TPOT − elapsed`` does not).
    check : {"activation", "request"}
        What CheckConstraints counts: the paper's activation (every prompt routed since the
        instance's ``t_switch``, against the decodes that existed before it) or pdopt's earlier
        per-request check (queued work plus this prompt, against every decode).
    phases : {"activation", "batch", "ticks"}
        ``"activation"``: the paper's reading (§4.2.2.1, Alg. 2): an activated instance stays
        in a prefill phase, its decodes paused and its activation's prompts held, until its
        activation's prompts are prefilled, then decodes (ended on control ticks; see the
        module docstring). ``"batch"``: vLLM's prefill-first schedule alone (a prefill
        stretch lasts while prompts are pending; the activation's own prompts decode between
        spaced prompts). ``"ticks"``: pdopt's earlier tick-bounded phase schedule
        (``prefill_slots`` applies to it only).
    migration_s : float
        Cost of moving an instance between macro-instance schedulers, seconds.
    refill : {"paper", "missing"}
        Which macro instance a standby instance joins when mitosis grows: Fig. 7's order
        (the oldest below ``n_upper``, else the newest) or the one that missed (pdopt's
        earlier rule).
    hold : {"prefilled", "deadline"}
        ``phases="activation"``: when a prefill phase with nothing left to prefill ends.
        ``"prefilled"`` (the default): then (no forced idling). ``"deadline"`` (pdopt's
        reading, not the paper's): while its activation goes on and it holds prompts and has
        no existed decode, the instance idles in the phase until a tick before its oldest
        held prompt's TTFT deadline, and C1 also refuses a prompt that would push the phase's
        end past that deadline (see the module docstring).
    c2_remaining : bool
        ``check="activation"``: C2 compares the existed decodes' saved TPOT with the prefill
        still to run on the instance (its outstanding prefill work plus the request's)
        instead of the whole activation's ``t_total``, whose part already run their saved
        TPOT already paid (a named departure; default off: the paper's ``mean_saved <
        t_total``, assumption (c)).
    """

    name = "ecoserve"
    TRAITS = PolicyTraits(wants_ticks=True, colocated_schedule="prefill_first")

    def __init__(
        self,
        ttft_slo_s: float | None = None,
        tpot_slo_s: float | None = None,
        *,
        n_lower: int = 3,
        n_upper: int = 6,
        macro_size: int = 4,
        initial_instances: int = 0,
        prefill_slots: int = 0,
        scale_idle_s: float = 2.0,
        rolling: bool = True,
        constraints: bool = True,
        mitosis: bool = True,
        scan: bool = False,
        saved_tpot: str = "mean",
        saved_tpot_margin: bool = False,
        check: str = "activation",
        phases: str = "activation",
        migration_s: float = 0.1,
        refill: str = "paper",
        hold: str = "prefilled",
        c2_remaining: bool = False,
    ) -> None:
        owner = "ecoserve"
        self.ttft_slo_s = check_positive_or_none(ttft_slo_s, "ttft_slo_s", owner)
        self.tpot_slo_s = check_positive_or_none(tpot_slo_s, "tpot_slo_s", owner)
        self._ttft_slo_s = self._tpot_slo_s = math.nan  # the run's, set by start
        self._tick_s = math.nan  # the run's control tick, set by start
        self.n_lower = check_int_at_least(n_lower, 1, "n_lower", owner)
        self.n_upper = check_int_at_least(n_upper, 2, "n_upper", owner)
        if self.n_upper < 2 * self.n_lower:
            raise param_error("n_upper", owner, f">= 2 * n_lower = {2 * n_lower}", n_upper)
        self.macro_size = check_int_at_least(macro_size, 1, "macro_size", owner)
        self.initial_instances = check_int_at_least(
            initial_instances, 0, "initial_instances", owner
        )
        self.prefill_slots = check_int_at_least(prefill_slots, 0, "prefill_slots", owner)
        self.scale_idle_s = check_non_negative(scale_idle_s, "scale_idle_s", owner)
        self.rolling, self.constraints, self.mitosis = (
            bool(rolling),
            bool(constraints),
            bool(mitosis),
        )
        self.scan = bool(scan)
        self.saved_tpot = check_one_of(saved_tpot, SAVED_TPOT, "saved_tpot", owner)
        self.saved_tpot_margin = bool(saved_tpot_margin)
        self.check = check_one_of(check, CHECKS, "check", owner)
        self.phases = check_one_of(phases, PHASE_RULES, "phases", owner)
        self.migration_s = check_non_negative(migration_s, "migration_s", owner)
        self.refill = check_one_of(refill, REFILLS, "refill", owner)
        self.hold = check_one_of(hold, HOLDS, "hold", owner)
        self.c2_remaining = bool(c2_remaining)
        self._models: WorkerModels | None = None
        self._requeue_front = True  # the cluster's preempted_requeue, set by start
        self._reset(0)

    # -- per-run state ----------------------------------------------------------------------------
    def _reset(self, n: int) -> None:
        self._instances = MacroInstances(
            n,
            n_lower=self.n_lower,
            n_upper=self.n_upper,
            scale_idle_s=self.scale_idle_s,
            migration_s=self.migration_s,
            tpot_slo_s=self._tpot_slo_s,
            tick_s=self._tick_s,
            base_phase=DECODE if self.phases == "ticks" else BOTH,
            refill=self.refill,
        )
        # the paper's activation of each instance: t_switch and {rid: predicted prefill s} of
        # the prompts routed to it since then (Alg. 2 lines 3-6)
        self._t_switch = [0.0] * n
        self._activation: list[dict[int, float]] = [{} for _ in range(n)]
        self._src: dict[int, int] = {}
        # w -> {rid: (prompt blocks, prefill tokens)} of prompts routed to w that will decode
        self._pending: list[dict[int, tuple[int, int]]] = [{} for _ in range(n)]
        self._batch_tokens = [8192] * n
        self._batch_size = [64] * n
        self._queued: list[dict[int, float]] = [{} for _ in range(n)]  # w -> {rid: arrival_s}
        self._first_token: dict[int, tuple[float, int]] = {}  # rid -> (time, context then)
        # phases="activation": w -> {rid: arrival_s} of the activation's prompts that will decode
        # on w and wait (prefilled or not) for its prefill phase to end
        self._held: list[dict[int, float]] = [{} for _ in range(n)]
        # rid -> prompt blocks of a request routed to decode (C3 counts those still waiting)
        self._decode_blocks: dict[int, int] = {}
        self._blocks: dict[int, int] = {}  # rid -> prompt blocks, from routing to prefill end
        self._started = False
        self._last_tick_s = 0.0
        # L6: request ids of _first_token/_decode_blocks seen nowhere at the last sweep
        self._gone: set[int] = set()
        self._next_sweep_s = SWEEP_S

    def start(self, ctx: RunContext) -> None:
        cluster = ctx.cluster
        n = len(cluster.workers)
        self._models = WorkerModels.of(cluster)
        self._tick_s = ctx.tick_s
        self._ttft_slo_s = ctx.slo.ttft_s if self.ttft_slo_s is None else self.ttft_slo_s
        self._tpot_slo_s = ctx.slo.tpot_s if self.tpot_slo_s is None else self.tpot_slo_s
        self._requeue_front = cluster.preempted_requeue == "front"
        self._reset(n)
        self._batch_tokens = [spec.max_batch_tokens for spec in cluster.workers]
        self._batch_size = [spec.max_batch_size for spec in cluster.workers]
        active = self.initial_instances or n
        active = min(active, n)
        groups = max(1, math.ceil(active / self.macro_size))
        self._instances.populate(active, groups)

    @property
    def _m(self) -> WorkerModels:
        if self._models is None:
            raise RuntimeError("ecoserve: route called before start(cluster, seed)")
        return self._models

    # -- the compiled twin (pdopt.sim._compiled._ecoserve) --------------------------------------
    def traits(self) -> PolicyTraits:
        twin = ("ecoserve", "ecoserve") if self._own_rules() else None
        return dataclasses.replace(self.TRAITS, compiled_routing=twin)

    def _own_rules(self) -> bool:
        """True when this policy runs EcoServe's hooks and the rules they decide with."""
        rules = (
            "_reset", "_dispatch", "_fallback", "_alg1", "_inter_schedule", "_fresh", "_check",
            "_check_activation",
            "_c2_need_s", "_kv_fits", "_prefill_s", "_activate", "_in_prefill", "_move_onto",
            "_enqueue", "_forget_queued", "_sweep", "_has_prefill", "_prefill_in_service",
            "_cursors", "_saved_tpot_s", "_slots_full",
        )  # fmt: skip
        return routes_as(self, EcoServe, rules)

    def compiled_tick(self) -> tuple[str, tuple[float, ...]] | None:
        """The compiled twin of :meth:`on_tick` and its settings (the TTFT and TPOT SLOs, the
        flags ``phases == "activation"``, ``mitosis`` and ``refill == "missing"`` as 1.0 or
        0.0, ``n_lower``, ``n_upper``, ``scale_idle_s``, ``migration_s``, BEHIND_FRAC,
        SWEEP_S, and the flags ``constraints``, ``saved_tpot == "min"``, ``saved_tpot_margin``,
        ``c2_remaining``, ``rolling``, ``scan``, ``phases == "ticks"`` and ``check ==
        "request"``, ``prefill_slots`` and the flag ``hold == "deadline"``), then each worker's
        macro instance (-1:
        standby) and TTFT predictor ``a, b, c`` (none before :meth:`start`), or None where it
        has none: a subclass with its own hooks."""
        if not self._own_rules():
            return None
        flags = (self.phases == "activation", self.mitosis, self.refill == "missing")
        departures = (
            self.constraints, self.saved_tpot == "min", self.saved_tpot_margin, self.c2_remaining,
            self.rolling, self.scan, self.phases == "ticks", self.check == "request",
        )  # fmt: skip
        settings = (
            self._ttft_slo_s, self._tpot_slo_s, *(float(f) for f in flags),
            float(self.n_lower), float(self.n_upper), self.scale_idle_s, self.migration_s,
            _ecoserve_macros.BEHIND_FRAC, SWEEP_S, *(float(f) for f in departures),
            float(self.prefill_slots), float(self.hold == "deadline"),
        )  # fmt: skip
        if self._models is None:
            return "ecoserve", settings
        coefficients = [(p.a_s_per_token2, p.b_s_per_token, p.c_s) for p in self._models.ttft]
        macro_of = tuple(float(m) for m in self._instances.macro_of)
        return "ecoserve", (*settings, *macro_of, *(float(x) for x in np.ravel(coefficients)))

    # -- routing ----------------------------------------------------------------------------------
    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        w = self._dispatch(request, view)
        self._src[request.request_id] = w
        self._enqueue(w, request, view)
        if request.output_tokens > request.prefill_tokens - request.input_tokens + 1:
            self._pending[w][request.request_id] = (request.kv_blocks, request.prefill_tokens)
            # a request preempted by recompute decoded before: not held again (its TTFT
            # deadline, from arrival, is long past: one-tick phases and a miss per release)
            if self.phases == "activation" and not request.preemptions:
                self._held[w][request.request_id] = request.arrival_s
        self._blocks[request.request_id] = request.kv_blocks
        self._activation[w][request.request_id] = self._prefill_s(w, request)
        return w

    def _enqueue(self, w: int, request: RequestInfo, view: ClusterView) -> None:
        """Record ``request`` in ``w``'s prefill queue as the engine orders it: at the back,
        or, a request preempted by recompute on a cluster with ``preempted_requeue="front"``,
        ahead of the prompts waiting there (after those already in service). What waits now is
        read from the engine (``view.prefill_waiting``: C3 and the phase's predicted end); this
        record is what the policy routed there and has not seen leave."""
        queued = self._queued[w]
        if not (request.preemptions and self._requeue_front):
            queued[request.request_id] = request.arrival_s
            return
        items = list(queued.items())
        items.insert(
            max(0, len(items) - int(view.prefill_queue_len[w])),
            (
                request.request_id,
                request.arrival_s,
            ),
        )
        self._queued[w] = dict(items)

    def _prefill_s(self, w: int, request: RequestInfo) -> float:
        """Predicted prefill time of ``request`` on ``w`` alone (Alg. 2 line 5: "predict
        pending_prefills durations" from the profile), seconds."""
        return float(self._m.ttft[w].predict(request.prefill_tokens))

    def _activate(self, w: int, now_s: float) -> None:
        """A new activation of ``w`` starts (its phase switch, Alg. 2 line 3): the prompts
        routed from now on form its pending batch; the decodes it holds are its existed
        decodes (line 10)."""
        self._t_switch[w] = now_s
        self._activation[w] = {}

    def _in_prefill(self, w: int, view: ClusterView) -> bool:
        """Whether ``w`` is in its prefill phase or still has prompts to prefill: its
        ``t_switch`` is then "when it last switched and is currently in prefill" (ecoserve.txt
        line 299), so a cursor moving onto it keeps its activation (B1 of the third review)."""
        return self._instances.phase[w] == PREFILL or self._has_prefill(w, view)

    def _move_onto(self, w: int, view: ClusterView) -> None:
        """The cursor moved onto ``w``: a new activation starts (``t_switch`` = now) unless
        ``w`` is still in prefill (:meth:`_in_prefill`), whose activation goes on."""
        if not self._in_prefill(w, view):
            self._activate(w, view.now_s)

    def _fresh(self, w: int, view: ClusterView) -> bool:
        """With ``rolling=False`` no cursor ends an activation: an instance's activation ends
        when its pending batch is done (nothing queued or prefilling, its prefill phase
        over: :meth:`_in_prefill`)."""
        return not self._in_prefill(w, view)

    def _dispatch(self, request: RequestInfo, view: ClusterView) -> int:
        eligible = {
            w for w in view.prefill_workers.tolist() if self._instances.ready(w, view.now_s)
        }
        wait = self._m.prefill_wait_s(view)
        macros = self._instances.macros
        # the overall scheduler (the paper leaves it open): least mean outstanding prefill
        # time, ties to the oldest macro instance (the lowest index)
        order = sorted(
            range(len(macros)), key=lambda m: (float(np.mean(wait[macros[m].members])), m)
        )
        if self.rolling and not self.scan:
            # Alg. 1 in the first macro instance with a member taking requests (one whose
            # members all migrate has, for now, an empty instance list)
            for m in order:
                if any(w in eligible for w in macros[m].members):
                    return self._alg1(macros[m], request, view, eligible)
        else:
            for m in order:
                w = self._inter_schedule(macros[m], request, view, eligible)
                if w >= 0:
                    return w
        if order:
            self._instances.miss(macros[order[0]], view.now_s)
        return self._fallback(request, view, eligible)

    def _fallback(self, request: RequestInfo, view: ClusterView, eligible: set[int]) -> int:
        """Where a request goes that no macro instance takes (``scan``/``rolling=False``: none
        meets CheckConstraints; Alg. 1: no member anywhere takes requests, e.g. all migrate):
        the least predicted TTFT among the macro instances' members taking requests, else
        among all members (a migration ends within ``migration_s``), else among the prefill
        workers; ties to the lowest worker index (pdopt's rule; the paper has none)."""
        members = [w for w in range(view.n_workers) if self._instances.macro_of[w] >= 0]
        prefill = set(view.prefill_workers.tolist())
        active = [w for w in members if w in eligible] or [w for w in members if w in prefill]
        active = active or view.prefill_workers.tolist()
        idx = np.array(sorted(active), dtype=np.int64)
        ttft = self._m.predicted_ttft_s(view, idx, request.prefill_tokens)
        return int(idx[int(np.argmin(ttft))])

    def _alg1(
        self, macro: Macro, request: RequestInfo, view: ClusterView, eligible: set[int]
    ) -> int:
        """InterSchedule as EcoServe's Alg. 1 writes it: the previous request's instance if
        CheckConstraints holds there, else ``(prev + 1) mod n`` unconditionally (a miss when
        that one fails CheckConstraints too). Instances still migrating are not in the list
        (not yet members of the macro-instance scheduler): "next" is the first member after
        ``prev`` in the macro instance's order that takes requests. When that is ``prev``
        itself (the only one), the request goes there as a miss and its activation goes on
        (the cursor does not move, so no phase switch: Alg. 1 with one instance, the paper's
        "degrades to NoDG", §6.2.1). The caller passes a macro instance with at least one
        member in ``eligible``."""
        members = macro.members
        size = len(members)
        cur = macro.cursor % size
        prev = members[cur]
        if prev in eligible and self._check(prev, request, view):
            return prev
        i = next(
            (cur + k) % size for k in range(1, size + 1) if members[(cur + k) % size] in eligible
        )
        nxt = members[i]
        if nxt != prev:
            macro.cursor = i
            self._move_onto(nxt, view)
            if self._check(nxt, request, view):
                return nxt
        self._instances.miss(macro, view.now_s)
        return nxt

    def _inter_schedule(
        self, macro: Macro, request: RequestInfo, view: ClusterView, eligible: set[int]
    ) -> int:
        """``scan=True`` (pdopt's variant): the current instance while CheckConstraints holds,
        else the next one that it holds for (``rolling=False``: the least predicted TTFT among
        those meeting the constraints); -1 when none does."""
        if not self.rolling:
            ok = [
                w
                for w in macro.members
                if w in eligible and self._check(w, request, view, fresh=self._fresh(w, view))
            ]
            if not ok:
                return -1
            idx = np.array(ok, dtype=np.int64)
            w = int(
                idx[int(np.argmin(self._m.predicted_ttft_s(view, idx, request.prefill_tokens)))]
            )
            if self._fresh(w, view):
                self._activate(w, view.now_s)
            return w
        size = len(macro.members)
        for k in range(size):
            i = (macro.cursor + k) % size
            w = macro.members[i]
            # a move onto an instance still in prefill keeps its activation (line 299)
            fresh = i != macro.cursor % size and not self._in_prefill(w, view)
            if w in eligible and self._check(w, request, view, fresh=fresh):
                if fresh:
                    self._activate(w, view.now_s)
                macro.cursor = i
                return w
        return -1

    def _check(
        self, w: int, request: RequestInfo, view: ClusterView, *, fresh: bool = False
    ) -> bool:
        """CheckConstraints: TTFT, saved TPOT and KV (see the module docstring); ``fresh``:
        as if ``w``'s activation started now (an instance the cursor would move to)."""
        if not self.constraints:
            return True
        if self.check == "activation":
            return self._check_activation(w, request, view, fresh=fresh)
        return check_request(self, w, request, view)

    def _check_activation(
        self, w: int, request: RequestInfo, view: ClusterView, *, fresh: bool
    ) -> bool:
        """Alg. 2 as written: C1 ``t_total`` = predicted prefill time of every prompt routed to
        ``w`` since ``t_switch`` plus ``request`` <= TTFT SLO; C2 the mean (or min) saved TPOT
        of the decodes that existed before ``t_switch`` >= ``t_total`` (no such decode: met);
        C3 its free KV, less the prompts routed to it and not yet decoding, holds ``request``
        (``c2_remaining``: C2 against the prefill still to run, :meth:`_c2_need_s`).
        """
        batch = {} if fresh else self._activation[w]
        t_total = math.fsum(batch.values()) + self._prefill_s(w, request)
        if t_total > self._ttft_slo_s or (not fresh and held_late(self, w, request, view)):
            return False
        saved = saved_tpot_s(
            self._m,
            w,
            view,
            self._first_token,
            self._tpot_slo_s,
            self.saved_tpot,
            exclude=not_decoding(self, w, batch),
            margin=self.saved_tpot_margin,
        )
        if saved is not None and saved < self._c2_need_s(w, request, view, t_total):
            return False
        return self._kv_fits(w, request, view)

    def _c2_need_s(self, w: int, request: RequestInfo, view: ClusterView, t_total: float) -> float:
        """What C2 holds the saved TPOT against, seconds: ``t_total`` (Alg. 2 line 17), or,
        with ``c2_remaining``, the prefill still to run on ``w`` (outstanding work, queued plus
        the batch in service's remainder, over P_peak) plus ``request``'s predicted prefill."""
        if not self.c2_remaining:
            return t_total
        return float(self._m.prefill_wait_s(view)[w]) + self._prefill_s(w, request)

    def _kv_fits(self, w: int, request: RequestInfo, view: ClusterView) -> bool:
        """C3: the free blocks of ``w``, less those the prompts queued on it (not the running
        prefill batch, whose blocks are already used) and the requests waiting there for
        decode admission (prefilled, holding no blocks until admitted) will take, hold
        ``request``'s prompt. The queue is the engine's (``view.prefill_waiting``), so a prompt
        withdrawn from it (a client timeout) stops counting at once."""
        need = sum(self._blocks.get(rid, 0) for rid in view.prefill_waiting(w).tolist())
        need += sum(self._decode_blocks.get(rid, 0) for rid in view.waiting_requests(w).tolist())
        return bool(view.kv_free_blocks[w] - need >= request.kv_blocks)

    def _saved_tpot_s(self, w: int, view: ClusterView) -> float | None:
        """The saved TPOT of the decodes of ``w`` (:func:`saved_tpot_s`), seconds; None when
        there are none."""
        return saved_tpot_s(
            self._m,
            w,
            view,
            self._first_token,
            self._tpot_slo_s,
            self.saved_tpot,
            margin=self.saved_tpot_margin,
        )

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        rid = request.request_id
        src = self._src.pop(rid, -1)
        if src >= 0:
            self._pending[src].pop(rid, None)
            self._queued[src].pop(rid, None)
        self._decode_blocks[rid] = self._blocks.pop(rid, request.kv_blocks)
        first = rid not in self._first_token  # not a request preempted and prefilled again
        self._first_token.setdefault(rid, (view.now_s, request.prefill_tokens))
        m_src = self._instances.macro_of[src] if src >= 0 else -1
        if first and m_src >= 0 and view.now_s - request.arrival_s > self._ttft_slo_s:
            self._instances.miss(self._instances.macros[m_src], view.now_s)  # an observed TTFT miss
        feasible = _feasible_decode(request, view)
        allowed = set(feasible.tolist())
        if src in allowed and view.roles[src] is Role.MIXED:
            return src
        if src >= 0:
            self._held[src].pop(rid, None)  # decodes elsewhere: nothing to hold on src
        m = self._instances.macro_of[src] if src >= 0 else -1
        local = [w for w in self._instances.macros[m].members if w in allowed] if m >= 0 else []
        pool = np.array(local, dtype=np.int64) if local else feasible
        return int(pool[int(np.argmax(view.kv_free_blocks[pool]))])

    # -- control tick -----------------------------------------------------------------------------
    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        now = view.now_s
        self._last_tick_s = now
        actions: list[Action] = []
        if not self._started:
            actions += self._instances.convert(view)
            self._started = True
        elif self.mitosis:
            before = self._cursors()
            self._instances.observe_finished(view, self._first_token)
            actions += self._instances.scale(view)
            for w in self._cursors() - before:
                self._move_onto(w, view)  # a split or a removal moved a cursor onto w
        for macro in self._instances.macros:
            macro.misses = 0  # counted since this tick (a phase ending late adds one below)
        for w in range(view.n_workers):
            idle = not self._has_prefill(w, view) and not self._prefill_in_service(w, view)
            if self._queued[w] and idle:
                self._forget_queued(w)
        if now >= self._next_sweep_s:
            self._sweep(view)
        if self.phases == "ticks":
            actions += tick_phases(self, view)
        elif self.phases == "activation":
            actions += activation_phases(self, view)
        return actions

    def _forget_queued(self, w: int) -> None:
        """``w`` has nothing left to prefill: the prompts still recorded in its queue finished
        at prefill (one output token) or were aborted (a client timeout) without reaching
        :meth:`route_decode`; their per-request records go (L6). ``_activation[w]`` keeps
        them: C1 counts every prompt of the activation (assumption (c))."""
        for rid in self._queued[w]:
            self._src.pop(rid, None)
            self._blocks.pop(rid, None)
            self._pending[w].pop(rid, None)
            self._held[w].pop(rid, None)
        self._queued[w].clear()

    def _sweep(self, view: ClusterView) -> None:
        """Every :data:`SWEEP_S`: drop the first-token and KV-block records of requests seen
        on no instance at this sweep and the last one (finished or aborted; two sweeps so that
        a request between two places, e.g. a KV transfer, is kept), so that they do not grow
        with the run (L6). Known limit (third review, low): a KV transfer that spans two sweeps
        (over :data:`SWEEP_S`) loses its request's records, so C2 then reads it as just started
        and C3 its blocks as 0; EcoServe decodes where it prefilled, so a transfer happens only
        when the decode could not stay local, and the view does not list requests in transfer."""
        self._next_sweep_s = view.now_s + SWEEP_S
        live = set(self._src)
        live.update(view.migrating_requests.tolist())
        for w in range(view.n_workers):
            live.update(view.running_contexts(w)["request_id"].tolist())
            live.update(view.waiting_requests(w).tolist())
        unseen = (self._first_token.keys() | self._decode_blocks.keys()) - live
        for rid in unseen & self._gone:
            self._first_token.pop(rid, None)
            self._decode_blocks.pop(rid, None)
        self._gone = unseen

    def _has_prefill(self, w: int, view: ClusterView) -> bool:
        return bool(view.prefill_queue_len[w] > 0 or view.queued_prefill_flop[w] > 0.0)

    def _slots_full(self, w: int, view: ClusterView) -> bool:
        """Whether ``w``'s running slots (``max_running``, vLLM's ``max_num_seqs``) are all
        taken or owed to the prefilled requests waiting there for decode admission: no prompt
        can start its prefill, and a prefill phase admits no decode, so a phase kept then
        would never end (the waiting requests never take their slots, nor free them)."""
        return bool(view.running_slots_free[w] - view.decode_queue_len[w] <= 0)

    def _prefill_in_service(self, w: int, view: ClusterView) -> bool:
        """Whether a prefill batch of ``w`` is still in service (``view.running`` counts its
        prompts besides the running decodes). At the instant a batch ends, before the engine
        has handled its end, its outstanding work reads 0 (:meth:`_has_prefill` is false)
        while its prompts have not reached :meth:`route_decode` yet: a tick landing there
        must not forget them (L6 race, third review)."""
        return int(view.running[w]) > len(view.running_contexts(w)["request_id"])

    def _cursors(self) -> set[int]:
        """The instance under each macro instance's InterSchedule cursor."""
        return {m.members[m.cursor % len(m.members)] for m in self._instances.macros if m.members}
