"""Phasor Table 6: energy per output token.

Each system serves each Table 1 workload (Poisson arrivals at 0.8× the nominal 4P4D rate, so
every system finishes); energy is pdopt's power model over the run,
Σ_w [P_idle·makespan + (P_max − P_idle)·busy_s] with V100 data-sheet power (40 W idle,
300 W max), divided by the output tokens served (:func:`pdopt.sim.compute_metrics`). Writes
``energy.csv`` (J/token per system × workload), ``energy.png`` and the summary (each system
relative to DistServe, geometric mean over workloads).

    python experiments/energy.py --out results/ [--quick]
"""

from __future__ import annotations

from typing import Any

import _common as c
import numpy as np
import pandas as pd

NAME = "energy"
DEFAULT_SYSTEMS = ("phasor", "distserve", "splitwise")
BASELINE = "distserve"


def plot(frame: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(1, width_in=8.0)
    table = frame.pivot(index="workload", columns="system", values="energy_per_output_token_j")
    table.plot.bar(ax=axes[0], rot=20, logy=True)
    axes[0].set_ylabel("energy per output token (J)")
    return fig


def summarise(frame: pd.DataFrame) -> list[dict[str, Any]]:
    table = frame.pivot(index="workload", columns="system", values="energy_per_output_token_j")
    rows: list[dict[str, Any]] = []
    for label in table.columns:
        rows.append(
            {
                "experiment": "Table 6 energy per token",
                "quantity": f"J/output token, {label} (mean over workloads)",
                "pdopt_value": float(table[label].mean()),
                "unit": "J/token",
                "detail": ", ".join(f"{w}: {v:.3g}" for w, v in table[label].items()),
            }
        )
        if label != BASELINE and BASELINE in table.columns:
            ratio = table[label] / table[BASELINE]
            rows.append(
                {
                    "experiment": "Table 6 energy per token",
                    "quantity": f"J/token {label}/{BASELINE} (geo-mean over workloads)",
                    "pdopt_value": float(np.exp(np.mean(np.log(ratio)))),
                    "unit": "ratio",
                    "detail": ", ".join(f"{w}: {v:.2f}" for w, v in ratio.items()),
                }
            )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME, DEFAULT_SYSTEMS)
    timer = c.Timer()
    workloads = ("production_mix",) if args.quick else c.PHASOR_WORKLOADS
    floor, cap = (150, 200) if args.quick else (400, 2000)
    raw = c.metrics_grid(
        args.systems, workloads, rate_factor=0.8, n_floor=floor, n_cap=cap, seed=args.seed
    )
    cols = ["system", "workload", "rate_per_s", "energy_j", "energy_per_output_token_j"]
    frame = raw[[*cols, "throughput_rps", "makespan_s"]]
    c.save_csv(frame, args.out, NAME)
    c.save_figure(plot(frame), args.out, NAME)
    c.save_summary(summarise(frame), args.out, NAME)
    print(f"{NAME}: {len(frame)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
