"""Request-level discrete-event simulation of a P/D disaggregated cluster (DESIGN.md).

``simulate(driver, cluster, policy, slo=...)`` runs one simulation and returns a
:class:`SimResult`; policies implement :class:`Policy` hooks and act through :class:`Migrate`,
:class:`MoveWorker` and :class:`SetPhase`.

The engine itself (:func:`simulate`, :class:`ClusterView`) is imported on first use, so that the
specs and result types load without it (:mod:`pdopt.fluid` shares only those).
"""

import importlib
from typing import TYPE_CHECKING, Any

from pdopt.cluster import (
    CHUNK_BUDGETS,
    KV_ALLOCATIONS,
    LINK_PRESETS,
    PREEMPTED_REQUEUES,
    SLO_TIMINGS,
    ClusterSpec,
    LinkSpec,
    Role,
    Slo,
    WorkerSpec,
)
from pdopt.sim._drivers import ClosedLoop
from pdopt.sim._policy import (
    Action,
    Migrate,
    MoveWorker,
    Policy,
    PolicyDecisionError,
    PolicyProtocol,
    PolicyTraits,
    RequestInfo,
    RunContext,
    SetPhase,
)
from pdopt.sim._result import (
    EVENT_COLUMNS,
    TIMESERIES_COLUMNS,
    SimResult,
    compute_metrics,
    decode_begin_s,
    fragmentation_by_tick,
    latency_by_timing,
    rejections_by_reason,
)
from pdopt.sim._window import context_rejections

if TYPE_CHECKING:
    from pdopt.sim._simulate import load_compiled_engine, simulate
    from pdopt.sim._view import ClusterView

_ENGINE_NAMES = {
    "simulate": "pdopt.sim._simulate",
    "load_compiled_engine": "pdopt.sim._simulate",
    "ClusterView": "pdopt.sim._view",
}

__all__ = [
    "CHUNK_BUDGETS",
    "EVENT_COLUMNS",
    "KV_ALLOCATIONS",
    "LINK_PRESETS",
    "PREEMPTED_REQUEUES",
    "SLO_TIMINGS",
    "TIMESERIES_COLUMNS",
    "Action",
    "ClosedLoop",
    "ClusterSpec",
    "ClusterView",
    "LinkSpec",
    "Migrate",
    "MoveWorker",
    "Policy",
    "PolicyDecisionError",
    "PolicyProtocol",
    "PolicyTraits",
    "RequestInfo",
    "Role",
    "RunContext",
    "SetPhase",
    "SimResult",
    "Slo",
    "WorkerSpec",
    "compute_metrics",
    "context_rejections",
    "decode_begin_s",
    "fragmentation_by_tick",
    "latency_by_timing",
    "load_compiled_engine",
    "rejections_by_reason",
    "simulate",
]


def __getattr__(name: str) -> Any:
    """The engine's public names, imported on first use (PEP 562) and then cached here."""
    module = _ENGINE_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'pdopt.sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ENGINE_NAMES})
