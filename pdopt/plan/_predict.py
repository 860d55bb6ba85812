"""Analytic latency of a sized plan (the numbers the simulator check compares with).

The same first-order models as :func:`pdopt.queueing.predict_pd`, generalised to several GPU
types: each option's prefill workers form one pool (one FCFS queue, Allen–Cunneen wait) and get
a share of the arrivals proportional to their capacity; each option's decode workers split their
share evenly and sit at the mean-field batch of :func:`pdopt.queueing.decode_load`. TTFT is the
mixture over pools; TPOT is each decode pool's iteration time (no spread), so its P99 over
requests is the largest pool's. Mixed workers are a reserve for the peak and are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq

from pdopt.plan._demand import Demand
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._workers import FloatArray, WorkerCapacity
from pdopt.queueing import allen_cunneen, decode_load


@dataclass(frozen=True, slots=True)
class PlanPrediction:
    """Predicted latencies of a plan at the demand's mean rate (seconds; attainment in [0, 1])."""

    stable: bool
    ttft_mean_s: float
    ttft_p99_s: float
    tpot_s: float
    ttft_attainment: float
    attainment: float
    prefill_utilization: float
    decode_batch: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Pool:
    share: float
    prob_wait: float
    mean_wait_s: float
    service_s: FloatArray

    def cdf(self, t: float) -> float:
        x = t - self.service_s
        if self.prob_wait <= 0 or self.mean_wait_s <= 0:
            return float(np.mean(x >= 0))
        cond = self.mean_wait_s / self.prob_wait
        inside = 1.0 - self.prob_wait * np.exp(-np.maximum(x, 0.0) / cond)
        return float(np.mean(np.where(x >= 0, inside, 0.0)))


def predict_plan(
    plan: PdSizingPlan, capacities: Sequence[WorkerCapacity], demand: Demand
) -> PlanPrediction:
    """TTFT mean/P99, TPOT and SLO attainment of ``plan``'s P and D pools at the mean rate."""
    by_key = {c.option.key: c for c in capacities}
    lam = demand.rate_per_s
    prefill = [(by_key[w.key], w.workers) for w in plan.counts if w.role == "prefill"]
    decode = [(by_key[w.key], w.workers) for w in plan.counts if w.role == "decode"]
    unstable = PlanPrediction(False, math.inf, math.inf, math.inf, 0.0, 0.0, math.inf, math.inf)
    if not prefill:
        return unstable
    weights = np.array([c.prefill_capacity_rps(n) for c, n in prefill])
    if weights.sum() <= 0:
        weights = np.array([float(n) for _, n in prefill])
    pools, util = [], 0.0
    for (cap, n), share in zip(prefill, weights / weights.sum(), strict=True):
        service = demand.prefill_service_s(cap.option.cost.prefill)
        mean = float(service.mean())
        rho = lam * share * mean / n
        if rho >= 1.0:
            return unstable
        util = max(util, float(rho))
        scv = float(service.var() / mean**2)
        q = allen_cunneen(lam * share, mean, n, arrival_scv=demand.arrival_scv, service_scv=scv)
        pools.append(_Pool(float(share), q.prob_wait, q.mean_wait_s, service))
    tpot, batch = _decode(decode, demand)
    if not math.isfinite(tpot) and demand.mean_decode_iterations > 0:
        return unstable
    mean_ttft = sum(p.share * (p.mean_wait_s + float(p.service_s.mean())) for p in pools)
    att_ttft = _mixture_cdf(pools, demand.ttft_slo_s)
    tpot_met = 1.0 if tpot <= demand.tpot_slo_s else float(np.mean(demand.output_tokens == 1))
    return PlanPrediction(
        True, mean_ttft, _mixture_quantile(pools, 0.99), tpot, att_ttft, att_ttft * tpot_met,
        util, batch,
    )  # fmt: skip


def _decode(pools: list[tuple[WorkerCapacity, int]], demand: Demand) -> tuple[float, float]:
    if demand.mean_decode_iterations <= 0:
        return 0.0, 0.0
    if not pools:
        return math.inf, math.inf
    rates = np.array([c.decode_rate_per_worker * n for c, n in pools])
    if rates.sum() <= 0:
        return math.inf, math.inf
    tpot, batch = 0.0, 0.0
    c_bar = demand.decode_context_tokens
    o_bar = float(np.mean(demand.output_tokens))
    for (cap, n), share in zip(pools, rates / rates.sum(), strict=True):
        model = cap.option.cost.decode
        slope = model.per_request_slope_s(c_bar)
        per_worker = demand.rate_per_s * share / n
        if per_worker * demand.mean_decode_iterations * slope >= 1.0:
            return math.inf, math.inf
        load = decode_load(model, per_worker, o_bar, c_bar)
        tpot, batch = max(tpot, load.iteration_time_s), max(batch, load.mean_batch_size)
    return tpot, batch


def _mixture_cdf(pools: list[_Pool], t: float) -> float:
    return sum(p.share * p.cdf(t) for p in pools)


def _mixture_quantile(pools: list[_Pool], q: float) -> float:
    lo = min(float(p.service_s.min()) for p in pools)
    if _mixture_cdf(pools, lo) >= q:
        return lo
    hi = max(float(p.service_s.max()) for p in pools) + 1e-9
    tail = max((p.mean_wait_s / p.prob_wait if p.prob_wait > 0 else 0.0) for p in pools)
    hi += tail * math.log(1.0 / (1.0 - q)) * 2.0 + 1e-9
    while _mixture_cdf(pools, hi) < q:
        hi *= 2.0
    return float(brentq(lambda t: _mixture_cdf(pools, t) - q, lo, hi, xtol=1e-9, rtol=1e-9))
