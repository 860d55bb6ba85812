"""Run every experiment script into one folder, then write RESULTS.md from their CSVs.

    python experiments/run_all.py [--out results/] [--quick] [--report RESULTS.md]
                                  [--traces ../shared/data/traces/] [--arrow-requests N]
    python experiments/run_all.py --report-only          # rebuild RESULTS.md from existing CSVs

A run records what ran in ``<out>/run_all.csv`` (per script: status, seconds, mode) and
``<out>/run.json`` (the git commit the scripts ran at, the mode, the total script seconds);
``--report-only`` stamps that commit on the report, or says the commit is unknown when
``run.json`` is absent (CSVs from before it existed).

Each script runs in its own process (``python experiments/<name>.py --out DIR [--quick]``); a
failing script is reported with its last message and the others still run. A step that reads
the Azure 2023 code trace (:attr:`Step.trace`: Arrow) gets it from ``--traces`` (a folder holding
``azure_llm_2023/AzureLLMInferenceTrace_code.csv``, or the CSV itself) and ``--requests`` (the
whole trace by default; 600 rows with ``--quick``); without the trace that step is reported as
skipped. The Phasor scripts with a production mix (:attr:`Step.mix`) get the ``--traces`` folder
and read its conversation trace (``azure_llm_2023/AzureLLMInferenceTrace_conv.csv``), or fall
back to a synthetic bursty mix and say so.

Scripts run ``--jobs`` (default 2) at a time, longest first by the previous run's times. Default
sizes since each script loads the compiled engine (session 47): 105 s of script time for every
script, 32 s of it ``fragmentation``'s. Before, every run was on the Python engine, on the
shared 2-core machine (load average 3-4 from other users): the Phasor scripts in
912 s of script time (ablations 471 s, slo_capacity 198 s, sensitivity 79 s, fragmentation 71 s,
latency_panorama 46 s, phasor_mechanisms 31 s, energy 11 s, utilization_phantom 6 s); every
script of the issue-15 branch ran in 742 s of wall time; with issue 16's EcoServe, Mooncake and
Arrow scripts (477 s of script time in its run) the total is 1389 s of script time, about 12
minutes of wall time at 2 jobs; the run at commit fe5ff67 (issue 18's fused hybrid cost and
re-queueing) took 2493 s of script time (ablations 745 s), about 40 minutes of wall time; the
run at commit 46f473a (issue 20's refitted roofline presets and all-reduce law) took 1088 s of
script time (ablations 288 s).
``--quick`` about 1 minute. ``--only NAME`` reruns some scripts
and keeps the other rows of ``run_all.csv``.

``--dask ADDRESS`` (``make experiments DASK=tcp://HOST:8786``) runs every script's independent
simulations on that Dask cluster (:func:`_common.map_runs`); ``--dask`` alone (``DASK=local``)
starts one LocalCluster of ``--dask-workers`` processes here for the whole run and hands its
address to each script. The CSVs are byte-identical to a serial run's.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import _report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRACES = ROOT.parent / "shared" / "data" / "traces"
CODE_TRACE_NAME = "azure_llm_2023/AzureLLMInferenceTrace_code.csv"


@dataclass(frozen=True, slots=True)
class Step:
    """One script: its file stem, what it reproduces, who owns it, whether it takes the Azure
    code trace (``--trace`` and ``--requests``) and whether it takes the traces folder for the
    Phasor production mix (``--traces``; the script falls back to a synthetic mix without the
    conversation trace there)."""

    name: str
    reproduces: str
    owner: str = "issue 8"
    trace: bool = False
    mix: bool = False


P15 = "issues 8, 15"

STEPS: tuple[Step, ...] = (
    Step("phasor_mechanisms", "Phasor Fig. 1, 7 (mechanisms)", "issues 4, 8"),
    Step("utilization_phantom", "Phasor Fig. 2 (utilization phantom)"),
    Step("latency_panorama", "Phasor Fig. 4/10, App. E (latency panorama)", P15, mix=True),
    Step("slo_capacity", "Phasor Fig. 5 (SLO-constrained capacity)", P15, mix=True),
    Step("fragmentation", "Phasor Fig. 6 (fragmentation over time)", P15, mix=True),
    Step("ablations", "Phasor Table 2 (ablations, both models)", P15, mix=True),
    Step("sensitivity", "Phasor Table 5 (sensitivity, pdopt.tune)", P15, mix=True),
    Step("energy", "Phasor Table 6 (energy per token)", P15, mix=True),
    Step("ecoserve_goodput", "EcoServe goodput and strict TPOT (V100 testbed)", "issues 8, 16"),
    Step(
        "ecoserve_testbed",
        "EcoServe goodput (Fig. 8 breakdowns) and static scaling (Fig. 9) on its testbeds",
        "issue 16",
    ),
    Step("ecoserve_dynamic", "EcoServe dynamic scaling (Fig. 10)", "issue 16"),
    Step(
        "ecoserve_run_length", "EcoServe attainment vs run length and rate (L20 check)", "issue 36"
    ),
    Step("mooncake_link", "Mooncake goodput vs link bandwidth (MHA vs GQA)", "issues 5, 8"),
    Step("prefix_reuse", "Mooncake-style KV reuse: GPUs, goodput with/without caching", "issue 35"),
    Step("arrow_max_rate", "Arrow max rate at 90% attainment", "issues 5, 8, 16", trace=True),
)


def code_trace(traces: Path) -> Path:
    """The Azure code trace CSV under ``traces`` (or ``traces`` itself when it is the file)."""
    return traces if traces.suffix == ".csv" else traces / CODE_TRACE_NAME


def command(
    step: Step,
    out: Path,
    quick: bool,
    traces: Path = TRACES,
    arrow_requests: int = 0,
    dask: str | None = None,
) -> tuple[list[str] | None, str]:
    """The command line for ``step``, or ``(None, why not)``; ``dask`` is the scheduler
    address its simulations go to (None: serially)."""
    cmd = [sys.executable, str(HERE / f"{step.name}.py"), "--out", str(out)]
    if quick:
        cmd.append("--quick")
    if dask is not None:
        cmd += ["--dask", dask]
    if step.mix:
        cmd += ["--traces", str(traces)]
    if step.trace:
        trace = code_trace(traces)
        if not trace.exists():
            return None, f"needs the Azure code trace, not found at {trace} (give --traces)"
        cmd += ["--trace", str(trace), "--requests", str(600 if quick else arrow_requests)]
    return cmd, ""


def run_step(
    step: Step,
    out: Path,
    quick: bool,
    timeout_s: float,
    traces: Path = TRACES,
    arrow_requests: int = 0,
    dask: str | None = None,
) -> _report.StepRun:
    """Run one script; never raises (a failure is a status)."""
    cmd, why = command(step, out, quick, traces, arrow_requests, dask)
    if cmd is None:
        return _report.StepRun(step.name, step.reproduces, step.owner, "skipped", 0.0, why)
    began = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        elapsed = time.perf_counter() - began
        msg = f"timed out after {timeout_s:.0f} s"
        return _report.StepRun(step.name, step.reproduces, step.owner, "timeout", elapsed, msg)
    elapsed = time.perf_counter() - began
    status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    message = "" if status == "ok" else (tail[-1] if tail else "")
    return _report.StepRun(step.name, step.reproduces, step.owner, status, elapsed, message)


def run_steps(steps: list[Step], args: argparse.Namespace) -> list[_report.StepRun]:
    """Run ``steps``, ``args.jobs`` at a time, longest first by the times of the previous run in
    ``args.out`` (unknown ones first), so the long scripts overlap the short ones; each prints
    its line when it ends. Returns the runs in ``steps`` order."""
    last = _report.previous_times(args.out, quick=args.quick)
    order = sorted(steps, key=lambda s: -last.get(s.name, float("inf")))

    def one(step: Step) -> _report.StepRun:
        run = run_step(
            step, args.out, args.quick, args.timeout, args.traces, args.arrow_requests, args.dask
        )
        print(f"{step.name:18s} {run.status:24s} {run.elapsed_s:6.1f} s {run.message}", flush=True)
        return run

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = dict(zip((s.name for s in order), pool.map(one, order), strict=True))
    return [done[s.name] for s in steps]


@contextlib.contextmanager
def scheduler(dask: str | None, workers: int | None) -> Iterator[str | None]:
    """The scheduler address the scripts get: ``dask`` itself, or for ``"local"`` the address
    of one LocalCluster started here for the whole run (so each script does not start its own);
    None: serially."""
    from pdopt.parallel import LOCAL, open_runs

    if dask != LOCAL:
        yield dask
        return
    with open_runs(LOCAL, n_workers=workers) as runs:
        yield str(runs.client.scheduler.address)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--quick", action="store_true", help="small sizes (each script in seconds)")
    ap.add_argument("--report", type=Path, default=ROOT / "RESULTS.md")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the report")
    ap.add_argument("--only", action="append", default=[], help="run only these scripts")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per script")
    ap.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="scripts run at once, each in its own process (default %(default)s: the 2 cores "
        "the time budget assumes)",
    )
    ap.add_argument(
        "--traces",
        type=Path,
        default=TRACES,
        help="folder with azure_llm_2023/AzureLLMInferenceTrace_code.csv, or that CSV "
        "(default: %(default)s)",
    )
    ap.add_argument(
        "--arrow-requests",
        type=int,
        default=0,
        help="first N rows of the code trace for the Arrow script (0: all; --quick: 600)",
    )
    ap.add_argument(
        "--dask",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="run the scripts' simulations on this Dask scheduler (tcp://HOST:8786), or with no "
        "address (or 'local') on one LocalCluster here; the same CSVs as serial",
    )
    ap.add_argument(
        "--dask-workers", type=int, default=None, help="LocalCluster processes (default: CPUs)"
    )
    args = ap.parse_args(argv)
    from pdopt.errors import ConfigError
    from pdopt.parallel import check_dask

    try:
        args.dask = check_dask(args.dask or None)
    except ConfigError as exc:
        ap.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        steps = [s for s in STEPS if not args.only or s.name in args.only]
        with scheduler(args.dask, args.dask_workers) as address:
            args.dask = address
            runs = run_steps(steps, args)
        _report.save_runs(runs, args.out, quick=args.quick, merge=bool(args.only))
    text = _report.render(args.out, args.report.parent)
    args.report.write_text(text)
    print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
