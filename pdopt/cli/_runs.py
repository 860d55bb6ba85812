"""What ``simulate`` and ``capacity`` share: progress on stderr and the run's exports.

Progress is tqdm on stderr, drawn only when stderr is a terminal and ``--quiet`` is not given
(tqdm's ``disable=None``), so pipes, files and ``--json`` stay clean. A single simulation reports
no fraction done (the engine writes nothing and is not interrupted), so it shows what runs and
the elapsed time, refreshed every second by a thread outside the engine. Exports:
``--requests-csv`` (one row per request), ``--timeseries-csv`` (per worker per tick) and
``--plots DIR`` (:func:`pdopt.report.save_run_figures`).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

if TYPE_CHECKING:
    from pdopt.scenario import Scenario
    from pdopt.sim import SimResult


def add_run_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--requests-csv``, ``--timeseries-csv``, ``--plots`` (of ``what``) and ``--quiet``."""
    parser.add_argument("--requests-csv", metavar="FILE", help=f"write {what}'s requests as CSV")
    parser.add_argument(
        "--timeseries-csv", metavar="FILE", help=f"write {what}'s per-worker time series as CSV"
    )
    parser.add_argument(
        "--plots",
        metavar="DIR",
        help=f"write {what}'s figures as PNG: latency_cdf (TTFT, TPOT), queue, kv",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")


def wants_export(args: argparse.Namespace) -> bool:
    return bool(args.requests_csv or args.timeseries_csv or args.plots)


def export(result: SimResult, args: argparse.Namespace) -> dict[str, Any]:
    """Write the exports ``args`` asks for; what was written, by flag name."""
    from pdopt.report import save_run_figures

    written: dict[str, Any] = {}
    if args.requests_csv:
        result.requests.to_csv(args.requests_csv, index=False)
        written["requests_csv"] = args.requests_csv
    if args.timeseries_csv:
        result.timeseries.to_csv(args.timeseries_csv, index=False)
        written["timeseries_csv"] = args.timeseries_csv
    if args.plots:
        written["plots"] = [str(p) for p in save_run_figures(result, args.plots)]
    return written


def print_written(written: dict[str, Any]) -> None:
    for value in written.values():
        for path in value if isinstance(value, list) else [value]:
            print(f"wrote {path}")


def describe_run(scenario: Scenario, n_requests: int) -> str:
    """What a progress line says a run is doing; notes when the run compiles the compiled engine
    (numba's cache cold: :func:`pdopt.sim._compiled._warm.cache_is_cold`)."""
    from pdopt.sim._simulate import COMPILED_MIN_REQUESTS

    text = f"simulating {n_requests} requests ({scenario.policy_name})"
    may_compile = scenario.engine == "compiled" or (
        scenario.engine == "auto" and n_requests >= COMPILED_MIN_REQUESTS
    )
    if may_compile:
        from pdopt.sim._compiled._warm import cache_is_cold

        if cache_is_cold():
            text += " — compiling the compiled engine first (several minutes, once)"
    return text


@contextmanager
def activity(desc: str, quiet: bool) -> Iterator[None]:
    """A one-line status with elapsed seconds while the block runs (module docstring)."""
    bar = tqdm(
        desc=desc,
        file=sys.stderr,
        disable=True if quiet else None,
        bar_format="{desc} [{elapsed}]",
        leave=False,
    )
    with ticking(bar):
        yield


@contextmanager
def ticking(bar: tqdm[Any]) -> Iterator[tqdm[Any]]:
    """``bar`` redrawn every second by a thread while the block runs (so its elapsed time moves
    during one long step), then closed."""
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(1.0):
            bar.refresh()

    thread = threading.Thread(target=refresh, daemon=True)
    if not bar.disable:
        thread.start()
    try:
        yield bar
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        bar.close()


def steps_bar(total: int, desc: str, quiet: bool) -> tqdm[Any]:
    """A bar over at most ``total`` steps (capacity: simulations, ``max_evaluations``)."""
    return tqdm(
        total=total, desc=desc, unit="run", file=sys.stderr, disable=True if quiet else None
    )
