"""The control side of the engine: the control tick, telemetry, policy actions and pool moves.

Control tick (DESIGN.md "Control loop"): at every ``k·tick_s`` the engine samples one time-series
row per worker, then calls ``policy.on_tick(view)`` and applies the returned actions in order.

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

from typing import TYPE_CHECKING, Any

import pandas as pd

from pdopt.freeness import stranded_blocks
from pdopt.sim._enums import Event
from pdopt.sim._policy import (
    Migrate,
    MoveWorker,
    PolicyDecisionError,
    PolicyProtocol,
    SetPhase,
    action_worker,
)
from pdopt.sim._result import TIMESERIES_COLUMNS
from pdopt.sim._spec import ClusterSpec, Role

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
        self._last_busy = [0.0] * len(cluster.workers)
        self._false_oom_flagged: set[int] = set()
        self.record_timeseries = False
        self.ts_rows: list[tuple[Any, ...]] = []  # see sample

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
        free = int(self._view.kv_free_blocks[self._view.decode_workers].sum())
        if free >= need:
            self._false_oom_flagged.add(rid)
            self._core.log(now, "false_oom", t.decode_target[rid], rid, f"need={need} free={free}")

    # -- tick ------------------------------------------------------------------------------------
    def on_tick(self, now: float, seq: int, k: int) -> None:
        """The control tick ``k`` (the kernel's ``Event.TICK`` handler)."""
        core = self._core
        self._view.invalidate()
        t = core.table
        for j in self._view.decode_workers:
            side = core.decode[j]
            if side.queue and side.accepting:
                head = side.queue[0]
                need = side.admission_blocks(head, t)
                free = side.cap - side.reserved - side.used_blocks(now)
                if need > free:  # waits for KV, not for a boundary
                    self.check_false_oom(head, now)
        if self.record_timeseries:
            self.sample(now)
        actions = self._policy.on_tick(self._view)
        for action in actions or ():
            self.apply(action, now)
        if core.n_done < core.n_total:
            if not len(core.kernel) and not self._colocated.phase_blocked():
                # NOTE: without this check a stuck request would make ticks run forever.
                raise RuntimeError(
                    f"pdopt.sim internal error: {core.n_total - core.n_done} requests are "
                    f"waiting at t={now} but nothing is scheduled to serve them; please report it"
                )
            core.kernel.schedule((k + 1) * self._tick_s, Event.TICK, k + 1)

    def sample(self, now: float) -> None:
        """Append one time-series row per worker (plain lists: this runs every tick).

        NOTE: the ``kv_stranded_blocks`` slot holds the reference need (blocks, 0 on prefill
        workers) until :meth:`timeseries` applies :func:`pdopt.freeness.stranded_blocks` to the
        whole column at once: a numpy call per tick would cost more than the row itself.
        """
        core = self._core
        append = self.ts_rows.append
        need = self._view.reference_need_blocks()
        tick = self._tick_s
        last = self._last_busy
        names = core.names
        roles = core.roles
        pools = core.pools
        for w, (p, d, spec) in enumerate(zip(core.prefill, core.decode, self._specs, strict=True)):
            role = roles[w]
            used = core.kv_used_blocks(w, now)
            free = d.cap - used if used < d.cap else 0
            busy = p.busy_until(now) + d.busy_until(now)
            frac = min(1.0, max(0.0, (busy - last[w]) / tick))
            last[w] = busy
            append(
                (
                    now,
                    names[w],
                    pools[w],
                    str(role),
                    len(d.queue) if role is Role.DECODE else len(p.queue),
                    p.outstanding_flop(now),
                    len(p.batch) + d.b,
                    used,
                    free,
                    need if role is not Role.PREFILL else 0,  # see the NOTE above
                    frac,
                    spec.idle_power_w + (spec.max_power_w - spec.idle_power_w) * frac,
                )
            )

    def timeseries(self) -> pd.DataFrame:
        """The sampled rows as a frame of :data:`pdopt.sim.TIMESERIES_COLUMNS`."""
        frame = pd.DataFrame.from_records(self.ts_rows, columns=list(TIMESERIES_COLUMNS))
        if len(frame):
            need = frame["kv_stranded_blocks"].to_numpy()
            frame["kv_stranded_blocks"] = stranded_blocks(frame["kv_free_blocks"].to_numpy(), need)
        return frame

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
