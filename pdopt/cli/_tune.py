"""``pdopt tune CONFIG.toml [--json]``: an Optuna study over a policy's parameters.

The config is a ``pdopt simulate`` config (open-loop workload) plus a ``[tune]`` table
(``pdopt tune --example-config`` prints both). Flags override the table. Storage by URL:
memory (default), ``sqlite:///study.db``, ``journal:///study.log``, ``postgresql://…``; run the
same command in several processes or machines on one storage to share the study, and again to
resume it (``n_trials`` is the total).
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from pdopt.cli._output import add_json_flag, print_json
from pdopt.errors import ConfigError

TUNE_EXAMPLE = """
[tune]
n_trials = 50                 # total trials the study should hold (resuming counts old ones)
fidelity = "fluid"            # "fluid" (fast screening) or "des" (request level)
steps = [1.0]                 # partial runs for pruning, e.g. [0.25, 0.5, 1.0] (single target)
targets = ["min:e2e_p99_s"]   # one: single objective; several: Pareto front
constraints = ["slo_attainment>=0.9"]   # capacity floor; [] for none
space = ["theta_frag=0.05:0.5", "theta_flow=0.3:0.95", "delta_t_s=0.01:0.5:log",
         "cool_s=0.1:10:log"]   # alpha_scale=0.5:2:log would vary the hardware, not the policy
storage = "memory"            # sqlite:///study.db, journal:///study.log, postgresql://...
study_name = "pdopt-tune"
confirm_top = 1               # re-run the best N with the request-level simulator
n_workers = 1                 # local worker processes (need a storage URL)
seed = 0                      # sampler seed
"""

_DEFAULTS: dict[str, Any] = {
    "n_trials": 50,
    "fidelity": "fluid",
    "steps": [1.0],
    "targets": ["min:e2e_p99_s"],
    "constraints": ["slo_attainment>=0.9"],
    "space": None,
    "storage": "memory",
    "study_name": "pdopt-tune",
    "confirm_top": 1,
    "n_workers": 1,
    "seed": 0,
}


def register(subparsers: Any) -> None:
    """Add ``pdopt tune``."""
    parser = subparsers.add_parser(
        "tune",
        help="tune a policy's parameters with Optuna (fluid screening, DES confirmation)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", help="simulation config (TOML) with [tune]")
    parser.add_argument("--example-config", action="store_true", help="print an example config")
    parser.add_argument("--n-trials", type=int, help="total trials (overrides [tune])")
    parser.add_argument("--storage", help="memory, sqlite:///F.db, journal:///F.log, postgresql://")
    parser.add_argument("--study-name", help="study name in the storage")
    parser.add_argument("--fidelity", choices=("fluid", "des"), help="simulator of the trials")
    parser.add_argument("--n-workers", type=int, help="local worker processes")
    parser.add_argument("--dask-scheduler", help="tcp://HOST:PORT: run trials on a Dask cluster")
    parser.add_argument("--confirm-top", type=int, help="DES re-runs of the best trials")
    parser.add_argument("--plots", metavar="DIR", help="write pareto.png and importance.png")
    parser.add_argument("--trials-csv", metavar="FILE", help="write every trial as CSV")
    parser.add_argument(
        "--sensitivity", action="store_true", help="also print the Table 5 sensitivity sweep"
    )
    parser.add_argument(
        "--fail-stale", action="store_true", help="mark RUNNING trials FAIL first (killed worker)"
    )
    parser.add_argument("--progress", action="store_true", help="progress bar on stderr")
    add_json_flag(parser)
    parser.set_defaults(handler=_tune, parser=parser)


def tune_options(data: dict[str, Any], args: argparse.Namespace, where: str) -> dict[str, Any]:
    """The ``[tune]`` table with defaults, then the command-line overrides."""
    part = data.get("tune", {})
    if not isinstance(part, dict):
        raise ConfigError(f"{where}: [tune] must be a table")
    unknown = sorted(set(part) - set(_DEFAULTS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown} in [tune]; allowed: {sorted(_DEFAULTS)}"
        )
    options = {**_DEFAULTS, **part}
    for key in ("n_trials", "storage", "study_name", "fidelity", "n_workers", "confirm_top"):
        value = getattr(args, key)
        if value is not None:
            options[key] = value
    return options


def _scenario(path: Path, data: dict[str, Any]) -> Any:
    from pdopt.sim._config import parse_config
    from pdopt.tune import TuneScenario
    from pdopt.workload import Workload

    cfg = parse_config(
        {k: v for k, v in data.items() if k != "tune"}, base=path.parent, where=str(path)
    )
    if not isinstance(cfg.driver, Workload):
        raise ConfigError(f"{path}: pdopt tune needs an open-loop [workload] (no closed_loop)")
    return TuneScenario(
        cfg.driver, cfg.cluster, cfg.slo, cfg.policy, cfg.policy_flags, cfg.tick_s, cfg.seed
    )


def _tune(args: argparse.Namespace) -> int:
    from pdopt.sim._config import EXAMPLE_CONFIG

    if args.example_config:
        print(
            EXAMPLE_CONFIG.replace('name = "least_loaded"', 'name = "phasor"') + TUNE_EXAMPLE,
            end="",
        )
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
    options = tune_options(data, args, str(path))
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the CLI prints its own summary
    payload = _run(_scenario(path, data), options, args)
    if args.json:
        print_json(payload)
    else:
        _print_text(payload)
    return 0


def _run(scenario: Any, options: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from pdopt.tune import (
        PHASOR_SPACE,
        Objective,
        SearchSpace,
        plot_importances,
        plot_pareto_front,
        sensitivity_table,
        tune,
    )

    space = PHASOR_SPACE if options["space"] is None else SearchSpace.parse(list(options["space"]))
    objective = Objective.parse(list(options["targets"]), list(options["constraints"]))
    result = tune(
        scenario, space, objective,
        n_trials=int(options["n_trials"]), fidelity=str(options["fidelity"]),
        steps=[float(s) for s in options["steps"]], storage=options["storage"],
        study_name=str(options["study_name"]), seed=int(options["seed"]),
        n_workers=int(options["n_workers"]), dask_scheduler=args.dask_scheduler,
        confirm_top=int(options["confirm_top"]), fail_stale=args.fail_stale,
        progress=args.progress,
    )  # fmt: skip
    payload: dict[str, Any] = {
        "study_name": result.study_name,
        "storage": result.storage,
        "targets": list(result.targets),
        "trials": len(result.trials),
        "states": result.trials["state"].value_counts().to_dict() if len(result.trials) else {},
        "best_params": result.best_params,
        "best": result.best,
        "confirmed": result.confirmed,
        "importances": result.importances,
    }
    if args.trials_csv:
        result.trials.to_csv(args.trials_csv, index=False)
        payload["trials_csv"] = args.trials_csv
    if args.plots:
        out = Path(args.plots)
        payload["plots"] = [
            str(plot_pareto_front(result, out / "pareto.png")),
            str(plot_importances(result, out / "importance.png")),
        ]
    if args.sensitivity:
        payload["sensitivity"] = sensitivity_table(
            scenario, fidelity=str(options["fidelity"]), dask_scheduler=args.dask_scheduler
        )
    return payload


def _print_text(payload: dict[str, Any]) -> None:
    print(
        f"study {payload['study_name']} ({payload['storage']}): {payload['trials']} trials "
        f"{payload['states']}; targets {', '.join(payload['targets'])}"
    )
    print("best parameters:")
    for key, value in payload["best_params"].items():
        print(f"  {key:16s} {value:.6g}" if isinstance(value, float) else f"  {key:16s} {value}")
    if not payload["best_params"]:
        print("  (no feasible trial: relax the constraints or widen the space)")
    confirmed = payload["confirmed"]
    if len(confirmed):
        print("DES confirmation:")
        print(confirmed.to_string(index=False))
    if payload["importances"]:
        print("importance:", ", ".join(f"{k} {v:.2f}" for k, v in payload["importances"].items()))
    for p in payload.get("plots", []):
        print(f"wrote {p}")
    if "sensitivity" in payload:
        print("sensitivity (normalised to the defaults):")
        print(payload["sensitivity"].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
