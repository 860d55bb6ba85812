"""``pdopt validate``: replay real serving runs and compare (issue 34).

Sub-commands::

    pdopt validate realgpu RUNS.csv [--exp SUBSTR] [--profile FILE] [--fit-overhead]
                           [--no-prefix-cache] [--client-timeout S | --no-client-timeout]
                           [--seed S] [--quiet] [--json]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import pandas as pd
from tqdm import tqdm

from pdopt.cli._args import NON_NEGATIVE_INT, POSITIVE
from pdopt.cli._output import add_json_flag, print_json
from pdopt.errors import InputError
from pdopt.validate import (
    INFERENCE_PERF_TIMEOUT_S,
    METRICS,
    fit_server_overhead,
    read_runs,
    replay_runs,
    summarize,
)


def register(subparsers: Any) -> None:
    """Add ``pdopt validate`` and its sub-commands."""
    parser = subparsers.add_parser("validate", help="replay real serving runs and compare")
    sub = parser.add_subparsers(dest="validate_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda _args: _help(parser))
    real = sub.add_parser(
        "realgpu",
        help="replay measured vLLM runs (one row per load stage) through the colocated engine",
    )
    real.add_argument("runs", help="run table CSV (e.g. realgpu/h100_vllm_serving.csv)")
    real.add_argument("--exp", help="replay only the runs whose exp contains this text")
    real.add_argument(
        "--profile",
        help="price every run with this profile's cost model (default: each run's roofline "
        "prior for its GPU, model and TP)",
    )
    real.add_argument(
        "--fit-overhead",
        action="store_true",
        help="fit the server overhead (fixed + iterations) on the calm stages and replay again",
    )
    real.add_argument(
        "--no-prefix-cache", action="store_true", help="replay with prefix caching off"
    )
    timeout = real.add_mutually_exclusive_group()
    timeout.add_argument(
        "--client-timeout",
        type=POSITIVE,
        default=INFERENCE_PERF_TIMEOUT_S,
        metavar="S",
        help="seconds after which a client gives up on its request, whatever its state (a "
        f"failure; default {INFERENCE_PERF_TIMEOUT_S:g}, inference-perf's)",
    )
    timeout.add_argument("--no-client-timeout", action="store_true", help="clients never give up")
    real.add_argument("--seed", type=NON_NEGATIVE_INT, default=0, help="arrival draws (0)")
    real.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_flag(real)
    real.set_defaults(handler=_realgpu)


def _help(parser: Any) -> int:
    parser.print_help()
    return 0


def _realgpu(args: Any) -> int:
    stages = read_runs(args.runs)
    if args.exp:
        stages = stages[stages["exp"].astype(str).str.contains(args.exp, regex=False)]
        if stages.empty:
            raise InputError(f"{args.runs}: no run's exp contains {args.exp!r}")
    cost_of = None
    source = "roofline prior per run"
    if args.profile:
        from pdopt.costmodel import fit_cost_model
        from pdopt.profile import read_profile

        cost, _ = fit_cost_model(read_profile(args.profile))
        cost_of = lambda _row: cost  # noqa: E731
        source = args.profile

    def bar(runs: Iterable[str]) -> Iterable[str]:
        items = list(runs)
        disable = True if args.quiet else None
        shown: Iterable[str] = tqdm(
            items, desc="replaying runs", unit="run", file=sys.stderr, disable=disable
        )
        return shown

    options: dict[str, Any] = {
        "seed": args.seed,
        "prefix_caching": not args.no_prefix_cache,
        "client_timeout_s": None if args.no_client_timeout else args.client_timeout,
    }
    if cost_of is not None:
        options["cost_of"] = cost_of
    replay = replay_runs(stages, progress=bar, **options)
    overhead = None
    if args.fit_overhead:
        overhead = fit_server_overhead(replay)
        replay = replay_runs(stages, progress=bar, overhead=overhead, **options)
    summary = summarize(replay)
    if args.json:
        payload: dict[str, Any] = {
            "cost_source": source,
            "prefix_caching": not args.no_prefix_cache,
            "client_timeout_s": options["client_timeout_s"],
            "summary": summary,
            "stages": replay.to_dict(orient="records"),
        }
        if overhead is not None:
            payload["fitted_overhead"] = overhead.to_dict()
        print_json(payload)
        return 0
    _print(replay, summary, source, overhead)
    return 0


def _print(replay: pd.DataFrame, summary: dict[str, float], source: str, overhead: Any) -> None:
    print(f"Replay of {len(replay)} load stages ({source}); errors = predicted / measured - 1")
    header = f"{'run':<42} {'stage':>5} {'req/s':>6}"
    for metric in METRICS:
        header += f" {metric + ' meas→pred':>24}"
    print(header)
    for _, row in replay.iterrows():
        line = f"{str(row['exp'])[-42:]:<42} {row['stage']:>5} {row['rate_rps']:>6g}"
        for metric in METRICS:
            cell = (
                f"{row[metric + '_measured']:.0f}→{row[metric + '_predicted']:.0f} "
                f"({row[metric + '_err_pct']:+.0f}%)"
            )
            line += f" {cell:>24}"
        if row["n_failed"] or row.get("n_failed_predicted", 0):
            line += f"  failed {row['n_failed']}→{row.get('n_failed_predicted', 0)}"
        print(line + ("  overloaded" if row["overloaded"] else ""))
    calm = int(summary["calm_stages"])
    mapes = ", ".join(f"{m} {summary[m + '_mape_pct']:.1f}%" for m in METRICS)
    print(f"MAPE over the {calm} stages measured not overloaded: {mapes}")
    print(f"largest E2E mean error there: {summary['e2e_mean_max_abs_err_pct']:.1f}%")
    print(
        f"overloads: {int(summary['overloads_predicted'])} of "
        f"{int(summary['overloads_measured'])} predicted, {int(summary['false_overloads'])} "
        "predicted where the GPU had none"
    )
    if "failed_predicted_overloaded" in summary:
        print(
            f"failed requests (client timeout): {int(summary['failed_measured_overloaded'])} "
            f"measured → {int(summary['failed_predicted_overloaded'])} predicted on the "
            f"overloaded stages, {int(summary['failed_predicted_calm'])} predicted on the others"
        )
    if overhead is not None:
        print(
            f"fitted server overhead: {overhead.fixed_s * 1e3:.2f} ms + "
            f"{overhead.stream_iterations:.2f} iterations"
        )
