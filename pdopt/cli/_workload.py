"""``pdopt workload``: summarise traces and write synthetic workloads.

Sub-commands::

    pdopt workload stats TRACE [--format auto|azure|burstgpt|mooncake|vidur|splitwise_sim|csv|jsonl]
                         [--columns arrival_s=NAME,input_tokens=NAME,output_tokens=NAME,
                                    block_hashes=NAME | prefix_group=NAME,prefix_tokens=NAME]
                         [--time-unit s|ms|us|ns|datetime] [--arrival-kind time|gap]
                         [--hash-block-tokens N] [--cache-blocks N,N,...] [--json]
    pdopt workload generate [--kind archetype|shared-prefix|sessions] [--archetype NAME]
                            --rate R (--requests N | --duration S) [--cv CV]
                            [--stages START:RATE,...] [reuse options, see --help]
                            [--seed S] --out FILE.csv [--json]

A trace (or generated workload) with prefix blocks also gets its prefix reuse: the reusable-token
fraction with an unbounded cache and the LRU token hit rate against cache size
(:func:`pdopt.workload.reuse_stats`).
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from pdopt.cli._args import NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT
from pdopt.cli._output import add_json_flag, print_json, print_warning
from pdopt.errors import InputError, PdoptWarning
from pdopt.model_spec import DEFAULT_BLOCK_TOKENS
from pdopt.workload import (
    ARCHETYPES,
    ARRIVAL_KINDS,
    COLUMN_MAP_KEYS,
    TIME_UNITS,
    TRACE_FORMATS,
    ConstantLengths,
    LengthDistribution,
    LognormalLengths,
    RateSchedule,
    Workload,
    archetype_workload,
    detect_trace_format,
    gamma_arrivals,
    piecewise_rate_arrivals,
    poisson_arrivals,
    read_trace,
    reuse_stats,
    session_workload,
    shared_prefix_workload,
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
        f"{', '.join(COLUMN_MAP_KEYS)} (default: the key itself; the prefix-block keys "
        "block_hashes, or prefix_group with prefix_tokens, are read when mapped or present)",
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
    stats.add_argument(
        "--hash-block-tokens",
        type=POSITIVE_INT,
        help="tokens per block of the trace's block hashes (Mooncake hash_ids: default 512; "
        "csv/jsonl block columns: needed unless the file has a block_tokens column)",
    )
    stats.add_argument(
        "--cache-blocks",
        type=positive_int_list,
        help="cache sizes in blocks for the LRU hit-rate curve, N,N,... (default: powers of 2 "
        "up to every distinct block)",
    )
    add_json_flag(stats)
    stats.set_defaults(handler=_stats, parser=stats)

    gen = sub.add_parser(
        "generate", help="write a synthetic workload (archetype, shared prefix, sessions) as CSV"
    )
    gen.add_argument(
        "--kind",
        choices=("archetype", "shared-prefix", "sessions"),
        default="archetype",
        help="archetype: lengths of a named archetype; shared-prefix: users of shared system "
        "prompts; sessions: multi-turn chats whose history grows (default archetype)",
    )
    gen.add_argument(
        "--archetype",
        choices=sorted(ARCHETYPES),
        help="request-length archetype (--kind archetype)",
    )
    gen.add_argument(
        "--rate",
        type=POSITIVE,
        help="mean arrival rate (req/s; sessions/s with --kind sessions); or give --stages",
    )
    size = gen.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--requests", type=POSITIVE_INT, help="number of requests (sessions with --kind sessions)"
    )
    size.add_argument("--duration", type=POSITIVE, help="fill [0, DURATION) seconds")
    gen.add_argument(
        "--cv",
        type=POSITIVE,
        default=1.0,
        help="inter-arrival CV: 1 is Poisson, else gamma gaps (default 1)",
    )
    gen.add_argument("--seed", type=NON_NEGATIVE_INT, default=0, help="random seed (default 0)")
    add_generate_reuse_arguments(gen)
    gen.add_argument("--out", required=True, help="CSV file to write")
    add_json_flag(gen)
    gen.set_defaults(handler=_generate, parser=gen)


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
    ok = all(len(pair) == 2 and pair[0] in COLUMN_MAP_KEYS and pair[1] for pair in pairs)
    if not ok or len(mapping) != len(pairs):
        raise argparse.ArgumentTypeError(
            f"expected KEY=NAME,... with each KEY once among {list(COLUMN_MAP_KEYS)}, got {text!r}"
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
        return read_trace(
            args.trace, format=args.format, **options, block_tokens=args.hash_block_tokens
        )

    workload, messages = _with_warnings(load)
    fmt = args.format
    if fmt == "auto":
        fmt = detect_trace_format(args.trace, column_map=bool(given))
    stats = workload.stats()
    reuse = reuse_payload(workload, args.cache_blocks)
    if args.json:
        payload = {"path": args.trace, "format": fmt, "stats": stats, "warnings": messages}
        print_json({**payload, **reuse})
        return 0
    for message in messages:
        print_warning(message)
    print(f"{args.trace} ({fmt})")
    print(_table(stats))
    print(reuse_text(reuse, _table))
    return 0


def _generate(args: argparse.Namespace) -> int:
    if args.kind == "archetype":
        return _generate_archetype(args)
    workload, messages = _with_warnings(lambda: generated_reuse_workload(args))
    _write(workload, args.out)
    reuse = reuse_payload(workload, None)
    payload = {"out": args.out, "kind": args.kind, "seed": args.seed, "stats": workload.stats()}
    if args.json:
        print_json({**payload, **reuse, "warnings": messages})
        return 0
    for message in messages:
        print_warning(message)
    print(f"wrote {len(workload)} requests to {args.out} ({args.kind}, seed {args.seed})")
    print(_table(workload.stats()))
    print(reuse_text(reuse, _table))
    return 0


def _write(workload: Workload, out: str) -> None:
    try:
        write_csv_trace(workload, out)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc}") from None


def _generate_archetype(args: argparse.Namespace) -> int:
    if args.archetype is None:
        args.parser.error("--kind archetype needs --archetype NAME")
    if args.rate is None or args.stages is not None:
        args.parser.error("--kind archetype needs --rate (and takes no --stages)")
    if args.multi_turn:
        args.parser.error("--multi-turn goes with --kind shared-prefix")

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
    _write(workload, args.out)
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


_COUNTS = ("requests", "block_tokens", "blocks", "distinct_blocks", "prompt_tokens")


def _table(stats: pd.Series) -> str:
    """Two aligned columns; counts as integers, the rest with 4 significant digits."""
    width = max(len(str(k)) for k in stats.index)
    rows = []
    for key, value in stats.items():
        text = f"{int(value)}" if key in _COUNTS else f"{value:.4g}"
        rows.append(f"  {key!s:<{width}}  {text:>10}")
    return "\n".join(rows)


# --- prefix reuse: stats output and the shared-prefix / sessions generators -----------------


def positive_int_list(text: str) -> list[int]:
    """``--cache-blocks``: ``N,N,...`` with each N >= 1."""
    return [POSITIVE_INT(part.strip()) for part in text.split(",")]


def _lengths(text: str) -> LengthDistribution:
    """``N`` (a constant) or ``lognormal:MEAN:MEDIAN`` (tokens)."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            return ConstantLengths(POSITIVE_INT(parts[0]))
        if len(parts) == 3 and parts[0] == "lognormal":
            return LognormalLengths.from_mean_median(POSITIVE(parts[1]), POSITIVE(parts[2]))
    except (argparse.ArgumentTypeError, ValueError):
        pass  # the one message below says what is accepted
    raise argparse.ArgumentTypeError(
        f"expected N (tokens >= 1) or lognormal:MEAN:MEDIAN (MEAN >= MEDIAN > 0), got {text!r}"
    )


def _stages(text: str) -> list[tuple[float, float]]:
    """``--stages``: ``START:RATE,...`` (seconds, req/s)."""
    try:
        pairs = [tuple(float(v) for v in item.split(":")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected START:RATE,... (s, req/s), got {text!r}")
    return [(p[0], p[1]) for p in pairs]


def add_generate_reuse_arguments(gen: argparse.ArgumentParser) -> None:
    """The options of ``--kind shared-prefix`` and ``--kind sessions``."""
    group = gen.add_argument_group(
        "shared-prefix and sessions (lengths: N or lognormal:MEAN:MEDIAN)"
    )
    group.add_argument(
        "--stages",
        type=_stages,
        help="piecewise Poisson rate START:RATE,... ending at --duration (instead of --rate)",
    )
    group.add_argument("--system-prompts", type=POSITIVE_INT, default=1, help="(default 1)")
    group.add_argument(
        "--system-prompt-tokens",
        type=NON_NEGATIVE_INT,
        default=None,
        help="tokens per system prompt (default 1024 for shared-prefix, 0 for sessions)",
    )
    group.add_argument(
        "--users-per-prompt", type=POSITIVE_INT, default=10, help="users per system prompt"
    )
    group.add_argument("--question-tokens", type=_lengths, default=ConstantLengths(128),
                       help="tokens per question (default 128)")  # fmt: skip
    group.add_argument("--output-tokens", type=_lengths, default=ConstantLengths(128),
                       help="tokens per answer (default 128)")  # fmt: skip
    group.add_argument(
        "--multi-turn",
        action="store_true",
        help="shared-prefix: a user's prompt holds its earlier questions and answers",
    )
    group.add_argument("--turns", type=_lengths, default=ConstantLengths(4),
                       help="turns per session (default 4)")  # fmt: skip
    group.add_argument(
        "--think-time", type=POSITIVE, default=30.0, help="mean seconds between turns (default 30)"
    )
    group.add_argument(
        "--max-input-tokens",
        type=POSITIVE_INT,
        help="drop a conversation's history before a turn would exceed it (default: no limit)",
    )
    group.add_argument(
        "--block-tokens",
        type=POSITIVE_INT,
        default=DEFAULT_BLOCK_TOKENS,
        help=f"tokens per prefix block ({DEFAULT_BLOCK_TOKENS})",
    )


def _arrivals(args: argparse.Namespace) -> np.ndarray:
    if args.stages is not None:
        if args.rate is not None or args.duration is None:
            args.parser.error("--stages goes with --duration (its end) and without --rate")
        starts, rates = zip(*args.stages, strict=True)
        schedule = RateSchedule(tuple(starts), tuple(rates), args.duration)
        return piecewise_rate_arrivals(schedule, seed=args.seed)
    if args.rate is None:
        args.parser.error(f"--kind {args.kind} needs --rate or --stages")
    size = {"n_requests": args.requests, "duration_s": args.duration, "seed": args.seed}
    if args.cv == 1.0:
        return poisson_arrivals(args.rate, **size)
    return gamma_arrivals(args.rate, args.cv, **size)


def generated_reuse_workload(args: argparse.Namespace) -> Workload:
    """The ``--kind shared-prefix`` or ``--kind sessions`` workload of ``args``."""
    arrival = _arrivals(args)
    common = {
        "question_tokens": args.question_tokens,
        "output_tokens": args.output_tokens,
        "max_input_tokens": args.max_input_tokens,
        "block_tokens": args.block_tokens,
        "seed": args.seed,
    }
    system = args.system_prompt_tokens
    if args.kind == "shared-prefix":
        return shared_prefix_workload(
            arrival,
            num_system_prompts=args.system_prompts,
            system_prompt_tokens=1024 if system is None else system,
            users_per_system_prompt=args.users_per_prompt,
            multi_turn=args.multi_turn,
            **common,
        )
    if args.multi_turn:
        args.parser.error("--multi-turn goes with --kind shared-prefix (sessions are multi-turn)")
    return session_workload(
        arrival,
        turns=args.turns,
        think_time_s=args.think_time,
        system_prompt_tokens=0 if system is None else system,
        **common,
    )


def reuse_payload(workload: Workload, cache_blocks: list[int] | None) -> dict[str, Any]:
    """``{"reuse": summary, "hit_curve": rows}`` for a workload with prefix blocks, else {}."""
    if workload.prefix_blocks is None:
        return {}
    stats = reuse_stats(workload, cache_blocks)
    return {"reuse": stats.summary, "hit_curve": stats.curve}


def reuse_text(reuse: dict[str, Any], table: Callable[[pd.Series], str]) -> str:
    """The reuse summary and the hit-rate curve as text ("" without blocks)."""
    if not reuse:
        return ""
    curve = reuse["hit_curve"].copy()
    for column in ("token_hit_rate", "request_hit_rate"):
        curve[column] = curve[column].map(lambda v: f"{v:.4f}")
    return (
        "prefix reuse (unbounded cache; LRU hit rate by cache size below)\n"
        + table(reuse["reuse"])
        + "\n"
        + str(curve.to_string(index=False))
    )
