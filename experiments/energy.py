"""Phasor Table 6: energy per generated output token on the production mix at peak load.

Phasor, DistServe and Splitwise from the same 4P4D split serve the production mix
(:mod:`_phasor`) at each rate of :data:`RATES` (the paper's 40–60 req/s peak-load phase) for
:data:`DURATION_S` s. Energy is pdopt's linear power model over the whole run (no warm-up cut,
unlike the paper's NVML window): Σ_w [P_idle·makespan + (P_max − P_idle)·busy_s] with V100
data-sheet power (40 W idle, 300 W max); average power is energy over makespan, generation
throughput output tokens over makespan, J/token their ratio (the paper's definition, App. G).
Writes ``energy.csv``, ``energy.png`` and the summary (means over the rates).

    python experiments/energy.py --out results/ [--quick] [--traces DIR] [--model M]
        [--cost-model roofline|phasor] [--burstgpt CSV]
"""

from __future__ import annotations

from typing import Any

import _common as c
import _phasor as ph
import pandas as pd

NAME = "energy"
WORKLOAD = "phasor_mix"
RATES = (40.0, 60.0)
DURATION_S, QUICK_DURATION_S = 60.0, 6.0


def table(args: Any, source: ph.MixSource) -> pd.DataFrame:
    cost = ph.cost_model(args.cost_model, args.model)
    grid = []
    for rate in RATES[:1] if args.quick else RATES:
        wl = ph.workload(
            WORKLOAD, rate, QUICK_DURATION_S if args.quick else DURATION_S, args.seed, source
        )
        for label in args.systems:
            scenario = c.system_scenario(
                c.SYSTEMS[label],
                wl,
                ph.slo(WORKLOAD),
                cost=cost,
                testbed=ph.testbed(args.model),
                seed=args.seed,
            )
            grid.append((label, rate, len(wl), scenario))
    runs = c.map_runs(c.metrics_of, [scenario for *_, scenario in grid], args)
    rows = []
    for (label, rate, n, _), m in zip(grid, runs, strict=True):
        tokens = float(m["energy_j"]) / float(m["energy_per_output_token_j"])
        rows.append(
            {
                "system": label,
                "rate_per_s": rate,
                "requests": n,
                "energy_j": m["energy_j"],
                "makespan_s": m["makespan_s"],
                "avg_power_w": float(m["energy_j"]) / float(m["makespan_s"]),
                "gen_throughput_tok_s": tokens / float(m["makespan_s"]),
                "energy_per_output_token_j": m["energy_per_output_token_j"],
            }
        )
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(1, width_in=6.0)
    frame.pivot(index="rate_per_s", columns="system", values="energy_per_output_token_j").plot.bar(
        ax=axes[0], rot=0
    )
    axes[0].set_ylabel("energy per output token (J)")
    return fig


def summarise(frame: pd.DataFrame, stated: str) -> list[dict[str, Any]]:
    means = frame.groupby("system", sort=False).mean(numeric_only=True)
    rows = []
    for label, r in means.iterrows():
        for col, what, unit in (
            ("energy_per_output_token_j", "J/token", "J/token"),
            ("avg_power_w", "average power", "W"),
            ("gen_throughput_tok_s", "generation throughput", "tok/s"),
        ):
            rows.append(
                {
                    "experiment": "Table 6 energy",
                    "quantity": f"{what}, {label}",
                    "pdopt_value": float(r[col]),
                    "unit": unit,
                    "detail": f"mean over {sorted(frame['rate_per_s'].unique())} req/s; {stated}",
                }
            )
    return rows


def main() -> None:
    args = ph.parse_args(__doc__ or NAME, ph.HEAD_TO_HEAD)
    timer = c.Timer()
    source = ph.mix_source(args)
    frame = table(args, source)
    c.save_csv(frame, args.out, NAME)
    c.save_figure(plot(frame), args.out, NAME)
    c.save_summary(summarise(frame, ph.stated(args, source)), args.out, NAME)
    print(frame.round(3).to_string(index=False))
    print(f"{NAME}: {len(frame)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
