"""The simulator's codes, in one place: kernel event kinds, mixed-worker step states, request
statuses and migration phases.

All are ``IntEnum``: the Python engine stores them in lists and schedules them on the kernel
heap, the compiled engine (:mod:`pdopt.sim._compiled`) uses the same values as integer constants,
so one definition serves both.
"""

from __future__ import annotations

from enum import IntEnum


class Event(IntEnum):
    """Kinds of kernel events (the index of their handler)."""

    ARRIVAL = 0
    PREFILL_DONE = 1
    TRANSFER_DONE = 2
    DECODE = 3  # a decode iteration boundary
    TICK = 4  # the control tick
    MIGRATION = 5  # a migration copy ended
    ABORT = 6  # a client's timeout, whatever the request's state


class Step(IntEnum):
    """What a mixed (colocated) worker is doing (:mod:`pdopt.sim._mixed`)."""

    NONE = 0  # not a mixed worker, no mixed step pending
    IDLE = 1
    PREFILL = 2  # a prefill batch or chunk-only iteration
    HYBRID = 3  # one decode iteration carrying prefill chunks
    DECODE = 4  # a decode segment
    BUSY = 5  # a step end being processed (arrivals wait for it)


class Status(IntEnum):
    """A request's status in the request table."""

    PENDING = 0
    FINISHED = 1
    REJECTED = 2
    ABORTED = 3  # its client gave up (client_timeout_s) before its last token


STATUS_NAMES = ("pending", "finished", "rejected", "aborted")
"""``Status`` values as they appear in ``SimResult.requests['status']``."""


class MigrationPhase(IntEnum):
    """Where a migration is (:mod:`pdopt.sim._migration`; ``ClusterView.migrations()``)."""

    PRECOPY = 0
    DEPARTING = 1  # waiting to leave its source at an iteration boundary
    STOPCOPY = 2
    JOINING = 3  # waiting to join its destination's running batch
