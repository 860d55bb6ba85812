"""Run every benchmark, one JSON file each: ``python -m benchmarks.run --out DIR``.

``--only NAME`` runs one benchmark; ``--quick`` runs them at a tenth of their size.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from benchmarks import bench_sim

SUITES = {**bench_sim.BENCHMARKS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run")
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSON files")
    parser.add_argument("--only", choices=sorted(SUITES), help="run one benchmark")
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = [args.only] if args.only else sorted(SUITES)
    sizes = {"sim_throughput": 100_000, "sim_memory": 1_000_000}
    for name in names:
        n = sizes[name] // (10 if args.quick else 1)
        t0 = time.perf_counter()
        result = SUITES[name](n)
        result["benchmark_wall_s"] = time.perf_counter() - t0
        result["machine"] = {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor(),
        }
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{name}: {json.dumps(result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
