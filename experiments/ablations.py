"""Phasor Table 2: ablations, normalised to DistServe.

Phasor and its ablations (flags of the one ``phasor`` policy: ``phi_routing=False`` routes
prefill by queue length, ``defrag=False`` drops the meso loop, ``mixed_pool=False`` freezes the
Mixed pool) against DistServe, on bursty arrivals (gamma, CV 3) at the nominal 4P4D rate of two
Table 1 workloads: production mix (1024/256, prefill-heavy) and short/long (128/2048,
generation-heavy). Every metric is divided by DistServe's on the same workload (lower is better
for latencies, higher for goodput). Writes ``ablations_raw.csv``, ``ablations.csv`` (normalised),
``ablations.png`` and the summary.

    python experiments/ablations.py --out results/ [--quick]
"""

from __future__ import annotations

from typing import Any

import _common as c
import pandas as pd

NAME = "ablations"
DEFAULT_SYSTEMS = (
    "phasor",
    "phasor_no_phi",
    "phasor_no_defrag",
    "phasor_no_mixed",
    "distserve",
)
BASELINE = "distserve"
METRICS = ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "goodput_rps", "slo_attainment")


def normalise(raw: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Each metric over the baseline's on the same workload."""
    out = []
    for _, grp in raw.groupby("workload", sort=False):
        base = grp[grp["system"] == baseline].iloc[0]
        norm = grp[["system", "workload"]].copy()
        for m in METRICS:
            norm[m] = grp[m].astype(float) / float(base[m]) if float(base[m]) else float("nan")
        out.append(norm)
    return pd.concat(out, ignore_index=True)


def plot(norm: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(3, width_in=4.0)
    for ax, metric in zip(axes, ("ttft_p99_s", "e2e_p99_s", "goodput_rps"), strict=True):
        table = norm.pivot(index="system", columns="workload", values=metric)
        table.plot.bar(ax=ax, rot=30)
        ax.axhline(1.0, c="k", ls=":")
        ax.set_title(f"{metric} / {BASELINE}", fontsize=9)
        ax.legend(fontsize=7)
    return fig


def summarise(norm: pd.DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for label, grp in norm.groupby("system", sort=False):
        if label == BASELINE:
            continue
        for metric in ("e2e_p99_s", "goodput_rps"):
            rows.append(
                {
                    "experiment": "Table 2 ablations",
                    "quantity": f"{metric} {label}/{BASELINE} (mean over workloads)",
                    "pdopt_value": float(grp[metric].mean()),
                    "unit": "ratio",
                    "detail": ", ".join(
                        f"{w}: {v:.2f}" for w, v in zip(grp["workload"], grp[metric], strict=True)
                    ),
                }
            )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME, DEFAULT_SYSTEMS)
    if BASELINE not in args.systems:
        args.systems.append(BASELINE)
    timer = c.Timer()
    workloads = ("production_mix",) if args.quick else ("production_mix", "short_long")
    floor, cap = (150, 200) if args.quick else (600, 2500)
    raw = c.metrics_grid(
        args.systems,
        workloads,
        rate_factor=1.0,
        n_floor=floor,
        n_cap=cap,
        seed=args.seed,
        cv=3.0,
    )
    norm = normalise(raw, BASELINE)
    c.save_csv(raw, args.out, f"{NAME}_raw")
    c.save_csv(norm, args.out, NAME)
    c.save_figure(plot(norm), args.out, NAME)
    c.save_summary(summarise(norm), args.out, NAME)
    print(f"{NAME}: {len(raw)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
