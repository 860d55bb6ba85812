"""The control side of the engine: drivers' arrivals, the control tick, telemetry, actions, logs.

Control tick (DESIGN.md "Control loop"): at every ``k·tick_s`` the engine samples one time-series
row per worker, then calls ``policy.on_tick(view)`` and applies the returned actions in order.

Elastic pools (:class:`MoveWorker`): the worker's pool and role change at once.

* prefill → decode: its running batch finishes; the requests still queued are routed again
  through ``route_prefill`` (the worker is no longer eligible); it admits decode work once the
  batch has ended.
* decode → prefill: it admits no more decode work; requests in its admission queue are routed
  again through ``route_decode`` and their KV moves from it over the link; its running requests
  finish (drain), and it starts prefill batches once none is left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdopt.sim._enums import Event
from pdopt.sim._migration import Migrations
from pdopt.sim._policy import (
    Migrate,
    MoveWorker,
    PolicyDecisionError,
    SetPhase,
    action_worker,
)
from pdopt.sim._spec import Role
from pdopt.sim._view import ClusterView

if TYPE_CHECKING:
    from collections import deque


class Control(Migrations):
    """Mixed into :class:`pdopt.sim._engine.Engine`."""

    if TYPE_CHECKING:  # attributes and methods the engine provides besides EngineState's
        false_oom_flagged: set[int]
        recent_peaks: deque[int]

        def set_phase(self, action: SetPhase, now: float) -> None: ...
        def mixed_move(self, w: int, old: Role, new: Role, now: float) -> None: ...
        def phase_blocked(self) -> bool: ...

    def __init__(self) -> None:
        Migrations.__init__(self)
        self.view = ClusterView(self)  # type: ignore[arg-type]
        self.event_rows: list[tuple[float, str, str, int, str]] = []
        self.ts_rows: list[tuple[Any, ...]] = []
        self.record_timeseries = False
        self.tick_s = 0.05
        self.last_busy = [0.0] * len(self.names)
        # open loop: arrivals in id order; closed loop: think times and the next id to send
        self.closed_think: list[float] | None = None
        self.clients = 0
        self.next_rid = 0

    # -- drivers ---------------------------------------------------------------------------------
    def start(self, ticks: bool) -> None:
        """Schedule the first arrivals (and the first tick)."""
        if self.closed_think is None:
            if self.n_total:
                self.kernel.schedule(self.table.arrival_s[0], Event.ARRIVAL, 0)
            self.next_rid = 1
        else:
            first = min(self.n_total, self.clients)
            for rid in range(first):
                self.table.arrival_s[rid] = 0.0
                self.kernel.schedule(0.0, Event.ARRIVAL, rid)
            self.next_rid = first
        if ticks:
            self.kernel.schedule(self.tick_s, Event.TICK, 1)

    def schedule_next_arrival(self, rid: int) -> None:
        if self.closed_think is None and self.next_rid < self.n_total:
            nxt = self.next_rid
            self.next_rid = nxt + 1
            self.kernel.schedule(self.table.arrival_s[nxt], Event.ARRIVAL, nxt)

    def request_ended(self, rid: int, now: float) -> None:
        think = self.closed_think
        if think is not None and self.next_rid < self.n_total:
            nxt = self.next_rid
            at = now + think[nxt - self.clients]
            self.next_rid = nxt + 1
            self.table.arrival_s[nxt] = at
            self.kernel.schedule(at, Event.ARRIVAL, nxt)

    # -- logs ------------------------------------------------------------------------------------
    def log(self, now: float, kind: str, worker: int, rid: int, detail: str) -> None:
        name = self.names[worker] if worker >= 0 else ""
        self.event_rows.append((now, kind, name, rid, detail))

    def check_false_oom(self, rid: int, now: float) -> None:
        """Log a false OOM once per request: it waits for KV while the cluster's total free
        decode blocks would hold it (DESIGN.md "Fragmentation")."""
        if rid in self.false_oom_flagged:
            return
        t = self.table
        need = (t.input_tokens[rid] + t.generated[rid] + self.bt - 1) // self.bt
        free = int(self.view.kv_free_blocks[self.view.decode_workers].sum())
        if free >= need:
            self.false_oom_flagged.add(rid)
            self.log(now, "false_oom", t.decode_target[rid], rid, f"need={need} free={free}")

    # -- tick ------------------------------------------------------------------------------------
    def on_tick(self, now: float, seq: int, k: int) -> None:
        self.view.invalidate()
        t = self.table
        for j in self.view.decode_workers:
            side = self.decode[j]
            if side.queue and side.accepting:
                head = side.queue[0]
                need = (t.input_tokens[head] + t.generated[head] + self.bt - 1) // self.bt
                free = side.cap - side.reserved - side.used_blocks(now)
                if need > free:  # waits for KV, not for a boundary
                    self.check_false_oom(head, now)
        if self.record_timeseries:
            self.sample(now)
        actions = self.policy.on_tick(self.view)
        for action in actions or ():
            self.apply(action, now)
        if self.n_done < self.n_total:
            if not len(self.kernel) and not self.phase_blocked():  # phase_blocked: _mixed
                # NOTE: without this check a stuck request would make ticks run forever.
                raise RuntimeError(
                    f"pdopt.sim internal error: {self.n_total - self.n_done} requests are "
                    f"waiting at t={now} but nothing is scheduled to serve them; please report it"
                )
            self.kernel.schedule((k + 1) * self.tick_s, Event.TICK, k + 1)

    def sample(self, now: float) -> None:
        """Append one time-series row per worker (plain lists: this runs every tick)."""
        append = self.ts_rows.append
        t = self.table
        bt = self.bt
        need = self.view.reference_need_blocks()
        tick = self.tick_s
        last = self.last_busy
        for w, (p, d, spec) in enumerate(
            zip(self.prefill, self.decode, self.cluster.workers, strict=True)
        ):
            role = self.roles[w]
            used = d.used_blocks(now) + d.reserved  # blocks held for migrations are not free
            used += sum((t.prefill_tokens[r] + bt - 1) // bt for r in p.batch)
            free = d.cap - used if used < d.cap else 0
            busy = p.busy_until(now) + d.busy_until(now)
            frac = min(1.0, max(0.0, (busy - last[w]) / tick))
            last[w] = busy
            append(
                (
                    now,
                    self.names[w],
                    self.pools[w],
                    str(role),
                    len(d.queue) if role is Role.DECODE else len(p.queue),
                    p.outstanding_flop(now),
                    len(p.batch) + d.b,
                    used,
                    free,
                    free if role is not Role.PREFILL and free < need else 0,
                    frac,
                    spec.idle_power_w + (spec.max_power_w - spec.idle_power_w) * frac,
                )
            )

    # -- actions ---------------------------------------------------------------------------------
    def apply(self, action: object, now: float) -> None:
        if isinstance(action, MoveWorker):
            self.move_worker(action, now)
        elif isinstance(action, Migrate):
            self.start_migration(action, now)
        elif isinstance(action, SetPhase):
            self.set_phase(action, now)
        else:
            raise PolicyDecisionError(
                f"policy {self.policy_name!r}: on_tick returned {action!r}, which is not an "
                "action (Migrate, MoveWorker or SetPhase)"
            )
        self.view.invalidate()

    def move_worker(self, action: MoveWorker, now: float) -> None:
        w = action_worker(action, len(self.roles), self.policy_name)
        try:
            role = Role(action.role)
        except ValueError as exc:
            raise PolicyDecisionError(
                f"policy {self.policy_name!r}: MoveWorker role {action.role!r} is not one of "
                f"{[str(r) for r in Role]}"
            ) from exc
        old = self.roles[w]
        self.roles[w] = role
        self.pools[w] = str(action.pool)
        self.log(now, "pool_move", w, -1, f"{old}->{role} pool={action.pool}")
        self.view.invalidate()
        if old is role:
            return
        if Role.MIXED in (old, role):
            self.mixed_move(w, old, role, now)  # pdopt.sim._mixed
        elif role is Role.DECODE:
            self._prefill_to_decode(w, now)
        else:
            self._decode_to_prefill(w, now)

    def _prefill_to_decode(self, w: int, now: float) -> None:
        side = self.prefill[w]
        queued = list(side.queue)
        side.queue.clear()
        side.queued_flop = 0.0
        for rid in queued:
            self.route_prefill(rid, now)
        if not side.batch:
            self.decode[w].accepting = True

    def _decode_to_prefill(self, w: int, now: float) -> None:
        side = self.decode[w]
        side.accepting = False
        waiting = list(side.queue)
        side.queue.clear()
        for rid in waiting:
            self.route_decode(rid, w, now)
        if side.b == 0 and self.prefill[w].queue and not self.prefill[w].batch:
            self.start_prefill(w, now)
