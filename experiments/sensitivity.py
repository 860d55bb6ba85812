"""Phasor Table 5: sensitivity of Phasor to its parameters (one changed at a time).

:func:`pdopt.tune.sensitivity_table` runs Phasor with its published defaults (θ_frag 0.168,
θ_flow 0.62, Δt 50 ms, α × 1) and then each Table 5 row (α × 0.5 / × 2 — the true quadratic
attention cost of prefill, not a policy knob —, θ_frag 0.10 / 0.35, Δt 20 / 200 ms, θ_flow 0.50 /
0.80), every metric normalised to the default run (1.00 = no change). Scenario: Phasor on its
3P + 3D + 2 Mixed layout of the V100-32GB / Qwen2.5-7B cluster, full discrete-event simulation,
bursty arrivals (gamma, CV 3) on two Table 1 workloads, each at a load where the SLO is at
stake: production mix (1024/256, prefill-heavy) at 0.5× the nominal 4P4D rate (attainment about
0.8; at 1× it is 0.2 and every setting drowns) and short/long (128/2048, generation-heavy) at
2.5× (decode KV fills: false OOMs and preemptions occur, so θ_frag has work). ``--quick``:
production mix only, fewer requests. Writes ``sensitivity.csv`` (both workloads, raw and
normalised) and the summary (each row's goodput and P99 E2E, mean over workloads).

    python experiments/sensitivity.py --out results/ [--quick]
"""

from __future__ import annotations

from typing import Any

import _common as c
import pandas as pd

from pdopt.scenario import Scenario
from pdopt.sim import PolicyDecisionError
from pdopt.tune import sensitivity_table
from pdopt.tune._sensitivity import TABLE5_ROWS

NAME = "sensitivity"
RATE_FACTORS = {"production_mix": 0.5, "short_long": 2.5}
"""Workload → multiple of its nominal 4P4D rate."""


def table_for(name: str, cost: Any, quick: bool, seed: int) -> pd.DataFrame:
    """The Table 5 rows for one workload."""
    rate = RATE_FACTORS[name] * c.nominal_rate_per_s(name, cost)
    n = (
        c.requests_for(name, cost, rate, 150, 200)
        if quick
        else c.requests_for(name, cost, rate, 600, 1500)
    )
    wl = c.workload(name, rate, n, seed, cv=3.0)
    scenario = c.system_scenario(c.SYSTEMS["phasor"], wl, c.SLOS[name], cost=cost, seed=seed)
    table = robust_table(scenario)
    table.insert(0, "workload", name)
    table.insert(1, "rate_per_s", rate)
    table.insert(2, "requests", n)
    return table


def robust_table(scenario: Scenario) -> pd.DataFrame:
    """:func:`sensitivity_table`; when a setting makes the policy emit an invalid action, each
    row again on its own, the failing ones kept with their error and no metrics."""
    try:
        table = sensitivity_table(scenario, fidelity="des")
        table["error"] = ""
        return table
    except PolicyDecisionError:
        pass
    parts: list[pd.DataFrame] = []
    for row in TABLE5_ROWS:
        try:
            one = sensitivity_table(scenario, fidelity="des", rows=[row])
            one["error"] = ""
            parts.append(one if not parts else one.iloc[1:])
        except PolicyDecisionError as exc:
            parts.append(
                pd.DataFrame([{"parameter": row[0], "setting": row[1], "error": str(exc)}])
            )
    return pd.concat(parts, ignore_index=True)


def summarise(table: pd.DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    changed = table[table["parameter"] != "default"]
    for (param, setting), grp in changed.groupby(["parameter", "setting"], sort=False):
        for metric, label in (("goodput_rps_norm", "goodput"), ("e2e_p99_s_norm", "P99 E2E")):
            rows.append(
                {
                    "experiment": "Table 5 sensitivity",
                    "quantity": f"{label} with {param} = {setting} / default",
                    "pdopt_value": float(grp[metric].mean()),
                    "unit": "ratio",
                    "detail": ", ".join(
                        f"{w}: {v:.3f}" if not err else f"{w}: failed ({err})"
                        for w, v, err in zip(
                            grp["workload"], grp[metric], grp["error"].fillna(""), strict=True
                        )
                    ),
                }
            )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME)
    timer = c.Timer()
    cost = c.v100_cost_model()
    workloads = tuple(RATE_FACTORS)[:1] if args.quick else tuple(RATE_FACTORS)
    table = pd.concat(
        [table_for(w, cost, args.quick, args.seed) for w in workloads], ignore_index=True
    )
    c.save_csv(table, args.out, NAME)
    c.save_summary(summarise(table), args.out, NAME)
    cols = ["workload", "parameter", "setting", "goodput_rps_norm", "e2e_p99_s_norm"]
    print(table[cols].round(3).to_string(index=False))
    print(f"{NAME}: {len(table)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
