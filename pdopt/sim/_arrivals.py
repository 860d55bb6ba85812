"""The arrivals of one run: the engine component that sends a driver's requests into the kernel
(open loop: :class:`pdopt.workload.Workload`; closed loop: :class:`pdopt.sim.ClosedLoop`)."""

from __future__ import annotations

from pdopt.sim._enums import Event
from pdopt.sim._kernel import Kernel
from pdopt.sim._requests import RequestTable


class Arrivals:
    """The arrival events of one run (the engine's driver component).

    Open loop (``think`` None): request ``i`` arrives at ``table.arrival_s[i]``; arrivals are
    scheduled one at a time, in id order, each when the previous one is handled (so the heap
    holds one). Closed loop: the clients' first requests ``0..clients-1`` arrive at the times
    already in the table (:meth:`pdopt.sim.ClosedLoop.first_send_s`), all scheduled at the start;
    each later request ``i`` is sent ``think[i - clients]`` seconds after some request ends
    (:meth:`after_end`), its arrival time written to the table then.
    """

    __slots__ = ("_clients", "_kernel", "_n", "_next", "_table", "_think")

    def __init__(
        self,
        kernel: Kernel,
        table: RequestTable,
        n_total: int,
        think: list[float] | None,
        clients: int,
    ) -> None:
        self._kernel = kernel
        self._table = table
        self._n = n_total
        self._think = think
        self._clients = clients
        self._next = 0  # the next request id to send

    def start(self) -> None:
        """Schedule the first arrivals."""
        if self._think is None:
            if self._n:
                self._kernel.schedule(self._table.arrival_s[0], Event.ARRIVAL, 0)
            self._next = 1
            return
        first = min(self._n, self._clients)
        for rid in range(first):
            self._kernel.schedule(self._table.arrival_s[rid], Event.ARRIVAL, rid)
        self._next = first

    def after_arrival(self) -> None:
        """A request arrived: open loop, schedule the next one."""
        if self._think is None and self._next < self._n:
            nxt = self._next
            self._next = nxt + 1
            self._kernel.schedule(self._table.arrival_s[nxt], Event.ARRIVAL, nxt)

    def after_end(self, now: float) -> None:
        """A request ended at ``now``: closed loop, its client sends the next one."""
        think = self._think
        if think is not None and self._next < self._n:
            nxt = self._next
            at = now + think[nxt - self._clients]
            self._next = nxt + 1
            self._table.arrival_s[nxt] = at
            self._kernel.schedule(at, Event.ARRIVAL, nxt)
