"""Phasor Fig. 5: SLO-constrained capacity — the largest closed-loop in-flight concurrency at
which both P99 TTFT and P99 TPOT stay within the SLO — and, separately, the best initial split.

Capacity as the paper measures it (§4.3): closed loop, a fixed think time of
:data:`_phasor.THINK_TIME_S` seconds between a client's request ending and its next one, client
starts staggered over :data:`_phasor.START_SPREAD_S` seconds; :func:`pdopt.capacity.
max_concurrency_under_slo` brackets and bisects the client count (each point a fixed-seed
simulation). SLOs are the paper's Table 3 budgets except where one request alone already misses
the TTFT budget at P99 (:func:`_phasor.capacity_slo` says so per row).

1. **Head-to-head**: Phasor, DistServe and Splitwise on every Table 1 workload, all from the same
   4 prefill + 4 decode split.
2. **Best split** (a separate experiment): DistServe and Phasor on the production mix from every
   initial split of 3–6 prefill GPUs; each system's best split and the ratio of the bests.

Writes ``slo_capacity.csv``, ``slo_capacity_split.csv``, ``slo_capacity.png`` and the summary.

    python experiments/slo_capacity.py --out results/ [--quick] [--traces DIR] [--model M]
        [--cost-model roofline|phasor] [--burstgpt CSV]
"""

from __future__ import annotations

from typing import Any

import _common as c
import _phasor as ph
import numpy as np
import pandas as pd

NAME = "slo_capacity"
SPLITS = (3, 4, 5, 6)
QUICK_SPLITS = (3, 4)
SPLIT_SYSTEMS = ("distserve", "phasor")


def head_to_head(args: Any, source: ph.MixSource) -> pd.DataFrame:
    cost = ph.cost_model(args.cost_model, args.model)
    workloads = ("phasor_l_s",) if args.quick else ph.WORKLOADS
    common = {"seed": args.seed, "quick": args.quick, "source": source, "model": args.model}
    jobs = [(c.SYSTEMS[label], name, cost, common) for name in workloads for label in args.systems]
    return pd.DataFrame(c.map_runs(ph.capacity_job, jobs, args))


def best_split(args: Any, source: ph.MixSource) -> pd.DataFrame:
    cost = ph.cost_model(args.cost_model, args.model)
    name = "phasor_l_s" if args.quick else "phasor_mix"
    common = {"seed": args.seed, "quick": args.quick, "source": source, "model": args.model}
    systems = [
        ph.with_split(c.SYSTEMS[label], n_prefill)
        for label in SPLIT_SYSTEMS
        for n_prefill in (QUICK_SPLITS if args.quick else SPLITS)
    ]
    found = c.map_runs(ph.capacity_job, [(s, name, cost, common) for s in systems], args)
    rows = [
        {**row, "n_prefill": s.n_prefill, "n_decode": s.n_decode, "n_mixed": s.n_mixed}
        for s, row in zip(systems, found, strict=True)
    ]
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame, args: Any) -> None:
    fig, axes = c.new_figure(1, width_in=8.0)
    table = frame.pivot(index="workload", columns="system", values="max_clients")
    table = table[[s for s in args.systems if s in table.columns]]
    table.plot.bar(ax=axes[0], rot=20)
    axes[0].set_ylabel("max clients meeting P99 TTFT and TPOT")
    axes[0].set_title(f"SLO-constrained capacity (think {ph.THINK_TIME_S:g} s)")
    c.save_figure(fig, args.out, NAME)


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b > 0 else (1.0 if a == b else np.inf)


def summarise(frame: pd.DataFrame, split: pd.DataFrame, args: Any, stated: str) -> list[dict]:
    rows: list[dict[str, Any]] = []
    exp = "Fig. 5 SLO-constrained capacity"
    note = f"think {ph.THINK_TIME_S:g} s, starts over {ph.START_SPREAD_S:g} s; {stated}"
    if "phasor" in args.systems:
        for name, grp in frame.groupby("workload", sort=False):
            t = grp.set_index("system")
            for base in (s for s in args.systems if s != "phasor"):
                p, b = float(t.loc["phasor", "max_clients"]), float(t.loc[base, "max_clients"])
                rows.append(
                    {
                        "experiment": exp,
                        "quantity": f"{ph.TASKS[str(name)]} capacity phasor/{base}",
                        "pdopt_value": _ratio(p, b),
                        "unit": "ratio",
                        "detail": f"{p:.0f} vs {b:.0f} clients; SLO {t['slo_note'].iloc[0]}; "
                        + note,
                    }
                )
    best = split.loc[split.groupby("system")["max_clients"].idxmax()].set_index("system")
    if {"phasor", "distserve"} <= set(best.index):
        p, d = best.loc["phasor"], best.loc["distserve"]
        rows.append(
            {
                "experiment": f"{exp}, best split",
                "quantity": f"{ph.TASKS[str(p['workload'])]} capacity at each system's best split, "
                "phasor/distserve",
                "pdopt_value": _ratio(float(p["max_clients"]), float(d["max_clients"])),
                "unit": "ratio",
                "detail": f"phasor {p['max_clients']:.0f} clients at {int(p['n_prefill'])}P"
                f"{int(p['n_decode'])}D{int(p['n_mixed'])}M, distserve {d['max_clients']:.0f} at "
                f"{int(d['n_prefill'])}P{int(d['n_decode'])}D; {note}",
            }
        )
    return rows


def main() -> None:
    args = ph.parse_args(__doc__ or NAME, ph.HEAD_TO_HEAD)
    timer = c.Timer()
    source = ph.mix_source(args)
    frame = head_to_head(args, source)
    split = best_split(args, source)
    c.save_csv(frame, args.out, NAME)
    c.save_csv(split, args.out, f"{NAME}_split")
    plot(frame, args)
    c.save_summary(summarise(frame, split, args, ph.stated(args, source)), args.out, NAME)
    print(frame.drop(columns=["error"]).to_string(index=False))
    print(f"{NAME}: {len(frame) + len(split)} searches in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
