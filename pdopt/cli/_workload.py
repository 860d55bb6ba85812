"""``pdopt workload``: summarise traces and write synthetic workloads.

Sub-commands::

    pdopt workload stats TRACE [--format auto|azure|burstgpt|mooncake|vidur|splitwise_sim|csv|jsonl]
                         [--columns arrival_s=NAME,input_tokens=NAME,output_tokens=NAME]
                         [--time-unit s|ms|us|ns|datetime] [--arrival-kind time|gap] [--json]
    pdopt workload generate --archetype NAME --rate R (--requests N | --duration S) [--cv CV]
                            [--seed S] --out FILE.csv [--json]
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any

import pandas as pd

from pdopt.cli._args import NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT
from pdopt.cli._output import add_json_flag, print_json, print_warning
from pdopt.errors import InputError, PdoptWarning
from pdopt.workload import (
    ARCHETYPES,
    ARRIVAL_KINDS,
    CSV_COLUMNS,
    TIME_UNITS,
    TRACE_FORMATS,
    Workload,
    archetype_workload,
    detect_trace_format,
    read_trace,
    write_csv_trace,
)


def register(subparsers: Any) -> None:
    """Add ``pdopt workload`` and its sub-commands."""
    parser = subparsers.add_parser("workload", help="summarise traces, generate workloads")
    sub = parser.add_subparsers(dest="workload_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda _args: _print_help(parser))

    stats = sub.add_parser("stats", help="rate, inter-arrival CV and length quantiles of a trace")
    stats.add_argument(
        "trace", help="trace file (Azure/BurstGPT/Vidur/Splitwise-sim/any CSV, Mooncake/any JSONL)"
    )
    stats.add_argument(
        "--format",
        choices=TRACE_FORMATS,
        default="auto",
        help="trace format (default: detect from the first line; with --columns, --time-unit "
        "or --arrival-kind: csv or jsonl by the file's type)",
    )
    stats.add_argument(
        "--columns",
        type=_column_map,
        help="column map of a csv/jsonl trace: KEY=NAME,... with KEY among "
        f"{', '.join(CSV_COLUMNS)} (default: the key itself)",
    )
    stats.add_argument(
        "--time-unit", choices=TIME_UNITS, help="unit of the arrival column (default s)"
    )
    stats.add_argument(
        "--arrival-kind",
        choices=ARRIVAL_KINDS,
        help="arrival column holds each request's time, or the gap since the previous one "
        "(default time)",
    )
    add_json_flag(stats)
    stats.set_defaults(handler=_stats, parser=stats)

    gen = sub.add_parser("generate", help="write a synthetic archetype workload as generic CSV")
    gen.add_argument(
        "--archetype", required=True, choices=sorted(ARCHETYPES), help="request-length archetype"
    )
    gen.add_argument("--rate", type=POSITIVE, required=True, help="mean arrival rate (req/s)")
    size = gen.add_mutually_exclusive_group(required=True)
    size.add_argument("--requests", type=POSITIVE_INT, help="number of requests")
    size.add_argument("--duration", type=POSITIVE, help="fill [0, DURATION) seconds")
    gen.add_argument(
        "--cv",
        type=POSITIVE,
        default=1.0,
        help="inter-arrival CV: 1 is Poisson, else gamma gaps (default 1)",
    )
    gen.add_argument("--seed", type=NON_NEGATIVE_INT, default=0, help="random seed (default 0)")
    gen.add_argument("--out", required=True, help="CSV file to write")
    add_json_flag(gen)
    gen.set_defaults(handler=_generate)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _with_warnings(make: Callable[[], Workload]) -> tuple[Workload, list[str]]:
    """Run ``make`` and collect pdopt's data warnings, so --json can carry them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PdoptWarning)
        try:
            workload = make()
        except OSError as exc:  # a missing or unreadable file is the user's input, not a crash
            raise InputError(str(exc)) from None
    messages = [str(w.message) for w in caught if issubclass(w.category, PdoptWarning)]
    for other in (w for w in caught if not issubclass(w.category, PdoptWarning)):
        warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    return workload, messages


def _column_map(text: str) -> dict[str, str]:
    """``--columns``: ``KEY=NAME`` pairs separated by commas, each KEY once."""
    pairs = [[part.strip() for part in item.split("=")] for item in text.split(",")]
    mapping = {pair[0]: pair[-1] for pair in pairs}
    ok = all(len(pair) == 2 and pair[0] in CSV_COLUMNS and pair[1] for pair in pairs)
    if not ok or len(mapping) != len(pairs):
        raise argparse.ArgumentTypeError(
            f"expected KEY=NAME,... with each KEY once among {list(CSV_COLUMNS)}, got {text!r}"
        )
    return mapping


def _stats(args: argparse.Namespace) -> int:
    options = {
        "columns": args.columns,
        "time_unit": args.time_unit,
        "arrival_kind": args.arrival_kind,
    }
    given = [name for name, value in options.items() if value is not None]
    if given and args.format not in ("auto", "csv", "jsonl"):
        option = "--" + given[0].replace("_", "-")
        args.parser.error(f"{option} goes with --format csv, jsonl or auto, not {args.format}")

    def load() -> Workload:
        return read_trace(args.trace, format=args.format, **options)

    workload, messages = _with_warnings(load)
    fmt = args.format
    if fmt == "auto":
        fmt = detect_trace_format(args.trace, column_map=bool(given))
    stats = workload.stats()
    if args.json:
        print_json({"path": args.trace, "format": fmt, "stats": stats, "warnings": messages})
        return 0
    for message in messages:
        print_warning(message)
    print(f"{args.trace} ({fmt})")
    print(_table(stats))
    return 0


def _generate(args: argparse.Namespace) -> int:
    def make() -> Workload:
        return archetype_workload(
            args.archetype,
            args.rate,
            n_requests=args.requests,
            duration_s=args.duration,
            cv=args.cv,
            seed=args.seed,
        )

    workload, messages = _with_warnings(make)
    try:
        write_csv_trace(workload, args.out)
    except OSError as exc:
        raise InputError(f"cannot write {args.out}: {exc}") from None
    payload = {
        "out": args.out,
        "archetype": args.archetype,
        "description": ARCHETYPES[args.archetype].description,
        "seed": args.seed,
        "cv_target": args.cv,
        "stats": workload.stats(),
        "warnings": messages,
    }
    if args.json:
        print_json(payload)
        return 0
    for message in messages:
        print_warning(message)
    print(
        f"wrote {len(workload)} requests to {args.out} "
        f"({ARCHETYPES[args.archetype].description}, seed {args.seed})"
    )
    print(_table(workload.stats()))
    return 0


def _table(stats: pd.Series) -> str:
    """Two aligned columns; counts as integers, the rest with 4 significant digits."""
    width = max(len(str(k)) for k in stats.index)
    rows = []
    for key, value in stats.items():
        text = f"{int(value)}" if key == "requests" else f"{value:.4g}"
        rows.append(f"  {key!s:<{width}}  {text:>10}")
    return "\n".join(rows)
