"""The KV links of one run: one FIFO wire per ordered pair of workers (DESIGN.md "Migration").

Every KV copy (a prefill → decode transfer, or a migration copy, :mod:`pdopt.sim._migration`)
queues on the link ``src → dst`` of :meth:`pdopt.sim.ClusterSpec.link_between`::

    start = max(now, free_at)          # the previous copy has put its last byte on the wire
    wire  = n_bytes / bw_bytes_per_s
    end   = start + latency_s + wire   # latency overlaps the next copy's wire time
    free_at ← start + wire

:class:`Links` owns the ``free_at`` of every link and is the only place this formula is written.
"""

from __future__ import annotations

from pdopt.cluster._spec import ClusterSpec


class Links:
    """Bandwidth, latency and wire-free time of every link ``src → dst`` (worker indices)."""

    __slots__ = ("_links",)

    def __init__(self, cluster: ClusterSpec) -> None:
        # _links[src][dst] = [bandwidth (bytes/s), latency (s), time the wire is free (s)]
        self._links = [
            [
                [spec.bw_bytes_per_s, spec.latency_s, 0.0]
                for spec in (cluster.link_between(a.name, b.name) for b in cluster.workers)
            ]
            for a in cluster.workers
        ]

    def send(self, src: int, dst: int, n_bytes: float, now: float) -> tuple[float, float]:
        """Queue ``n_bytes`` on the link ``src → dst`` at ``now``; return the copy's
        ``(start, end)`` times in seconds (see the module docstring)."""
        link = self._links[src][dst]
        start = now if now > link[2] else link[2]
        wire = n_bytes / link[0]
        link[2] = start + wire
        return start, start + link[1] + wire
