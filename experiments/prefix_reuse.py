"""Mooncake-style KV reuse: GPUs planned and goodput with and without prefix caching (issue 35).

Multi-turn chat sessions reuse their history: turn ``k``'s prompt is a shared system prompt, every
earlier question and answer, then the new question (:func:`pdopt.workload.session_workload`), so
most prompt tokens were computed before, on the worker that served the session's last turn.

Setup (our assumptions): Llama-3.1-8B on H100-SXM TP 1 (roofline prior); sessions arriving Poisson
at 25/s with 4 turns each, 10 s mean think time, a 512-token system
prompt, 256-token questions and answers; SLO TTFT 1 s (P99) / TPOT 50 ms. For each of caching off
and on:

* **plan**: at 60 req/s (the sessions' arrivals time-scaled), :func:`pdopt.plan.solve_verified`
  (the MILP, then simulation and correction until the plan meets, then its smaller neighbours;
  with caching it simulates with the cache on and ``cache_aware`` routing) on
  :func:`pdopt.plan.demand_from_workload`, which
  with caching sizes prefill on the tokens that miss an LRU cache of one prefill worker's KV
  (:func:`pdopt.plan._demand.prefix_hits`);
* **check**: that deployment simulated with the cache on (or off), routing ``cache_aware``
  (``kv_aware``), at the workload's rate: SLO attainment, P99 TTFT and the simulated hit rate;
* **goodput**: on a fixed 2 prefill + 2 decode cluster, the largest rate at 90% attainment
  (:func:`pdopt.capacity.max_rate_under_slo`) with ``least_loaded`` and ``cache_aware`` routing.

Writes ``prefix_reuse.csv`` and its summary rows. The two settings run as independent tasks
(``--dask [ADDRESS]``: on a Dask cluster, same CSV).

    python experiments/prefix_reuse.py --out results/ [--quick] [--dask]
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import _common as c
import numpy as np
import pandas as pd

from pdopt.capacity import max_rate_under_slo
from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import roofline_cost_model
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model, kv_bytes_per_token
from pdopt.plan import demand_from_workload, solve_verified, worker_options
from pdopt.policies import make_policy
from pdopt.scenario import Scenario
from pdopt.sim import simulate
from pdopt.workload import Workload, poisson_arrivals, session_workload

NAME = "prefix_reuse"
GPU, MODEL = "H100-SXM", "Llama-3.1-8B"
SLO = Slo(ttft_s=1.0, tpot_s=0.05)
SESSIONS_PER_S = 25.0


def workload(quick: bool, seed: int) -> Workload:
    """Chat sessions (module docstring): 200 sessions quick, 600 otherwise."""
    sessions = 200 if quick else 600
    starts = poisson_arrivals(SESSIONS_PER_S, n_requests=sessions, seed=seed)
    return session_workload(
        starts, turns=4, think_time_s=10.0, question_tokens=256, output_tokens=256,
        system_prompt_tokens=512, block_tokens=16, seed=seed,
    )  # fmt: skip


def cluster(n_prefill: int, n_decode: int, caching: bool) -> ClusterSpec:
    gpu, model = get_gpu(GPU), get_model(MODEL)
    cost = roofline_cost_model(gpu, model, 1)
    built = ClusterSpec.from_hardware(gpu, model, cost, n_prefill, n_decode)
    return built.with_engine_args(enable_prefix_caching=caching)


PLAN_RATE_PER_S = 60.0
"""The rate the plan is sized for (the sessions' requests, time-scaled to it)."""


def run(quick: bool, seed: int, args: argparse.Namespace | None = None) -> pd.DataFrame:
    """One row per caching setting (off, on), each an independent task (``--dask``)."""
    task = functools.partial(_row, quick=quick, seed=seed)
    return pd.DataFrame(c.map_runs(task, (False, True), args or argparse.Namespace()))


def _row(caching: bool, quick: bool, seed: int) -> dict[str, Any]:
    """The plan, its check and the 2P2D goodputs with prefix caching on or off."""
    base = workload(quick, seed)
    wl = base.scale_rate(PLAN_RATE_PER_S / base.rate_per_s)
    option = worker_options([GPU], MODEL, (1,))[0]
    cache_tokens = float(option.kv_capacity_tokens) if caching else None
    demand = demand_from_workload(
        wl, ttft_slo_s=SLO.ttft_s, tpot_slo_s=SLO.tpot_s, cache_tokens=cache_tokens
    )
    draws = [wl]
    verified = solve_verified(demand, [option], draws, kv_bytes_per_token(get_model(MODEL)))
    plan = verified.final.plan
    n_p = sum(w.workers for w in plan.counts if w.role == "prefill")
    n_d = sum(w.workers for w in plan.counts if w.role == "decode")
    check = simulate(wl, cluster(n_p, n_d, caching), make_policy("cache_aware"), slo=SLO)
    q = check.requests
    metrics = check.metrics()
    simulated_hit = float(metrics.get("prefix_hit_rate_tokens", 0.0))
    row: dict[str, Any] = {
        "prefix_caching": caching,
        "requests": len(wl),
        "rate_per_s": wl.rate_per_s,
        "assumed_hit_fraction": demand.hit_fraction,
        "plan_prefill_gpus": n_p,
        "plan_decode_gpus": n_d,
        "plan_gpus": plan.n_gpus,
        "plan_meets": verified.meets,
        "check_attainment": float(metrics["slo_attainment"]),
        "check_ttft_p99_s": float(np.nanpercentile(q["ttft_s"], 99)),
        "check_hit_fraction": simulated_hit,
    }
    for policy in ("least_loaded", "cache_aware"):
        scenario = Scenario(base, cluster(2, 2, caching), policy, SLO, seed=seed)
        cap = max_rate_under_slo(scenario, rel_tol=0.1 if quick else 0.05)
        row[f"goodput_{policy}_rps"] = cap.max_rate_per_s
        row[f"goodput_{policy}_status"] = cap.status
    return row


def summarise(frame: pd.DataFrame) -> list[dict[str, Any]]:
    off, on = frame.iloc[0], frame.iloc[1]
    return [
        {
            "experiment": "Prefix reuse",
            "quantity": "prefill GPUs planned with prefix caching / without",
            "pdopt_value": float(on["plan_prefill_gpus"] / max(off["plan_prefill_gpus"], 1)),
            "unit": "ratio",
            "detail": (
                f"{int(on['plan_prefill_gpus'])}P{int(on['plan_decode_gpus'])}D with caching "
                f"(assumed hit {on['assumed_hit_fraction']:.0%}, simulated "
                f"{on['check_hit_fraction']:.0%}, attainment {on['check_attainment']:.3f}) vs "
                f"{int(off['plan_prefill_gpus'])}P{int(off['plan_decode_gpus'])}D without "
                f"(attainment {off['check_attainment']:.3f})"
            ),
        },
        {
            "experiment": "Prefix reuse",
            "quantity": "2P2D goodput with prefix caching / without (cache_aware routing)",
            "pdopt_value": float(
                on["goodput_cache_aware_rps"] / max(off["goodput_cache_aware_rps"], 1e-12)
            ),
            "unit": "ratio",
            "detail": (
                f"cache_aware {on['goodput_cache_aware_rps']:.3g} vs "
                f"{off['goodput_cache_aware_rps']:.3g} req/s; least_loaded "
                f"{on['goodput_least_loaded_rps']:.3g} vs {off['goodput_least_loaded_rps']:.3g}"
            ),
        },
    ]


def main() -> None:
    args = c.parse_args(__doc__ or NAME)
    timer = c.Timer()
    frame = run(args.quick, args.seed, args)
    c.save_csv(frame, args.out, NAME)
    c.save_summary(summarise(frame), args.out, NAME)
    print(frame.round(3).to_string(index=False))
    print(f"{NAME}: {len(frame)} rows in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
