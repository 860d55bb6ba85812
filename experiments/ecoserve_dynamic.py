"""EcoServe dynamic fine-grained scaling (Du et al. 2025, §6.2.2, Fig. 10): the request rate
steps up every 2 minutes from 20 to 50 req/s; SLO attainment is sampled every 30 s while
mitosis scaling adds standby instances as SLOs fail.

Setup (the paper's where legible, else stated):

* CodeLlama-34B on L20 instances (TP 4, as in Fig. 9: "1 instance (4 GPUs)"), ShareGPT-like
  requests (inputs truncated at 4,096 tokens), Table 4 SLOs (TTFT 5 s, TPOT 100 ms), Poisson
  arrivals at 20, 30, 40, 50 req/s for 2 minutes each (the paper says "from 20 to 50" every 2
  minutes; the step size of 10 req/s is our assumption).
* "The system starts with 8 instances and uses up all GPUs eventually": 8 active instances
  (32 GPUs) and 8 standby ones (the L20 cluster's other 32 GPUs), mitosis bounds ``n_lower=3``,
  ``n_upper=6`` (the example of the paper's Fig. 7; Fig. 10's values are not legible in our
  copy), instance migration 0.1 s (the paper's "< 100 ms"), every other flag the policy's
  default (:mod:`pdopt.policies.ecoserve`).
* Attainment per 30 s window: the share of requests *arriving* in the window that meet both
  SLOs; active instances: workers outside the ``standby`` pool, mean and maximum over the
  window's control ticks.

Runs the paper's algorithm (``ecoserve``) and pdopt's earlier variant (``ecoserve_pdopt``:
``_common.ECOSERVE_PDOPT_FLAGS``). Writes ``ecoserve_dynamic.csv`` (one row per variant and
window) and ``ecoserve_dynamic.png`` (the paper's algorithm); the summary gives, per variant,
the lowest window attainment, the attainment over the run and the instances at the end.
``--quick``: 30 s per step, 5 s windows.

    python experiments/ecoserve_dynamic.py --out results/ [--quick]
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import _common as c
import ecoserve_testbed as et
import numpy as np
import pandas as pd

from pdopt.workload import Workload

NAME = "ecoserve_dynamic"
RATES = (20.0, 30.0, 40.0, 50.0)
STEP_S, WINDOW_S = 120.0, 30.0
QUICK_STEP_S, QUICK_WINDOW_S = 30.0, 5.0
ACTIVE, TOTAL = 8, 16
FLAGS = {"initial_instances": ACTIVE, "n_lower": 3, "n_upper": 6, "macro_size": 4}


def stepped_workload(step_s: float, seed: int) -> Workload:
    """Poisson arrivals at each rate of :data:`RATES` for ``step_s`` seconds, ShareGPT-like
    lengths truncated at 4,096 tokens."""
    parts = []
    for i, rate in enumerate(RATES):
        n = round(rate * step_s)
        wl = et.truncated_workload("sharegpt", rate, n, seed + i)
        keep = wl.arrival_s < step_s
        parts.append(
            (wl.arrival_s[keep] + i * step_s, wl.input_tokens[keep], wl.output_tokens[keep])
        )
    return Workload(*(np.concatenate([p[k] for p in parts]) for k in range(3)))


def windows(
    requests: pd.DataFrame, ts: pd.DataFrame, window_s: float, step_s: float
) -> pd.DataFrame:
    """Per window of ``window_s``: offered rate, attainment of the requests arriving in it,
    active instances (mean, max over its ticks)."""
    active = ts[ts["pool"] != "standby"].groupby("t_s")["worker"].nunique()
    end = len(RATES) * step_s
    rows = []
    for start in np.arange(0.0, end, window_s):
        mine = requests[
            (requests["arrival_s"] >= start) & (requests["arrival_s"] < start + window_s)
        ]
        tick = active[(active.index >= start) & (active.index < start + window_s)]
        rows.append(
            {
                "t_start_s": start,
                "offered_rps": RATES[min(int(start // step_s), len(RATES) - 1)],
                "arrived_rps": len(mine) / window_s,
                "slo_attainment": float(mine["slo_met"].mean()) if len(mine) else float("nan"),
                "active_mean": float(tick.mean()) if len(tick) else float("nan"),
                "active_max": int(tick.max()) if len(tick) else 0,
            }
        )
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(1, width_in=6.0)
    ax = axes[0]
    ax.plot(table["t_start_s"], table["slo_attainment"], "o", color="tab:blue", label="attainment")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("SLO attainment")
    right = ax.twinx()
    right.step(table["t_start_s"], table["offered_rps"], where="post", color="tab:green")
    right.plot(table["t_start_s"], table["active_mean"], color="tab:red", label="instances")
    right.set_ylabel("req/s (green), instances (red)")
    return fig


def run(label: str, wl: Workload, window_s: float, step_s: float, seed: int) -> pd.DataFrame:
    """Windows of one run of EcoServe variant ``label`` (``ecoserve``: the paper's algorithm;
    ``ecoserve_pdopt``: pdopt's earlier variant) on the stepped workload."""
    cfg = et.CONFIGS[0]
    bed = cfg.testbed()
    base = c.SYSTEMS[label]
    system = replace(base, n_mixed=TOTAL, flags={**base.flags, **FLAGS})
    slo = et.PAPER_SLOS["sharegpt"]
    res = c.system_scenario(
        system, wl, slo, cost=c.testbed_cost_model(bed), testbed=bed, seed=seed,
        record_timeseries=True,
    ).run()  # fmt: skip
    req = res.requests.copy()
    req["slo_met"] = (
        (req["status"] == "finished")
        & (req["ttft_s"] <= slo.ttft_s)
        & (req["tpot_s"].fillna(0.0) <= slo.tpot_s)
    )
    table = windows(req, res.timeseries, window_s, step_s)
    table.insert(0, "system", label)
    table.attrs["attainment"] = float(req["slo_met"].mean())
    return table


def summary(table: pd.DataFrame, label: str, attainment: float, n: int) -> list[dict[str, Any]]:
    """The three summary quantities of one variant's run."""
    detail = "; ".join(
        f"{r.t_start_s:.0f} s: {r.offered_rps:.0f} req/s, {r.slo_attainment:.2f}, "
        f"{r.active_mean:.1f} inst"
        for r in table.itertuples()
    )
    row = {"experiment": "EcoServe dynamic scaling", "unit": "fraction"}
    return [
        row | {"quantity": f"{label}: lowest attainment over the windows",
               "pdopt_value": float(table["slo_attainment"].min()), "detail": detail},
        row | {"quantity": f"{label}: attainment over the whole run", "pdopt_value": attainment,
               "detail": f"{n} requests"},
        row | {"quantity": f"{label}: active instances in the last window (of {TOTAL})",
               "pdopt_value": float(table["active_mean"].iloc[-1]), "unit": "instances",
               "detail": f"max {int(table['active_max'].max())} over the run, {ACTIVE} at start"},
    ]  # fmt: skip


def main() -> None:
    args = c.parse_args(__doc__ or NAME)
    timer = c.Timer()
    step_s, window_s = (QUICK_STEP_S, QUICK_WINDOW_S) if args.quick else (STEP_S, WINDOW_S)
    wl = stepped_workload(step_s, args.seed)
    labels = ("ecoserve", "ecoserve_pdopt")
    # the two variants' runs are independent tasks (--dask)
    task = functools.partial(run, wl=wl, window_s=window_s, step_s=step_s, seed=args.seed)
    tables = c.map_runs(task, labels, args)
    rows = []
    for label, table in zip(labels, tables, strict=True):
        rows += summary(table, label, table.attrs["attainment"], len(wl.arrival_s))
    c.save_csv(pd.concat(tables, ignore_index=True), args.out, NAME)
    c.save_figure(plot(tables[0]), args.out, NAME)
    c.save_summary(rows, args.out, NAME)
    print(f"{NAME}: {len(wl.arrival_s)} requests x 2 in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
