"""Virtual Freeness Φ (Phasor): temporal Φ_T of prefill workers, spatial Φ_S of decode workers,
fragmentation, defragmentation planning, and the macro flow-control rule over the Mixed pool
(DESIGN.md)."""

from pdopt.freeness._defrag import DefragMove, plan_defrag
from pdopt.freeness._flow import NO_MOVE, FlowDecision, flow_control, starved_pool
from pdopt.freeness._phi import (
    fragmentation_pct,
    fragmentation_pct_of_totals,
    queued_work_flop,
    spatial_freeness,
    stranded_blocks,
    temporal_freeness,
    temporal_freeness_of_queues,
)

__all__ = [
    "NO_MOVE",
    "DefragMove",
    "FlowDecision",
    "flow_control",
    "fragmentation_pct",
    "fragmentation_pct_of_totals",
    "plan_defrag",
    "queued_work_flop",
    "spatial_freeness",
    "starved_pool",
    "stranded_blocks",
    "temporal_freeness",
    "temporal_freeness_of_queues",
]
