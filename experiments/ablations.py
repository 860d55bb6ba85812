"""Phasor Table 2: ablations, normalised to DistServe, on both of the paper's models.

Phasor and its ablations (flags of the one ``phasor`` policy: ``phi_routing=False`` routes
prefill by queue length, ``defrag=False`` drops the meso loop, ``mixed_pool=False`` freezes the
Mixed pool), DistServe and Splitwise, all from the same 4P4D split (:data:`_common.SYSTEMS`), on
Qwen2.5-7B and Llama-3-8B (8 × V100-32GB, :mod:`_phasor`). The table's two halves:

* **latency**: P99 TTFT on Summarization (L-S) and P99 end-to-end latency on Code Generation (S-L)
  and the production mix, at :data:`LATENCY_RATE` req/s for :data:`DURATION_S` s of arrivals
  (the paper does not say at which rate; all requests served to the end);
* **capacity**: the closed-loop SLO-constrained capacity of :func:`_phasor.capacity` on Code
  Generation, Summarization and the production mix.

Every value is divided by DistServe's on the same model and column. Writes ``ablations_raw.csv``,
``ablations.csv`` (normalised, the paper's layout), ``ablations.png`` and the summary.

    python experiments/ablations.py --out results/ [--quick] [--traces DIR]
        [--cost-model roofline|phasor] [--burstgpt CSV]
"""

from __future__ import annotations

from typing import Any

import _common as c
import _phasor as ph
import numpy as np
import pandas as pd

NAME = "ablations"
DEFAULT_SYSTEMS = (
    "splitwise",
    "distserve",
    "phasor",
    "phasor_no_phi",
    "phasor_no_mixed",
    "phasor_no_defrag",
)
BASELINE = "distserve"
CAPACITY_EVALUATIONS = 7
"""Simulations per capacity search (from :data:`_phasor.START_CLIENTS`, near each knee): 36
searches make this the longest Phasor script."""
LATENCY_RATE = 20.0
DURATION_S, QUICK_DURATION_S = 60.0, 8.0
LATENCY_COLUMNS = (
    ("phasor_l_s", "ttft_p99_s", "Summ. (TTFT)"),
    ("phasor_s_l", "e2e_p99_s", "Code (Total)"),
    ("phasor_mix", "e2e_p99_s", "Prod. Mix (Total)"),
)
CAPACITY_COLUMNS = (
    ("phasor_s_l", "Code Gen."),
    ("phasor_l_s", "Summ."),
    ("phasor_mix", "Prod. Mix"),
)


def raw_table(args: Any, source: ph.MixSource) -> pd.DataFrame:
    """One row per model × system × column: the raw value (s or clients) or its error."""
    models = ph.MODELS[:1] if args.quick else ph.MODELS
    lat_cols = LATENCY_COLUMNS[2:] if args.quick else LATENCY_COLUMNS
    cap_cols = () if args.quick else CAPACITY_COLUMNS
    duration = QUICK_DURATION_S if args.quick else DURATION_S
    latency: list[tuple[dict[str, Any], Any]] = []
    capacity: list[tuple[dict[str, Any], tuple[Any, ...]]] = []
    for model in models:
        cost = ph.cost_model(args.cost_model, model)
        for name, metric, column in lat_cols:
            wl = ph.workload(name, LATENCY_RATE, duration, args.seed, source)
            for label in args.systems:
                scenario = c.system_scenario(
                    c.SYSTEMS[label],
                    wl,
                    ph.slo(name),
                    cost=cost,
                    testbed=ph.testbed(model),
                    seed=args.seed,
                )
                row = {"model": model, "system": label, "column": column, "kind": "latency"}
                latency.append(({**row, "metric": metric}, scenario))
        for name, column in cap_cols:
            for label in args.systems:
                row = {"model": model, "system": label, "column": column, "kind": "capacity"}
                job = (label, name, cost, args.seed, args.quick, source, model)
                capacity.append(({**row, "metric": "max_clients"}, job))
    # every simulation and capacity search is independent: one grid each (serial or Dask)
    rows: list[dict[str, Any]] = []
    ran = c.map_runs(ph.run_metrics, [scenario for _, scenario in latency], args)
    for (row, _), (m, error) in zip(latency, ran, strict=True):
        value = float(m[row["metric"]]) if m is not None else np.nan
        rows.append({**row, "value": value, "error": error})
    found = c.map_runs(_capacity, [job for _, job in capacity], args)
    for (row, _), r in zip(capacity, found, strict=True):
        rows.append({**row, "value": float(r["max_clients"]), "error": r["error"]})
    # per model, its latency columns then its capacity columns (stable: the grid's order)
    rows.sort(key=lambda r: (models.index(r["model"]), r["kind"] == "capacity"))
    return pd.DataFrame(rows)


def _capacity(job: tuple[Any, ...]) -> dict[str, Any]:
    """One capacity search of the grid: ``(system, workload, cost, seed, quick, source,
    model)`` (:func:`_phasor.capacity`)."""
    label, name, cost, seed, quick, source, model = job
    return ph.capacity(
        c.SYSTEMS[label],
        name,
        cost,
        seed=seed,
        quick=quick,
        source=source,
        model=model,
        max_evaluations=CAPACITY_EVALUATIONS,
    )


def normalise(raw: pd.DataFrame) -> pd.DataFrame:
    """Each value over DistServe's on the same model and column (the paper's layout)."""
    base = raw[raw["system"] == BASELINE].set_index(["model", "column"])["value"]
    keys = pd.MultiIndex.from_frame(raw[["model", "column"]])
    norm = raw.assign(norm=raw["value"].to_numpy() / base.reindex(keys).to_numpy())
    return norm.pivot_table(
        index=["model", "system"], columns="column", values="norm", sort=False
    ).reset_index()


def plot(norm: pd.DataFrame) -> Any:
    columns = [col for col in norm.columns if col not in ("model", "system")]
    fig, axes = c.new_figure(len(columns), width_in=3.2)
    for ax, col in zip(axes, columns, strict=True):
        norm.pivot(index="system", columns="model", values=col).plot.bar(ax=ax, rot=60)
        ax.axhline(1.0, c="k", ls=":")
        ax.set_title(f"{col} / {BASELINE}", fontsize=9)
        ax.legend(fontsize=6)
    return fig


def summarise(raw: pd.DataFrame, norm: pd.DataFrame, stated: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    kinds = dict(zip(raw["column"], raw["kind"], strict=False))
    for _, r in norm.iterrows():
        if r["system"] == BASELINE:
            continue
        for col, kind in kinds.items():
            what = "P99" if kind == "latency" else "capacity"
            mine = raw[(raw["model"] == r["model"]) & (raw["column"] == col)].set_index("system")
            err = mine.loc[r["system"], "error"]
            rows.append(
                {
                    "experiment": "Table 2 ablations",
                    "quantity": f"{r['model']} {col} {what} {r['system']}/{BASELINE}",
                    "pdopt_value": float(r[col]),
                    "unit": "ratio",
                    "detail": f"{mine.loc[r['system'], 'value']:.4g} vs "
                    f"{mine.loc[BASELINE, 'value']:.4g}"
                    + (f"; failed: {err}" if isinstance(err, str) and err else "")
                    + f"; {stated}",
                }
            )
    return rows


def main() -> None:
    args = ph.parse_args(__doc__ or NAME, DEFAULT_SYSTEMS)
    if BASELINE not in args.systems:
        args.systems.append(BASELINE)
    timer = c.Timer()
    source = ph.mix_source(args)
    raw = raw_table(args, source)
    norm = normalise(raw)
    c.save_csv(raw, args.out, f"{NAME}_raw")
    c.save_csv(norm, args.out, NAME)
    c.save_figure(plot(norm), args.out, NAME)
    stated = f"{ph.stated(args, source)}; latency at {LATENCY_RATE:g} req/s"
    c.save_summary(summarise(raw, norm, stated), args.out, NAME)
    print(norm.round(3).to_string(index=False))
    print(f"{NAME}: {len(raw)} values in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
