"""What a deployment runs on: SLOs, links, workers and the cluster, as frozen values.

The simulator (:mod:`pdopt.sim`), the fluid model, the policies, the planner, scenarios and the
tuner all describe clusters with these types; they live here, apart from the engine, so that
describing a cluster never loads the simulator. :mod:`pdopt.sim` re-exports them for
compatibility (``from pdopt.sim import ClusterSpec`` keeps working).

One builder: :func:`build_cluster` (with :func:`worker_spec` for each worker) makes every
cluster: :meth:`ClusterSpec.build`, :meth:`ClusterSpec.from_hardware` and so scenarios'
``[cluster]`` tables, explicit scenario tables, and the planner's checks. One owner each for
the block size and running-request defaults: :data:`DEFAULT_BLOCK_TOKENS` (16 tokens) and
:data:`DEFAULT_MAX_RUNNING` (256), defined in :mod:`pdopt.model_spec` (the lowest layer that
counts blocks) and read from here by everything above it.
"""

from pdopt.cluster._spec import (
    CHUNK_BUDGETS,
    COLOCATED_SCHEDULES,
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_MAX_RUNNING,
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
    build_cluster,
    gpu_link,
    worker_spec,
)

__all__ = [
    "CHUNK_BUDGETS",
    "COLOCATED_SCHEDULES",
    "DEFAULT_BLOCK_TOKENS",
    "DEFAULT_MAX_RUNNING",
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
    "build_cluster",
    "gpu_link",
    "worker_spec",
]
