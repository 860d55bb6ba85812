"""Checking a sized plan in the request-level simulator (predicted versus simulated latency)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pdopt._validation import check_int_at_least
from pdopt.errors import ConfigError
from pdopt.plan._demand import Demand
from pdopt.plan._predict import PlanPrediction, predict_plan
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._workers import WorkerCapacity
from pdopt.policies import make_policy
from pdopt.sim import ClusterSpec, LinkSpec, Role, Slo, WorkerSpec, simulate
from pdopt.workload import Workload

DEFAULT_PREFILL_BATCH = 1
"""Prefill batch size of the simulated workers: 1, as the queueing model assumes (a larger
batch changes who waits for whom; pass ``prefill_batch_size`` to see its effect)."""


@dataclass(frozen=True, slots=True)
class PlanCheck:
    """Predicted (:func:`~pdopt.plan.predict_plan`) and simulated latency of one plan.

    Simulated values are over the finished requests of one run; ``sim_attainment`` counts
    rejected requests as misses; ``sim_goodput_rps`` is requests meeting both SLOs per second.
    """

    predicted: PlanPrediction
    sim_requests: int
    sim_ttft_mean_s: float
    sim_ttft_p99_s: float
    sim_tpot_mean_s: float
    sim_tpot_p99_s: float
    sim_attainment: float
    sim_goodput_rps: float
    sim_throughput_rps: float
    sim_wall_s: float
    policy: str

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["predicted"] = self.predicted.to_dict()
        return out


def cluster_for_plan(
    plan: PdSizingPlan,
    capacities: Sequence[WorkerCapacity],
    kv_bytes_per_token: float,
    *,
    link: LinkSpec | None = None,
    prefill_batch_size: int = DEFAULT_PREFILL_BATCH,
) -> ClusterSpec:
    """The plan's dedicated prefill and decode workers as a simulator cluster.

    Mixed-pool workers are left out (they are a reserve for the peak, and promoting them needs a
    policy that does so). Each worker keeps its option's cost model, KV capacity (16-token
    blocks) and ``max_running``; ``link`` defaults to NVLink.
    """
    batch = check_int_at_least(prefill_batch_size, 1, "prefill_batch_size", "cluster_for_plan")
    by_key = {(c.option.gpu, c.option.tp): c for c in capacities}
    workers: list[WorkerSpec] = []
    for count in plan.counts:
        if count.role == "mixed":
            continue
        option = by_key[(count.gpu, count.tp)].option
        role = Role.PREFILL if count.role == "prefill" else Role.DECODE
        blocks = max(1, int(option.kv_capacity_tokens // 16))
        for i in range(count.workers):
            name = f"{count.role[0]}-{count.gpu}-tp{count.tp}-{i}"
            spec = WorkerSpec(
                name, role, option.cost, blocks, max_batch_size=batch,
                max_running=option.max_running,
            )  # fmt: skip
            workers.append(spec)
    if not workers:
        raise ConfigError("the plan has no prefill or decode workers to simulate")
    return ClusterSpec(tuple(workers), kv_bytes_per_token, link or LinkSpec.nvlink())


def check_plan(
    plan: PdSizingPlan,
    capacities: Sequence[WorkerCapacity],
    demand: Demand,
    workload: Workload,
    kv_bytes_per_token: float,
    *,
    policy: str = "least_loaded",
    seed: int = 0,
    link: LinkSpec | None = None,
    prefill_batch_size: int = DEFAULT_PREFILL_BATCH,
) -> PlanCheck:
    """Simulate ``workload`` on the plan's cluster and set it beside the analytic prediction.

    ``least_loaded`` routes prefill to the least queued work, which for identical workers is
    the single FCFS queue the prediction assumes.
    """
    predicted = predict_plan(plan, capacities, demand)
    cluster = cluster_for_plan(
        plan, capacities, kv_bytes_per_token, link=link, prefill_batch_size=prefill_batch_size
    )
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)
    start = time.perf_counter()
    result = simulate(
        workload, cluster, make_policy(policy), slo=slo, seed=seed, record_timeseries=False
    )
    wall = time.perf_counter() - start
    m = result.metrics()
    return PlanCheck(
        predicted, len(workload), float(m["ttft_mean_s"]), float(m["ttft_p99_s"]),
        _nan_safe(m["tpot_mean_s"]), _nan_safe(m["tpot_p99_s"]), float(m["slo_attainment"]),
        float(m["goodput_rps"]), float(m["throughput_rps"]), wall, policy,
    )  # fmt: skip


def _nan_safe(value: Any) -> float:
    out = float(value)
    return out if math.isfinite(out) else math.nan
