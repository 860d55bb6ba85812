"""``pdopt capacity CONFIG.toml [--json]``: SLO-constrained capacity from a simulation config.

The config is a ``pdopt simulate`` config (``pdopt simulate --example-config``) plus an optional
``[capacity]`` table (``pdopt capacity --example-config`` prints both)::

    [capacity]
    mode = "open"               # "open": largest rate scale; "closed": largest client count
    target_attainment = 0.9     # open: fraction of requests meeting TTFT and TPOT SLOs
    rel_tol = 0.02              # open: bisect until (hi - lo) <= rel_tol * lo
    start_scale = 1.0           # open: first rate scale tried (1 = the workload as given)
    max_evaluations = 40        # simulations at most
    requests_per_client = 20    # closed: requests per client in each run
    start_clients = 1           # closed: first client count tried
    max_clients = 65536         # closed: stop doubling here
    # think_time_s = 0.0        # closed: defaults to [workload.closed_loop] think_time_s, or 0

Open mode needs an open-loop ``[workload]``; closed mode takes the lengths (and think time) of
the workload, whether or not it has a ``[workload.closed_loop]`` table (its ``clients`` is then
ignored: the search chooses the count). Every simulation uses the config's ``seed``.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from pdopt.cli._output import add_json_flag, print_json
from pdopt.errors import ConfigError

CAPACITY_EXAMPLE = """
[capacity]
mode = "open"               # "open": largest rate scale; "closed": largest client count
target_attainment = 0.9     # open: fraction of requests meeting both TTFT and TPOT SLOs
rel_tol = 0.02              # open: bisect until (hi - lo) <= rel_tol * lo
start_scale = 1.0           # open: first rate scale tried (1 = the workload as given)
max_evaluations = 40        # simulations at most
requests_per_client = 20    # closed: requests per client in each run
start_clients = 1           # closed: first client count tried
max_clients = 65536         # closed: stop doubling here
# think_time_s = 0.0        # closed: default [workload.closed_loop] think_time_s, or 0
"""

_DEFAULTS: dict[str, Any] = {
    "mode": "open",
    "target_attainment": 0.9,
    "rel_tol": 0.02,
    "start_scale": 1.0,
    "max_evaluations": 40,
    "requests_per_client": 20,
    "start_clients": 1,
    "max_clients": 65536,
    "think_time_s": None,
}


def register(subparsers: Any) -> None:
    """Add ``pdopt capacity``."""
    parser = subparsers.add_parser(
        "capacity",
        help="largest rate (open loop) or concurrency (closed loop) meeting the SLO",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", help="simulation config (TOML) with [capacity]")
    parser.add_argument(
        "--example-config", action="store_true", help="print a commented example config"
    )
    add_json_flag(parser)
    parser.set_defaults(handler=_capacity, parser=parser)


def capacity_options(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The ``[capacity]`` table with defaults filled in; unknown keys are errors."""
    part = data.get("capacity", {})
    if not isinstance(part, dict):
        raise ConfigError(f"{where}: [capacity] must be a table")
    unknown = sorted(set(part) - set(_DEFAULTS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown} in [capacity]; allowed: {sorted(_DEFAULTS)}"
        )
    options = {**_DEFAULTS, **part}
    if options["mode"] not in ("open", "closed"):
        raise ConfigError(
            f"{where}: [capacity] mode must be 'open' or 'closed'; got {options['mode']!r}"
        )
    return options


def _capacity(args: argparse.Namespace) -> int:
    from pdopt.sim._config import EXAMPLE_CONFIG, parse_config

    if args.example_config:
        print(EXAMPLE_CONFIG + CAPACITY_EXAMPLE, end="")
        return 0
    if not args.config:
        args.parser.error("give a CONFIG.toml (or --example-config)")
    path = Path(args.config)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such config file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    options = capacity_options(data, str(path))
    sim_part = {k: v for k, v in data.items() if k != "capacity"}
    cfg = parse_config(sim_part, base=path.parent, where=str(path))
    run = _open if options["mode"] == "open" else _closed
    payload = {"config": args.config, "policy": cfg.policy, **run(cfg, options, str(path))}
    if args.json:
        print_json(payload)
    else:
        _print_text(payload)
    return 0


def _factory(cfg: Any) -> Any:
    from pdopt.policies import make_policy

    return lambda: make_policy(cfg.policy, **cfg.policy_flags)


def _open(cfg: Any, options: dict[str, Any], where: str) -> dict[str, Any]:
    from pdopt.capacity import max_rate_under_slo
    from pdopt.workload import Workload

    if not isinstance(cfg.driver, Workload):
        raise ConfigError(
            f"{where}: [capacity] mode 'open' needs an open-loop [workload]; remove "
            "[workload.closed_loop] or use mode = 'closed'"
        )
    res = max_rate_under_slo(
        cfg.driver, cfg.cluster, _factory(cfg), cfg.slo,
        attainment=float(options["target_attainment"]), rel_tol=float(options["rel_tol"]),
        seed=cfg.seed, start_scale=float(options["start_scale"]), tick_s=cfg.tick_s,
        max_evaluations=int(options["max_evaluations"]), engine=cfg.engine,
    )  # fmt: skip
    return {
        "mode": "open",
        "status": res.status,
        "max_rate_per_s": res.max_rate_per_s,
        "max_rate_scale": res.max_rate_scale,
        "attainment_at_max": res.attainment_at_max,
        "target_attainment": res.target_attainment,
        "rel_tol": res.rel_tol,
        "bracket_scale": list(res.bracket_scale),
        "seed": res.seed,
        "points": res.points,
    }


def _closed(cfg: Any, options: dict[str, Any], where: str) -> dict[str, Any]:
    from pdopt.capacity import max_concurrency_under_slo
    from pdopt.sim import ClosedLoop
    from pdopt.workload import Workload

    think, think_kind = 0.0, "constant"
    if isinstance(cfg.driver, ClosedLoop):
        inputs, outputs = cfg.driver.length_arrays()
        think, think_kind = cfg.driver.think_time_s, cfg.driver.think
        lengths = Workload(np.zeros(len(inputs)), inputs, outputs)
    else:
        lengths = cfg.driver
    if options["think_time_s"] is not None:
        think = float(options["think_time_s"])
    res = max_concurrency_under_slo(
        lengths, cfg.cluster, _factory(cfg), cfg.slo, think_time_s=think, think=think_kind,
        requests_per_client=int(options["requests_per_client"]), seed=cfg.seed,
        start_clients=int(options["start_clients"]), max_clients=int(options["max_clients"]),
        tick_s=cfg.tick_s, max_evaluations=int(options["max_evaluations"]), engine=cfg.engine,
    )  # fmt: skip
    return {
        "mode": "closed",
        "status": res.status,
        "max_clients": res.max_clients,
        "ttft_p99_s": res.ttft_p99_s,
        "tpot_p99_s": res.tpot_p99_s,
        "think_time_s": think,
        "bracket_clients": list(res.bracket_clients),
        "seed": res.seed,
        "points": res.points,
    }


def _print_text(payload: dict[str, Any]) -> None:
    print(f"{payload['config']}: policy {payload['policy']}, mode {payload['mode']}")
    for key, value in payload.items():
        if key in ("config", "policy", "mode", "points"):
            continue
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        print(f"  {key:20s} {shown}")
    print("points tried (in order):")
    print(payload["points"].to_string(index=False, float_format=lambda v: f"{v:.6g}"))
