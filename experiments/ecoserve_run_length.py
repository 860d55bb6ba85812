"""EcoServe's SLO attainment against run length and rate on the L20 main config (issue 36: the
L20 check that gave 0.84 in one run and 0.938 in another at 10 req/s, beside a P90 goodput of
20.8 req/s).

Setup: the EcoServe testbed's main config (:data:`ecoserve_testbed.CONFIGS` [0]: L20 CodeLlama-34B
TP 4, 8 instances, ShareGPT-like requests truncated at 4,096 tokens, Table 4 SLOs), the paper's
algorithm (``ecoserve``), the same with its macro instances' scaling off (``ecoserve_no_mitosis``,
long runs only) and vLLM, Poisson arrivals at :data:`RATES`. Each rate runs twice per seed: with
the request count the goodput runs use (``ecoserve_goodput.run_requests``: about four unloaded
request lifetimes of arrivals, at least 300) and with :data:`LONG_REQUESTS`. Per run: SLO
attainment under pdopt's TTFT/TPOT and under the paper's (the wait before decoding counted in
TTFT), and the attainment of the requests that arrive in the first :data:`WARM_S` seconds (the
warm-up of an empty cluster) and after them.

Writes ``ecoserve_run_length_runs.csv`` (one row per run), ``ecoserve_run_length.csv`` (per
system, rate and run size: mean, min and max over the seeds) and a summary: attainment at 10
req/s with the goodput runs' size and with the long runs, and after the warm-up, and the
ablation at the lowest rate. ``--quick``: two rates, one seed, 800 requests for the long runs,
a 10 s warm-up.

    python experiments/ecoserve_run_length.py --out results/ [--quick]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import _common as c
import ecoserve_goodput as eg
import ecoserve_testbed as et
import pandas as pd

NAME = "ecoserve_run_length"
SYSTEMS = ("ecoserve", "vllm", "ecoserve_no_mitosis")
LONG_ONLY = ("ecoserve_no_mitosis",)  # the ablation runs the long runs only
WORKLOAD = "sharegpt"
RATES = (5.0, 10.0, 20.0, 30.0)
QUICK_RATES = (10.0, 20.0)
LONG_REQUESTS, QUICK_LONG_REQUESTS = 2000, 800
SEEDS, QUICK_SEEDS = (0, 1, 2), (0,)
WARM_S, QUICK_WARM_S = 50.0, 10.0
PROBE_RATE = 10.0


def run(job: tuple[str, float, int, str, int, float]) -> dict[str, Any]:
    """One run: ``(system, rate, requests, size label, seed, warm-up seconds)``."""
    label, rate, n, size, seed, warm_s = job
    cfg = et.CONFIGS[0]
    bed = cfg.testbed()
    cost = c.testbed_cost_model(bed)
    slo = et.PAPER_SLOS[WORKLOAD]
    system = _system(label, cfg.instances)
    wl = et.truncated_workload(WORKLOAD, rate, n, seed)
    cluster = c.system_cluster(system, cost, bed)
    res = c.run_system(system, wl, cost, slo, seed=seed, cluster=cluster)
    m = res.metrics()
    req = res.requests
    met = (req["ttft_s"] <= slo.ttft_s) & (req["tpot_s"].fillna(0.0) <= slo.tpot_s)
    met &= req["status"] == "finished"
    warm = req["arrival_s"] < warm_s
    return {
        "system": label,
        "rate_per_s": rate,
        "run": size,
        "requests": n,
        "seed": seed,
        "slo_attainment": m["slo_attainment"],
        "slo_attainment_paper": m["slo_attainment_decode_start"],
        "warm_up_s": warm_s,
        "attainment_warm_up": float(met[warm].mean()) if warm.any() else float("nan"),
        "attainment_after_warm_up": float(met[~warm].mean()) if (~warm).any() else float("nan"),
        "requests_after_warm_up": int((~warm).sum()),
    }


def _system(label: str, instances: int) -> c.System:
    """A compared system; ``ecoserve_no_mitosis`` is the paper's algorithm with the macro
    instances' scaling off (``mitosis=False``): the ablation that tells what mitosis costs."""
    if label == "ecoserve_no_mitosis":
        return replace(et.system("ecoserve", instances), label=label, flags={"mitosis": False})
    return et.system(label, instances)


def jobs(quick: bool) -> list[tuple[str, float, int, str, int, float]]:
    """Every (system, rate, requests, size label, seed, warm-up seconds) to run."""
    cost = c.testbed_cost_model(et.CONFIGS[0].testbed())
    long_n = QUICK_LONG_REQUESTS if quick else LONG_REQUESTS
    out = []
    for label in SYSTEMS:
        for rate in QUICK_RATES if quick else RATES:
            short_n = eg.run_requests(WORKLOAD, cost, rate, et.RUN_SIZES)
            sizes = (("goodput run", short_n), ("long run", long_n))
            for size, n in sizes[1:] if label in LONG_ONLY else sizes:
                for seed in QUICK_SEEDS if quick else SEEDS:
                    out.append((label, rate, n, size, seed, QUICK_WARM_S if quick else WARM_S))
    return out


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean, min and max over the seeds per system, rate and run size."""
    keys = ["system", "rate_per_s", "run", "requests"]
    g = runs.groupby(keys, sort=False)
    out = g[["slo_attainment", "slo_attainment_paper", "attainment_after_warm_up"]].mean()
    out["slo_attainment_min"] = g["slo_attainment"].min()
    out["slo_attainment_max"] = g["slo_attainment"].max()
    out["warm_up_s"] = g["warm_up_s"].first()
    out["seeds"] = g.size()
    return out.reset_index()


def summary(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per system: attainment at :data:`PROBE_RATE` with the goodput runs' size, with the long
    runs, and after the first 50 s of the long runs; the detail lists every rate."""
    rows = []
    base = {"experiment": "EcoServe run length (L20 main config)", "unit": "fraction"}
    for label in SYSTEMS:
        mine = table[table["system"] == label]
        at = mine[mine["rate_per_s"] == PROBE_RATE].set_index("run")
        if label in LONG_ONLY:
            lowest = mine.loc[mine["rate_per_s"].idxmin()]
            rows.append(
                base | {"quantity": f"{label}: attainment at {lowest.rate_per_s:g} req/s, "
                                    "long runs",
                        "pdopt_value": float(lowest.slo_attainment),
                        "detail": "; ".join(f"{r.rate_per_s:g} req/s: {r.slo_attainment:.3f}"
                                            for r in mine.itertuples())}
            )  # fmt: skip
            continue
        detail = "; ".join(
            f"{r.rate_per_s:g} req/s {r.run} ({r.requests}): {r.slo_attainment:.3f}"
            for r in mine.itertuples()
        )
        short, long_ = at.loc["goodput run"], at.loc["long run"]
        warm_s = float(long_["warm_up_s"])
        rows += [
            base | {"quantity": f"{label}: attainment at {PROBE_RATE:g} req/s, goodput-run size",
                    "pdopt_value": float(short["slo_attainment"]),
                    "detail": f"{int(short['requests'])} requests; {detail}"},
            base | {"quantity": f"{label}: attainment at {PROBE_RATE:g} req/s, long runs",
                    "pdopt_value": float(long_["slo_attainment"]),
                    "detail": f"{int(long_['requests'])} requests"},
            base | {"quantity": f"{label}: attainment after the warm-up, long runs at "
                                f"{PROBE_RATE:g} req/s",
                    "pdopt_value": float(long_["attainment_after_warm_up"]),
                    "detail": f"requests arriving after the first {warm_s:g} s (an empty "
                              "cluster's warm-up)"},
        ]  # fmt: skip
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME)
    timer = c.Timer()
    todo = jobs(args.quick)
    runs = pd.DataFrame(c.map_runs(run, todo, args))
    table = aggregate(runs)
    c.save_csv(runs, args.out, f"{NAME}_runs")
    c.save_csv(table, args.out, NAME)
    c.save_summary(summary(table), args.out, NAME)
    print(table.to_string(index=False))
    print(f"{NAME}: {len(todo)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
