"""MILP and analytic planning (cvxpy + HiGHS): P/D sizing over GPU types and TP degrees,
EcoServe macro-instance sizing, batch Φ routing and defragmentation packing.

Each ``build_*`` returns an unsolved :class:`cvxpy.Problem` whose swept values are
``cp.Parameter`` (``problem.param_dict``); each ``solve_*`` returns a frozen plan with
``status``, ``gap``, ``runtime_s`` and the decisions. Infeasible sizings raise
:class:`SizingInfeasibleError` (an :class:`~pdopt.errors.InfeasiblePlanError`) naming the
binding constraint and the closest plan.
"""

from pdopt.plan._defrag import DefragPlan, Migration, build_defrag_packing, solve_defrag_packing
from pdopt.plan._demand import Demand, demand_from_workload, sampled_quantile_error
from pdopt.plan._deployment import DeploymentPlan, plan_deployment
from pdopt.plan._macro import (
    InstanceModel,
    MacroPlan,
    build_macro_sizing,
    instance_model,
    solve_macro_sizing,
)
from pdopt.plan._pd import (
    SizingInfeasibleError,
    capacities_for,
    closest_ttft_slo_s,
    explain_infeasible,
    solve_pd_sizing,
)
from pdopt.plan._predict import PlanPrediction, predict_plan
from pdopt.plan._profiles import ProfileCosts, gemm_calibrations, profile_costs
from pdopt.plan._routing import (
    BatchRoutingPlan,
    build_batch_routing,
    greedy_phi_routing,
    phi_after,
    routing_work_flop,
    solve_batch_routing,
)
from pdopt.plan._sizing import (
    PdSizingPlan,
    WorkerCount,
    build_pd_sizing,
    gpu_types,
    read_plan,
    set_limits,
)
from pdopt.plan._solve import SolveInfo, solve_highs
from pdopt.plan._verified import Iteration, VerifiedPlan, derate, solve_verified
from pdopt.plan._verify import (
    PlanCheck,
    check_plan,
    cluster_for_plan,
    promote_mixed,
    scenario_for_plan,
)
from pdopt.plan._workers import (
    DEFAULT_TPS,
    WorkerCapacity,
    WorkerOption,
    max_prefill_rate_per_worker,
    pool_grid,
    prefill_workers_needed,
    ttft_attainment,
    worker_capacity,
    worker_options,
)

__all__ = [
    "DEFAULT_TPS",
    "BatchRoutingPlan",
    "DefragPlan",
    "Demand",
    "DeploymentPlan",
    "InstanceModel",
    "Iteration",
    "MacroPlan",
    "Migration",
    "PdSizingPlan",
    "PlanCheck",
    "PlanPrediction",
    "ProfileCosts",
    "SizingInfeasibleError",
    "SolveInfo",
    "VerifiedPlan",
    "WorkerCapacity",
    "WorkerCount",
    "WorkerOption",
    "build_batch_routing",
    "build_defrag_packing",
    "build_macro_sizing",
    "build_pd_sizing",
    "capacities_for",
    "check_plan",
    "closest_ttft_slo_s",
    "cluster_for_plan",
    "demand_from_workload",
    "derate",
    "explain_infeasible",
    "gemm_calibrations",
    "gpu_types",
    "greedy_phi_routing",
    "instance_model",
    "max_prefill_rate_per_worker",
    "phi_after",
    "plan_deployment",
    "pool_grid",
    "predict_plan",
    "prefill_workers_needed",
    "profile_costs",
    "promote_mixed",
    "read_plan",
    "routing_work_flop",
    "sampled_quantile_error",
    "scenario_for_plan",
    "set_limits",
    "solve_batch_routing",
    "solve_defrag_packing",
    "solve_highs",
    "solve_macro_sizing",
    "solve_pd_sizing",
    "solve_verified",
    "ttft_attainment",
    "worker_capacity",
    "worker_options",
]
