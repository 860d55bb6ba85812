"""Tuning speed (issue 7 "Speed"): 200 trials on a one-hour production-mix workload in <= 5
minutes on 2 cores.

``tune_200_trials``: a Phasor study over :data:`pdopt.tune.PHASOR_SPACE` (θ_frag, θ_flow, Δt on a
log scale in [10, 500] ms, T_cool) with the default objective (P99 E2E under a 90% SLO
floor), fluid fidelity, on one hour of the production mix (1024 in / 256 out, 85 requests/s with
bursty arrivals, inter-arrival CV 2: about 306,000 requests, 90% of the prefill pool, so the
Mixed pool moves and the thresholds matter) served by 8 prefill, 16 decode and 4 Mixed-pool
workers; two local worker processes share one study in a SQLite file (WAL). The
wall time covers the whole ``tune`` call: process start-up, every trial, and the results
(trials table, fANOVA importances). The size argument is the number of trials; the target
scales with it (1.5 s a trial).
"""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any


def scenario(duration_s: float = 3600.0) -> Any:
    """The scenario of the benchmark (``duration_s`` of traffic: an hour by default)."""
    from pdopt.cluster import ClusterSpec, Slo
    from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
    from pdopt.scenario import Scenario
    from pdopt.workload import archetype_workload

    cost = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
    cluster = ClusterSpec.build(cost, 8, 16, 4, kv_capacity_blocks=20000, mixed_pool_role="decode")
    workload = archetype_workload("production_mix", 85.0, duration_s=duration_s, seed=1, cv=2.0)
    return Scenario(workload, cluster, "phasor", Slo(2.0, 0.1))


def run_trials(n_trials: int = 200) -> dict[str, Any]:
    from pdopt.tune import tune

    sc = scenario()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = tune(sc, n_trials=n_trials, storage=f"sqlite:///{tmp}/bench.db",
                   study_name="bench", n_workers=2, seed=0)  # fmt: skip
        wall = time.perf_counter() - t0
    trials = res.trials
    done = trials[trials["state"] == "COMPLETE"]
    target = 300.0 * n_trials / 200
    return {
        "benchmark": "tune_200_trials",
        "trials": len(done),
        "surplus_or_failed": int(len(trials) - len(done)),
        "workers": int(trials["worker"].replace("", None).nunique()),
        "requests": len(sc.workload),
        "wall_s": wall,
        "target_wall_s": target,
        "met": wall <= target and len(done) == n_trials,
        "trial_wall_mean_s": float(done["wall_s"].mean()),
        "trial_duration_mean_s": float(done["duration_s"].mean()),
        "best_e2e_p99_s": float(res.best["value_e2e_p99_s"].iloc[0]) if len(res.best) else None,
        "best_params": {k: float(v) for k, v in res.best_params.items()},
    }


# name -> (function of a size, full size)
BENCHMARKS = {"tune_200_trials": (run_trials, 200)}

if __name__ == "__main__":
    import json

    size = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    print(json.dumps(run_trials(size), indent=2))
