"""``pdopt capacity CONFIG.toml [--json]``: SLO-constrained capacity from a simulation config.

``--requests-csv``, ``--timeseries-csv`` and ``--plots DIR`` export the run at the capacity found
(simulated once more, with its time series); a progress bar counts the simulations (``--quiet``).

The config is a ``pdopt simulate`` config (``pdopt simulate --example-config``) plus an optional
``[capacity]`` table (``pdopt capacity --example-config`` prints both)::

    [capacity]
    mode = "open"               # "open": largest rate scale; "closed": largest client count
    target_attainment = 0.9     # open: fraction of requests meeting TTFT and TPOT SLOs
    rel_tol = 0.02              # open: bisect until (hi - lo) <= rel_tol * lo
    start_scale = 1.0           # open: first rate scale tried (1 = the workload as given)
    max_evaluations = 40        # simulations at most
    seeds = 3                   # open: replicate searches (seed, seed + 1, ...) for the interval
    requests_per_client = 20    # closed: requests per client in each run
    start_clients = 1           # closed: first client count tried
    max_clients = 65536         # closed: stop doubling here
    # think_time_s = 0.0        # closed: defaults to [workload.closed_loop] think_time_s, or 0
    # start_spread_s = 0.0      # closed: client i of n starts at i * start_spread_s / n;
                                # defaults to [workload.closed_loop] start_spread_s, or 0

Open mode needs an open-loop ``[workload]``; closed mode takes the lengths (and think time and
start spread) of the workload, whether or not it has a ``[workload.closed_loop]`` table (its
``clients`` is then ignored: the search chooses the count), and reports the think time and
spread it used. The Phasor paper measures capacity with a fixed non-zero think time and
staggered client starts: set both. Every simulation uses the config's ``seed``.

Open mode repeats the search with ``seeds`` replicate seeds (``seed``, ``seed + 1``, …; an
archetype workload is drawn afresh with each, a trace stays the same and only the policy's seed
changes) and reports the mean crossing with a 95% Student-t interval, or "flat/undetermined"
when some replicate's attainment never leaves sampling noise of the target
(:func:`pdopt.capacity.max_rate_crossing`; seeds combined as the experiments' goodput is,
:func:`pdopt.capacity.combine_crossings`: a seed below the smallest rate does not zero the
others). The other fields are those of the first seed's
search.

``--dask [ADDRESS]`` runs the replicate seeds' searches (open mode) on a Dask cluster, one task
per seed: a scheduler address, or no address for a LocalCluster on this machine
(:func:`pdopt.parallel.map_runs`); the answers are the serial ones. A closed-mode search is one
bisection, run here.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdopt.cli._dask import add_dask_flag, dask_of
from pdopt.cli._output import add_json_flag, print_json
from pdopt.cli._runs import add_run_flags, export, print_written, steps_bar, wants_export

if TYPE_CHECKING:
    from pdopt.scenario import Scenario, TomlTable

CAPACITY_EXAMPLE = """
[capacity]
mode = "open"               # "open": largest rate scale; "closed": largest client count
target_attainment = 0.9     # open: fraction of requests meeting both TTFT and TPOT SLOs
rel_tol = 0.02              # open: bisect until (hi - lo) <= rel_tol * lo
start_scale = 1.0           # open: first rate scale tried (1 = the workload as given)
max_evaluations = 40        # simulations at most
seeds = 3                   # open: replicate searches (seed, seed + 1, ...) for the interval
requests_per_client = 20    # closed: requests per client in each run
start_clients = 1           # closed: first client count tried
max_clients = 65536         # closed: stop doubling here
# think_time_s = 0.0        # closed: default [workload.closed_loop] think_time_s, or 0
# start_spread_s = 0.0      # closed: client i of n starts at i * start_spread_s / n;
                            # default [workload.closed_loop] start_spread_s, or 0
"""

_KEYS = (
    "mode", "target_attainment", "rel_tol", "start_scale", "max_evaluations", "seeds",
    "requests_per_client", "start_clients", "max_clients", "think_time_s", "start_spread_s",
)  # fmt: skip


_EXPORTS = ("requests_csv", "timeseries_csv", "plots")


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
    add_run_flags(parser, "the run at the capacity found")
    add_dask_flag(parser, "the open-loop searches of the replicate seeds (one per seed)")
    add_json_flag(parser)
    parser.set_defaults(handler=_capacity, parser=parser)


def capacity_options(top: TomlTable) -> dict[str, Any]:
    """The ``[capacity]`` table of a parsed file, defaults filled in (module docstring)."""
    part = top.table("capacity", _KEYS)
    think = part.raw("think_time_s", None)
    spread = part.raw("start_spread_s", None)
    spread_s = None if spread is None else part.number("start_spread_s", non_negative=True)
    target = part.number("target_attainment", 0.9, positive=True)
    if target > 1:
        raise part.error("target_attainment", "a number in (0, 1]", part.raw("target_attainment"))
    return {
        "mode": part.string("mode", "open", choices=("open", "closed")),
        "target_attainment": target,
        "rel_tol": part.number("rel_tol", 0.02, positive=True),
        "start_scale": part.number("start_scale", 1.0, positive=True),
        "max_evaluations": part.integer("max_evaluations", 40, min_value=2),
        "seeds": part.integer("seeds", 3, min_value=1),
        "requests_per_client": part.integer("requests_per_client", 20, min_value=1),
        "start_clients": part.integer("start_clients", 1, min_value=1),
        "max_clients": part.integer("max_clients", 65536, min_value=1),
        "think_time_s": None if think is None else part.number("think_time_s", non_negative=True),
        "start_spread_s": spread_s,
    }


def _capacity(args: argparse.Namespace) -> int:
    from pdopt.scenario import EXAMPLE_CONFIG, read_toml, scenario_from_table
    from pdopt.sim import ClosedLoop

    if args.example_config:
        print(EXAMPLE_CONFIG + CAPACITY_EXAMPLE, end="")
        return 0
    if not args.config:
        args.parser.error("give a CONFIG.toml (or --example-config)")
    top = read_toml(args.config)
    options = capacity_options(top)
    scenario = scenario_from_table(top, Path(args.config).parent, other_tables=("capacity",))
    if options["mode"] == "open" and isinstance(scenario.workload, ClosedLoop):
        raise top.table("capacity").error(
            "mode",
            '"closed" for a [workload.closed_loop] (the open-loop search needs an open-loop '
            "[workload])",
            "open",
        )
    payload: dict[str, Any] = {"config": args.config, "policy": scenario.policy_name}
    seeds = options["seeds"] if options["mode"] == "open" else 1
    dask = dask_of(args) if options["mode"] == "open" else None  # closed: one bisection
    # serially the bar counts simulations; on Dask, whole searches (a worker's points stay there)
    total = seeds if dask is not None else options["max_evaluations"] * seeds
    bar = steps_bar(total, "capacity search", args.quiet)
    with bar:
        options["on_point"] = None if dask is not None else (lambda probe: bar.update(1))
        if options["mode"] == "open":
            replicates = [scenario] + [
                _with_seed(top, Path(args.config).parent, scenario.seed + i)
                for i in range(1, options["seeds"])
            ]
            done = (lambda: bar.update(1)) if dask is not None else None
            payload.update(_open(replicates, options, dask, done))
        else:
            payload.update(_closed(scenario, options))
    if wants_export(args):
        payload.update(export(_at_capacity(scenario, options, payload), args))
    if args.json:
        print_json(payload)
    else:
        _print_text(payload)
        print_written(
            {k: payload[k] for k in ("requests_csv", "timeseries_csv", "plots") if k in payload}
        )
    return 0


def _at_capacity(scenario: Scenario, options: dict[str, Any], payload: dict[str, Any]) -> Any:
    """The run the search made at its answer, again with the time series (for the exports):
    the workload at ``max_rate_scale``, or ``max_clients`` clients as
    :func:`pdopt.capacity.max_concurrency_under_slo` drives them."""
    from pdopt.sim import ClosedLoop

    if payload["mode"] == "open":
        workload = scenario.workload.scale_rate(payload["max_rate_scale"])  # type: ignore[union-attr]
        return scenario.run(workload=workload, record_timeseries=True)
    n = payload["max_clients"]
    driver = scenario.workload
    lengths = driver.lengths if isinstance(driver, ClosedLoop) else driver
    think = driver.think if isinstance(driver, ClosedLoop) else "constant"
    # NOTE: as max_concurrency_under_slo builds each point's driver (one warm-up request per
    # client), with the think time and start spread it reports.
    loop = ClosedLoop(
        n, payload["think_time_s"], lengths, options["requests_per_client"] * n + n, think=think,
        start_spread_s=payload["start_spread_s"],
    )  # fmt: skip
    return scenario.run(workload=loop, record_timeseries=True)


def _with_seed(top: TomlTable, base: Path, seed: int) -> Scenario:
    """The config's scenario with another seed (an archetype workload is drawn again)."""
    from pdopt.scenario import TomlTable, scenario_from_table

    table = TomlTable({**top.data, "seed": seed}, top.file, top.name)
    return scenario_from_table(table, base, other_tables=("capacity",))


def _open(
    replicates: list[Scenario],
    options: dict[str, Any],
    dask: str | None = None,
    done: Any = None,
) -> dict[str, Any]:
    from pdopt.capacity import RateSearch, crossing_of
    from pdopt.parallel import map_runs
    from pdopt.sim import rejections_by_reason
    from pdopt.workload import Workload

    search = RateSearch(
        options["target_attainment"], options["rel_tol"], options["start_scale"],
        options["max_evaluations"], options["on_point"],
    )  # fmt: skip
    # the replicate seeds' searches are independent: serially or on Dask, the same answers
    runs = map_runs(search, replicates, dask=dask, progress=done)
    crossing = crossing_of([RateSearch.answer(r) for r in runs], [sc.seed for sc in replicates])
    res = runs[0]
    scenario = replicates[0]
    workload = scenario.workload
    assert isinstance(workload, Workload)  # open mode: checked by the caller
    at_max = scenario.run(
        workload=workload.scale_rate(max(res.max_rate_scale, 1e-6)), record_timeseries=False
    )
    return {
        "mode": "open",
        "crossing": {
            "status": crossing.status,
            "max_rate_per_s": crossing.max_rate_per_s,
            "ci95_per_s": [crossing.ci_low_per_s, crossing.ci_high_per_s],
            "seeds": list(crossing.seeds),
            "per_seed_rate_per_s": list(crossing.per_seed_rate_per_s),
            "per_seed_status": list(crossing.per_seed_status),
            "text": crossing.describe(),
        },
        "rejected_by_reason_at_max": rejections_by_reason(at_max.requests),
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


def _closed(scenario: Scenario, options: dict[str, Any]) -> dict[str, Any]:
    from pdopt.capacity import max_concurrency_under_slo

    res = max_concurrency_under_slo(
        scenario, think_time_s=options["think_time_s"],
        start_spread_s=options["start_spread_s"],
        requests_per_client=options["requests_per_client"],
        start_clients=options["start_clients"], max_clients=options["max_clients"],
        max_evaluations=options["max_evaluations"], on_point=options["on_point"],
    )  # fmt: skip
    return {
        "mode": "closed",
        "status": res.status,
        "max_clients": res.max_clients,
        "ttft_p99_s": res.ttft_p99_s,
        "tpot_p99_s": res.tpot_p99_s,
        "think_time_s": res.think_time_s,
        "start_spread_s": res.start_spread_s,
        "bracket_clients": list(res.bracket_clients),
        "seed": res.seed,
        "points": res.points,
    }


def _print_text(payload: dict[str, Any]) -> None:
    print(f"{payload['config']}: policy {payload['policy']}, mode {payload['mode']}")
    crossing = payload.get("crossing")
    if crossing is not None:
        seeds = ", ".join(str(s) for s in crossing["seeds"])
        if crossing["status"] == "ok":
            low, high = crossing["ci95_per_s"]
            ci = "" if low is None or math.isnan(low) else f", 95% CI [{low:.4g}, {high:.4g}]"
            print(f"  max rate meeting the target: {crossing['max_rate_per_s']:.4g} req/s{ci} "
                  f"(seeds {seeds})")  # fmt: skip
        elif crossing["status"] == "flat":
            print("  max rate: flat/undetermined: attainment stays within sampling noise over "
                  f"the rates tried (seeds {seeds}); no crossing to report")  # fmt: skip
        else:
            print(f"  max rate: {crossing['text']} (seeds {seeds})")
    for key, value in payload.items():
        if key in ("config", "policy", "mode", "points", "crossing", *_EXPORTS):
            continue
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        print(f"  {key:20s} {shown}")
    print("points tried (in order):")
    print(payload["points"].to_string(index=False, float_format=lambda v: f"{v:.6g}"))
