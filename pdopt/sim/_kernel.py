"""A tiny discrete-event kernel (SimPy-like) that knows nothing of LLMs.

Events are ``(time_s, seq, kind, arg)`` tuples on a binary heap; ``seq`` is a per-kernel counter, so
events at equal times run in the order they were scheduled and every run is deterministic.
Handlers are plain functions ``handler(time_s, seq, arg)`` indexed by ``kind``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

Handler = Callable[[float, int, int], None]


class Kernel:
    """The event heap and the clock of one run (never shared between runs)."""

    __slots__ = ("_heap", "_seq", "now", "stopped")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.now = 0.0
        self.stopped = False

    def schedule(self, time_s: float, kind: int, arg: int) -> int:
        """Schedule ``kind`` with integer ``arg`` at ``time_s``; return its sequence number."""
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._heap, (time_s, seq, kind, arg))
        return seq

    def run(self, handlers: Sequence[Handler]) -> None:
        """Pop and dispatch events in (time, seq) order until the heap empties or ``stopped``."""
        heap = self._heap
        pop = heapq.heappop
        while heap and not self.stopped:
            time_s, seq, kind, arg = pop(heap)
            self.now = time_s
            handlers[kind](time_s, seq, arg)

    def next_time(self) -> float:
        """Time of the next event (the heap is not empty), seconds."""
        return self._heap[0][0]

    def __len__(self) -> int:
        return len(self._heap)
