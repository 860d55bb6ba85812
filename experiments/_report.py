"""RESULTS.md from the experiment CSVs: the paper's number and pdopt's side by side.

Reads ``<out>/run_all.csv`` (what ran, how long, with which status), every
``<out>/<script>_summary.csv`` (see :data:`_common.SUMMARY_COLUMNS`) and, for the Arrow script
owned by issue 5, ``arrow_max_rate.csv``; matches each quantity to :data:`_paper.CLAIMS`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import _common as c
import _paper
import _phasor as ph
import pandas as pd

RUNS_FILE = "run_all.csv"
RUN_INFO_FILE = "run.json"


@dataclass(frozen=True, slots=True)
class Section:
    """One RESULTS.md section: the script, its title, extra PNG stems and the CSV tables (stem,
    columns) printed in full so the report stands without the (git-ignored) figures."""

    name: str
    title: str
    images: tuple[str, ...] = ()
    tables: tuple[tuple[str, tuple[str, ...]], ...] = ()


SECTIONS: tuple[Section, ...] = (
    Section(
        "phasor_mechanisms",
        "Phasor Fig. 1, 7 and mechanisms: starvation, queue divergence, defragmentation, "
        "Mixed pool",
    ),
    Section(
        "utilization_phantom",
        "Phasor Fig. 2: utilization phantom (compute vs memory headroom vs batch)",
    ),
    Section("latency_panorama", "Phasor Fig. 4/10: latency panorama"),
    Section("slo_capacity", "Phasor Fig. 5: SLO-constrained capacity (closed loop)"),
    Section("fragmentation", "Phasor Fig. 6: fragmentation over time"),
    Section("ablations", "Phasor Table 2: ablations (normalised to DistServe)"),
    Section(
        "sensitivity",
        "Phasor Table 5: sensitivity (one parameter changed, normalised to the default)",
        tables=(
            (
                "sensitivity",
                (
                    "workload",
                    "parameter",
                    "setting",
                    "goodput_rps_norm",
                    "slo_attainment_norm",
                    "ttft_p99_s_norm",
                    "e2e_p99_s_norm",
                ),
            ),
        ),
    ),
    Section("energy", "Phasor Table 6: energy per output token"),
    Section(
        "ecoserve_goodput",
        "EcoServe: goodput at P50/P90/P99 attainment and strict TPOT (V100 testbed)",
        tables=(("ecoserve_goodput", ()), ("ecoserve_strict", ())),
    ),
    Section(
        "ecoserve_testbed",
        "EcoServe on its paper's testbeds: L20 / 10 GbE and A800 / 25 GbE, Table 4 SLOs; "
        "static scaling (Fig. 9)",
        tables=(
            ("ecoserve_testbed", ()),
            ("ecoserve_testbed_scaling", ()),
            (
                "ecoserve_testbed_slos",
                (
                    "config",
                    "workload",
                    "ttft_s",
                    "tpot_s",
                    "prefill_mean_s",
                    "decode_step_s",
                    "kv_pcie_mean_s",
                    "kv_pool_mean_s",
                ),
            ),
        ),
    ),
    Section(
        "ecoserve_dynamic",
        "EcoServe dynamic scaling (Fig. 10): 20 to 50 req/s, attainment per 30 s",
        tables=(("ecoserve_dynamic", ()),),
    ),
    Section(
        "ecoserve_run_length",
        "EcoServe: attainment against run length and rate (L20 main config, ShareGPT-like)",
        tables=(("ecoserve_run_length", ()),),
    ),
    Section(
        "mooncake_link",
        "Mooncake-style KV pool: goodput vs link bandwidth, MHA vs GQA",
        tables=(
            (
                "mooncake_link",
                ("model", "attention", "link", "transfer_s", "link_bound_rps", "max_rate_per_s"),
            ),
        ),
    ),
    Section(
        "prefix_reuse",
        "Mooncake-style KV reuse: GPUs planned and goodput with and without prefix caching",
        tables=(
            (
                "prefix_reuse",
                (
                    "prefix_caching",
                    "rate_per_s",
                    "assumed_hit_fraction",
                    "check_hit_fraction",
                    "plan_prefill_gpus",
                    "plan_decode_gpus",
                    "plan_meets",
                    "check_attainment",
                    "goodput_least_loaded_rps",
                    "goodput_cache_aware_rps",
                ),
            ),
        ),
    ),
    Section(
        "arrow_max_rate",
        "Arrow: max rate at 90% SLO attainment (Azure traces, Table 1 SLOs)",
        tables=(
            (
                "arrow_max_rate",
                (
                    "trace",
                    "policy",
                    "max_rate_per_s",
                    "max_rate_scale",
                    "attainment_at_max",
                    "status",
                    "requests",
                ),
            ),
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class StepRun:
    """How one script ran."""

    name: str
    reproduces: str
    owner: str
    status: str
    elapsed_s: float
    message: str


def save_runs(runs: list[StepRun], out: Path, *, quick: bool, merge: bool = False) -> None:
    """Write ``run_all.csv``; with ``merge`` (a partial rerun, ``--only``) earlier rows of the
    same mode for scripts not rerun are kept, in the order of :data:`SECTIONS`' scripts. Also
    write ``run.json`` (:func:`read_run_info`): the git commit the scripts ran at, the mode and
    the total script time, so that ``--report-only`` later stamps the run's commit, not the
    one checked out when the report is rebuilt."""
    frame = pd.DataFrame([asdict(r) for r in runs])
    frame["mode"] = "quick" if quick else "default"
    path = out / RUNS_FILE
    if merge and path.exists():
        old = pd.read_csv(path)
        old = old[(old["mode"] == frame["mode"].iloc[0]) & ~old["name"].isin(frame["name"])]
        order = {spec.name: i for i, spec in enumerate(SECTIONS)}
        frame = pd.concat([old, frame], ignore_index=True)
        frame = frame.sort_values("name", key=lambda n: n.map(order), kind="stable")
    frame.to_csv(path, index=False, float_format="%.1f")
    _save_run_info(out, frame, [r.name for r in runs], merge=merge)


def _save_run_info(out: Path, frame: pd.DataFrame, rerun: list[str], *, merge: bool) -> None:
    mode = str(frame["mode"].iloc[0])
    commit = _git_head()
    previous = read_run_info(out)
    if merge and previous.get("mode") == mode and previous.get("commit", commit) != commit:
        # a partial rerun mixes commits: say which scripts ran at which
        commit = f"{commit} ({', '.join(rerun)}) and {previous['commit']} (the others)"
    info = {"commit": commit, "mode": mode, "simulation_s": round(float(frame["elapsed_s"].sum()))}
    (out / RUN_INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")


def read_run_info(out: Path) -> dict[str, object]:
    """What ``save_runs`` recorded of the run whose CSVs are in ``out``: ``commit`` (git HEAD
    when the scripts ran, not when the report is rebuilt), ``mode`` (``default`` or ``quick``)
    and ``simulation_s`` (script seconds in all); empty if ``run.json`` is absent."""
    path = out / RUN_INFO_FILE
    return dict(json.loads(path.read_text())) if path.exists() else {}


def previous_times(out: Path, *, quick: bool) -> dict[str, float]:
    """Seconds each script took in ``out``'s last run of the same mode (empty if none)."""
    path = out / RUNS_FILE
    if not path.exists():
        return {}
    old = pd.read_csv(path)
    old = old[old["mode"] == ("quick" if quick else "default")]
    return {str(n): float(t) for n, t in zip(old["name"], old["elapsed_s"], strict=True)}


def _git_head() -> str:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=c.ROOT
        )
        return proc.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.3g}"


def arrow_summary(out: Path) -> pd.DataFrame:
    """Summary rows from ``arrow_max_rate.csv``: Arrow's max rate over every other row's."""
    path = out / "arrow_max_rate.csv"
    if not path.exists():
        return pd.DataFrame(columns=list(c.SUMMARY_COLUMNS))
    table = pd.read_csv(path).set_index("policy")
    rows = []
    top = "arrow"
    for base in table.index:
        if base == top or top not in table.index or table.loc[base, "max_rate_per_s"] <= 0:
            continue
        ratio = table.loc[top, "max_rate_per_s"] / table.loc[base, "max_rate_per_s"]
        rows.append(
            {
                "experiment": "Arrow max rate",
                "quantity": f"max rate at 90% attainment, {top}/{base}",
                "pdopt_value": float(ratio),
                "unit": "ratio",
                "detail": f"{top} {table.loc[top, 'max_rate_per_s']:.3g} req/s vs "
                f"{base} {table.loc[base, 'max_rate_per_s']:.3g} req/s "
                f"({int(table.loc[top, 'requests'])} requests)",
            }
        )
    return pd.DataFrame(rows, columns=list(c.SUMMARY_COLUMNS))


def markdown_table(frame: pd.DataFrame) -> list[str]:
    """``frame`` as a Markdown table (numbers with 3 significant digits)."""

    def cell(x: object) -> str:
        if isinstance(x, float):
            return _fmt(x)
        return str(x)

    lines = [
        "| " + " | ".join(str(col) for col in frame.columns) + " |",
        "|" + "|".join("---" for _ in frame.columns) + "|",
    ]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(x) for x in row) + " |")
    return lines


def csv_tables(out: Path, section: Section) -> list[str]:
    lines: list[str] = []
    for stem, columns in section.tables:
        path = out / f"{stem}.csv"
        if not path.exists():
            continue
        frame = pd.read_csv(path)
        if columns:
            frame = frame[[col for col in columns if col in frame.columns]]
        lines += [f"`{stem}.csv`:", "", *markdown_table(frame), ""]
    return lines


def summary_rows(out: Path, name: str) -> pd.DataFrame:
    path = out / f"{name}_summary.csv"
    if name == "arrow_max_rate" and not path.exists():
        return arrow_summary(out)  # an older arrow_max_rate.py without its own summary
    if not path.exists():
        return pd.DataFrame(columns=list(c.SUMMARY_COLUMNS))
    return pd.read_csv(path)


def _ratio_text(value: float, claim: _paper.PaperClaim | None) -> str:
    if claim is None or claim.low is None or claim.high is None:
        return "–"
    if claim.bound:
        if value == claim.low:
            return "at the bound"  # e.g. an ablation that changed nothing: neither meets nor misses
        meets = value >= claim.low if claim.bound == "ge" else value <= claim.low
        return "meets" if meets else "misses"
    if claim.low == claim.high:
        return f"{value / claim.low:.2f}"
    return f"{value / claim.high:.2f}–{value / claim.low:.2f}"


def _paper_value(claim: _paper.PaperClaim | None) -> str:
    if claim is None or claim.low is None or claim.high is None:
        return "no paper number"
    if claim.bound:
        return f"{'≥' if claim.bound == 'ge' else '≤'} {claim.low:.3g}"
    if claim.low == claim.high:
        return f"{claim.low:.3g}"
    return f"{claim.low:.3g}–{claim.high:.3g}"


def comparison_table(rows: pd.DataFrame) -> list[str]:
    """The side-by-side table, then each paper claim and why pdopt differs (once per claim)."""
    lines = [
        "| quantity | paper | pdopt | pdopt / paper (or meets/misses a threshold) |",
        "|---|---:|---:|---:|",
    ]
    claims: list[_paper.PaperClaim] = []
    for _, r in rows.iterrows():
        claim = _paper.claim_for(str(r["experiment"]), str(r["quantity"]))
        if claim is not None and claim not in claims:
            claims.append(claim)
        value = float(r["pdopt_value"])
        unit = "" if str(r["unit"]) == "ratio" else f" {r['unit']}"
        lines.append(
            f"| {r['quantity']} | {_paper_value(claim)} | {_fmt(value)}{unit} "
            f"| {_ratio_text(value, claim)} |"
        )
    lines.append("")
    notes = dict.fromkeys(
        f"*Paper:* {claim.paper_text} ({claim.source}). *Why they differ:* {claim.why}"
        for claim in claims
    )  # one note per text: a [[points]] table's claims share theirs
    for note in notes:
        lines += [note, ""]
    details = [f"- {r['quantity']}: {r['detail']}" for _, r in rows.iterrows() if r["detail"]]
    return [*lines, "Details:", "", *details] if details else lines


def direction_checks(out: Path) -> list[str]:
    """Every summary quantity whose paper claim is a threshold, with meets/misses, in one table."""
    lines = [
        "## Direction checks at a glance",
        "",
        "Each row is a claim stated as a threshold (by a paper or by the issues quoting it); "
        "the sections below give the details and why pdopt differs.",
        "",
        "| experiment | quantity | expected | pdopt | verdict |",
        "|---|---|---:|---:|---|",
    ]
    found = False
    for spec in SECTIONS:
        for _, r in summary_rows(out, spec.name).iterrows():
            claim = _paper.claim_for(str(r["experiment"]), str(r["quantity"]))
            if claim is None or not claim.bound or claim.low is None:
                continue
            found = True
            value = float(r["pdopt_value"])
            lines.append(
                f"| {r['experiment']} | {r['quantity']} | {_paper_value(claim)} "
                f"| {_fmt(value)} | {_ratio_text(value, claim)} |"
            )
    return [*lines, ""] if found else []


def _section(out: Path, report_dir: Path, runs: pd.DataFrame, spec: Section) -> list[str]:
    name, title = spec.name, spec.title
    lines = [f"## {title}", ""]
    run = runs[runs["name"] == name] if len(runs) else runs
    if len(run):
        r = run.iloc[0]
        lines.append(
            f"`experiments/{name}.py` ({r['owner']}): **{r['status']}**"
            f" in {float(r['elapsed_s']):.0f} s."
        )
        if r["status"] != "ok" and isinstance(r["message"], str) and r["message"]:
            lines.append(f"> {r['message']}")
        lines.append("")
    pngs = sorted(out.glob(f"{name}*.png")) + [out / f"{e}.png" for e in spec.images]
    shown = sorted({os.path.relpath(p, report_dir) for p in pngs if p.exists()})
    if shown:
        lines += [
            "Figures (regenerated by `run_all.py`; not committed): "
            + ", ".join(f"`{p}`" for p in shown)
            + ".",
            "",
        ]
    rows = summary_rows(out, name)
    if len(rows):
        lines += [*comparison_table(rows), ""]
    elif not spec.tables:
        csvs = sorted(p.name for p in out.glob(f"{name}*.csv"))
        lines += [f"No summary quantities. Files: {', '.join(csvs) or 'none'}.", ""]
    return lines + csv_tables(out, spec)


def assumptions() -> list[str]:
    roofline_prefill_s = c.v100_cost_model().prefill.batch_time_s([1024])
    lines = [
        "## Testbed and assumptions",
        "",
        f"- Cluster (the Phasor paper's testbed): {c.N_GPUS} × {c.GPU_NAME} serving "
        f"{' and '.join(ph.MODELS)} (TP 1; Table 2 uses both, the other Phasor scripts "
        f"{ph.MODELS[0]}). Cost model: **{ph.DEFAULT_COST_MODEL}** "
        f"(`{c.PROFILE.relative_to(c.ROOT)}` for Qwen2.5-7B; a roofline, not a measurement) in "
        "every Phasor result, because the paper's Table 4 α/β price a 1,024-token prefill at "
        "0.43 s, above its own 0.40 s TTFT SLO and ~3.7× its measured ~116 ms (§2.1), while the "
        f"roofline gives {roofline_prefill_s:.2f} s; the Table 4 prefill (with roofline decode) "
        "is available with "
        "`--cost-model phasor`, and each result's Details name the model used. KV capacity from "
        "memory × 0.9 − weights − activation peak (pdopt.model_spec.kv_capacity); power 40 W "
        "idle to 300 W busy per GPU. The Arrow "
        "script uses 8 × H800 / Llama-3.1-8B and the Mooncake link script 4 × A100-80GB with "
        "Llama-2-7B (MHA) and Llama-3-8B (GQA) instead, and the EcoServe testbed and dynamic "
        "scripts the EcoServe paper's clusters (L20 / 10 GbE, A800 / 25 GbE), models and "
        "Table 4 SLOs.",
        "- Phasor workloads and SLOs: the paper's Table 1 workloads as length distributions "
        "(`pdopt.workload` archetypes, lognormal around the paper's means with the Azure "
        "conversation trace's spread) with its Table 3 SLOs, TTFT / TPOT in seconds: "
        + ", ".join(
            f"{ph.TASKS[w]} {ph.slo(w).ttft_s:g}/{ph.slo(w).tpot_s:g}" for w in ph.WORKLOADS
        )
        + ". The production mix is the Azure LLM inference 2023 conversation trace, "
        "time-compressed to each rate (`--traces`; without it, `phasor_mix` lengths with CV-3 "
        "gamma bursts; a BurstGPT file with `--burstgpt`). Head-to-head comparisons start every "
        "system from the same 4 prefill + 4 decode split; the best split is a separate experiment "
        f"(`slo_capacity`). Capacity: closed loop, fixed think time {ph.THINK_TIME_S:g} s, client "
        f"starts staggered over {ph.START_SPREAD_S:g} s (the paper gives neither value).",
        "- EcoServe V100-testbed SLOs (assumed; TTFT / TPOT in seconds): "
        + ", ".join(f"{w} {c.SLOS[w].ttft_s:g}/{c.SLOS[w].tpot_s:g}" for w in c.ECOSERVE_WORKLOADS)
        + ".",
        "- Layouts (our choice for 8 GPUs): "
        + "; ".join(
            f"{s.label} = `{s.policy}` {s.n_prefill}P {s.n_decode}D {s.n_mixed}M"
            + (f" (M home role {s.mixed_role})" if s.n_mixed and s.mixed_role != "mixed" else "")
            + (f" {s.flags}" if s.flags else "")
            + (f" link {s.link}" if s.link else "")
            for s in c.SYSTEMS.values()
        )
        + ".",
        "- Rates are multiples of a back-of-envelope 4P4D service rate per workload "
        "(`_common.nominal_rate_per_s`); every reported number is simulated with fixed seeds.",
        "",
    ]
    return lines


def render(out: Path, report_dir: Path) -> str:
    """The whole RESULTS.md text."""
    runs_path = out / RUNS_FILE
    runs = pd.read_csv(runs_path) if runs_path.exists() else pd.DataFrame(columns=["name"])
    info = read_run_info(out)
    mode = str(runs["mode"].iloc[0]) if len(runs) and "mode" in runs else "unknown"
    mode = str(info.get("mode", mode))
    total = float(runs["elapsed_s"].sum()) if len(runs) else 0.0
    total = float(info.get("simulation_s", total))  # type: ignore[arg-type]
    where = (
        f"at commit `{info['commit']}`"
        if "commit" in info
        else f"at an unknown commit (no `{RUN_INFO_FILE}` beside the CSVs)"
    )
    lines = [
        "# Results: the seed papers' figures and tables, reproduced with pdopt",
        "",
        f"Generated by `python experiments/run_all.py{' --quick' if mode == 'quick' else ''}` "
        f"(**{mode}** sizes, {total:.0f} s of simulation in all) {where}; "
        "every number below comes from the CSVs in "
        f"`{os.path.relpath(out, report_dir)}/`. Paper numbers are only those we could read in "
        "the paper or a public source (`experiments/paper_claims.toml` says where); where a "
        "paper gives none the table says so and shows no ratio. Honest misses stay in. "
        "`results/` is git-ignored: the tables below carry the numbers; rerun the command to "
        "get the CSVs and PNGs.",
        "",
        "| script | reproduces | owner | status | time (s) |",
        "|---|---|---|---|---:|",
    ]
    for _, r in runs.iterrows():
        lines.append(
            f"| {r['name']} | {r['reproduces']} | {r['owner']} | {r['status']} "
            f"| {float(r['elapsed_s']):.0f} |"
        )
    lines += ["", *direction_checks(out), *assumptions()]
    for spec in SECTIONS:
        lines += _section(out, report_dir, runs, spec)
    lines += ["## Where the paper numbers come from", "", *_sources()]
    return "\n".join(lines) + "\n"


def _sources() -> list[str]:
    return [*_paper.SOURCES.splitlines(), ""]
