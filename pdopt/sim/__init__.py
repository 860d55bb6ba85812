"""Request-level discrete-event simulation of a P/D disaggregated cluster (DESIGN.md).

``simulate(driver, cluster, policy, slo=...)`` runs one simulation and returns a
:class:`SimResult`; policies implement :class:`Policy` hooks and act through :class:`Migrate`,
:class:`MoveWorker` and :class:`SetPhase`.
"""

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
from pdopt.sim._result import EVENT_COLUMNS, TIMESERIES_COLUMNS, SimResult, compute_metrics
from pdopt.sim._simulate import simulate
from pdopt.sim._spec import LINK_PRESETS, ClusterSpec, LinkSpec, Role, Slo, WorkerSpec
from pdopt.sim._view import ClusterView

__all__ = [
    "EVENT_COLUMNS",
    "LINK_PRESETS",
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
    "simulate",
]
