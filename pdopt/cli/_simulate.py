"""``pdopt simulate CONFIG.toml [--json]``: one request-level simulation from a config file.

``pdopt simulate --example-config`` prints a commented example config.
"""

from __future__ import annotations

import argparse
from typing import Any

from pdopt.cli._output import add_json_flag, print_json


def register(subparsers: Any) -> None:
    """Add ``pdopt simulate``."""
    parser = subparsers.add_parser(
        "simulate", help="run one request-level simulation from a TOML config"
    )
    parser.add_argument("config", nargs="?", help="simulation config (TOML)")
    parser.add_argument(
        "--example-config", action="store_true", help="print a commented example config"
    )
    add_json_flag(parser)
    parser.set_defaults(handler=_simulate, parser=parser)


def _simulate(args: argparse.Namespace) -> int:
    from pdopt.policies import make_policy
    from pdopt.sim import simulate
    from pdopt.sim._config import EXAMPLE_CONFIG, load_config

    if args.example_config:
        print(EXAMPLE_CONFIG, end="")
        return 0
    if not args.config:
        args.parser.error("give a CONFIG.toml (or --example-config)")
    cfg = load_config(args.config)
    result = simulate(
        cfg.driver,
        cfg.cluster,
        make_policy(cfg.policy, **cfg.policy_flags),
        slo=cfg.slo,
        tick_s=cfg.tick_s,
        seed=cfg.seed,
        record_timeseries=cfg.record_timeseries,
        engine=cfg.engine,
    )
    metrics = result.metrics()
    if args.json:
        print_json(
            {
                "config": args.config,
                "policy": cfg.policy,
                "workers": result.workers,
                "metrics": metrics,
            }
        )
        return 0
    print(f"{args.config}: policy {cfg.policy}, {len(cfg.cluster.workers)} workers")
    for key, value in metrics.items():
        print(f"  {key:28s} {value:.6g}")
    return 0
