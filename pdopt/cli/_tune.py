"""``pdopt tune CONFIG.toml [--json]``: an Optuna study over a policy's parameters.

The config is a ``pdopt simulate`` config (open-loop workload) plus a ``[tune]`` table
(``pdopt tune --example-config`` prints both). Flags override the table. Storage by URL:
memory (default), ``sqlite:///study.db``, ``journal:///study.log``, ``postgresql://…``; run the
same command in several processes or machines on one storage to share the study, and again to
resume it (``n_trials`` is the total).

Fidelity ``"auto"`` (the default) runs the trials in the request-level simulator (DES) when the
study's estimated DES time fits ``--budget-s`` (default 600 s; estimated from a timed DES run of
the configured scenario on its first 1,000 requests), else screens with the fluid model, and says
which and why (:func:`pdopt.tune.choose_fidelity`); at DES every parameter is seen, θ_frag
included. ``--dask [ADDRESS]`` runs the trials (and ``--sensitivity``'s runs) on a Dask cluster:
a scheduler address, or none for a LocalCluster here (``--dask-scheduler`` is the old spelling).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdopt.cli._args import NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT
from pdopt.cli._dask import add_dask_flag
from pdopt.cli._output import add_json_flag, print_json
from pdopt.errors import PdoptError

if TYPE_CHECKING:
    from pdopt.scenario import Scenario, TomlTable
    from pdopt.tune import FidelityChoice, TuneResult

TUNE_EXAMPLE = """
[tune]
n_trials = 50                 # total trials the study should hold (resuming counts old ones)
fidelity = "auto"             # "des" (request level) if the study fits budget_s, else "fluid"
budget_s = 600.0              # auto: seconds the study may take at DES fidelity
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

_KEYS = (
    "n_trials", "fidelity", "steps", "targets", "constraints", "space", "storage", "study_name",
    "confirm_top", "n_workers", "seed", "budget_s",
)  # fmt: skip
_OVERRIDES = (
    "n_trials", "storage", "study_name", "fidelity", "n_workers", "confirm_top", "budget_s",
)  # fmt: skip
_FIDELITY_CHOICES = ("auto", "fluid", "des")


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
    parser.add_argument("--n-trials", type=POSITIVE_INT, help="total trials (overrides [tune])")
    parser.add_argument("--storage", help="memory, sqlite:///F.db, journal:///F.log, postgresql://")
    parser.add_argument("--study-name", help="study name in the storage")
    parser.add_argument(
        "--fidelity",
        choices=_FIDELITY_CHOICES,
        help="simulator of the trials: des (request level), fluid (fast screening) or auto "
        "(default: des when the study fits --budget-s, else fluid)",
    )
    parser.add_argument(
        "--budget-s",
        type=POSITIVE,
        metavar="SECONDS",
        help="--fidelity auto: wall seconds the study may take at DES fidelity (default 600)",
    )
    parser.add_argument(
        "--target",
        action="append",
        metavar="min:METRIC",
        help="min:METRIC or max:METRIC, repeat for a Pareto front (overrides [tune] targets)",
    )
    parser.add_argument(
        "--constraint",
        action="append",
        metavar="METRIC>=X",
        help="METRIC>=NUMBER or METRIC<=NUMBER, repeatable (overrides [tune] constraints)",
    )
    parser.add_argument("--n-workers", type=POSITIVE_INT, help="local worker processes")
    add_dask_flag(parser, "the trials (they share the study through --storage)")
    parser.add_argument(
        "--dask-scheduler", metavar="ADDRESS", help="the old spelling of --dask ADDRESS"
    )
    parser.add_argument(
        "--confirm-top", type=NON_NEGATIVE_INT, help="DES re-runs of the best trials"
    )
    parser.add_argument("--plots", metavar="DIR", help="write pareto.png and importance.png")
    parser.add_argument("--trials-csv", metavar="FILE", help="write every trial as CSV")
    parser.add_argument(
        "--best-config",
        metavar="FILE",
        help="write the best trial as a scenario file that `pdopt simulate` runs as its DES "
        "confirmation (its flags, and tick_s = delta_t_s)",
    )
    parser.add_argument(
        "--sensitivity", action="store_true", help="also print the Table 5 sensitivity sweep"
    )
    parser.add_argument(
        "--fail-stale", action="store_true", help="mark RUNNING trials FAIL first (killed worker)"
    )
    parser.add_argument(
        "--progress", action="store_true", help="progress bar on stderr even when not a terminal"
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar; the fidelity line comes with the report, after the study",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=_tune, parser=parser)


def tune_options(top: TomlTable, args: argparse.Namespace) -> dict[str, Any]:
    """The ``[tune]`` table of a parsed file with defaults, then the command-line overrides."""
    part = top.table("tune", _KEYS)
    options: dict[str, Any] = {
        "n_trials": part.integer("n_trials", 50, min_value=1),
        "fidelity": part.string("fidelity", "auto", choices=_FIDELITY_CHOICES),
        "budget_s": part.number("budget_s", 600.0, positive=True),
        "steps": part.array("steps", [1.0], of=float),
        "targets": part.array("targets", ["min:e2e_p99_s"]),
        "constraints": part.array("constraints", ["slo_attainment>=0.9"]),
        "space": part.array("space") if part.has("space") else None,
        "storage": part.string("storage", "memory"),
        "study_name": part.string("study_name", "pdopt-tune"),
        "confirm_top": part.integer("confirm_top", 1, min_value=0),
        "n_workers": part.integer("n_workers", 1, min_value=1),
        "seed": part.integer("seed", 0, min_value=0),
    }
    for key in _OVERRIDES:
        value = getattr(args, key)
        if value is not None:
            options[key] = value
    for key, flag in (("targets", "target"), ("constraints", "constraint")):
        if getattr(args, flag, None):
            options[key] = list(getattr(args, flag))
    return options


def _tune(args: argparse.Namespace) -> int:
    from pdopt.scenario import EXAMPLE_CONFIG, read_toml, scenario_from_table
    from pdopt.workload import Workload

    if args.example_config:
        print(
            EXAMPLE_CONFIG.replace('name = "least_loaded"', 'name = "phasor"') + TUNE_EXAMPLE,
            end="",
        )
        return 0
    if not args.config:
        args.parser.error("give a CONFIG.toml (or --example-config)")
    top = read_toml(args.config)
    options = tune_options(top, args)
    scenario = scenario_from_table(top, Path(args.config).parent, other_tables=("tune",))
    if not isinstance(scenario.workload, Workload):
        raise top.table("workload").error(
            "closed_loop", "no closed loop (pdopt tune needs an open-loop [workload])", shown="one"
        )
    dask = _dask_address(args)
    parsed = _parsed(top, scenario, options, args)  # "auto": metrics of either fidelity
    choice = _fidelity(scenario, parsed)
    options["fidelity"] = parsed["fidelity"] = choice.fidelity
    if choice.reason and not args.json and not args.quiet:  # before a long study: on stdout,
        print(_fidelity_line(choice.to_dict()), flush=True)  # stderr is for errors
    _check_fluid_cluster(top, scenario, options["fidelity"])
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the CLI prints its own summary
    # A user error in a trial reaches `pdopt`'s one-paragraph message; Optuna's log record of
    # the failed trial would print its traceback first. (On the handlers: a logger's own
    # filters do not see its children's records.)
    for handler in optuna.logging.get_logger("optuna").handlers:
        handler.addFilter(_not_a_user_error)
    from pdopt.parallel import open_runs

    with _say_trials_are_lost(options["storage"]), open_runs(dask) as runs:
        # a LocalCluster (--dask alone) is started here; Optuna's workers connect to it
        address = None if runs.client is None else str(runs.client.scheduler.address)
        payload = _run(scenario, parsed, args, address)
    payload["fidelity_choice"] = choice.to_dict()
    if args.json:
        print_json(payload)
    else:
        if args.quiet and choice.reason:  # said after the study instead
            print(_fidelity_line(payload["fidelity_choice"]))
        _print_text(payload)
    return 0


def _parsed(
    top: TomlTable, scenario: Scenario, options: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """``options`` with ``space`` a :class:`SearchSpace` whose names are flags of the policy (or
    ``alpha_scale``) and ``objective`` an :class:`Objective` whose metrics the fidelity reports;
    errors name ``[tune]`` keys, or the option (exit 2) for ``--target`` and ``--constraint``."""
    from pdopt.policies import policy_flags
    from pdopt.tune import PHASOR_SPACE, Objective, SearchSpace

    part = top.table("tune")
    with part.naming("space"):
        space = PHASOR_SPACE if options["space"] is None else SearchSpace.parse(options["space"])
    flags = policy_flags(str(scenario.policy))
    known = None if flags is None else [*flags, "alpha_scale"]
    unknown = [name for name in space.names if known is not None and name not in known]
    if unknown:
        expected = f"parameters among the flags of {scenario.policy_name!r} {known}"
        raise part.error("space", expected, shown=f"{unknown} (the default space is Phasor's)")
    targets = _objective_part(part, options, "targets", args.target, args)
    constraints = _objective_part(part, options, "constraints", args.constraint, args)
    with part.naming("targets"):
        objective = Objective(tuple(targets), tuple(constraints))
    return {**options, "space": space, "objective": objective}


def _objective_part(
    part: TomlTable,
    options: dict[str, Any],
    key: str,
    given: list[str] | None,
    args: argparse.Namespace,
) -> list[Any]:
    """The targets or constraints of ``options[key]``, parsed, each naming a metric the
    fidelity reports: a bad one is an error of the command-line option when ``given`` there
    (argparse's exit 2), else of the ``[tune]`` key, with the closest metric names."""
    from pdopt.errors import ConfigError
    from pdopt.tune import metric_names, parse_constraint, parse_target
    from pdopt.tune._metrics import metric_hint

    fidelity = str(options["fidelity"])
    option = "--target" if key == "targets" else "--constraint"
    parse = parse_target if key == "targets" else parse_constraint
    out = []
    for text in options[key]:
        try:
            with part.naming(key) if not given else contextlib.nullcontext():
                item = parse(text)
        except ConfigError as exc:
            if given:
                args.parser.error(f"argument {option}: {exc}")
            raise
        known = metric_names(fidelity) if fidelity != "auto" else _either_metric()
        if item.metric not in known:
            named = "fluid or des" if fidelity == "auto" else fidelity
            hint = metric_hint(item.metric, "des" if fidelity == "auto" else fidelity)
            if given:
                args.parser.error(
                    f"argument {option}: {item.metric!r} in {text!r} is not a metric of the "
                    f"{named} simulator; {hint}"
                )
            raise part.error(key, f"a metric of the {named} simulator ({hint})", text)
        out.append(item)
    return out


def _dask_address(args: argparse.Namespace) -> str | None:
    """``--dask`` (or its old spelling ``--dask-scheduler``), checked; None: no Dask."""
    from pdopt.errors import ConfigError
    from pdopt.parallel import check_dask

    if args.dask is not None and args.dask_scheduler is not None:
        raise ConfigError("give --dask or its old spelling --dask-scheduler, not both")
    if args.dask_scheduler is not None:
        return check_dask(args.dask_scheduler, "--dask-scheduler")
    return check_dask(args.dask)


def _fidelity(scenario: Scenario, parsed: dict[str, Any]) -> FidelityChoice:
    """The fidelity asked for, or with ``"auto"`` the one :func:`pdopt.tune.choose_fidelity`
    picks (an objective metric only one fidelity reports settles it)."""
    from pdopt.tune import FidelityChoice, choose_fidelity, metric_names
    from pdopt.tune._storage import study_fidelity

    budget = float(parsed["budget_s"])
    if parsed["fidelity"] != "auto":
        return FidelityChoice(str(parsed["fidelity"]), "", budget)
    name, storage = str(parsed["study_name"]), parsed["storage"]
    ran = study_fidelity(storage, name)  # also reports a bad storage before any probe
    if ran is not None:
        why = f"study {name!r} in {storage} ran its trials at {ran}: resumed at {ran}"
        return FidelityChoice(ran, why, budget)
    objective = parsed["objective"]
    metrics = [item.metric for item in (*objective.targets, *objective.constraints)]
    fluid, des = set(metric_names("fluid")), set(metric_names("des"))
    return choose_fidelity(
        scenario, int(parsed["n_trials"]), budget_s=budget, workers=int(parsed["n_workers"]),
        des_only_metrics=[m for m in metrics if m not in fluid],
        fluid_only_metrics=[m for m in metrics if m not in des],
    )  # fmt: skip


def _either_metric() -> list[str]:
    """What ``fidelity = "auto"`` accepts in an objective: a metric of either fidelity (the
    choice then follows it, :func:`_fidelity`)."""
    from pdopt.tune import metric_names

    return sorted({*metric_names("fluid"), *metric_names("des")})


def _check_fluid_cluster(top: TomlTable, scenario: Scenario, fidelity: str) -> None:
    """The fluid model screens pools of prefill and decode workers: a Mixed pool must start in
    one of those roles (``mixed_pool_role``), not colocated (the reader's default)."""
    from pdopt.cluster import Role

    if fidelity == "fluid" and any(w.role == Role.MIXED for w in scenario.cluster.workers):
        cluster = top.table("cluster")
        raise cluster.error(
            "mixed_pool_role",
            '"prefill" or "decode" with n_mixed > 0 for pdopt tune\'s fluid fidelity (it has no '
            "colocated workers)",
            cluster.raw("mixed_pool_role", "mixed"),
        )


def _not_a_user_error(record: logging.LogRecord) -> bool:
    """False for a log record carrying a PdoptError (see ``_tune``)."""
    return not (record.exc_info and isinstance(record.exc_info[1], PdoptError))


def _run(
    scenario: Scenario, options: dict[str, Any], args: argparse.Namespace, dask: str | None
) -> dict[str, Any]:
    from pdopt.tune import plot_importances, plot_pareto_front, sensitivity_table, tune

    result = tune(
        scenario, options["space"], options["objective"],
        n_trials=int(options["n_trials"]), fidelity=str(options["fidelity"]),
        steps=[float(s) for s in options["steps"]], storage=options["storage"],
        study_name=str(options["study_name"]), seed=int(options["seed"]),
        n_workers=int(options["n_workers"]), dask_scheduler=dask,
        confirm_top=int(options["confirm_top"]), fail_stale=args.fail_stale,
        progress=not args.quiet and (args.progress or sys.stderr.isatty()),
    )  # fmt: skip
    payload: dict[str, Any] = {
        "study_name": result.study_name,
        "storage": result.storage,
        "targets": list(result.targets),
        "trials": len(result.trials),
        "states": result.trials["state"].value_counts().to_dict() if len(result.trials) else {},
        "best_params": result.best_params,
        "best": result.best,
        "defaults": _defaults_entry(result),
        "recommendation": result.recommendation,
        "note": result.note,
        "confirmed": result.confirmed,
        "importances": result.importances,
        "inert_params": list(result.inert),
        "fidelity": options["fidelity"],
        "best_settings": _best_settings(result.best_scenario, scenario),
    }
    if args.best_config and result.best_scenario is not None:
        payload["best_config"] = str(result.best_scenario.to_toml(args.best_config))
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
            scenario, fidelity=str(options["fidelity"]), dask_scheduler=dask
        )
    return payload


def _defaults_entry(result: TuneResult) -> dict[str, Any]:
    """The trial of the policy's defaults for the output: its number, parameters, value of each
    target (``values``; ``des_values`` when confirmed at DES) and ``feasible``; empty without."""
    if result.defaults.empty:
        return {}
    row = result.defaults.iloc[0]
    metrics = [target.partition(":")[2] for target in result.targets]
    entry: dict[str, Any] = {
        "number": int(row["number"]),
        "params": {
            str(c).removeprefix("param_"): row[c] for c in row.index if str(c).startswith("param_")
        },
        "values": {m: row[f"value_{m}"] for m in metrics},
        "feasible": bool(row["feasible"]),
    }
    if all(f"des_{m}" in row.index for m in metrics):
        entry["des_values"] = {m: row[f"des_{m}"] for m in metrics}
    return entry


def lost_trials_line(storage: object) -> str:
    """What Ctrl-C says when the study lives in memory: one line, ``pdopt: interrupted`` first
    as every command says it, then that the trials are lost and how to keep them."""
    where = "in memory" if storage in (None, "memory", ":memory:") else f"in {storage!r}"
    return (
        f"pdopt: interrupted; the study was {where}, so its trials are lost: keep them with "
        "--storage sqlite:///study.db (or journal:///study.log), which a rerun resumes"
    )


@contextlib.contextmanager
def _say_trials_are_lost(storage: object) -> Iterator[None]:
    """While an in-memory study runs, Ctrl-C prints :func:`lost_trials_line` in place of the
    CLI's ``pdopt: interrupted`` (:func:`pdopt.cli._interrupted`), which then ends the process
    as always (exit code 130); the previous handler is restored after."""
    from pdopt.cli import _interrupted
    from pdopt.tune._storage import is_shared

    previous = signal.getsignal(signal.SIGINT)
    if is_shared(storage) or threading.current_thread() is not threading.main_thread():
        yield
        return
    if not callable(previous):  # SIG_IGN / SIG_DFL: leave them be
        yield
        return
    handler = previous

    def interrupted(signum: int, frame: Any) -> None:
        print(lost_trials_line(storage), file=sys.stderr, flush=True)
        if handler is _interrupted:
            # its own line would follow ours: it goes where its later output goes
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        handler(signum, frame)

    signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _best_settings(best: Scenario | None, scenario: Scenario) -> dict[str, Any]:
    """What ``pdopt simulate`` needs, beside the config, to run the best trial as its DES
    confirmation: ``tick_s`` (Δt is also the engine tick) and ``[policy.flags]``; empty when
    nothing is feasible."""
    if best is None:
        return {}
    settings: dict[str, Any] = {"tick_s": best.tick_s, "policy_flags": dict(best.policy_flags)}
    if best.cluster != scenario.cluster:
        settings["note"] = "alpha_scale changes the cluster: use --best-config to run it"
    return settings


def _fidelity_line(choice: dict[str, Any]) -> str:
    """``fidelity des: <why>`` (:class:`pdopt.tune.FidelityChoice`)."""
    return f"fidelity {choice['fidelity']}: {choice['reason']}"


def _print_text(payload: dict[str, Any]) -> None:
    print(
        f"study {payload['study_name']} ({payload['storage']}): {payload['trials']} trials "
        f"{payload['states']}; targets {', '.join(payload['targets'])}"
    )
    _print_best_beside_defaults(payload)
    settings = payload["best_settings"]
    if settings:
        flags = ", ".join(f"{k} = {v!r}" for k, v in settings["policy_flags"].items())
        print(f"to reproduce: tick_s = {settings['tick_s']!r}; [policy.flags] {flags}")
    confirmed = payload["confirmed"]
    if len(confirmed):
        print("DES confirmation:")
        print(confirmed.to_string(index=False))
    if payload["importances"]:
        print("importance:", ", ".join(f"{k} {v:.2f}" for k, v in payload["importances"].items()))
    if payload["inert_params"]:
        print(
            f"not seen by the {payload['fidelity']} fidelity (sampled, no effect on the screening, "
            f"no importance; only the DES confirmation runs them): "
            + ", ".join(payload["inert_params"])
        )
    for p in [*payload.get("plots", []), *[payload[k] for k in ("best_config",) if k in payload]]:
        print(f"wrote {p}")
    if "sensitivity" in payload:
        print("sensitivity (normalised to the defaults):")
        print(payload["sensitivity"].to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def _print_best_beside_defaults(payload: dict[str, Any]) -> None:
    """``best parameters:`` (the best trial's) beside the defaults' when the study ran them,
    the targets' values of both (and their DES values when confirmed), then the
    recommendation when it is the defaults."""
    rows, defaults = payload["best"], payload["defaults"]
    best_row = rows.iloc[0] if len(rows) else None
    best = {} if best_row is None else {
        str(c).removeprefix("param_"): best_row[c]
        for c in best_row.index if str(c).startswith("param_")
    }  # fmt: skip
    print("best parameters:" + (f" {'best':>12s} {'defaults':>12s}" if defaults else ""))
    for key in best or defaults.get("params", {}):
        row = f"  {key:14s} {_cell(best.get(key, '')):>12s}"
        print(row + (f" {_cell(defaults['params'].get(key, '')):>12s}" if defaults else ""))
    if defaults:
        for metric, value in defaults["values"].items():
            mine = "" if best_row is None else _cell(best_row[f"value_{metric}"])
            print(f"  {metric:14s} {mine:>12s} {_cell(value):>12s}")
        confirmed = payload["confirmed"]
        for metric, value in defaults.get("des_values", {}).items():
            mine = _cell(confirmed.iloc[0][f"des_{metric}"]) if len(confirmed) else ""
            print(f"  {'DES ' + metric:14s} {mine:>12s} {_cell(value):>12s}")
    if best_row is None:
        print("  (no feasible trial: relax the constraints or widen the space)")
    if payload["recommendation"] == "defaults":
        print(f"recommendation: {payload['note']}")
    elif payload["note"]:
        print(f"note: {payload['note']}")


def _cell(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
