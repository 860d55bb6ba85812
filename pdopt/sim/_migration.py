"""KV migration of a running decode request with pipelined pre-copy (DESIGN.md "Migration").

Work in progress: the hooks the engine calls exist; the state machine follows.
"""

from __future__ import annotations


class Migrations:
    """Mixed into :class:`pdopt.sim._control.Control` (and so the engine)."""

    def __init__(self) -> None:
        self.migrations: dict[int, object] = {}

    def on_migration(self, now: float, seq: int, mid: int) -> None:
        """A migration copy stage ended (kernel event)."""

    def migration_boundary(
        self, j: int, now: float, finished: list[int], preempted: list[int]
    ) -> None:
        """After decode worker ``j`` processed a boundary."""
