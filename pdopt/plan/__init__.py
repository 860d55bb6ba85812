"""MILP and analytic planning (cvxpy + HiGHS): P/D sizing over GPU types and TP degrees,
EcoServe macro-instance sizing, batch Φ routing and defragmentation packing.

Each ``build_*`` returns an unsolved :class:`cvxpy.Problem` whose swept values are
``cp.Parameter`` (``problem.param_dict``); each ``solve_*`` returns a frozen plan with
``status``, ``gap``, ``runtime_s`` and the decisions. Infeasible sizings raise
:class:`SizingInfeasibleError` (an :class:`~pdopt.errors.InfeasiblePlanError`) naming the
binding constraint and the closest plan.
"""

from pdopt.plan._demand import Demand, demand_from_workload
from pdopt.plan._pd import (
    SizingInfeasibleError,
    capacities_for,
    closest_ttft_slo_s,
    explain_infeasible,
    solve_pd_sizing,
)
from pdopt.plan._predict import PlanPrediction, predict_plan
from pdopt.plan._sizing import (
    PdSizingPlan,
    WorkerCount,
    build_pd_sizing,
    gpu_types,
    read_plan,
    set_limits,
)
from pdopt.plan._solve import SolveInfo, solve_highs
from pdopt.plan._workers import (
    WorkerCapacity,
    WorkerOption,
    erlang_c_vec,
    max_prefill_rate_per_worker,
    pool_grid,
    prefill_workers_needed,
    ttft_attainment,
    worker_capacity,
    worker_options,
)

__all__ = [
    "Demand",
    "PdSizingPlan",
    "PlanPrediction",
    "SizingInfeasibleError",
    "SolveInfo",
    "WorkerCapacity",
    "WorkerCount",
    "WorkerOption",
    "build_pd_sizing",
    "capacities_for",
    "closest_ttft_slo_s",
    "demand_from_workload",
    "erlang_c_vec",
    "explain_infeasible",
    "gpu_types",
    "max_prefill_rate_per_worker",
    "pool_grid",
    "predict_plan",
    "prefill_workers_needed",
    "read_plan",
    "set_limits",
    "solve_highs",
    "solve_pd_sizing",
    "ttft_attainment",
    "worker_capacity",
    "worker_options",
]
