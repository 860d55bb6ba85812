"""EcoServe-style policy: partial disaggregation on colocated instances (Du et al., "EcoServe:
Enabling Cost-effective LLM Serving with Proactive Intra- and Inter-Instance Orchestration",
2025, §4: temporal disaggregation, rolling activation, InterSchedule/CheckConstraints, mitosis
scaling).

Every instance is a *mixed* worker (colocated prefill and decode, one KV cache); the policy
groups them into *macro instances* (simulator pools ``macro<k>``; idle spares sit in pool
``standby``). Workers of another role are moved to ``mixed`` at the first control tick (requests
arriving before it are routed by role).

* Temporal disaggregation (:class:`pdopt.sim.SetPhase`): an instance runs decode-only phases
  and, when prompts are queued on it, prefill-only phases. Phases are *bounded* by the decodes'
  saved TPOT (below): on each control tick a prefill phase starts, or goes on, only while the
  smallest saved TPOT of the instance's decodes covers the queued prefill work (rounded up to
  whole ticks, since phases change on ticks only), so a phase ends once its next batch would
  cost more than the least patient decode has saved, including the decodes its own batches
  just created. A prompt that would otherwise miss the TTFT SLO starts a phase anyway.
* Rolling activation: new requests gather on one instance of a macro instance at a time (the
  sticky InterSchedule below) until its decodes have no saved TPOT left for another prefill,
  then on the next one, so the instances' prefill phases take turns; ``prefill_slots > 0``
  also caps how many instances of a macro instance may be in a prefill phase at once (the TTFT
  check then counts the wait for a slot).
* InterSchedule: a new request goes to the macro instance's current instance while
  CheckConstraints holds, else to the next one (round robin) that it holds for, which becomes
  current.
* CheckConstraints(w, r): (TTFT) time to the instance's next prefill phase + predicted prefill
  time of its pending prompts and ``r`` (outstanding FLOP / P_peak + the quadratic TTFT
  predictor) <= TTFT SLO; (TPOT) the saved TPOT of *each* decode of ``w``,
  ``(k + 1)·TPOT_SLO − elapsed − τ`` (``k`` tokens since the first token, ``elapsed`` time
  since it, ``τ`` the decode iteration; the minimum over decodes, not the mean), covers the
  decode stall that prefill causes; prompts already pending on ``w`` count as decodes with
  nothing saved (``TPOT_SLO − τ``) unless ``r`` joins their batch (``w`` not prefilling yet,
  their tokens and ``r``'s within ``max_batch_tokens``); (KV) its free blocks, less those of
  prompts routed to it and not yet decoding, hold ``r``'s prompt.
* Overall scheduler: macro instances are tried in order of mean outstanding prefill time; a
  request no macro instance accepts counts as a *miss* of the least-loaded one and goes to the
  instance with the least predicted TTFT.
* Mitosis scaling (every tick): a macro instance that missed takes a standby instance; at
  ``n_upper`` instances it splits into two halves; an instance idle for ``scale_idle_s`` while
  nothing missed goes back to standby from the smallest macro instance, which merges into another
  when it falls below ``n_lower`` (if the merged size stays within ``n_upper``). Scaling starts
  at the second tick (the first one sets the instances up).

Decodes stay on the instance that prefilled them (no KV transfer) when it can hold them.
Ablations: ``rolling=False`` (each request goes to the instance with the least predicted TTFT
among those meeting the constraints, so prefills spread and interrupt every instance's decodes),
``constraints=False``
(sticky routing without CheckConstraints), ``mitosis=False`` (fixed macro instances).

One module (~530 lines) on purpose: routing, the phase schedule and mitosis read and write the
same per-run state (macro instances, phases, pending prompts, first-token times), and splitting
them would put that state behind accessors used by one class only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pdopt._validation import (
    check_int_at_least,
    check_non_negative,
    check_positive_or_none,
    param_error,
)
from pdopt.policies._baselines import _feasible_decode
from pdopt.policies._registry import register_policy
from pdopt.policies._slo_predict import WorkerModels
from pdopt.sim import (
    Action,
    ClusterView,
    MoveWorker,
    Policy,
    PolicyTraits,
    RequestInfo,
    Role,
    RunContext,
    SetPhase,
)

PREFILL, DECODE = "prefill", "decode"
STANDBY = "standby"


@dataclass(slots=True)
class _Macro:
    """A macro instance: its pool name, members (worker indices) and the InterSchedule cursor."""

    pool: str
    members: list[int] = field(default_factory=list)
    cursor: int = 0
    misses: int = 0


@register_policy("ecoserve")
class EcoServe(Policy):
    """Temporal disaggregation in macro instances (see the module docstring).

    Parameters
    ----------
    ttft_slo_s, tpot_slo_s : float or None
        The SLOs CheckConstraints protects, seconds. None: the run's (``RunContext.slo``); a
        value overrides it.
    n_lower, n_upper : int
        Mitosis bounds on a macro instance's size (merge below ``n_lower``, split at ``n_upper``).
    macro_size : int
        Initial macro-instance size (active instances are cut into groups of about this size).
    initial_instances : int
        Instances active at start (0: all); the rest wait in standby for mitosis to add them.
    prefill_slots : int
        Most instances of one macro instance in a prefill phase at once (0: no cap).
    scale_idle_s : float
        Idle time after which an instance is removed (mitosis scale-down).
    rolling, constraints, mitosis : bool
        Ablations (see the module docstring).
    """

    name = "ecoserve"
    TRAITS = PolicyTraits(wants_ticks=True, colocated_schedule="prefill_first")

    def __init__(
        self,
        ttft_slo_s: float | None = None,
        tpot_slo_s: float | None = None,
        *,
        n_lower: int = 2,
        n_upper: int = 8,
        macro_size: int = 4,
        initial_instances: int = 0,
        prefill_slots: int = 0,
        scale_idle_s: float = 2.0,
        rolling: bool = True,
        constraints: bool = True,
        mitosis: bool = True,
    ) -> None:
        owner = "ecoserve"
        self.ttft_slo_s = check_positive_or_none(ttft_slo_s, "ttft_slo_s", owner)
        self.tpot_slo_s = check_positive_or_none(tpot_slo_s, "tpot_slo_s", owner)
        self._ttft_slo_s = self._tpot_slo_s = math.nan  # the run's, set by start
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
        self._models: WorkerModels | None = None
        self._reset(0)

    # -- per-run state ----------------------------------------------------------------------------
    def _reset(self, n: int) -> None:
        self._macros: list[_Macro] = []
        self._macro_of = [-1] * n
        self._standby: list[int] = []
        self._phase = ["both"] * n
        self._src: dict[int, int] = {}
        # w -> {rid: (prompt blocks, prefill tokens)} of prompts routed to w that will decode
        self._pending: list[dict[int, tuple[int, int]]] = [{} for _ in range(n)]
        self._batch_tokens = [8192] * n
        self._queued: list[dict[int, float]] = [{} for _ in range(n)]  # w -> {rid: arrival_s}
        self._first_token: dict[int, tuple[float, int]] = {}  # rid -> (time, context then)
        self._idle_since = [0.0] * n
        self._last_miss_s = 0.0
        self._next_pool = 0
        self._started = False
        self._tick_s = math.nan  # the run's control tick, set by start
        self._last_tick_s = 0.0

    def start(self, ctx: RunContext) -> None:
        cluster = ctx.cluster
        n = len(cluster.workers)
        self._models = WorkerModels.of(cluster)
        self._reset(n)
        self._tick_s = ctx.tick_s
        self._ttft_slo_s = ctx.slo.ttft_s if self.ttft_slo_s is None else self.ttft_slo_s
        self._tpot_slo_s = ctx.slo.tpot_s if self.tpot_slo_s is None else self.tpot_slo_s
        self._batch_tokens = [spec.max_batch_tokens for spec in cluster.workers]
        active = self.initial_instances or n
        active = min(active, n)
        groups = max(1, math.ceil(active / self.macro_size))
        for g in range(groups):
            self._new_macro().members.extend(range(g, active, groups))
        for m, macro in enumerate(self._macros):
            for w in macro.members:
                self._macro_of[w] = m
        self._standby = list(range(active, n))

    def _new_macro(self) -> _Macro:
        macro = _Macro(f"macro{self._next_pool}")
        self._next_pool += 1
        self._macros.append(macro)
        return macro

    @property
    def _m(self) -> WorkerModels:
        if self._models is None:
            raise RuntimeError("ecoserve: route called before start(cluster, seed)")
        return self._models

    # -- routing ----------------------------------------------------------------------------------
    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        w = self._dispatch(request, view)
        self._src[request.request_id] = w
        self._queued[w][request.request_id] = request.arrival_s
        if request.output_tokens > request.prefill_tokens - request.input_tokens + 1:
            self._pending[w][request.request_id] = (request.kv_blocks, request.prefill_tokens)
        return w

    def _dispatch(self, request: RequestInfo, view: ClusterView) -> int:
        eligible = set(view.prefill_workers.tolist())
        wait = self._m.prefill_wait_s(view)
        order = sorted(
            range(len(self._macros)),
            key=lambda m: (float(np.mean(wait[self._macros[m].members])), m),
        )
        for m in order:
            w = self._inter_schedule(self._macros[m], request, view, eligible)
            if w >= 0:
                return w
        if order:
            self._macros[order[0]].misses += 1
            self._last_miss_s = view.now_s
        active = [w for w in eligible if self._macro_of[w] >= 0] or sorted(eligible)
        idx = np.array(sorted(active), dtype=np.int64)
        ttft = self._m.predicted_ttft_s(view, idx, request.prefill_tokens)
        return int(idx[int(np.argmin(ttft))])

    def _inter_schedule(
        self, macro: _Macro, request: RequestInfo, view: ClusterView, eligible: set[int]
    ) -> int:
        """Sticky-then-next: the current instance while CheckConstraints holds, else the next
        (``rolling=False``: the least predicted TTFT among those meeting the constraints)."""
        if not self.rolling:
            ok = [w for w in macro.members if w in eligible and self._check(w, request, view)]
            if not ok:
                return -1
            idx = np.array(ok, dtype=np.int64)
            return int(
                idx[int(np.argmin(self._m.predicted_ttft_s(view, idx, request.prefill_tokens)))]
            )
        size = len(macro.members)
        for k in range(size):
            i = (macro.cursor + k) % size
            w = macro.members[i]
            if w in eligible and self._check(w, request, view):
                macro.cursor = i
                return w
        return -1

    def _check(self, w: int, request: RequestInfo, view: ClusterView) -> bool:
        """CheckConstraints: TTFT, saved TPOT and KV (see the module docstring)."""
        if not self.constraints:
            return True
        prefill_s = float(self._m.predicted_ttft_s(view, np.array([w]), request.prefill_tokens)[0])
        if self._switch_s(w, view) + prefill_s > self._ttft_slo_s:
            return False
        saved = self._saved_tpot_s(w, view)
        if self._pending[w] and not self._joins_batch(w, request):
            # the prompts routed before ``request`` decode, with nothing saved yet, while it
            # prefills in a later batch of the same phase
            fresh = self._tpot_slo_s - self._iteration_s(w, view)
            saved = fresh if saved is None else min(saved, fresh)
        if saved is not None and saved < self._stall_s(w, view.now_s, prefill_s):
            return False
        pending = sum(blocks for blocks, _ in self._pending[w].values())
        return bool(view.kv_free_blocks[w] - pending >= request.kv_blocks)

    def _joins_batch(self, w: int, request: RequestInfo) -> bool:
        """Whether ``request`` would be prefilled in the same batch as the prompts already
        routed to ``w``: ``w`` is not prefilling yet (its queue forms one batch when the phase
        starts) and their tokens and its own fit one batch (``max_batch_tokens``)."""
        if self._phase[w] == PREFILL:
            return False
        tokens = sum(t for _, t in self._pending[w].values()) + request.prefill_tokens
        return tokens <= self._batch_tokens[w]

    def _to_next_tick(self, now_s: float) -> float:
        return max(0.0, self._last_tick_s + self._tick_s - now_s)

    def _switch_s(self, w: int, view: ClusterView) -> float:
        """Time until ``w`` can be in a prefill phase: 0 if it is; else the next tick, or with
        every prefill slot of its macro instance taken, the tick after the first of those
        instances runs out of prefill work."""
        if self._phase[w] == PREFILL:
            return 0.0
        wait = self._to_next_tick(view.now_s)
        m = self._macro_of[w]
        if not self.prefill_slots or m < 0:
            return wait
        busy = [v for v in self._macros[m].members if self._phase[v] == PREFILL]
        if len(busy) < self.prefill_slots:
            return wait
        left = float(np.min(self._m.prefill_wait_s(view)[busy]))
        ticks = math.ceil(max(0.0, left - wait) / self._tick_s)
        return wait + ticks * self._tick_s

    def _ticks_s(self, work_s: float) -> float:
        """A prefill phase of ``work_s`` seconds of prompts started on a tick stalls decodes
        until the first tick after the work (phases change on ticks only), seconds."""
        return math.ceil(work_s / self._tick_s - 1e-9) * self._tick_s

    def _stall_s(self, w: int, now_s: float, work_s: float) -> float:
        """How long ``work_s`` seconds of prefill on ``w`` stall its decodes, counted from
        ``now_s`` if it is in a prefill phase (to the first tick after the work), else from the
        phase's start at the next tick."""
        if self._phase[w] != PREFILL:
            return self._ticks_s(work_s)
        return self._ticks_s(now_s - self._last_tick_s + work_s) - (now_s - self._last_tick_s)

    def _saved_tpot_s(self, w: int, view: ClusterView) -> float | None:
        """Smallest saved TPOT over the decodes of ``w`` (running, or waiting for admission),
        seconds; None when there are none.

        A decode that has emitted ``k`` tokens since its first one, ``elapsed`` seconds ago,
        and is then stalled ``x`` seconds still meets its TPOT SLO after its next token (and
        after any later one, while iterations stay under the SLO) iff
        ``x <= (k + 1)·TPOT_SLO − elapsed − τ`` (``τ`` the worker's decode iteration): its
        *saved TPOT* (EcoServe §4, CheckConstraints: ``L·TPOT_SLO − elapsed`` with ``L`` counting
        the coming token). The *minimum* is what a prefill phase may spend: a mean lets
        long-running decodes with a large saving pay for short ones that have none."""
        run = view.running_requests(w)
        ids = run["request_id"].tolist()
        ctxs = run["context_tokens"].tolist()
        waiting = view.waiting_requests(w).tolist()
        if not ids and not waiting:
            return None
        now = view.now_s
        least = math.inf
        for rid, ctx in zip(ids + waiting, ctxs + [-1] * len(waiting), strict=True):
            t0, c0 = self._first_token.get(rid, (now, ctx))
            decoded = max(0, ctx - c0) if ctx >= 0 else 0
            least = min(least, (decoded + 1) * self._tpot_slo_s - (now - t0))
        return least - self._iteration_s(w, view)

    def _iteration_s(self, w: int, view: ClusterView) -> float:
        """Predicted decode iteration of ``w`` with its running and waiting decodes, seconds."""
        run = view.running_requests(w)
        batch = len(run["request_id"]) + int(view.decode_queue_len[w])
        return self._m.decode_iteration_s(w, max(batch, 1), float(np.sum(run["context_tokens"])))

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        rid = request.request_id
        src = self._src.pop(rid, -1)
        if src >= 0:
            self._pending[src].pop(rid, None)
            self._queued[src].pop(rid, None)
        self._first_token.setdefault(rid, (view.now_s, request.prefill_tokens))
        feasible = _feasible_decode(request, view)
        allowed = set(feasible.tolist())
        if src in allowed and view.roles[src] is Role.MIXED:
            return src
        m = self._macro_of[src] if src >= 0 else -1
        local = [w for w in self._macros[m].members if w in allowed] if m >= 0 else []
        pool = np.array(local, dtype=np.int64) if local else feasible
        return int(pool[int(np.argmax(view.kv_free_blocks[pool]))])

    # -- control tick -----------------------------------------------------------------------------
    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        now = view.now_s
        self._last_tick_s = now
        actions: list[Action] = []
        if not self._started:
            actions += self._convert(view)
            self._started = True
        elif self.mitosis:
            actions += self._scale(view)
        for w in range(view.n_workers):
            if not self._has_prefill(w, view):
                self._queued[w].clear()  # prompts that finished at prefill (one output token)
        actions += self._phases(view)
        for macro in self._macros:
            macro.misses = 0
        return actions

    def _convert(self, view: ClusterView) -> list[Action]:
        """First tick: every active worker becomes a mixed instance of its macro instance (in
        a decode phase), every spare goes to standby."""
        out: list[Action] = []
        for macro in self._macros:
            for w in macro.members:
                out += self._join(w, macro, view)
        for w in self._standby:
            if view.pools[w] != STANDBY or view.roles[w] is not Role.PREFILL:
                out.append(MoveWorker(w, STANDBY, Role.PREFILL))
        return out

    def _join(self, w: int, macro: _Macro, view: ClusterView) -> list[Action]:
        self._phase[w] = DECODE
        out: list[Action] = []
        if view.pools[w] != macro.pool or view.roles[w] is not Role.MIXED:
            out.append(MoveWorker(w, macro.pool, Role.MIXED))
        out.append(SetPhase(w, DECODE))
        return out

    def _has_prefill(self, w: int, view: ClusterView) -> bool:
        return bool(view.prefill_queue_len[w] > 0 or view.queued_prefill_flop[w] > 0.0)

    def _phases(self, view: ClusterView) -> list[Action]:
        """Temporal disaggregation with bounded prefill phases (see the module docstring)."""
        out: list[Action] = []
        work_s = self._m.prefill_wait_s(view)
        for macro in self._macros:
            mixed = [w for w in macro.members if view.roles[w] is Role.MIXED]
            busy = 0
            for w in mixed:
                if self._phase[w] != PREFILL:
                    continue
                if self._has_prefill(w, view) and self._may_prefill(w, view, float(work_s[w])):
                    busy += 1
                else:
                    self._phase[w] = DECODE
                    out.append(SetPhase(w, DECODE))
            slots = self.prefill_slots or len(mixed)
            ready = [
                w
                for w in mixed
                if self._phase[w] != PREFILL
                and self._has_prefill(w, view)
                and self._may_prefill(w, view, float(work_s[w]))
            ]
            ready.sort(key=lambda w: (self._oldest_s(w, view.now_s), w))
            for w in ready[: max(0, slots - busy)]:
                self._phase[w] = PREFILL
                out.append(SetPhase(w, PREFILL))
        return out

    def _may_prefill(self, w: int, view: ClusterView, work_s: float) -> bool:
        """Whether ``w`` may (go on) prefill ``work_s`` seconds of queued prompts: the smallest
        saved TPOT of its decodes covers it, or its oldest prompt would otherwise miss the TTFT
        SLO (waiting longer cannot help it; the decodes pay instead)."""
        if not self.constraints:
            return True
        saved = self._saved_tpot_s(w, view)
        if saved is None or saved >= self._ticks_s(work_s):
            return True
        waited_s = view.now_s - self._oldest_s(w, view.now_s)
        return waited_s + work_s + self._tick_s >= self._ttft_slo_s

    def _oldest_s(self, w: int, now_s: float) -> float:
        """Arrival of the oldest prompt routed to ``w`` and not yet prefilled (``now_s`` if
        none)."""
        return min(self._queued[w].values(), default=now_s)

    def _scale(self, view: ClusterView) -> list[Action]:
        """Mitosis: add a standby instance where requests missed (split at n_upper); remove an
        idle one from the smallest macro instance (merge below n_lower)."""
        out: list[Action] = []
        for macro in list(self._macros):
            if macro.misses and self._standby:
                w = self._standby.pop(0)
                macro.members.append(w)
                out += self._join(w, macro, view)
                if len(macro.members) >= self.n_upper:
                    out += self._split(macro, view)
        self._index()
        out += self._scale_down(view)
        return out

    def _split(self, macro: _Macro, view: ClusterView) -> list[Action]:
        half = len(macro.members) // 2
        other = self._new_macro()
        other.members = macro.members[half:]
        macro.members = macro.members[:half]
        macro.cursor %= len(macro.members)
        out: list[Action] = []
        for w in other.members:
            out.append(MoveWorker(w, other.pool, Role.MIXED))
            out.append(SetPhase(w, self._phase[w] if self._phase[w] != "both" else DECODE))
        return out

    def _scale_down(self, view: ClusterView) -> list[Action]:
        now = view.now_s
        idle = (view.running == 0) & (view.prefill_queue_len == 0) & (view.decode_queue_len == 0)
        for w in range(view.n_workers):
            if not idle[w]:
                self._idle_since[w] = now
        candidates = [m for m in self._macros if m.members]
        if len(candidates) == 0 or sum(len(m.members) for m in candidates) <= 1:
            return []
        if now - self._last_miss_s < self.scale_idle_s:
            return []
        smallest = min(candidates, key=lambda m: (len(m.members), m.pool))
        gone = [w for w in smallest.members if now - self._idle_since[w] >= self.scale_idle_s]
        if not gone:
            return []
        w = gone[-1]
        smallest.members.remove(w)
        smallest.cursor = 0
        self._standby.append(w)
        self._phase[w] = "both"
        out: list[Action] = [MoveWorker(w, STANDBY, Role.PREFILL)]
        out += self._merge(smallest, view)
        self._index()
        return out

    def _merge(self, macro: _Macro, view: ClusterView) -> list[Action]:
        """A macro instance below n_lower joins the smallest other one (if that stays below
        n_upper); an empty one disappears."""
        if macro.members and len(macro.members) >= self.n_lower:
            return []
        others = [m for m in self._macros if m is not macro and m.members]
        out: list[Action] = []
        if macro.members and others:
            into = min(others, key=lambda m: (len(m.members), m.pool))
            if len(into.members) + len(macro.members) > self.n_upper:
                return []
            for w in macro.members:
                into.members.append(w)
                out.append(MoveWorker(w, into.pool, Role.MIXED))
                out.append(SetPhase(w, self._phase[w] if self._phase[w] != "both" else DECODE))
            macro.members = []
        if not macro.members:
            self._macros.remove(macro)
        return out

    def _index(self) -> None:
        self._macro_of = [-1] * len(self._macro_of)
        for m, macro in enumerate(self._macros):
            for w in macro.members:
                self._macro_of[w] = m
