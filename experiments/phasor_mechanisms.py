"""Phasor's mechanisms (issue 4), each on the V100-32GB / Qwen2.5-7B cluster of ``_common``.

1. **Queue divergence** (Fig. 7, Appendix A) — a burst of mixed-length prompts (256–2048 tokens)
   on 4P4D: the memory-centric router (most free KV) against Phasor's argmax Φ_T. Divergence is
   Σ_t max_w queue / Σ_t mean_w queue over ticks whose mean prefill queue is >= 1 (issue 4: ≥ 2
   for memory-centric, ≤ 1.3 for Φ). Appendix A's figures (busiest worker's peak and mean queue,
   the other workers', Φ's) come from the shock–recovery run of part 2, both routers on 4P4D.
2. **Pipeline starvation** (Fig. 1, §2.1) — the paper's shock–recovery: 5 → 25 → 5 req/s with the
   shock on [90, 120) s, gamma inter-arrivals with CV 3 inside each phase, production-mix lengths
   (``phasor_mix``, mean 1024/256) and its Table 3 SLO: prefill latency (arrival → prefill end)
   and the decode running batch over time, DistServe 4P4D against Phasor from the same split
   (4P + 2D + 2 Mixed at home on decode).
3. **Defragmentation** — bursty workloads (CV 3) that fill decode KV: Dialog (``phasor_m_m``) at
   1.5× the nominal rate on 4P4D, 1024/1024 with 10% 6144/256 long prompts on 6P2D, and Code
   Generation (``phasor_s_l``) at 1.5× on 4P4D: Phasor with and without the meso loop (Mixed
   pool off in both, to isolate it): cluster fragmentation %, false OOMs, preemptions, decode
   concurrency and admission wait, migrations and their overhead.
4. **Mixed pool** — P99 TTFT/E2E on the shock–recovery workload, Phasor with and without the
   Mixed pool on the same 4P + 2D + 2M cluster (and DistServe 4P4D), over two seeds.

Cost model: the roofline of :mod:`_phasor` (its module doc says why).

Writes ``phasor_mechanisms_<part>.csv`` tables, ``phasor_mechanisms_<part>_series.csv`` time
series, ``phasor_mechanisms_<part>.png`` figures and ``phasor_mechanisms_summary.csv``. Each
part's runs (its seeds × systems, or scenarios × variants) are independent tasks of
:func:`_common.map_runs`: serially, or on a Dask cluster with ``--dask``, with the same CSVs.

    python experiments/phasor_mechanisms.py --out results/ [--quick] [--seed 0] [--dask [ADDRESS]]
"""

from __future__ import annotations

import functools
import math
from typing import Any

import _common as c
import _phasor as ph
import numpy as np
import pandas as pd

from pdopt.cluster import Slo
from pdopt.costmodel import CostModel
from pdopt.scenario import Scenario
from pdopt.sim import SimResult
from pdopt.workload import RateSchedule, Workload, gamma_arrivals, shock_recovery_schedule

NAME = "phasor_mechanisms"
SHOCK_SLO = ph.slo("phasor_mix")  # Table 3, BurstGPT: 0.40 s / 0.20 s


def bursty_schedule_arrivals(schedule: RateSchedule, cv: float, seed: int) -> np.ndarray:
    """Arrivals following ``schedule``'s rate with gamma inter-arrival CV ``cv`` in each phase.

    Time rescaling: a unit-rate gamma renewal process (shape 1/cv², scale cv²) in operational
    time Λ, mapped back through the inverse of the cumulative rate Λ(t) = ∫ rate.
    """
    rng = np.random.default_rng(seed)
    bounds = np.array([*schedule.start_s, schedule.end_s])
    cum = np.concatenate([[0.0], np.cumsum(np.array(schedule.rate_per_s) * np.diff(bounds))])
    total = float(cum[-1])
    gaps = rng.gamma(1.0 / cv**2, cv**2, size=int(total * 1.5) + 100)
    ops = np.cumsum(gaps)
    return np.interp(ops[ops < total], cum, bounds)


def _run(
    wl: Workload, cost: CostModel, layout: tuple[int, int, int], policy: str, slo: Slo, **flags: Any
) -> SimResult:
    cluster = c.build_cluster(cost, *layout, mixed_role="decode")
    return Scenario(wl, cluster, policy, slo, policy_flags=flags).run()


# -- 1. queue divergence ------------------------------------------------------------------------


def divergence(result: SimResult) -> float:
    """Σ_t max_w queue / Σ_t mean_w queue over ticks whose mean prefill queue is >= 1."""
    q = _prefill_queues(result)
    mean = q.mean(axis=1)
    busy = mean >= 1
    return float(q.max(axis=1)[busy].sum() / mean[busy].sum()) if busy.any() else 1.0


def _prefill_queues(result: SimResult) -> pd.DataFrame:
    ts = result.timeseries
    return ts[ts["role"] == "prefill"].pivot(index="t_s", columns="worker", values="queue_len")


def burst_workload(seed: int, quick: bool) -> Workload:
    """Base traffic over 8 s plus a burst of 120 prompts in [2, 4) s (30/60 in ``quick``)."""
    rng = np.random.default_rng(seed)
    n_base, n_burst = (20, 60) if quick else (40, 120)
    arrivals = np.sort(np.concatenate([rng.uniform(0, 8, n_base), rng.uniform(2, 4, n_burst)]))
    n = len(arrivals)
    return Workload(arrivals, rng.integers(256, 2048, n), np.full(n, 16), name="burst")


DIVERGENCE_SYSTEMS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("memory_centric", {}),
    ("phasor", {}),
)


def divergence_run(
    job: tuple[int, Workload, str, dict[str, Any], bool], cost: CostModel
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """One run of the burst (``job``: seed, workload, policy, flags, keep the series): its row
    and, when kept, its prefill queues over time (:func:`_common.map_runs`' unit)."""
    seed, wl, policy, flags, keep_series = job
    res = _run(wl, cost, (4, 4, 0), policy, SHOCK_SLO, **flags)
    q = _prefill_queues(res)
    row = {
        "system": policy,
        "seed": seed,
        "divergence": divergence(res),
        "max_queue": int(q.to_numpy().max()),
        "ttft_p99_s": res.metrics()["ttft_p99_s"],
    }
    return row, q.assign(system=policy).reset_index() if keep_series else None


def queue_divergence(args: Any, cost: CostModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    seeds = [args.seed] if args.quick else [args.seed + k for k in range(2)]
    jobs = []
    for seed in seeds:
        wl = burst_workload(seed, args.quick)
        jobs += [
            (seed, wl, policy, flags, seed == seeds[0]) for policy, flags in DIVERGENCE_SYSTEMS
        ]
    # every (seed, system) run is an independent task (--dask); results in the jobs' order
    ran = c.map_runs(functools.partial(divergence_run, cost=cost), jobs, args)
    rows = [row for row, _ in ran]
    series = [s for _, s in ran if s is not None]
    return pd.DataFrame(rows), pd.concat(series, ignore_index=True)


def plot_divergence(series: pd.DataFrame, table: pd.DataFrame, out: Any) -> None:
    fig, axes = c.new_figure(2)
    for ax, system in zip(axes, ("memory_centric", "phasor"), strict=True):
        part = series[series["system"] == system]
        for worker in [k for k in part.columns if k.startswith("p")]:
            ax.plot(part["t_s"], part[worker], label=worker)
        d = table[table["system"] == system]["divergence"].iloc[0]
        ax.set_title(f"{system}: max/mean queue {d:.2f}")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("prefill queue (requests)")
        ax.legend(fontsize=7)
    c.save_figure(fig, out, f"{NAME}_divergence")


# -- 2 and 4. shock-recovery: pipeline starvation and the Mixed pool ----------------------------


def shock_workload(seed: int, quick: bool) -> tuple[Workload, RateSchedule]:
    """The paper's shock (§2.1): 5 → 25 req/s on [90, 120) s, back to 5 until 210 s
    (``--quick``: [20, 35) of 60 s); production-mix lengths."""
    sched = (
        shock_recovery_schedule(5.0, 25.0, 20.0, 35.0, 60.0)
        if quick
        else shock_recovery_schedule(5.0, 25.0, 90.0, 120.0, 210.0)
    )
    arrivals = bursty_schedule_arrivals(sched, 3.0, seed)
    lengths = c.workload("phasor_mix", 1.0, len(arrivals), seed)
    wl = Workload(arrivals, lengths.input_tokens, lengths.output_tokens, name="shock_recovery")
    return wl, sched


SHOCK_SYSTEMS: tuple[tuple[str, tuple[int, int, int], str, dict[str, Any]], ...] = (
    ("distserve", (4, 4, 0), "distserve", {}),
    ("memory_centric", (4, 4, 0), "memory_centric", {}),
    ("phasor", (4, 2, 2), "phasor", {}),
    ("phasor_no_mixed", (4, 2, 2), "phasor", {"mixed_pool": False}),
)


def appendix_a(res: SimResult, sched: RateSchedule) -> dict[str, float]:
    """Appendix A's prefill-queue figures of one run: the busiest of the initial prefill workers
    (largest mean queue in the shock) and the others, peak over the run and mean over the shock
    window."""
    q = _prefill_queues(res)
    # the initial prefill workers only (a promoted Mixed member has no queue before its move)
    q = q[[w for w in q.columns if w.startswith("p")]]
    shock = q[(q.index >= sched.start_s[1]) & (q.index < sched.start_s[2])]
    busiest = shock.mean().idxmax()
    others = [w for w in q.columns if w != busiest]
    return {
        "queue_busiest_peak": float(q[busiest].max()),
        "queue_others_peak": float(q[others].max().mean()),
        "queue_busiest_shock_mean": float(shock[busiest].mean()),
        "queue_others_shock_mean": float(np.nanmean(shock[others].to_numpy())),
        "queue_all_shock_mean": float(np.nanmean(shock.to_numpy())),
    }


def shock_series(res: SimResult, bin_s: float) -> pd.DataFrame:
    """Per ``bin_s``: mean prefill latency of requests arriving then, mean decode running batch
    (Σ over decode-role workers) and mean number of prefill-role workers."""
    req = res.requests
    latency = (
        (req["prefill_end_s"] - req["arrival_s"])
        .groupby((req["arrival_s"] // bin_s) * bin_s)
        .mean()
    )
    ts = res.timeseries
    dec = ts[ts["role"] == "decode"].groupby("t_s")["running"].sum()
    n_prefill = ts[ts["role"] == "prefill"].groupby("t_s")["worker"].count()
    frame = pd.DataFrame(
        {
            "prefill_latency_s": latency,
            "decode_running": dec.groupby((dec.index // bin_s) * bin_s).mean(),
            "prefill_workers": n_prefill.groupby((n_prefill.index // bin_s) * bin_s).mean(),
        }
    )
    return frame.rename_axis("t_s").reset_index()


def shock_row(label: str, seed: int, res: SimResult, sched: RateSchedule) -> dict[str, Any]:
    m = res.metrics()
    s = shock_series(res, 5.0)
    start, end = sched.start_s[1], sched.start_s[2]
    base = s[s["t_s"] < start]
    shock = s[(s["t_s"] >= start) & (s["t_s"] < end)]
    return {
        "system": label,
        "seed": seed,
        "ttft_p50_s": m["ttft_p50_s"],
        "ttft_p99_s": m["ttft_p99_s"],
        "e2e_p99_s": m["e2e_p99_s"],
        "tpot_p99_s": m["tpot_p99_s"],
        "slo_attainment": m["slo_attainment"],
        "prefill_latency_base_s": float(base["prefill_latency_s"].mean()),
        "prefill_latency_peak_s": float(s["prefill_latency_s"].max()),
        "decode_running_base": float(base["decode_running"].mean()),
        "decode_running_shock": float(shock["decode_running"].mean()),
        "pool_moves": int((res.events["kind"] == "pool_move").sum()),
        **appendix_a(res, sched),
    }


def shock_run(
    job: tuple[int, Workload, RateSchedule, str, tuple[int, int, int], str, dict[str, Any], bool],
    cost: CostModel,
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """One system on the shock-recovery workload (``job``: seed, workload, schedule, label,
    layout, policy, flags, keep the series): its row and, when kept, its 1-s series
    (:func:`_common.map_runs`' unit)."""
    seed, wl, sched, label, layout, policy, flags, keep_series = job
    res = _run(wl, cost, layout, policy, SHOCK_SLO, **flags)
    row = shock_row(label, seed, res, sched)
    return row, shock_series(res, 1.0).assign(system=label) if keep_series else None


def shock_recovery(args: Any, cost: CostModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    seeds = [args.seed] if args.quick else [args.seed + k for k in range(2)]
    jobs = []
    for seed in seeds:
        wl, sched = shock_workload(seed, args.quick)
        jobs += [
            (seed, wl, sched, label, layout, policy, flags, seed == seeds[0])
            for label, layout, policy, flags in SHOCK_SYSTEMS
        ]
    # every (seed, system) run is an independent task (--dask); results in the jobs' order
    ran = c.map_runs(functools.partial(shock_run, cost=cost), jobs, args)
    rows = [row for row, _ in ran]
    series = [s for _, s in ran if s is not None]
    return pd.DataFrame(rows), pd.concat(series, ignore_index=True)


def plot_shock(series: pd.DataFrame, out: Any) -> None:
    fig, axes = c.new_figure(2, width_in=5.0)
    for label in ("distserve", "phasor"):
        part = series[series["system"] == label]
        axes[0].plot(part["t_s"], part["prefill_latency_s"], label=label)
        axes[1].plot(part["t_s"], part["decode_running"], label=label)
    axes[0].set_ylabel("prefill latency (s), by arrival second")
    axes[1].set_ylabel("decode running batch (requests, all decode workers)")
    for ax in axes:
        ax.set_xlabel("time (s)")
        ax.legend()
    c.save_figure(fig, out, f"{NAME}_starvation")


def plot_mixed(table: pd.DataFrame, out: Any) -> None:
    fig, axes = c.new_figure(2)
    means = table.groupby("system")[["ttft_p99_s", "e2e_p99_s"]].mean()
    for ax, col in zip(axes, ("ttft_p99_s", "e2e_p99_s"), strict=True):
        ax.bar(means.index, means[col])
        ax.set_ylabel(f"{col} (mean over seeds)")
        ax.tick_params(axis="x", labelrotation=20)
    c.save_figure(fig, out, f"{NAME}_mixed_pool")


# -- 3. defragmentation -------------------------------------------------------------------------


DEFRAG_SCENARIOS = ("phasor_m_m", "heavy_mix", "phasor_s_l")


def defrag_workload(name: str, cost: CostModel, seed: int, quick: bool) -> Workload:
    """``phasor_m_m``: Dialog lengths at 1.5× the nominal 4P4D rate, CV 3 (4P4D).
    ``heavy_mix``: 90% 1024/1024 and 10% 6144/256 tokens at 8 req/s, CV 3 (6P2D): long prompts
    wait at the head of decode queues whose free KV is scattered.
    ``phasor_s_l``: the generation-heavy case of issue 4, Code Generation lengths at 1.5× the
    nominal 4P4D rate, CV 3 (4P4D): contexts grow until KV runs out and preempted requests come
    back
    with long contexts (3000 requests, so that the decode pool fills)."""
    n = 300 if quick else 1200
    if name in ("phasor_m_m", "phasor_s_l"):
        rate = 1.5 * c.nominal_rate_per_s(name, cost)
        n = n if name == "phasor_m_m" else (800 if quick else 3000)
        return c.workload(name, rate, n, seed, cv=3.0)
    rng = np.random.default_rng(seed)
    arrivals = gamma_arrivals(8.0, 3.0, n_requests=n, seed=seed)
    heavy = rng.random(n) < 0.1
    inputs = np.where(heavy, 6144, 1024)
    outputs = np.where(heavy, 256, 1024)
    return Workload(arrivals, inputs, outputs, name="heavy_mix")


def defrag_row(scenario: str, label: str, res: SimResult) -> dict[str, Any]:
    m = res.metrics()
    frag = c.cluster_fragmentation_series(res)
    ts = res.timeseries
    running = ts[ts["role"] == "decode"].groupby("t_s")["running"].sum()
    req = res.requests
    wait = req["decode_start_s"] - req["transfer_end_s"]
    migrated = req["migrations"] > 0 if "migrations" in req else req["request_id"] < 0
    return {
        "scenario": scenario,
        "system": label,
        "fragmentation_pct": float(frag["fragmentation_pct"].mean()),
        "false_oom": m["false_oom"],
        "preemptions": m["preemptions"],
        "decode_concurrency": float(running.mean()),
        "decode_admission_wait_mean_s": float(wait.mean()),
        "decode_admission_wait_p99_s": float(wait.quantile(0.99)),
        "migrations": m["migrations"],
        "migrations_cancelled": m.get("migrations_cancelled", 0.0),
        "migrated_gb": float(req.get("migrated_bytes", pd.Series([0.0])).sum()) / 1e9,
        "downtime_mean_s": float(req["migration_downtime_s"][migrated].mean())
        if migrated.any()
        else 0.0,
        "tpot_p99_s": m["tpot_p99_s"],
        "e2e_p99_s": m["e2e_p99_s"],
        "makespan_s": m["makespan_s"],
    }


DEFRAG_SYSTEMS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("phasor", {}),
    ("phasor_no_defrag", {"defrag": False}),
)


def defrag_run(
    job: tuple[str, Workload, str, dict[str, Any]], cost: CostModel
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Phasor with or without the meso loop on one defragmentation scenario (``job``: scenario,
    workload, label, flags): its row and its fragmentation series (:func:`_common.map_runs`'
    unit)."""
    scenario, wl, label, flags = job
    slo = ph.slo("phasor_m_m" if scenario == "heavy_mix" else scenario)
    layout = (6, 2, 0) if scenario == "heavy_mix" else (4, 4, 0)
    res = _run(wl, cost, layout, "phasor", slo, mixed_pool=False, **flags)
    series = c.cluster_fragmentation_series(res).assign(scenario=scenario, system=label)
    return defrag_row(scenario, label, res), series


def defragmentation(args: Any, cost: CostModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    jobs = []
    for scenario in DEFRAG_SCENARIOS:
        wl = defrag_workload(scenario, cost, args.seed, args.quick)
        jobs += [(scenario, wl, label, flags) for label, flags in DEFRAG_SYSTEMS]
    # every (scenario, variant) run is an independent task (--dask); results in the jobs' order
    ran = c.map_runs(functools.partial(defrag_run, cost=cost), jobs, args)
    rows = [row for row, _ in ran]
    series = [s for _, s in ran]
    return pd.DataFrame(rows), pd.concat(series, ignore_index=True)


def plot_defrag(series: pd.DataFrame, out: Any) -> None:
    fig, axes = c.new_figure(len(DEFRAG_SCENARIOS), width_in=5.0)
    for ax, scenario in zip(axes, DEFRAG_SCENARIOS, strict=True):
        part = series[series["scenario"] == scenario]
        for label, rows in part.groupby("system"):
            ax.plot(rows["t_s"], rows["fragmentation_pct"], label=str(label), lw=0.6)
        ax.set_title(scenario)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("cluster fragmentation (%)")
        ax.legend()
    c.save_figure(fig, out, f"{NAME}_defrag")


# -- summary and main ---------------------------------------------------------------------------


def summary_rows(
    div: pd.DataFrame, shock: pd.DataFrame, defrag: pd.DataFrame
) -> list[dict[str, Any]]:
    def row(quantity: str, value: float, unit: str, detail: str) -> dict[str, Any]:
        return {
            "experiment": NAME,
            "quantity": quantity,
            "pdopt_value": value,
            "unit": unit,
            "detail": detail,
        }

    d = div.groupby("system")["divergence"].mean()
    s = shock.groupby("system").mean(numeric_only=True)
    f = defrag[defrag["scenario"] == "heavy_mix"].set_index("system")
    g = defrag[defrag["scenario"] == "phasor_s_l"].set_index("system")

    def defrag_ratio(column: str, scenario: pd.DataFrame = g) -> float:
        with_defrag = float(scenario.loc["phasor", column])
        without = float(scenario.loc["phasor_no_defrag", column])
        if with_defrag == without:
            return 1.0  # also 0/0: the meso loop changed nothing
        return with_defrag / without if without > 0 else math.inf

    generation_heavy = [
        row(
            f"{column}_defrag_over_no_defrag_short_long",
            defrag_ratio(column),
            "ratio",
            f"phasor_s_l 128/2048 (generation-heavy); {what}: {g.loc['phasor', column]:.4g} "
            f"with defrag, {g.loc['phasor_no_defrag', column]:.4g} without",
        )
        for column, what in (
            ("fragmentation_pct", "time-averaged fragmentation %"),
            ("false_oom", "false OOMs"),
            ("preemptions", "preemptions"),
            ("decode_admission_wait_p99_s", "decode admission wait P99"),
            ("decode_concurrency", "mean running decode requests"),
        )
    ]
    shock_note = "shock-recovery 5 -> 25 req/s, 4 prefill workers, mean over seeds"
    mc, phi = s.loc["memory_centric"], s.loc["phasor"]
    appendix = [
        row(
            "App. A busiest prefill worker's peak queue, memory_centric",
            mc["queue_busiest_peak"],
            "requests",
            shock_note,
        ),
        row(
            "App. A other prefill workers' peak queue, memory_centric",
            mc["queue_others_peak"],
            "requests",
            shock_note,
        ),
        row(
            "App. A busiest prefill worker's peak queue, phasor",
            phi["queue_busiest_peak"],
            "requests",
            shock_note,
        ),
        row(
            "App. A busiest worker's mean queue in the shock, memory_centric",
            mc["queue_busiest_shock_mean"],
            "requests",
            shock_note,
        ),
        row(
            "App. A other workers' mean queue in the shock, memory_centric",
            mc["queue_others_shock_mean"],
            "requests",
            shock_note,
        ),
        row(
            "App. A mean queue per worker in the shock, phasor",
            phi["queue_all_shock_mean"],
            "requests",
            shock_note,
        ),
        row(
            "§2.1 prefill latency before the shock, distserve",
            s.loc["distserve", "prefill_latency_base_s"] * 1e3,
            "ms",
            shock_note,
        ),
        row(
            "§2.1 decode running batch before the shock, distserve",
            s.loc["distserve", "decode_running_base"],
            "requests",
            shock_note,
        ),
        row(
            "§2.1 decode running batch in the shock, distserve",
            s.loc["distserve", "decode_running_shock"],
            "requests",
            shock_note,
        ),
    ]
    return [
        *appendix,
        row("queue_divergence_memory_centric", d["memory_centric"], "max/mean", "paper: >= 2"),
        row("queue_divergence_phi", d["phasor"], "max/mean", "paper: <= 1.3"),
        row(
            "prefill_latency_rise_distserve",
            s.loc["distserve", "prefill_latency_peak_s"]
            / s.loc["distserve", "prefill_latency_base_s"],
            "x",
            "peak 5-s bin / base mean",
        ),
        row(
            "prefill_latency_rise_phasor",
            s.loc["phasor", "prefill_latency_peak_s"] / s.loc["phasor", "prefill_latency_base_s"],
            "x",
            "peak 5-s bin / base mean",
        ),
        row(
            "ttft_p99_mixed_over_no_mixed",
            s.loc["phasor", "ttft_p99_s"] / s.loc["phasor_no_mixed", "ttft_p99_s"],
            "ratio",
            "paper: Mixed pool cuts P99 (< 1)",
        ),
        row(
            "false_oom_defrag_over_no_defrag",
            defrag_ratio("false_oom", f),
            "ratio",
            "heavy_mix; paper: defrag lowers false OOMs (< 1)",
        ),
        row(
            "admission_wait_p99_defrag_over_no_defrag",
            defrag_ratio("decode_admission_wait_p99_s", f),
            "ratio",
            "heavy_mix; decode admission wait P99",
        ),
        *generation_heavy,
    ]


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__ or NAME, argv=argv)
    timer = c.Timer()
    cost = c.v100_cost_model()
    div, div_series = queue_divergence(args, cost)
    c.save_csv(div, args.out, f"{NAME}_divergence")
    c.save_csv(div_series, args.out, f"{NAME}_divergence_series")
    plot_divergence(div_series, div, args.out)
    shock, shock_ts = shock_recovery(args, cost)
    c.save_csv(shock, args.out, f"{NAME}_shock")
    c.save_csv(shock_ts, args.out, f"{NAME}_shock_series")
    plot_shock(shock_ts, args.out)
    plot_mixed(shock, args.out)
    defrag, defrag_ts = defragmentation(args, cost)
    c.save_csv(defrag, args.out, f"{NAME}_defrag")
    c.save_csv(defrag_ts, args.out, f"{NAME}_defrag_series")
    plot_defrag(defrag_ts, args.out)
    c.save_summary(summary_rows(div, shock, defrag), args.out, NAME)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(div.groupby("system").mean(numeric_only=True).round(3))
        print(shock.groupby("system").mean(numeric_only=True).round(3))
        print(defrag.round(3).to_string(index=False))
    print(f"{NAME}: done in {timer.elapsed_s():.1f} s, files in {args.out}")


if __name__ == "__main__":
    main()
