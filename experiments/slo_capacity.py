"""Phasor Fig. 5: SLO-constrained capacity — the largest closed-loop concurrency (in-flight
clients, zero think time) at which both P99 TTFT and P99 TPOT stay within the SLO.

For each Table 1 workload and each system, :func:`pdopt.capacity.max_concurrency_under_slo`
brackets and bisects the client count (every point a fixed-seed simulation; the synchronised
first wave is left out of the P99s). Writes ``slo_capacity.csv`` (one row per system × workload),
``slo_capacity_points.csv`` (every simulated point), ``slo_capacity.png`` and the summary
(Phasor's capacity over each baseline's, geometric mean over workloads).

    python experiments/slo_capacity.py --out results/ [--quick]
"""

from __future__ import annotations

from typing import Any

import _common as c
import numpy as np
import pandas as pd

from pdopt.capacity import max_concurrency_under_slo

NAME = "slo_capacity"
DEFAULT_SYSTEMS = ("phasor", "distserve", "splitwise")


def start_clients(name: str, cost: Any) -> int:
    """A starting guess near the knee: Little's law at half the nominal 4P4D rate."""
    wl = c.workload(name, 1.0, 2000, 12345)
    life_s = float(np.mean(cost.prefill.request_time_s(wl.input_tokens))) + float(
        np.mean(wl.output_tokens)
    ) * float(cost.decode.iteration_time_s(64, 64 * 1024))
    return max(1, round(0.5 * c.nominal_rate_per_s(name, cost) * life_s))


def capacities(args: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per system × workload, every point)``."""
    cost = c.v100_cost_model()
    workloads = ("long_short",) if args.quick else c.PHASOR_WORKLOADS
    per_client = 2 if args.quick else 3
    rows: list[dict[str, Any]] = []
    points: list[pd.DataFrame] = []
    for name in workloads:
        slo = c.SLOS[name]
        lengths = c.workload(name, 1.0, 500, args.seed)
        start = start_clients(name, cost)
        for label in args.systems:
            system = c.SYSTEMS[label]
            res = max_concurrency_under_slo(
                c.system_scenario(system, lengths, slo, cost=cost, seed=args.seed),
                requests_per_client=per_client,
                start_clients=start,
                max_clients=4096,
                max_evaluations=8 if args.quick else 12,
            )
            rows.append(
                {
                    "system": label,
                    "workload": name,
                    "max_clients": res.max_clients,
                    "ttft_p99_s": res.ttft_p99_s,
                    "tpot_p99_s": res.tpot_p99_s,
                    "bracket_lo": res.bracket_clients[0],
                    "bracket_hi": res.bracket_clients[1],
                    "status": res.status,
                    "evaluations": len(res.points),
                }
            )
            pts = res.points.copy()
            pts.insert(0, "workload", name)
            pts.insert(0, "system", label)
            points.append(pts)
    return pd.DataFrame(rows), pd.concat(points, ignore_index=True)


def plot(frame: pd.DataFrame, args: Any) -> None:
    """Grouped bars: max clients per workload and system."""
    fig, axes = c.new_figure(1, width_in=8.0)
    ax = axes[0]
    table = frame.pivot(index="workload", columns="system", values="max_clients")
    table = table[[s for s in args.systems if s in table.columns]]
    table.plot.bar(ax=ax, rot=20)
    ax.set_ylabel("max clients meeting P99 TTFT and TPOT")
    ax.set_title("SLO-constrained capacity (closed loop)")
    c.save_figure(fig, args.out, NAME)


def summarise(frame: pd.DataFrame, args: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if "phasor" not in args.systems:
        return rows
    table = frame.pivot(index="workload", columns="system", values="max_clients")
    for base in (s for s in args.systems if s != "phasor"):
        ratio = (table["phasor"] / table[base].clip(lower=1)).astype(float)
        rows.append(
            {
                "experiment": "Fig. 5 SLO-constrained capacity",
                "quantity": f"max clients phasor/{base} (geo-mean over workloads)",
                "pdopt_value": float(np.exp(np.mean(np.log(ratio.clip(lower=1e-9))))),
                "unit": "ratio",
                "detail": ", ".join(f"{w}: {r:.2f}" for w, r in ratio.items()),
            }
        )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME, DEFAULT_SYSTEMS)
    timer = c.Timer()
    frame, points = capacities(args)
    c.save_csv(frame, args.out, NAME)
    c.save_csv(points, args.out, f"{NAME}_points")
    plot(frame, args)
    c.save_summary(summarise(frame, args), args.out, NAME)
    print(f"{NAME}: {len(points)} simulations in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
