"""EcoServe's macro instances (Du et al. 2025, §4.2.4): which instance (worker) serves in which
macro instance, each instance's phase and its migrations between macro-instance schedulers, and
mitosis scaling (Fig. 7). :class:`pdopt.policies.ecoserve.EcoServe` holds one
:class:`MacroInstances` per run; its module docstring states the rules.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pdopt.cluster import Role
from pdopt.sim import Action, ClusterView, MoveWorker, SetPhase

PREFILL, DECODE, BOTH = "prefill", "decode", "both"
STANDBY = "standby"
BEHIND_FRAC = 0.1
"""Mitosis grows a macro instance when more than this share of the requests it finished lately
missed the TPOT SLO (the paper says only "when the system fails to meet SLOs"; our threshold,
the complement of the 90% attainment the paper reports goodput at)."""


@dataclass(slots=True)
class Macro:
    """A macro instance: its pool name, members (worker indices) and the InterSchedule cursor."""

    pool: str
    members: list[int] = field(default_factory=list)
    cursor: int = 0
    misses: int = 0
    changed_s: float = 0.0  # last time an instance joined or left (or it brought one in)
    uid: int = -1  # stable id (the ``k`` of its pool ``macro<k>``): list indices shift


class MacroInstances:
    """Per-run macro-instance state of EcoServe and mitosis scaling over it.

    Parameters
    ----------
    n : int
        Workers in the cluster.
    n_lower, n_upper, scale_idle_s, migration_s
        EcoServe's parameters of the same names (:class:`pdopt.policies.EcoServe`).
    tpot_slo_s : float
        The run's TPOT SLO, seconds (scale-up counts finished requests that missed it).
    tick_s : float
        The run's control tick, seconds.
    base_phase : str
        The phase an instance takes when it joins a macro instance: ``"decode"`` when the
        policy schedules phases on ticks, else ``"both"`` (vLLM's prefill-first schedule).
    refill : {"paper", "missing"}
        Which macro instance a standby instance joins when mitosis grows (:meth:`scale`).

    Attributes
    ----------
    macros : list of Macro
        The macro instances (simulator pools ``macro<k>``).
    macro_of : list of int
        Index into ``macros`` of each worker's macro instance (-1: none).
    standby : list of int
        Idle spare workers (pool ``standby``), first to be added first.
    phase : list of str
        Each worker's phase: ``"prefill"``, ``"decode"`` or ``"both"`` (in no macro instance).
    """

    def __init__(
        self,
        n: int,
        *,
        n_lower: int,
        n_upper: int,
        scale_idle_s: float,
        migration_s: float,
        tpot_slo_s: float,
        tick_s: float,
        base_phase: str = DECODE,
        refill: str = "paper",
    ) -> None:
        self.base_phase = base_phase
        self.refill = refill
        self.n_lower, self.n_upper = n_lower, n_upper
        self.scale_idle_s, self.migration_s = scale_idle_s, migration_s
        self.tpot_slo_s, self.tick_s = tpot_slo_s, tick_s
        self.macros: list[Macro] = []
        self.macro_of = [-1] * n
        self.standby: list[int] = []
        self.phase = ["both"] * n
        self._idle_since = [0.0] * n
        self._ready_at = [0.0] * n  # end of the instance's migration (serializable proxy)
        self._seen: list[dict[int, int]] = [{} for _ in range(n)]  # w -> {rid: context}
        self._finished: deque[tuple[float, int, bool]] = deque()  # (t, macro uid, missed TPOT)
        self._last_miss_s = 0.0
        self._next_pool = 0

    def populate(self, active: int, groups: int) -> None:
        """Cut workers ``0 .. active-1`` into ``groups`` macro instances (round robin); the
        rest go to standby."""
        for g in range(groups):
            self._new_macro().members.extend(range(g, active, groups))
        for m, macro in enumerate(self.macros):
            for w in macro.members:
                self.macro_of[w] = m
        self.standby = list(range(active, len(self.macro_of)))

    def _new_macro(self) -> Macro:
        macro = Macro(f"macro{self._next_pool}", uid=self._next_pool)
        self._next_pool += 1
        self.macros.append(macro)
        return macro

    def ready(self, w: int, now_s: float) -> bool:
        """Whether ``w`` has finished its last migration between macro-instance schedulers."""
        return now_s >= self._ready_at[w]

    def miss(self, macro: Macro, now_s: float) -> None:
        """A request the macro instance could not take within CheckConstraints (mitosis grows
        it at the next tick)."""
        macro.misses += 1
        self._last_miss_s = now_s

    def convert(self, view: ClusterView) -> list[Action]:
        """First tick: every active worker becomes a mixed instance of its macro instance (in
        a decode phase), every spare goes to standby."""
        out: list[Action] = []
        for macro in self.macros:
            for w in macro.members:
                out += self._join(w, macro, view, migrate=False)
        for w in self.standby:
            if view.pools[w] != STANDBY or view.roles[w] is not Role.PREFILL:
                out.append(MoveWorker(w, STANDBY, Role.PREFILL))
        return out

    def _join(
        self, w: int, macro: Macro, view: ClusterView, *, migrate: bool = True
    ) -> list[Action]:
        """``w`` becomes a mixed instance of ``macro`` in its base phase; ``migrate``: its
        handler moves from another scheduler (:meth:`_migrate`)."""
        self.phase[w] = self.base_phase
        if migrate:
            self._migrate(w, view.now_s)
        out: list[Action] = []
        if view.pools[w] != macro.pool or view.roles[w] is not Role.MIXED:
            out.append(MoveWorker(w, macro.pool, Role.MIXED))
        out.append(SetPhase(w, self.base_phase))
        return out

    def _migrate(self, w: int, now_s: float) -> None:
        """Instance migration through the serializable proxy (EcoServe §4.2.4.2, < 100 ms): for
        ``migration_s`` the instance takes no new request and starts no prefill phase; its
        decodes go on (the migration is hidden in a decode phase, §6.2.2)."""
        self._ready_at[w] = now_s + self.migration_s

    def scale(self, view: ClusterView) -> list[Action]:
        """Mitosis (EcoServe §4.2.4.1, Fig. 7): one standby instance per macro instance that
        missed joins a macro instance (split off ``n_lower`` instances past ``n_upper``);
        remove an idle one (merge). Where it joins, ``refill="paper"`` (Fig. 7 steps 1-4):
        the oldest macro instance below ``n_upper`` (after a split the original one refills to
        ``n_upper`` before the new one grows), else the newest (which then splits);
        ``refill="missing"`` (pdopt's earlier rule): the macro instance that missed."""
        out: list[Action] = []
        for macro in list(self.macros):
            if not macro.misses and self.standby and self._failing(macro):
                self.miss(macro, view.now_s)
            if macro.misses and self.standby:
                target = macro if self.refill == "missing" else self._refill_target()
                w = self.standby.pop(0)
                target.members.append(w)
                # both restart their TPOT window: the macro instance that missed (else, under
                # refill="paper", its old misses fire again every tick) and the one that grew
                macro.changed_s = target.changed_s = view.now_s
                out += self._join(w, target, view)
                if len(target.members) > self.n_upper:
                    out += self._split(target, view)
        self._index()
        out += self._scale_down(view)
        return out

    def _refill_target(self) -> Macro:
        """Fig. 7 steps 1-4: the oldest macro instance below ``n_upper``, else the newest."""
        below = [m for m in self.macros if len(m.members) < self.n_upper]
        return below[0] if below else self.macros[-1]

    def observe_finished(
        self, view: ClusterView, first_token: dict[int, tuple[float, int]]
    ) -> None:
        """Requests that left a worker's running batch since the last tick (finished): their
        TPOT, ``(now − first token) / tokens since it`` (late by at most a tick), against the
        TPOT SLO, kept per macro instance for ``scale_idle_s``. ``first_token``: request id ->
        (time, context then) of its first token. With no standby instance nothing can be
        added: the scan is skipped and what was seen is forgotten (a request seen before and
        gone by the time an instance is back in standby would count as finishing then)."""
        now = view.now_s
        if not self.standby:
            # NOTE: skip the per-worker scan while nothing can be added (a large saving)
            for seen in self._seen:
                seen.clear()
            return
        for macro in self.macros:
            for w in macro.members:
                run = view.running_contexts(w)
                cur = dict(
                    zip(run["request_id"].tolist(), run["context_tokens"].tolist(), strict=True)
                )
                for rid in self._seen[w].keys() - cur.keys():
                    t0, c0 = first_token.get(rid, (now, self._seen[w][rid]))
                    tokens = self._seen[w][rid] - c0 + 1
                    late = (now - t0) > tokens * self.tpot_slo_s + self.tick_s
                    self._finished.append((now, macro.uid, bool(late)))
                self._seen[w] = cur
        while self._finished and self._finished[0][0] < now - self.scale_idle_s:
            self._finished.popleft()

    def _failing(self, macro: Macro) -> bool:
        """Whether ``macro`` missed the TPOT SLO on more than :data:`BEHIND_FRAC` of
        the requests it finished in the last ``scale_idle_s`` (at least 10 of them) since
        an instance last joined or left it, or it last brought one in (:meth:`scale`)."""
        since = macro.changed_s
        mine = [late for t, k, late in self._finished if k == macro.uid and t > since]
        return len(mine) >= 10 and sum(mine) > BEHIND_FRAC * len(mine)

    def _split(self, macro: Macro, view: ClusterView) -> list[Action]:
        """A new macro instance of the last ``n_lower`` members (Fig. 7 steps 2-3)."""
        other = self._new_macro()
        other.members = macro.members[-self.n_lower :]
        macro.members = macro.members[: -self.n_lower]
        other.changed_s = macro.changed_s = view.now_s
        # the cursor's instance keeps it: in its new macro instance if it left with the split
        # (the original then goes on with its first member, the next after the moved tail)
        cur = macro.cursor % (len(macro.members) + self.n_lower)
        if cur >= len(macro.members):
            other.cursor, macro.cursor = cur - len(macro.members), 0
        return self._move_all(other.members, other, view)

    def _move_all(self, workers: list[int], macro: Macro, view: ClusterView) -> list[Action]:
        """Move ``workers`` to ``macro``'s scheduler, keeping their phases (migrations)."""
        out: list[Action] = []
        for w in workers:
            self._migrate(w, view.now_s)
            out.append(MoveWorker(w, macro.pool, Role.MIXED))
            out.append(SetPhase(w, self.phase[w] if self.phase[w] != BOTH else self.base_phase))
        return out

    def _scale_down(self, view: ClusterView) -> list[Action]:
        now = view.now_s
        idle = (view.running == 0) & (view.prefill_queue_len == 0) & (view.decode_queue_len == 0)
        for w in range(view.n_workers):
            if not idle[w]:
                self._idle_since[w] = now
        candidates = [m for m in self.macros if m.members]
        if len(candidates) == 0 or sum(len(m.members) for m in candidates) <= 1:
            return []
        if now - self._last_miss_s < self.scale_idle_s:
            return []
        source = self._shrinkable(candidates)
        # idle now, too: with scale_idle_s=0 a busy member has idled "0 s" as well
        gone = [
            w for w in source.members if idle[w] and now - self._idle_since[w] >= self.scale_idle_s
        ]
        if not gone:
            return []
        w = gone[-1]
        self._remove(source, w)
        source.changed_s = now
        self.standby.append(w)
        self.phase[w] = "both"
        out: list[Action] = [MoveWorker(w, STANDBY, Role.PREFILL)]
        if not source.members:
            self.macros.remove(source)
        out += self._merge(view)
        self._index()
        return out

    @staticmethod
    def _remove(macro: Macro, w: int) -> None:
        """``w`` leaves ``macro``; the InterSchedule cursor stays on the instance the last
        request was routed to (Alg. 1's ``prev_idx`` names an instance, not a slot), or, when
        ``w`` was that instance, moves to the member that followed it (Alg. 1's next one; its
        activation starts at this tick). Before the second review's L5 it went back to the
        first member, whose activation then restarted."""
        i = macro.members.index(w)
        cur = macro.cursor % len(macro.members)
        macro.members.remove(w)
        if macro.members:
            macro.cursor = cur - 1 if i < cur else cur % len(macro.members)
        else:
            macro.cursor = 0

    def _shrinkable(self, macros: list[Macro]) -> Macro:
        """Where contraction removes an instance (Fig. 7 steps 5-6): the smallest macro instance
        while it is above ``n_lower``, then the largest."""
        smallest = min(macros, key=lambda m: (len(m.members), m.pool))
        if len(smallest.members) > self.n_lower or len(macros) == 1:
            return smallest
        return max(macros, key=lambda m: (len(m.members), m.pool))

    def _merge(self, view: ClusterView) -> list[Action]:
        """The two smallest macro instances merge once together they are below ``n_upper``
        (Fig. 7 steps 7-8: they reach ``n_upper``, then one more instance is removed)."""
        live = sorted(self.macros, key=lambda m: (len(m.members), m.pool))
        if len(live) < 2 or len(live[0].members) + len(live[1].members) >= self.n_upper:
            return []
        small, into = live[0], live[1]
        out = self._move_all(small.members, into, view)
        into.members += small.members
        into.changed_s = view.now_s
        small.members = []
        self.macros.remove(small)
        return out

    def _index(self) -> None:
        self.macro_of = [-1] * len(self.macro_of)
        for m, macro in enumerate(self.macros):
            for w in macro.members:
                self.macro_of[w] = m
