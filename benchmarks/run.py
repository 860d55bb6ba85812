"""Run every benchmark, one JSON file each: ``python -m benchmarks.run --out DIR``.

Each ``benchmarks/bench_*.py`` module exports ``BENCHMARKS``: a dict from benchmark name to
``(function, full_size)``; the function takes a size and returns a JSON-able dict of what it
measured (and the target it is checked against). ``--only NAME`` runs one benchmark; ``--quick``
runs each at a tenth of its size. A module may also export ``FULL``: benchmark name to a function
of the size that runs the whole long job the benchmark otherwise samples and extrapolates
(``phasor_study``: the 200-trial study); ``--full`` runs those instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Bench = tuple[Callable[[int], dict[str, Any]], int]


def discover(full: bool = False) -> dict[str, Bench]:
    """Every benchmark of every ``bench_*`` module next to this file, by name; with ``full``,
    a module's ``FULL`` functions replace its sampled ones."""
    suites: dict[str, Bench] = {}
    for path in sorted(Path(__file__).parent.glob("bench_*.py")):
        module = importlib.import_module(f"benchmarks.{path.stem}")
        whole = getattr(module, "FULL", {}) if full else {}
        for name, (function, size) in module.BENCHMARKS.items():
            if name in suites:
                raise SystemExit(f"benchmark {name!r} is defined twice ({path.name})")
            suites[name] = (whole.get(name, function), size)
    return suites


def main(argv: list[str] | None = None) -> int:
    suites = discover(full="--full" in (argv if argv is not None else sys.argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run")
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSON files")
    parser.add_argument("--only", choices=sorted(suites), action="append", help="run these only")
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    parser.add_argument(
        "--full", action="store_true", help="run whole what some benchmarks sample (phasor_study)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or sorted(suites):
        function, full_size = suites[name]
        size = max(1, full_size // (10 if args.quick else 1))
        t0 = time.perf_counter()
        result = function(size)
        result["benchmark_wall_s"] = time.perf_counter() - t0
        result["machine"] = {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor(),
        }
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"{name}: {json.dumps(result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
