"""The control side of the engine: the control tick, telemetry, policy actions and pool moves.

Control tick (DESIGN.md "Control loop"): at every ``k·tick_s`` the engine samples one time-series
row per worker, then calls ``policy.on_tick(view)`` and applies the returned actions in order.
When the policy does not act on ticks (``PolicyTraits.wants_ticks`` False) and no waiting request
could be logged as a false OOM, the ticks before the next event are not run: the state moves only
in closed form until then, so the tick's snapshot stands for them
(:mod:`pdopt.sim._telemetry`), with the same rows and event log as running each tick.

Elastic pools (:class:`MoveWorker`): the worker's pool and role change at once.

* prefill → decode: its running batch finishes; the requests still queued are routed again
  through ``route_prefill`` (the worker is no longer eligible); it admits decode work once the
  batch has ended.
* decode → prefill: it admits no more decode work; requests in its admission queue are routed
  again through ``route_decode`` and their KV moves from it over the link; its running requests
  finish (drain), and it starts prefill batches once none is left.

Moves to or from the mixed role go through the colocated scheduler (:mod:`pdopt.sim._mixed`),
migrations through :mod:`pdopt.sim._migration`. The :class:`Control` component owns the tick, the
time-series rows and the false-OOM log; it reaches the engine's core through
:class:`pdopt.sim._core.Core`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from pdopt.cluster._spec import ClusterSpec, Role
from pdopt.sim._closed_form import next_tick
from pdopt.sim._enums import Event
from pdopt.sim._policy import (
    Migrate,
    MoveWorker,
    PolicyDecisionError,
    PolicyProtocol,
    SetPhase,
    action_worker,
)
from pdopt.sim._telemetry import Telemetry

if TYPE_CHECKING:
    from pdopt.sim._core import Core
    from pdopt.sim._migration import Migrations
    from pdopt.sim._mixed import Colocated
    from pdopt.sim._view import ClusterView


class Control:
    """Control tick, telemetry and actions of one run (see the module docstring)."""

    def __init__(
        self,
        core: Core,
        cluster: ClusterSpec,
        policy: PolicyProtocol,
        view: ClusterView,
        colocated: Colocated,
        migrations: Migrations,
        tick_s: float,
    ) -> None:
        self._core = core
        self._specs = cluster.workers
        self._policy = policy
        self._view = view
        self._colocated = colocated
        self._migrations = migrations
        self._tick_s = tick_s
        self._false_oom_flagged: set[int] = set()
        self.record_timeseries = False
        self.policy_ticks = True  # the policy's on_tick acts (PolicyTraits.wants_ticks)
        self.telemetry = Telemetry(core, cluster.workers, tick_s, cluster.kv_window)

    def start(self) -> None:
        """Schedule the first tick."""
        self._core.kernel.schedule(self._tick_s, Event.TICK, 1)

    # -- logs ------------------------------------------------------------------------------------
    def check_false_oom(self, rid: int, now: float) -> None:
        """Log a false OOM once per request: it waits for KV while the cluster's total free
        decode blocks would hold it (DESIGN.md "Fragmentation")."""
        if rid in self._false_oom_flagged:
            return
        t = self._core.table
        need = self._core.decode[t.decode_target[rid]].admission_blocks(rid, t)
        per_worker = self._view.kv_free_blocks[self._view.decode_workers]
        free = int(per_worker.sum())
        if free >= need:
            self._false_oom_flagged.add(rid)
            # most_free: the largest free space on one decode worker (need > most_free: the
            # request fits on no worker, only in the cluster's sum; compute_metrics counts those)
            most = int(per_worker.max(initial=0))
            detail = f"need={need} free={free} most_free={most}"
            self._core.log(now, "false_oom", t.decode_target[rid], rid, detail)

    # -- tick ------------------------------------------------------------------------------------
    def on_tick(self, now: float, seq: int, k: int) -> None:
        """The control tick ``k`` (the kernel's ``Event.TICK`` handler)."""
        core = self._core
        self._view.invalidate()
        t = core.table
        flagged = self._false_oom_flagged
        settled = True  # no waiting head that a later tick could log as a false OOM
        for side, role in zip(core.decode, core.roles, strict=True):  # the decode workers'
            if side.queue and side.accepting and role is not Role.PREFILL:
                head = side.queue[0]
                need = side.admission_blocks(head, t)
                free = side.free_blocks(now)
                if need > free:  # waits for KV, not for a boundary
                    self.check_false_oom(head, now)
                settled = settled and head in flagged
        if self.record_timeseries:
            self.telemetry.snapshot(k, self._view.reference_need_blocks())
        self._view.open_call()
        actions = self._policy.on_tick(self._view)
        self._view.close_call()
        for action in actions or ():
            self.apply(action, now)
        if core.n_done < core.n_total:
            if not len(core.kernel) and not self._colocated.phase_blocked():
                # NOTE: without this check a stuck request would make ticks run forever.
                raise RuntimeError(
                    f"pdopt.sim internal error: {core.n_total - core.n_done} requests are "
                    f"waiting at t={now} but nothing is scheduled to serve them; please report it"
                )
            nxt = k + 1
            if settled and not actions and not self.policy_ticks and len(core.kernel):
                # NOTE: the ticks before the next event would only sample a state that changes
                # in closed form: skip them (pdopt.sim._telemetry; a 7x saving on long runs).
                # the first tick at or after the next event (ticks run for the time series
                # alone here); the snapshot of tick k stands for the ticks before it
                nxt = next_tick(k, core.kernel.next_time(), self._tick_s)
                self.telemetry.stretch(nxt)
            core.kernel.schedule(nxt * self._tick_s, Event.TICK, nxt)

    def timeseries(self) -> pd.DataFrame:
        """The sampled rows as a frame of :data:`pdopt.sim.TIMESERIES_COLUMNS`."""
        return self.telemetry.frame()

    # -- actions ---------------------------------------------------------------------------------
    def apply(self, action: object, now: float) -> None:
        """Apply one action returned by ``policy.on_tick``."""
        if isinstance(action, MoveWorker):
            self.move_worker(action, now)
        elif isinstance(action, Migrate):
            self._migrations.start(action, now)
        elif isinstance(action, SetPhase):
            self._colocated.set_phase(action, now)
        else:
            raise PolicyDecisionError(
                f"policy {self._core.policy_name!r}: on_tick returned {action!r}, which is not "
                "an action (Migrate, MoveWorker or SetPhase)"
            )
        self._view.invalidate()

    def move_worker(self, action: MoveWorker, now: float) -> None:
        """Apply :class:`MoveWorker` (see the module docstring)."""
        core = self._core
        name = core.policy_name
        w = action_worker(action, len(core.roles), name)
        try:
            role = Role(action.role)
        except ValueError as exc:
            raise PolicyDecisionError(
                f"policy {name!r}: MoveWorker role {action.role!r} is not one of "
                f"{[str(r) for r in Role]}"
            ) from exc
        old = core.assign(w, role, str(action.pool))
        core.log(now, "pool_move", w, -1, f"{old}->{role} pool={action.pool}")
        self._view.invalidate()
        if old is role:
            return
        if Role.MIXED in (old, role):
            self._colocated.move(w, role, now)
            if role is Role.MIXED:
                return
        if role is Role.DECODE:
            self._prefill_to_decode(w, now)
        else:
            self._decode_to_prefill(w, now)

    def _prefill_to_decode(self, w: int, now: float) -> None:
        core = self._core
        side = core.prefill[w]
        queued = list(side.queue)
        side.queue.clear()
        side.queued_flop = 0.0
        for rid in queued:
            core.route_prefill(rid, now)
        if not side.batch:
            core.decode[w].accepting = True

    def _decode_to_prefill(self, w: int, now: float) -> None:
        core = self._core
        side = core.decode[w]
        side.accepting = False
        waiting = list(side.queue)
        side.queue.clear()
        for rid in waiting:
            core.route_decode(rid, w, now)
        if side.b == 0 and core.prefill[w].queue and not core.prefill[w].batch:
            core.start_prefill(w, now)
