"""EcoServe: goodput at P50/P90/P99 SLO attainment and strict-TPOT directions (V100 testbed).

**Goodput.** For each system (EcoServe, vLLM, Sarathi, DistServe, Mooncake, and ``ecoserve_min``:
the paper's algorithm with C2 on the minimum saved TPOT; ``ecoserve_pdopt``: EcoServe with every
earlier pdopt departure, ``experiments/_common.ECOSERVE_PDOPT_FLAGS``; the colocated ones on 8 mixed
instances, the disaggregated ones on 4P4D) and each data-set-like workload (Alpaca, ShareGPT,
LongBench; lognormal archetypes), SLO attainment (TTFT and TPOT both met) is simulated on a grid of
Poisson rates from 0.2× the nominal 4P4D rate upwards. Each run has enough requests for its arrivals
to span four unloaded request lifetimes or 20 s, whichever is longer (300 to 3000 requests; 600 to
6000 before issue 16, halved to keep the script within a few minutes), so an overload shows as a
growing queue. The grid stops at the first rate whose attainment is below the lowest target (0.5:
nothing above it changes any goodput) under both pdopt's and EcoServe's TTFT/TPOT and grows by ×1.5
steps (at most three) while even its top still meets 0.5; a goodput equal to the grid's top is a
lower bound.
Every curve is run with :data:`SEEDS` seeds (``--seed``, ``--seed + 1``, …; 2 with ``--quick``).
The goodput at a target (0.5, 0.9, 0.99) is pdopt's one goodput rule
(:func:`pdopt.capacity.grid_crossing` per seed, :func:`pdopt.capacity.combine_crossings` over
seeds, the rule ``pdopt capacity`` combines its seeds by): per seed, the largest grid rate whose
attainment meets the target, linearly interpolated towards the next rate; over seeds, the mean
and 95% Student-t interval. It is "below the grid" only when every seed misses the target at
every rate (never 0 because one seed's first rate missed), and a lower bound when a seed's top
rate still meets it. A grid, not a bisection, so all three targets share the same runs.
Writes ``ecoserve_attainment.csv`` (every run), ``ecoserve_goodput.csv``,
``ecoserve_goodput_paper_timing.csv`` (the same under EcoServe's TTFT/TPOT, §4.4) and
``ecoserve_goodput.png``.

**Strict TPOT (issue 5's direction).** The same goodput for EcoServe, vLLM and Sarathi on the
Alpaca- and LongBench-like workloads with the TPOT SLO halved to 50 ms (≈ 2× the V100's unloaded
decode step of 23 ms): EcoServe should win on long inputs and lose on short ones. Writes
``ecoserve_strict.csv``.

**Static scaling** (Fig. 9) runs on the paper's testbed in ``ecoserve_testbed.py``.

    python experiments/ecoserve_goodput.py --out results/ [--quick]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import _common as c
import numpy as np
import pandas as pd

from pdopt.capacity import combine_crossings, grid_crossing
from pdopt.cluster import Slo

NAME = "ecoserve_goodput"
DEFAULT_SYSTEMS = (
    "ecoserve", "vllm", "sarathi", "distserve", "mooncake", "ecoserve_min", "ecoserve_pdopt",
)  # fmt: skip
STRICT_SYSTEMS = ("ecoserve", "vllm", "sarathi", "ecoserve_min", "ecoserve_pdopt")
STRICT_WORKLOADS = ("longbench", "alpaca")
STRICT_TPOT_S = 0.05
TARGETS = (0.5, 0.9, 0.99)
RATE_FACTORS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0, 2.4)
QUICK_RATE_FACTORS = (0.4, 1.0, 2.0)
GROWTH, MAX_GROWTH_STEPS = 1.5, 3
SEEDS, QUICK_SEEDS = 3, 2
"""Seeds per attainment curve (default, ``--quick``)."""
MIN_SPAN_S = 20.0
"""Arrivals of a default-size run span at least this long (or 4 request lifetimes), so an
overload builds a queue instead of fitting in the first batches."""


def miss_shares(res: Any, slo: Slo) -> dict[str, float]:
    """Share of a run's requests missing the TTFT SLO and the TPOT SLO (pdopt's timing; a
    request may miss both; rejected ones count as both): what a goodput gap is made of."""
    req = res.requests
    n = max(len(req), 1)
    done = req["status"] == "finished"
    ttft = ~done | (req["ttft_s"] > slo.ttft_s)
    tpot = ~done | (req["tpot_s"] > slo.tpot_s)
    return {"ttft_miss_share": float(ttft.sum() / n), "tpot_miss_share": float(tpot.sum() / n)}


def seeds_of(args: Any) -> tuple[int, ...]:
    """The seeds every curve runs with: ``args.seed`` and the next ones."""
    k = QUICK_SEEDS if args.quick else SEEDS
    return tuple(args.seed + i for i in range(k))


def attainment_curve(
    system: c.System,
    name: str,
    factors: tuple[float, ...],
    sizes: tuple[int, int],
    seeds: int | Sequence[int],
    cost: Any,
    slo: Slo | None = None,
    testbed: c.Testbed = c.V100,
    make_workload: Any = c.workload,
    nominal_layout: tuple[int, int] = (4, 4),
) -> pd.DataFrame:
    """Attainment on the rate grid ``factors`` × nominal for one system and workload.

    Stops at the first rate below the lowest target; extends the grid by ×1.5 (at most
    :data:`MAX_GROWTH_STEPS` times) while the top rate still meets it. ``sizes`` is the
    (floor, cap) of the request count per run. ``cost`` must be ``testbed``'s cost model.
    ``make_workload(name, rate, n, seed)`` draws each run's requests; the grid is placed
    around the nominal rate of ``nominal_layout`` (P, D) instances. Runs once per seed of
    ``seeds`` (each its own grid; column ``seed``).
    """
    if not isinstance(seeds, int):
        return pd.concat(
            [
                attainment_curve(
                    system, name, factors, sizes, seed, cost, slo, testbed, make_workload,
                    nominal_layout,
                )
                for seed in seeds
            ],
            ignore_index=True,
        )  # fmt: skip
    seed = seeds
    slo = slo or c.SLOS[name]
    nominal = c.nominal_rate_per_s(name, cost, *nominal_layout)
    cluster = c.system_cluster(system, cost, testbed)
    grid = list(factors)
    rows: list[dict[str, Any]] = []
    grown = 0
    i = 0
    while i < len(grid):
        rate = grid[i] * nominal
        n = run_requests(name, cost, rate, sizes)
        wl = make_workload(name, rate, n, seed)
        res = c.run_system(system, wl, cost, slo, seed=seed, cluster=cluster)
        m = res.metrics()
        rows.append(
            {
                "system": system.label,
                "workload": name,
                "seed": seed,
                "tpot_slo_s": slo.tpot_s,
                "rate_per_s": rate,
                "requests": n,
                "slo_attainment": m["slo_attainment"],
                "slo_attainment_first_token": m["slo_attainment_first_token"],
                "slo_attainment_decode_start": m["slo_attainment_decode_start"],
                **miss_shares(res, slo),
                "goodput_rps": m["goodput_rps"],
                "ttft_p99_s": m["ttft_p99_s"],
                "tpot_p99_s": m["tpot_p99_s"],
            }
        )
        i += 1
        # both timings' curves must have crossed before the grid stops (issue 36)
        if max(m["slo_attainment"], m["slo_attainment_decode_start"]) < min(TARGETS):
            break
        if i == len(grid) and grown < MAX_GROWTH_STEPS:
            grid.append(grid[-1] * GROWTH)
            grown += 1
    return pd.DataFrame(rows)


def _curve(job: tuple[Any, ...]) -> pd.DataFrame:
    """:func:`attainment_curve` of ``(system name, workload, factors, sizes, seed, cost)``."""
    system, name, factors, sizes, seed, cost = job
    return attainment_curve(c.SYSTEMS[system], name, factors, sizes, seed, cost)


def goodput_table(
    curves: pd.DataFrame, keys: list[str], column: str = "slo_attainment"
) -> pd.DataFrame:
    """Goodput per ``keys`` group at each of :data:`TARGETS` from ``column`` (pdopt's one rule,
    see the module docstring): ``goodput_pXX_rps`` (mean over seeds; NaN below the grid),
    ``goodput_pXX_ci_low_rps`` / ``_ci_high_rps``, ``goodput_pXX_status`` and
    ``goodput_pXX_text`` (the estimate in words)."""
    rows = []
    for key, grp in curves.groupby(keys, sort=False):
        row: dict[str, Any] = dict(
            zip(keys, key if isinstance(key, tuple) else (key,), strict=True)
        )
        by_seed = list(grp.groupby("seed", sort=True)) if "seed" in grp else [(0, grp)]
        for t in TARGETS:
            found = [
                grid_crossing(g["rate_per_s"].to_numpy(), g[column].to_numpy(), t)
                for _, g in by_seed
            ]
            est = combine_crossings(
                [st for st, _ in found], [r for _, r in found], [int(sd) for sd, _ in by_seed]
            )
            name = f"goodput_p{round(t * 100)}"
            row[f"{name}_rps"] = est.max_rate_per_s
            row[f"{name}_ci_low_rps"] = est.ci_low_per_s
            row[f"{name}_ci_high_rps"] = est.ci_high_per_s
            row[f"{name}_status"] = est.status
            row[f"{name}_text"] = est.describe()
        rows.append(row)
    return pd.DataFrame(rows)


def run_sizes(quick: bool) -> tuple[int, int]:
    """(floor, cap) of requests per run."""
    return (150, 300) if quick else (300, 3000)


def run_requests(name: str, cost: Any, rate: float, sizes: tuple[int, int]) -> int:
    """Requests of one run: arrivals spanning 4 unloaded lifetimes or :data:`MIN_SPAN_S`,
    whichever is longer, within ``sizes`` (floor, cap)."""
    floor, cap = sizes
    by_life = c.requests_for(name, cost, rate, floor, cap)
    return int(min(cap, max(by_life, np.ceil(rate * MIN_SPAN_S))))


def strict(args: Any, cost: Any) -> pd.DataFrame:
    """Goodput of EcoServe, vLLM and Sarathi with the TPOT SLO at :data:`STRICT_TPOT_S`."""
    systems = [s for s in STRICT_SYSTEMS if s in args.systems]
    workloads = STRICT_WORKLOADS[:1] if args.quick else STRICT_WORKLOADS
    factors = QUICK_RATE_FACTORS if args.quick else RATE_FACTORS
    # one curve per (workload, system), as the main grid: serially or on --dask
    jobs = [(w, s, factors, run_sizes(args.quick), seeds_of(args), cost)
            for w in workloads for s in systems]  # fmt: skip
    curves = pd.concat(c.map_runs(_strict_curve, jobs, args), ignore_index=True)
    return goodput_table(curves, ["system", "workload"])


def _strict_curve(job: tuple[Any, ...]) -> pd.DataFrame:
    """One system's attainment curve on one workload under the strict TPOT SLO."""
    w, s, factors, sizes, seeds, cost = job
    slo = replace(c.SLOS[w], tpot_s=STRICT_TPOT_S)
    return attainment_curve(c.SYSTEMS[s], w, factors, sizes, seeds, cost, slo)


def plot_goodput(table: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(len(TARGETS), width_in=4.0)
    for ax, t in zip(axes, TARGETS, strict=True):
        col = f"goodput_p{round(t * 100)}_rps"
        table.pivot(index="workload", columns="system", values=col).plot.bar(ax=ax, rot=0)
        ax.set_title(f"goodput at P{round(t * 100)} attainment", fontsize=9)
        ax.set_ylabel("req/s")
        ax.legend(fontsize=6)
    return fig


def _row(experiment: str, quantity: str, value: float, detail: str) -> dict[str, Any]:
    return {
        "experiment": experiment,
        "quantity": quantity,
        "pdopt_value": value,
        "unit": "ratio",
        "detail": detail,
    }


TOPS = ("ecoserve", "ecoserve_min", "ecoserve_pdopt")
"""The EcoServe variants whose goodput is set over each baseline's."""


def _pairs(columns: Any) -> list[tuple[str, str]]:
    """(EcoServe variant, other system) pairs among ``columns``: each variant over each
    baseline, and the paper's algorithm over each of its ablations (``ecoserve_min``: C2 with
    the minimum saved TPOT; ``ecoserve_pdopt``: every earlier departure)."""
    cols = list(columns)
    pairs = [(t, b) for t in TOPS if t in cols for b in cols if b not in TOPS]
    if TOPS[0] in cols:
        pairs += [(TOPS[0], t) for t in TOPS[1:] if t in cols]
    return pairs


def goodput_rows(
    table: pd.DataFrame, experiment: str = "EcoServe goodput", suffix: str = ""
) -> list[dict[str, Any]]:
    """Each EcoServe variant's P90 goodput over each baseline's, mean over the workloads where
    both are > 0 (``suffix`` is appended to each quantity, e.g. the testbed)."""
    rows: list[dict[str, Any]] = []
    p90 = table.pivot(index="workload", columns="system", values="goodput_p90_rps")
    text = table.pivot(index="workload", columns="system", values="goodput_p90_text")
    for top, base in _pairs(p90.columns):
        ratio = p90[top] / p90[base].replace(0.0, np.nan)
        detail = "; ".join(f"{w}: {text.loc[w, top]} / {text.loc[w, base]}" for w in p90.index)
        if ratio.notna().any():
            rows.append(
                _row(
                    experiment,
                    f"goodput at P90, {top}/{base} (mean over workloads){suffix}",
                    float(ratio.mean()),
                    detail,
                )
            )
    return rows


def strict_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Each EcoServe variant's P90 goodput over vLLM's and Sarathi's per workload under the
    strict TPOT."""
    rows: list[dict[str, Any]] = []
    p90 = table.pivot(index="workload", columns="system", values="goodput_p90_rps")
    text = table.pivot(index="workload", columns="system", values="goodput_p90_text")
    for w in p90.index:
        for top, base in _pairs(p90.columns):
            eco, ref = float(p90.loc[w, top]), float(p90.loc[w, base])
            if not ref > 0.0 or math.isnan(eco):
                continue  # no ratio with a goodput below the grid; the CSV keeps both
            rows.append(
                _row(
                    "EcoServe strict TPOT",
                    f"goodput at P90 with TPOT {STRICT_TPOT_S * 1e3:.0f} ms, {w}, {top}/{base}",
                    eco / ref,
                    f"{top} {text.loc[w, top]}, {base} {text.loc[w, base]}",
                )
            )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME, DEFAULT_SYSTEMS)
    timer = c.Timer()
    cost = c.v100_cost_model()
    workloads = ("sharegpt",) if args.quick else c.ECOSERVE_WORKLOADS
    factors = QUICK_RATE_FACTORS if args.quick else RATE_FACTORS
    sizes = run_sizes(args.quick)
    # one curve per (workload, system, seed), each independent: serially or on --dask
    jobs = [(s, w, factors, sizes, seed, cost)
            for w in workloads for s in args.systems for seed in seeds_of(args)]  # fmt: skip
    curves = pd.concat(c.map_runs(_curve, jobs, args), ignore_index=True)
    strict_table = strict(args, cost) if set(TOPS) & set(args.systems) else None
    table = goodput_table(curves, ["system", "workload"])
    c.save_csv(curves, args.out, "ecoserve_attainment")
    c.save_csv(table, args.out, NAME)
    c.save_figure(plot_goodput(table), args.out, NAME)
    rows = goodput_rows(table)
    # the same runs under the paper's TTFT/TPOT (EcoServe §4.4: the wait before decoding counts
    # in TTFT, TPOT starts after it)
    paper = goodput_table(curves, ["system", "workload"], "slo_attainment_decode_start")
    c.save_csv(paper, args.out, "ecoserve_goodput_paper_timing")
    rows += goodput_rows(paper, suffix=", paper's TTFT/TPOT")
    if strict_table is not None:
        c.save_csv(strict_table, args.out, "ecoserve_strict")
        rows += strict_rows(strict_table)
    c.save_summary(rows, args.out, NAME)
    print(f"{NAME}: {len(curves)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
