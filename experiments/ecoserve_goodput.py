"""EcoServe: goodput at P50/P90/P99 SLO attainment, and static scaling.

**Goodput.** For each system (EcoServe, vLLM, Sarathi, DistServe, Mooncake) and each data-set-like
workload (Alpaca, ShareGPT, LongBench; lognormal archetypes), SLO attainment (TTFT and TPOT both
met) is simulated on a grid of Poisson rates from 0.2× to 2.4× the nominal 4P4D rate. The goodput
at an attainment target (0.5, 0.9, 0.99) is the largest rate whose attainment meets it, linearly
interpolated to the first grid rate that fails (a grid, not a bisection, so all three targets
share the same runs). Writes ``ecoserve_attainment.csv`` (every run), ``ecoserve_goodput.csv``
and ``ecoserve_goodput.png``.

**Static scaling.** EcoServe with one macro instance of 1, 2, 4, 6 or 8 instances and mitosis
off (ShareGPT-like): goodput at P90 in total and per instance. Writes ``ecoserve_scaling.csv``
and ``ecoserve_scaling.png``.

    python experiments/ecoserve_goodput.py --out results/ [--quick]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import _common as c
import numpy as np
import pandas as pd

NAME = "ecoserve_goodput"
DEFAULT_SYSTEMS = ("ecoserve", "vllm", "sarathi", "distserve", "mooncake")
TARGETS = (0.5, 0.9, 0.99)
RATE_FACTORS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0, 2.4)
QUICK_RATE_FACTORS = (0.4, 1.0, 2.0)
SCALING_SIZES = (1, 2, 4, 6, 8)


def goodput_at(rates: np.ndarray, attainment: np.ndarray, target: float) -> float:
    """Largest rate with attainment >= target on an increasing grid, interpolated to the first
    failing rate after it; 0 when even the lowest rate fails."""
    ok = attainment >= target
    if not ok[0]:
        return 0.0
    last = int(np.argmin(ok)) - 1 if not ok.all() else len(ok) - 1
    if last == len(ok) - 1:
        return float(rates[last])
    a0, a1 = attainment[last], attainment[last + 1]
    frac = (a0 - target) / (a0 - a1) if a0 > a1 else 0.0
    return float(rates[last] + frac * (rates[last + 1] - rates[last]))


def attainment_curve(
    system: c.System, name: str, factors: tuple[float, ...], n: int, seed: int, cost: Any
) -> pd.DataFrame:
    """Attainment at every grid rate for one system and workload."""
    nominal = c.nominal_rate_per_s(name, cost)
    rows = []
    for f in factors:
        wl = c.workload(name, f * nominal, n, seed)
        m = c.run_system(system, wl, cost, c.SLOS[name], seed=seed).metrics()
        rows.append(
            {
                "system": system.label,
                "workload": name,
                "rate_per_s": f * nominal,
                "slo_attainment": m["slo_attainment"],
                "goodput_rps": m["goodput_rps"],
                "ttft_p99_s": m["ttft_p99_s"],
                "tpot_p99_s": m["tpot_p99_s"],
            }
        )
    return pd.DataFrame(rows)


def goodput_table(curves: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    rows = []
    for key, grp in curves.groupby(keys, sort=False):
        rates = grp["rate_per_s"].to_numpy()
        att = grp["slo_attainment"].to_numpy()
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        for t in TARGETS:
            row[f"goodput_p{round(t * 100)}_rps"] = goodput_at(rates, att, t)
        rows.append(row)
    return pd.DataFrame(rows)


def scaling(args: Any, cost: Any) -> pd.DataFrame:
    """EcoServe goodput at P90 on 1..8 instances (ShareGPT-like)."""
    base = c.SYSTEMS["ecoserve"]
    sizes = (1, 2) if args.quick else SCALING_SIZES
    factors = QUICK_RATE_FACTORS if args.quick else RATE_FACTORS
    frames = []
    for k in sizes:
        # Static scaling: one macro instance of k instances, no mitosis (EcoServe's setup).
        flags = {"macro_size": k, "mitosis": False, "n_lower": 1, "n_upper": max(2, k)}
        system = replace(base, label=f"ecoserve_x{k}", n_mixed=k, flags=flags)
        # The grid scales with the instance count so every size is probed around its own knee.
        scaled = tuple(f * k / c.N_GPUS for f in factors)
        curve = attainment_curve(
            system, "sharegpt", scaled, 150 if args.quick else 600, args.seed, cost
        )
        curve.insert(1, "instances", k)
        frames.append(curve)
    curves = pd.concat(frames, ignore_index=True)
    table = goodput_table(curves, ["instances"])
    table["goodput_p90_per_instance_rps"] = table["goodput_p90_rps"] / table["instances"]
    return table


def plot_goodput(table: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(len(TARGETS), width_in=4.0)
    for ax, t in zip(axes, TARGETS, strict=True):
        col = f"goodput_p{round(t * 100)}_rps"
        table.pivot(index="workload", columns="system", values=col).plot.bar(ax=ax, rot=0)
        ax.set_title(f"goodput at P{round(t * 100)} attainment", fontsize=9)
        ax.set_ylabel("req/s")
        ax.legend(fontsize=6)
    return fig


def plot_scaling(table: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(2, width_in=4.0)
    axes[0].plot(table["instances"], table["goodput_p90_rps"], marker="o")
    axes[0].set_ylabel("goodput at P90 (req/s)")
    axes[1].plot(table["instances"], table["goodput_p90_per_instance_rps"], marker="o")
    axes[1].set_ylabel("per instance (req/s)")
    for ax in axes:
        ax.set_xlabel("EcoServe instances")
    return fig


def summarise(table: pd.DataFrame, scale: pd.DataFrame | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if "ecoserve" in set(table["system"]):
        p90 = table.pivot(index="workload", columns="system", values="goodput_p90_rps")
        for base in (s for s in p90.columns if s != "ecoserve"):
            ratio = p90["ecoserve"] / p90[base].replace(0.0, np.nan)
            rows.append(
                {
                    "experiment": "EcoServe goodput",
                    "quantity": f"goodput at P90, ecoserve/{base} (mean over workloads)",
                    "pdopt_value": float(ratio.mean()),
                    "unit": "ratio",
                    "detail": ", ".join(f"{w}: {v:.2f}" for w, v in ratio.items()),
                }
            )
    if scale is not None and len(scale) > 1:
        per = scale.set_index("instances")["goodput_p90_per_instance_rps"]
        rows.append(
            {
                "experiment": "EcoServe static scaling",
                "quantity": f"per-instance goodput at {per.index[-1]} vs 1 instance",
                "pdopt_value": float(per.iloc[-1] / per.iloc[0]) if per.iloc[0] else float("nan"),
                "unit": "ratio",
                "detail": ", ".join(f"{k}: {v:.2f}" for k, v in per.items()),
            }
        )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME, DEFAULT_SYSTEMS)
    c.require_systems(args.systems, NAME)
    timer = c.Timer()
    cost = c.v100_cost_model()
    workloads = ("sharegpt",) if args.quick else c.ECOSERVE_WORKLOADS
    factors = QUICK_RATE_FACTORS if args.quick else RATE_FACTORS
    n = 150 if args.quick else 600
    with c.engine_feature_guard(NAME):
        curves = pd.concat(
            [
                attainment_curve(c.SYSTEMS[s], w, factors, n, args.seed, cost)
                for w in workloads
                for s in args.systems
            ],
            ignore_index=True,
        )
        scale = scaling(args, cost) if "ecoserve" in args.systems else None
    table = goodput_table(curves, ["system", "workload"])
    c.save_csv(curves, args.out, "ecoserve_attainment")
    c.save_csv(table, args.out, NAME)
    c.save_figure(plot_goodput(table), args.out, NAME)
    if scale is not None:
        c.save_csv(scale, args.out, "ecoserve_scaling")
        c.save_figure(plot_scaling(scale), args.out, "ecoserve_scaling")
    c.save_summary(summarise(table, scale), args.out, NAME)
    print(f"{NAME}: {len(curves)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
