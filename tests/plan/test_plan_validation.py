"""Analytic plan prediction versus the request-level simulator at rho <= 0.8 (issue 6).

Set-up: A100-80GB serving Llama-3-8B (roofline prior fitted like a profile), prefill batch 1 as
the model assumes, least_loaded routing (= one FCFS prefill queue for identical workers), decode
workers at ~70% of their TPOT-bound rate, 10k requests, seed 1. Target: mean TTFT within 10%,
P99 within 25%.

Measured (prediction / simulation − 1), Poisson arrivals:

============== ===== ====== ========= =========
workload       n_p   rho    mean TTFT P99 TTFT
============== ===== ====== ========= =========
production_mix 1     0.5    -0.1%     +17.8%
production_mix 3     0.8    +0.8%     +7.1%
longbench      1     0.8    +0.9%     -11.9%
longbench      3     0.5    -0.8%     -0.5%
============== ===== ====== ========= =========

(With 20k requests: -0.0/+17.8, +0.4/+7.9, +1.1/+2.2, -0.6/+0.2%.) The simulator runs at a
few thousand requests per wall second on the shared test machine, so two cases are ``slow``.

Outside the target (reported, asserted only as the measured band; 20k requests):

* ShareGPT-like lengths (lognormal, prefill-time SCV ~3): 3 workers at rho 0.8: mean +60%,
  P99 +43% (Allen–Cunneen's ``(c_a² + c_s²)/2`` factor overstates multi-server waits when short
  jobs overtake long ones); 1 worker at rho 0.8: mean +23%, P99 −47% (the exponential tail is
  lighter than the true one under heavy-tailed service).
* Bursty gamma arrivals, CV 2: production_mix 3 workers at rho 0.5: mean −23% (Kingman's
  heavy-traffic factor understates waits of clustered arrivals at moderate load), P99 +2%.

TPOT (mean-field τ at the mean batch) is within 10% of the simulated mean TPOT in all of these
(within 2% with 20k requests); the simulated P99 TPOT is 5–80% above it (batch fluctuation, long
LongBench prompts).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from pdopt.model_spec import get_model, kv_bytes_per_token
from pdopt.plan import (
    PdSizingPlan,
    WorkerCount,
    capacities_for,
    check_plan,
    demand_from_workload,
    worker_options,
)
from pdopt.workload import archetype_workload

N_REQUESTS = 10_000


def run(
    archetype: str, n_prefill: int, rho: float, cv: float = 1.0, n: int = N_REQUESTS
) -> tuple[float, ...]:
    """(predicted, simulated) mean TTFT, P99 TTFT, TPOT and mean TPOT of a fixed plan."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # no context window: the measured bands are of the queueing model on every request
        # (the plan's cluster would reject those past 8,192 tokens: issue 37)
        unbounded = dataclasses.replace(get_model("Llama-3-8B"), max_context_tokens=None)
        options = worker_options(["A100-80GB"], unbounded, tps=[1])
    prefill = options[0].cost.prefill
    lengths = archetype_workload(archetype, 1.0, n_requests=n, seed=1, cv=cv)
    rate = rho * n_prefill / float(prefill.request_time_s(lengths.input_tokens).mean())
    workload = archetype_workload(archetype, rate, n_requests=n, seed=1, cv=cv)
    demand = demand_from_workload(
        workload, ttft_slo_s=1.0, tpot_slo_s=0.1, rate_per_s=rate, arrival_cv=cv,
        max_samples=n,
    )  # fmt: skip
    caps = capacities_for(options, demand)
    n_decode = int(np.ceil(rate / caps[0].decode_rate_per_worker / 0.7))
    counts = (
        WorkerCount("A100-80GB", 1, "prefill", n_prefill),
        WorkerCount("A100-80GB", 1, "decode", n_decode),
    )
    plan = PdSizingPlan("optimal", 0.0, 0.0, "min_cost", rate, rate, rate, counts,
                        n_prefill + n_decode, 1.0, 0.0, 0.0)  # fmt: skip
    check = check_plan(plan, caps, demand, workload, kv_bytes_per_token(get_model("Llama-3-8B")))
    p = check.predicted
    return (p.ttft_mean_s, check.sim_ttft_mean_s, p.ttft_p99_s, check.sim_ttft_p99_s,
            p.tpot_s, check.sim_tpot_mean_s)  # fmt: skip


@pytest.mark.parametrize(
    ("archetype", "n_prefill", "rho"),
    [pytest.param("production_mix", 1, 0.5, marks=pytest.mark.slow),
     ("production_mix", 3, 0.8), ("longbench", 1, 0.8),
     pytest.param("longbench", 3, 0.5, marks=pytest.mark.slow)],
)  # fmt: skip
def test_predicted_ttft_within_target_of_simulation(
    archetype: str, n_prefill: int, rho: float
) -> None:
    mean_p, mean_s, p99_p, p99_s, tpot_p, tpot_s = run(archetype, n_prefill, rho)
    assert mean_p == pytest.approx(mean_s, rel=0.10)
    assert p99_p == pytest.approx(p99_s, rel=0.25)
    assert tpot_p == pytest.approx(tpot_s, rel=0.15)


@pytest.mark.slow
def test_outside_the_target_the_measured_deviation_holds() -> None:
    """Heavy-tailed prompts and bursty arrivals: the deviations in the module docstring."""
    mean_p, mean_s, p99_p, p99_s, _, _ = run("sharegpt", 3, 0.8, n=20_000)
    assert 1.3 < mean_p / mean_s < 1.9 and 1.2 < p99_p / p99_s < 1.7  # pessimistic
    mean_p, mean_s, p99_p, p99_s, _, _ = run("sharegpt", 1, 0.8, n=20_000)
    assert 0.4 < p99_p / p99_s < 0.7  # optimistic tail
    mean_p, mean_s, _, _, _, _ = run("production_mix", 3, 0.5, cv=2.0, n=20_000)
    assert 0.65 < mean_p / mean_s < 0.9  # optimistic mean under bursts
