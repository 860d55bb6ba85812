"""What a deployment runs on: SLOs, links, workers and the cluster, as frozen values.

The simulator (:mod:`pdopt.sim`), the fluid model, the policies, the planner, scenarios and the
tuner all describe clusters with these types; they live here, apart from the engine, so that
describing a cluster never loads the simulator. :mod:`pdopt.sim` re-exports them for
compatibility (``from pdopt.sim import ClusterSpec`` keeps working).
"""

from pdopt.cluster._spec import (
    CHUNK_BUDGETS,
    COLOCATED_SCHEDULES,
    KV_ALLOCATIONS,
    LINK_PRESETS,
    PHASES,
    PREEMPTED_REQUEUES,
    SLO_TIMINGS,
    ClusterSpec,
    LinkSpec,
    Role,
    Slo,
    WorkerSpec,
)

__all__ = [
    "CHUNK_BUDGETS",
    "COLOCATED_SCHEDULES",
    "KV_ALLOCATIONS",
    "LINK_PRESETS",
    "PHASES",
    "PREEMPTED_REQUEUES",
    "SLO_TIMINGS",
    "ClusterSpec",
    "LinkSpec",
    "Role",
    "Slo",
    "WorkerSpec",
]
