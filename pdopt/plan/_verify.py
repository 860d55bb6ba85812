"""Checking a sized plan in the request-level simulator (predicted versus simulated latency).

The simulated run is a :class:`pdopt.scenario.Scenario` (:func:`scenario_for_plan`), so the run
the planner judges is exactly the one ``Scenario.to_toml`` exports and ``pdopt simulate`` replays.
A plan *meets* its SLOs when, over all requests of the run (a rejected request counts as an
infinite TTFT and TPOT), the ``q``-quantile of TTFT is within the TTFT SLO and the ``q``-quantile
of TPOT within the TPOT SLO, ``q`` the demand's ``ttft_quantile`` (issue 17, "verified plans").
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pdopt._validation import check_int_at_least
from pdopt.cluster import ClusterSpec, LinkSpec, Role, Slo, WorkerSpec, build_cluster, worker_spec
from pdopt.errors import ConfigError, ParameterError
from pdopt.hardware import GpuSpec, get_gpu
from pdopt.plan._demand import Demand
from pdopt.plan._predict import PlanPrediction, predict_plan
from pdopt.plan._sizing import PdSizingPlan, WorkerCount
from pdopt.plan._workers import WorkerCapacity
from pdopt.scenario import Scenario
from pdopt.sim import SimResult, rejections_by_reason
from pdopt.workload import Workload

DEFAULT_PREFILL_BATCH = 1
"""Prefill batch size of the simulated workers: 1, as the queueing model assumes (a larger
batch changes who waits for whom; pass ``prefill_batch_size`` to see its effect)."""

DEFAULT_POLICY = "least_loaded"
"""Routing of the check: least queued prefill work is, for identical workers, the single FCFS
queue the prediction assumes."""

CACHED_POLICY = "cache_aware"
"""Routing of the check of a plan sized on prefix-cache hits (``Demand.cached_tokens``): the
KV-aware rule (:mod:`pdopt.policies._cache_routing`), with every worker's prefix cache on."""


@dataclass(frozen=True, slots=True)
class PlanCheck:
    """Predicted (:func:`~pdopt.plan.predict_plan`) and simulated latency of one plan.

    Simulated means and P99s are over the finished requests of one run; ``sim_ttft_q_s`` and
    ``sim_tpot_q_s`` are the ``quantile``-quantiles over all requests with a rejected one
    counted as infinitely late (the numbers the verdict uses); ``sim_attainment`` counts
    rejected requests as misses; ``sim_goodput_over_makespan_rps`` is the requests meeting both
    SLOs over the run's makespan, draining included (``pdopt simulate``'s ``goodput_rps``; less
    than SLO attainment × offered rate, since the last requests drain after the arrivals end).
    ``rejected_by_reason`` counts the run's rejections by their reason; ``rate_per_s`` is the
    offered rate of the run (the mean rate, or the peak for a peak check);
    ``sim_prefix_hit_fraction`` is the share of prompt tokens the run's prefix caches served (0
    without caching). ``sim_ttft_q_upper_s`` and ``sim_tpot_q_upper_s`` are 95% upper confidence
    bounds of the two quantiles (:func:`quantile_upper_bound`).
    ``sim_energy_per_output_token_j`` is the run's energy per output token (the workers' GPUs'
    data-sheet power, :func:`cluster_for_plan`; :func:`pdopt.sim.compute_metrics`).
    """

    predicted: PlanPrediction
    sim_requests: int
    sim_ttft_mean_s: float
    sim_ttft_p99_s: float
    sim_tpot_mean_s: float
    sim_tpot_p99_s: float
    sim_attainment: float
    sim_goodput_over_makespan_rps: float
    sim_throughput_rps: float
    sim_wall_s: float
    policy: str
    quantile: float = 0.99
    sim_ttft_q_s: float = math.nan
    sim_tpot_q_s: float = math.nan
    rate_per_s: float = math.nan
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    sim_ttft_q_upper_s: float = math.nan
    sim_tpot_q_upper_s: float = math.nan
    sim_prefix_hit_fraction: float = 0.0
    sim_energy_per_output_token_j: float = math.nan

    def meets_confidently(self, slo: Slo) -> bool:
        """Both quantiles' 95% upper bounds (:func:`quantile_upper_bound`: the sampling of
        requests in one run) within their SLOs."""
        tpot = self.sim_tpot_q_upper_s
        return self.sim_ttft_q_upper_s <= slo.ttft_s and (math.isnan(tpot) or tpot <= slo.tpot_s)

    def meets(self, slo: Slo) -> bool:
        """Both quantiles within their SLOs (NaN TPOT: no request decodes, met)."""
        tpot_ok = math.isnan(self.sim_tpot_q_s) or self.sim_tpot_q_s <= slo.tpot_s
        return self.sim_ttft_q_s <= slo.ttft_s and tpot_ok

    def slo_excess(self, slo: Slo) -> float:
        """The larger ratio of a simulated quantile to its SLO (above 1: missed; a NaN TPOT,
        nothing decodes, left out): how a draw is ranked against others of the same plan."""
        ratios = [
            value / limit
            for value, limit in ((self.sim_ttft_q_s, slo.ttft_s), (self.sim_tpot_q_s, slo.tpot_s))
            if not math.isnan(value)
        ]
        return max(ratios, default=0.0)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["predicted"] = self.predicted.to_dict()
        return out


def _worker_roles(
    plan: PdSizingPlan, capacities: Sequence[WorkerCapacity], peak: bool
) -> list[tuple[WorkerCount, Role]]:
    """One ``(count, role)`` per simulated worker; Mixed workers only at the peak, promoted."""
    out = [
        (c, Role.PREFILL if c.role == "prefill" else Role.DECODE)
        for c in plan.counts
        for _ in range(c.workers)
        if c.role != "mixed"
    ]
    if peak:
        out += promote_mixed(plan, capacities)
    return out


def promote_mixed(
    plan: PdSizingPlan, capacities: Sequence[WorkerCapacity]
) -> list[tuple[WorkerCount, Role]]:
    """The roles Mixed-pool workers take at the forecast peak: each, in turn, joins the stage
    whose capacity falls furthest short of the peak rate (relative), by the capacities the plan
    was sized with (a static promotion: the state the Mixed pool reaches after it moves)."""
    by_key = {c.option.key: c for c in capacities}
    short = {
        Role.PREFILL: plan.peak_rate_per_s - plan.prefill_capacity_rps,
        Role.DECODE: plan.peak_rate_per_s - plan.decode_capacity_rps,
    }
    out: list[tuple[WorkerCount, Role]] = []
    for count in (c for c in plan.counts if c.role == "mixed"):
        cap = by_key[count.key]
        for _ in range(count.workers):
            role = max(short, key=lambda r: short[r])
            gain = (
                cap.prefill_rate_per_worker[0]
                if role is Role.PREFILL
                else (cap.decode_rate_per_worker)
            )
            short[role] -= gain
            out.append((count, role))
    return out


def cluster_for_plan(
    plan: PdSizingPlan,
    capacities: Sequence[WorkerCapacity],
    kv_bytes_per_token: float,
    *,
    link: LinkSpec | None = None,
    prefill_batch_size: int = DEFAULT_PREFILL_BATCH,
    peak: bool = False,
) -> ClusterSpec:
    """The plan's prefill and decode workers as a simulator cluster.

    Mixed-pool workers are left out at the mean rate (they are a reserve for the peak); with
    ``peak=True`` they join prefill or decode as :func:`promote_mixed` says. Each worker keeps
    its option's cost model, KV capacity (blocks of :data:`pdopt.cluster.DEFAULT_BLOCK_TOKENS`),
    ``max_running`` and its GPUs' data-sheet power (so the check reports energy); ``link``
    defaults to NVLink; the options' model (:attr:`WorkerOption.model`) gives the cluster's
    :attr:`pdopt.sim.ClusterSpec.sliding_window` and its context window (requests beyond it are
    rejected by the simulation, each a miss).
    """
    batch = check_int_at_least(prefill_batch_size, 1, "prefill_batch_size", "cluster_for_plan")
    by_key = {c.option.key: c for c in capacities}
    workers: list[WorkerSpec] = []
    for i, (count, role) in enumerate(_worker_roles(plan, capacities, peak)):
        option = by_key[count.key].option
        name = f"{role.value[0]}-{count.option_name.replace('/', '-')}-{i}"
        spec = worker_spec(
            name, role, option.cost, kv_tokens=option.kv_capacity_tokens,
            gpu=option_gpu(option.gpu), tp=option.tp, max_batch_size=batch,
            max_running=option.max_running,
        )  # fmt: skip
        workers.append(spec)
    if not any(w.role is Role.PREFILL for w in workers) or not any(
        w.role is Role.DECODE for w in workers
    ):
        raise ConfigError("the plan has no prefill or no decode workers to simulate")
    # every option serves the same model: its sliding-window layers shape the transfers
    model = next((c.option.model for c in capacities if c.option.model is not None), None)
    return build_cluster(workers, kv_bytes_per_token, link=link or LinkSpec.nvlink(), model=model)


def option_gpu(name: str) -> GpuSpec | None:
    """The catalogued GPU an option names (its power goes into the simulated workers), or None
    for a name the catalogue does not know (no power: energy unreported)."""
    try:
        return get_gpu(name)
    except (ConfigError, ParameterError):
        return None


def scenario_for_plan(
    plan: PdSizingPlan,
    capacities: Sequence[WorkerCapacity],
    demand: Demand,
    workload: Workload,
    kv_bytes_per_token: float,
    *,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
    link: LinkSpec | None = None,
    prefill_batch_size: int = DEFAULT_PREFILL_BATCH,
    peak: bool = False,
) -> Scenario:
    """The simulation that checks ``plan``: its cluster serving ``workload`` under the demand's
    SLOs (no time series). With ``peak=True`` the workload runs at the demand's peak rate
    (arrivals compressed by ``peak / rate``) and the Mixed pool is promoted."""
    cluster = cluster_for_plan(
        plan, capacities, kv_bytes_per_token, link=link, prefill_batch_size=prefill_batch_size,
        peak=peak,
    )  # fmt: skip
    if peak and demand.has_peak:
        workload = workload.scale_rate(demand.peak_rate_per_s / demand.rate_per_s)
    if demand.cached_tokens is not None:
        # a plan sized on cache hits is checked with the cache on, routed as the estimate
        # assumes (prefix_hits: one cache per prefix, which cache-aware routing approaches)
        cluster = cluster.with_engine_args(enable_prefix_caching=True)
        policy = CACHED_POLICY if policy == DEFAULT_POLICY else policy
    slo = Slo(demand.ttft_slo_s, demand.tpot_slo_s)
    return Scenario(workload, cluster, policy, slo, seed=seed, record_timeseries=False)


def check_scenario(
    scenario: Scenario, predicted: PlanPrediction, quantile: float, rate_per_s: float
) -> PlanCheck:
    """Run ``scenario`` and summarise it beside ``predicted`` (see :class:`PlanCheck`)."""
    start = time.perf_counter()
    result = scenario.run()
    wall = time.perf_counter() - start
    return summarise_run(result, predicted, quantile, rate_per_s, wall, scenario.policy_name)


def summarise_run(
    result: SimResult,
    predicted: PlanPrediction,
    quantile: float,
    rate_per_s: float,
    wall_s: float,
    policy: str,
) -> PlanCheck:
    """A :class:`PlanCheck` of a finished run."""
    m = result.metrics()
    req = result.requests
    ttft_q, tpot_q = slo_quantiles(result, quantile)
    ttft_hi, tpot_hi = slo_quantiles(result, quantile, upper=True)
    return PlanCheck(
        predicted, len(req), float(m["ttft_mean_s"]), float(m["ttft_p99_s"]),
        _nan_safe(m["tpot_mean_s"]), _nan_safe(m["tpot_p99_s"]), float(m["slo_attainment"]),
        float(m["goodput_rps"]), float(m["throughput_rps"]), wall_s, policy, quantile,
        ttft_q, tpot_q, rate_per_s,
        rejections_by_reason(req), ttft_hi, tpot_hi,
        float(m.get("prefix_hit_rate_tokens", 0.0)),
        _nan_safe(m.get("energy_per_output_token_j", math.nan)),
    )  # fmt: skip


def slo_quantiles(
    result: SimResult, quantile: float, *, upper: bool = False
) -> tuple[float, float]:
    """The verdict's ``quantile`` of TTFT and of TPOT over all requests of a run, a rejected
    request counting as infinitely late (TPOT: NaN when no request decodes); what a plan's check
    and ``pdopt simulate --check`` compare with the SLOs. ``upper``: their 95% upper
    confidence bounds instead (:func:`quantile_upper_bound`)."""
    req = result.requests
    done = (req["status"] == "finished").to_numpy()
    ttft = np.where(done, req["ttft_s"].to_numpy(dtype=np.float64), math.inf)
    tpot = np.where(done, req["tpot_s"].to_numpy(dtype=np.float64), math.inf)
    tpot = tpot[~np.isnan(tpot)]
    if upper:
        return quantile_upper_bound(ttft, quantile), quantile_upper_bound(tpot, quantile)
    return _quantile(ttft, quantile), _quantile(tpot, quantile)


UPPER_BOUND_Z = 1.6449
"""One-sided 95% normal quantile of :func:`quantile_upper_bound`."""


def quantile_upper_bound(values: np.ndarray, q: float) -> float:
    """A one-sided 95% upper confidence bound of the ``q``-quantile of the distribution
    ``values`` were drawn from, distribution-free: the order statistic of rank
    ``ceil(n q + z sqrt(n q (1 − q)))`` (the binomial count of values below the true quantile,
    normal approximation; z = 1.645). It covers the sampling of requests in one run, not the
    cost model's own error (``pdopt plan --slo-margin`` holds room for that). Infinite when the
    rank passes ``n`` (too few requests for this quantile) or lands on a rejected request."""
    n = len(values)
    if n == 0:
        return math.nan
    rank = math.ceil(n * q + UPPER_BOUND_Z * math.sqrt(n * q * (1.0 - q)))
    if rank > n:
        return math.inf
    return float(np.partition(values, rank - 1)[rank - 1])


def _quantile(values: np.ndarray, q: float) -> float:
    # "inverted_cdf": the smallest value with at least q of the requests at or below it, so a
    # rejected (infinite) request can never be interpolated into a finite number.
    return float(np.quantile(values, q, method="inverted_cdf")) if len(values) else math.nan


def check_plan(
    plan: PdSizingPlan,
    capacities: Sequence[WorkerCapacity],
    demand: Demand,
    workload: Workload,
    kv_bytes_per_token: float,
    *,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
    link: LinkSpec | None = None,
    prefill_batch_size: int = DEFAULT_PREFILL_BATCH,
    peak: bool = False,
) -> PlanCheck:
    """Simulate ``workload`` on the plan's cluster (:func:`scenario_for_plan`) and set it beside
    the analytic prediction at the mean rate."""
    predicted = predict_plan(plan, capacities, demand)
    scenario = scenario_for_plan(
        plan, capacities, demand, workload, kv_bytes_per_token, policy=policy, seed=seed,
        link=link, prefill_batch_size=prefill_batch_size, peak=peak,
    )  # fmt: skip
    rate = demand.peak_rate_per_s if peak else demand.rate_per_s
    return check_scenario(scenario, predicted, demand.ttft_quantile, rate)


def _nan_safe(value: Any) -> float:
    out = float(value)
    return out if math.isfinite(out) else math.nan
