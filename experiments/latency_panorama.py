"""Phasor Fig. 4/10 and Appendix E: the latency panorama — P99 TTFT, TPOT and end-to-end latency
versus arrival rate, Phasor against DistServe and Splitwise from the same 4P4D split.

Testbed, workloads and SLOs as in :mod:`_phasor` (8 × V100-32GB, Qwen2.5-7B by default, Table 1
workloads as length distributions, the production mix from the Azure conversation trace with
``--traces``). Each workload runs :data:`DURATION_S` seconds of arrivals at every rate of
:data:`RATES` (5–40 req/s, App. E's range; the production mix also at 60 req/s, §4.2's
40–60 req/s phase); every request is served to the end, so an
overloaded run shows the minutes-long tail the paper reports. Writes ``latency_panorama.csv``
(one row per system × workload × rate), ``latency_panorama.png`` and the summary: the numbers the
paper quotes (§4.2 and Appendix E) at λ = 40 req/s and over all rates.

    python experiments/latency_panorama.py --out results/ [--quick] [--traces DIR]
        [--model Qwen2.5-7B|Llama-3-8B] [--cost-model roofline|phasor] [--burstgpt CSV]
"""

from __future__ import annotations

from typing import Any

import _common as c
import _phasor as ph
import numpy as np
import pandas as pd

NAME = "latency_panorama"
RATES = (5.0, 10.0, 20.0, 40.0)
MIX_RATES = (*RATES, 60.0)
"""App. E sweeps λ = 5 to 40 req/s; the production mix also 40-60 req/s (§4.2)."""
QUICK_RATES = (5.0, 40.0)
DURATION_S, QUICK_DURATION_S = 45.0, 8.0
PEAK_RATE = 40.0
"""The paper's "peak load" of Appendix E and §4.2 Scenario 3."""
METRICS = ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s")


def sweep(args: Any, source: ph.MixSource) -> pd.DataFrame:
    """Every system × workload × rate: P99 metrics (or the policy error) per row."""
    cost = ph.cost_model(args.cost_model, args.model)
    workloads = ("phasor_mix", "phasor_s_s") if args.quick else ph.WORKLOADS
    duration = QUICK_DURATION_S if args.quick else DURATION_S
    grid: list[tuple[dict[str, Any], Any]] = []
    for name in workloads:
        rates = QUICK_RATES if args.quick else MIX_RATES if name == "phasor_mix" else RATES
        for rate in rates:
            wl = ph.workload(name, rate, duration, args.seed, source)
            for label in args.systems:
                scenario = c.system_scenario(
                    c.SYSTEMS[label],
                    wl,
                    ph.slo(name),
                    cost=cost,
                    testbed=ph.testbed(args.model),
                    seed=args.seed,
                )
                row = {"system": label, "workload": name, "rate_per_s": rate, "requests": len(wl)}
                grid.append((row, scenario))
    runs = c.map_runs(ph.run_metrics, [scenario for _, scenario in grid], args)
    rows: list[dict[str, Any]] = []
    keys = (*METRICS, "slo_attainment", "makespan_s")
    for (row, _), (m, error) in zip(grid, runs, strict=True):
        row.update({k: (float(m[k]) if m is not None else np.nan) for k in keys})
        rows.append({**row, "error": error})
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame, out: Any) -> None:
    """One row of three panels (TTFT, TPOT, E2E P99, log scale) per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(frame["workload"]))
    fig, axes = plt.subplots(len(workloads), 3, figsize=(11, 2.6 * len(workloads)), squeeze=False)
    for i, name in enumerate(workloads):
        sub = frame[frame["workload"] == name]
        slo = ph.slo(name)
        for j, metric in enumerate(METRICS):
            ax = axes[i][j]
            for label, grp in sub.groupby("system", sort=False):
                ax.plot(grp["rate_per_s"], grp[metric], marker="o", label=str(label))
            ax.set_yscale("log")
            ax.set_xlabel("rate (req/s)")
            ax.set_ylabel(f"{metric.split('_')[0].upper()} P99 (s)")
            ax.set_title(ph.TASKS[name], fontsize=9)
            if metric != "e2e_p99_s":
                ax.axhline(slo.ttft_s if metric == "ttft_p99_s" else slo.tpot_s, ls=":", c="k")
        axes[i][0].legend(fontsize=7)
    c.save_figure(fig, out, NAME)


def _at(frame: pd.DataFrame, name: str, rate: float) -> pd.DataFrame:
    return frame[(frame["workload"] == name) & (frame["rate_per_s"] == rate)].set_index("system")


# (workload, metric, unit scale, unit, what) quoted by the paper at λ = 40 req/s
PEAK_QUOTES: tuple[tuple[str, str, float, str, str], ...] = (
    ("phasor_s_s", "e2e_p99_s", 1.0, "s", "P99 E2E"),
    ("phasor_s_s", "ttft_p99_s", 1e3, "ms", "P99 TTFT"),
    ("phasor_m_m", "e2e_p99_s", 1.0, "s", "P99 E2E"),
    ("phasor_l_l", "e2e_p99_s", 1.0, "s", "P99 E2E"),
    ("phasor_l_l", "tpot_p99_s", 1e3, "ms", "P99 TPOT"),
    ("phasor_s_l", "e2e_p99_s", 1.0, "s", "P99 E2E"),
    ("phasor_s_l", "tpot_p99_s", 1e3, "ms", "P99 TPOT"),
)

# (workload, metric, what) whose mean over all rates the paper compares
MEAN_QUOTES: tuple[tuple[str, str, str], ...] = (
    ("phasor_mix", "e2e_p99_s", "P99 E2E"),
    ("phasor_l_s", "ttft_p99_s", "P99 TTFT"),
    ("phasor_s_l", "tpot_p99_s", "P99 TPOT"),
    ("phasor_s_s", "e2e_p99_s", "P99 E2E"),
    ("phasor_m_m", "e2e_p99_s", "P99 E2E"),
    ("phasor_l_l", "e2e_p99_s", "P99 E2E"),
)


def summarise(frame: pd.DataFrame, args: Any, stated: str) -> list[dict[str, Any]]:
    """The quantities §4.2 and Appendix E quote, each system's value and Phasor's ratios."""
    rows: list[dict[str, Any]] = []
    exp = "Fig. 4/10 latency panorama"

    def add(quantity: str, value: float, unit: str, detail: str) -> None:
        rows.append(
            {
                "experiment": exp,
                "quantity": quantity,
                "pdopt_value": value,
                "unit": unit,
                "detail": f"{detail}; {stated}",
            }
        )

    present = set(frame["workload"])
    if "phasor_mix" in present:
        high = frame[(frame["workload"] == "phasor_mix") & (frame["rate_per_s"] >= PEAK_RATE)]
        worst = high.groupby("system")["e2e_p99_s"].max()
        for label in args.systems:
            add(
                f"Production Mix P99 E2E at 40-60 req/s (worst rate), {label}",
                float(worst.get(label, np.nan)),
                "s",
                f"max over rates {sorted(set(high['rate_per_s']))}",
            )
    for name, metric, scale, unit, what in PEAK_QUOTES:
        if name not in present or PEAK_RATE not in set(frame["rate_per_s"]):
            continue
        at = _at(frame, name, PEAK_RATE)
        for label in args.systems:
            value = float(at.loc[label, metric]) * scale if label in at.index else np.nan
            err = at.loc[label, "error"] if label in at.index else "not run"
            add(
                f"{ph.TASKS[name]} {what} at 40 req/s, {label}",
                value,
                unit,
                f"{int(at['requests'].iloc[0])} requests" + (f"; failed: {err}" if err else ""),
            )
    for name, metric, what in MEAN_QUOTES:
        sub = frame[frame["workload"] == name]
        if not len(sub) or "phasor" not in args.systems:
            continue
        table = sub.pivot(index="rate_per_s", columns="system", values=metric)
        for base in (s for s in args.systems if s != "phasor"):
            ratio = table["phasor"] / table[base]
            add(
                f"{ph.TASKS[name]} {what} phasor/{base}, mean over rates",
                float(ratio.mean()),
                "ratio",
                ", ".join(f"{r:g} req/s: {v:.2f}" for r, v in ratio.items()),
            )
    return rows


def main() -> None:
    args = ph.parse_args(__doc__ or NAME, ph.HEAD_TO_HEAD)
    timer = c.Timer()
    source = ph.mix_source(args)
    frame = sweep(args, source)
    c.save_csv(frame, args.out, NAME)
    plot(frame, args.out)
    c.save_summary(summarise(frame, args, ph.stated(args, source)), args.out, NAME)
    print(f"{NAME}: {len(frame)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
