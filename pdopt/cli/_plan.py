"""``pdopt plan``: size a P/D cluster for a workload and SLOs, verify it in the simulator.

Steps: fit each ``--profile`` (a GPU × model × TP profile CSV; other GPU types and TP degrees in
the search get the roofline prior of the same model; ``--calibrate-gemm`` sets its compute
efficiency on a GPU from that GPU's measured GEMMs), reject requests beyond the model's
context window, derive per-worker capacities from the queueing models over the whole workload,
size the cheapest plan over every GPU type × TP degree that holds the model by MILP (cvxpy +
HiGHS), then simulate it on the whole workload (and at ``--peak-rate``), an archetype on
``--verify-draws`` independent draws (default 3; a trace is one draw); when the simulation
misses an SLO on any draw, correct that stage's capacities by the worst draw and re-solve, until
the plan meets the SLOs on every draw or the GPU limits are exhausted.

Exit codes: 0 the recommended plan meets its SLOs in simulation (or ``--no-sim``); 2 a bad
option value; 1 bad data or no plan at all (the message names the binding constraint and the
knob that would help); 3 every plan tried misses its SLOs in simulation (the verdict line says
by how much; no plan is recommended).

Example (the demo, a few seconds)::

    pdopt plan --profile profiles/v100-32gb_qwen2.5-7b_roofline.csv --workload sharegpt \\
        --rate 12 --ttft-slo 1.0 --tpot-slo 0.1 --gpus V100-32GB=16 --out plan.toml
    pdopt simulate plan.toml     # the plan's own check, replayed
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdopt.cli._args import integer, number
from pdopt.cli._dask import add_dask_flag, dask_of
from pdopt.cli._output import add_json_flag, print_json
from pdopt.errors import ConfigError, ParameterError, PdoptError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextlib import AbstractContextManager

    from pdopt.model_spec import ModelSpec
    from pdopt.plan._pipeline import Steps, Tick

EXIT_MISSES = 3
"""Exit code when every plan tried misses its SLOs in simulation."""

ARCHETYPE_REQUESTS = 4000
"""Requests generated for an archetype workload when ``--requests`` is not given."""

VERIFY_DRAWS = 3
"""Independent draws of an archetype each plan is simulated on (``--verify-draws``): one draw
is one sample of the tails, and a plan sized close to its SLO can meet on one and miss on the
next. Three keep the demo at a few seconds (README "Planning")."""


def register(subparsers: Any) -> None:
    """Add ``pdopt plan``."""
    p = subparsers.add_parser(
        "plan",
        help="size prefill/decode workers by MILP and verify the plan in the simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="CSV",
        help="profile CSV (repeatable); its GPU, model and TP come from its header",
    )
    p.add_argument(
        "--calibrate-gemm",
        action="append",
        default=[],
        metavar="CSV",
        help="measured profile with 16-bit gemm rows (repeatable): the roofline prior of its "
        "GPU computes at the preset's efficiency scaled by these GEMMs' speed (README "
        "'Calibrating the prior on your GPU's GEMMs')",
    )
    p.add_argument(
        "--model",
        help="catalogue name (NAME@WEIGHTS[/KV] for another precision), a [model] spec file "
        "or a Hugging Face config.json or its folder; must be the profiles' model, if given",
    )
    p.add_argument(
        "--workload",
        required=True,
        help="an archetype name (listed by pdopt workload generate --help) or a trace file",
    )
    positive = number(positive=True)
    p.add_argument("--rate", type=positive, help="mean rate, req/s (archetypes: required)")
    p.add_argument("--cv", type=positive, help="inter-arrival CV (default: 1, or the trace's)")
    p.add_argument(
        "--requests",
        type=integer(1),
        help=f"archetype: requests generated (default {ARCHETYPE_REQUESTS}); trace: use only the "
        "first N (default: the whole trace)",
    )
    p.add_argument(
        "--sample",
        type=integer(1),
        metavar="N",
        help="size from N randomly drawn request lengths instead of all (faster; the report "
        "states the sampling error bound); the simulation always runs every request",
    )
    p.add_argument(
        "--too-long",
        choices=("miss", "drop", "truncate"),  # pdopt.plan._context.TOO_LONG (not imported:
        # the plan package loads cvxpy, and the parser is built for every command)
        default="miss",
        help="requests beyond the model's context window: rejected and counted as misses in "
        "the verdict (miss, the default; a plan refuses when they alone break the SLO quantile), "
        "left out of the plan and its verdict (drop), or cut to fit (truncate: the prompt keeps "
        "its end, as vLLM's truncate_prompt_tokens)",
    )
    p.add_argument(
        "--max-context",
        type=integer(1),
        metavar="TOKENS",
        help="the deployment's context window, tokens (default: the model's, e.g. "
        "max_position_embeddings), as vLLM's --max-model-len",
    )
    p.add_argument("--peak-rate", type=positive, help="forecast peak rate: adds a Mixed pool")
    p.add_argument("--ttft-slo", type=positive, required=True, help="TTFT SLO, seconds")
    p.add_argument("--tpot-slo", type=positive, required=True, help="TPOT SLO, seconds")
    p.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="size prefill as if nothing were cached, and verify with prefix caching off "
        "(default: a workload with prefix blocks is sized on the tokens that miss one prefill "
        "worker's LRU prefix cache and verified with caching on and cache-aware routing)",
    )
    p.add_argument(
        "--slo-margin",
        type=slo_margin,
        default=0.0,
        metavar="FRACTION",
        help="size and verify at the SLOs less this fraction (0.1: a plan must meet 90%% of "
        "each SLO in its own simulation), a margin for the cost model's error (default 0)",
    )
    p.add_argument(
        "--quantile",
        type=number(positive=True, at_most=1.0),
        default=0.99,
        help="both SLOs hold at this quantile of requests (default 0.99)",
    )
    p.add_argument(
        "--gpus",
        type=gpu_limits,
        default={},
        metavar="TYPE=N,...",
        help="GPU types and inventory, e.g. A100-80GB=16,H100-SXM=8: N a positive integer, or "
        "'inf' for no limit",
    )
    p.add_argument(
        "--tp",
        default="",
        metavar="1,2,...",
        help="TP degrees to consider (default: 1, 2, 4, 8, those that hold the model)",
    )
    p.add_argument(
        "--expert-parallel",
        choices=("off", "on", "both"),
        default="both",
        help="MoE models at TP >= 2: experts split over the TP GPUs (on), each expert split TP "
        "ways (off), or both as candidates, the cheapest chosen (default both; dense models: "
        "no effect)",
    )
    p.add_argument("--max-gpus", type=integer(1), help="most GPUs in all")
    p.add_argument(
        "--max-gpu-types",
        type=integer(1),
        metavar="N",
        help="at most N GPU types in the deployment (the cheapest set by the sizing model)",
    )
    p.add_argument(
        "--one-type-per-role",
        action="store_true",
        help="every prefill worker on one GPU type and every decode worker on one type",
    )
    p.add_argument(
        "--prices",
        type=gpu_prices,
        default={},
        metavar="TYPE=USD,...",
        help="USD per GPU-hour (default: the catalogue's cost_per_hour)",
    )
    p.add_argument("--seed", type=integer(0), default=0, help="workload and simulation seed")
    p.add_argument(
        "--verify-draws",
        type=integer(1),
        metavar="N",
        help=f"archetypes: check each plan on N independent draws of the workload (seeds SEED, "
        f"SEED+1, ...; default {VERIFY_DRAWS}); a plan meets only if every draw meets, and each "
        "stage is corrected by its worst draw. A trace is one draw",
    )
    p.add_argument(
        "--max-iterations",
        type=integer(1),
        default=6,
        help="simulations at most in the size-simulate-correct loop (default 6)",
    )
    p.add_argument("--no-sim", action="store_true", help="skip the simulation (unverified plan)")
    p.add_argument(
        "--headroom",
        action="store_true",
        help="also find the largest load factor at which the recommended P/D plan still meets "
        "its SLOs on every draw (a crossing by simulation; a few more seconds)",
    )
    p.add_argument(
        "--compare-modes",
        action="store_true",
        help="also size colocated (vLLM, Sarathi) and EcoServe deployments by simulation and "
        "compare them with full P/D (cost per 1,000 requests, GPUs, SLO attainment)",
    )
    add_dask_flag(p, "the verification draws and --compare-modes' modes")
    p.add_argument(
        "--out", metavar="TOML", help="write the verified plan as a scenario for pdopt simulate"
    )
    p.add_argument(
        "--emit",
        choices=("vllm", "sglang", "dynamo"),  # pdopt.plan._emit.EMIT_FORMATS
        help="write launch configurations of the recommended deployment for this engine "
        "(a starting point: per role model, TP/EP, max-num-seqs, max-num-batched-tokens, KV "
        "transfer; README 'Launching a plan')",
    )
    p.add_argument(
        "--emit-out",
        metavar="FILE",
        help="where --emit writes (default launch-vllm.sh, launch-sglang.sh or "
        "launch-dynamo.yaml in the current folder)",
    )
    p.add_argument(
        "--sweep",
        type=sweep_values,
        metavar="NAME=V1,V2,...",
        help="plan once per value of rate, ttft-slo, tpot-slo or price (a factor on every GPU's "
        "price) and print a table of GPUs and cost against it (--sweep-chart: a PNG)",
    )
    p.add_argument("--sweep-chart", metavar="PNG", help="with --sweep: GPUs and cost, charted")
    p.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    add_json_flag(p)  # fmt: skip
    p.set_defaults(handler=_plan, parser=p)


def _pairs(text: str, rule: str) -> list[tuple[str, str]]:
    """``TYPE=VALUE`` items of a comma-separated list (an item without ``=`` is refused)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"{item!r} must be TYPE={rule}")
        out.append((name.strip(), value.strip()))
    return out


def gpu_limits(text: str) -> dict[str, float]:
    """``--gpus``: GPU type -> most GPUs (a positive integer, or inf for no limit)."""
    rule = "N, N a positive integer or 'inf'"
    out: dict[str, float] = {}
    for name, value in _pairs(text, rule):
        if value.lower() == "inf":
            out[name] = math.inf
            continue
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{name}={value}: must be TYPE={rule}")
        out[name] = float(n)
    return out


SWEEPABLE = ("rate", "ttft-slo", "tpot-slo", "price")
"""What ``--sweep`` varies (``pdopt.plan._sweep.SWEEPABLE``, not imported: the plan package
loads cvxpy, and the parser is built for every command)."""


def sweep_values(text: str) -> tuple[str, list[float]]:
    """``--sweep NAME=V1,V2,...``: a sweepable name and positive numbers."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or name not in SWEEPABLE:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be NAME=V1,V2,... with NAME one of {', '.join(SWEEPABLE)}"
        )
    try:
        numbers = [number(positive=True)(v) for v in values.split(",") if v.strip()]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from exc
    if not numbers:
        raise argparse.ArgumentTypeError(f"{name}: give at least one value")
    return name, numbers


def slo_margin(text: str) -> float:
    """``--slo-margin``: a fraction in [0, 1)."""
    value = number()(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def gpu_prices(text: str) -> dict[str, float]:
    """``--prices``: GPU type -> USD per GPU-hour (a finite number > 0)."""
    out: dict[str, float] = {}
    for name, value in _pairs(text, "USD"):
        try:
            out[name] = number(positive=True)(value)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{name}={value}: {exc} (USD per GPU-hour)") from exc
    return out


def _given_model(args: argparse.Namespace) -> ModelSpec | None:
    """``--model`` resolved (a catalogue name, spec file or Hugging Face config), or None."""
    from pdopt.model_spec import get_model

    return None if args.model is None else get_model(args.model)


def _model(
    args: argparse.Namespace, given: ModelSpec | None, profiled: ModelSpec | None
) -> ModelSpec:
    """The model to plan: ``--model`` (``given``), else the profiles' (``profiled``)."""
    if given is None:
        if profiled is None:
            raise ConfigError("give --profile CSV (or --model NAME with --gpus)")
        return profiled
    if profiled is not None and given.name != profiled.name:
        raise ConfigError(
            f"--model {args.model} ({given.name}) differs from the profiles' model "
            f"{profiled.name}: give profiles of {given.name}, or drop --model to plan "
            f"{profiled.name}"
        )
    return given


def _alias_notes(args: argparse.Namespace) -> list[str]:
    """Say which catalogued board an alias in ``--gpus`` or ``--prices`` was read as (``H100``
    is the SXM board), so a plan for another variant is not made silently."""
    from pdopt.hardware import get_gpu

    notes = []
    for option, names in (("--gpus", args.gpus), ("--prices", args.prices)):
        for name in names:
            try:
                resolved = get_gpu(name).name
            except (ConfigError, ParameterError):
                continue  # refused with its own message where the name is used
            if resolved.lower() != name.strip().lower():
                notes.append(
                    f"{option} {name} is read as {resolved}, the catalogue's board of that "
                    "name; for another variant give a spec file (README 'Hardware, models "
                    "and profiles')"
                )
    return notes


def _draws(args: argparse.Namespace) -> list[Any]:
    """The further draws of an archetype (seeds ``--seed`` + 1, …; the library treats their
    over-long requests as the first's); none for a trace."""
    from pdopt.workload import ARCHETYPES, archetype_workload

    if args.workload not in ARCHETYPES:
        return []
    n = ARCHETYPE_REQUESTS if args.requests is None else args.requests
    cv = 1.0 if args.cv is None else args.cv
    count = VERIFY_DRAWS if args.verify_draws is None else args.verify_draws
    return [
        archetype_workload(args.workload, args.rate, n_requests=n, cv=cv, seed=args.seed + i)
        for i in range(1, count)
    ]


def _workload(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The workload and what was used of it (``requests``, ``of``, ``source``)."""
    from pdopt.workload import ARCHETYPES, archetype_workload, read_trace

    if args.requests is not None and args.requests < 1:
        raise ConfigError(f"--requests must be >= 1; got {args.requests}")
    if args.workload in ARCHETYPES:
        if args.rate is None:
            raise ConfigError(f"--workload {args.workload} is an archetype: give --rate")
        n = ARCHETYPE_REQUESTS if args.requests is None else args.requests
        cv = 1.0 if args.cv is None else args.cv
        wl = archetype_workload(args.workload, args.rate, n_requests=n, cv=cv, seed=args.seed)
        return wl, {"source": f"archetype {args.workload}", "requests": n, "of": n}
    path = Path(args.workload)
    if not path.exists():
        raise ConfigError(
            f"--workload {args.workload!r} is neither an archetype ({sorted(ARCHETYPES)}) "
            "nor an existing trace file"
        )
    trace = read_trace(path).shifted_to_zero()
    total = len(trace)
    if args.requests is not None and args.requests < total:
        trace = trace[: args.requests]
    if args.rate is not None:
        trace = trace.scale_rate(args.rate / trace.rate_per_s)
    return trace, {"source": f"trace {args.workload}", "requests": len(trace), "of": total}


def _arrival_cv(args: argparse.Namespace) -> float | None:
    from pdopt.workload import ARCHETYPES

    if args.cv is not None:
        return float(args.cv)
    # An archetype is generated with CV 1; a trace's own CV is estimated from its gaps.
    return 1.0 if args.workload in ARCHETYPES else None


def _tps(args: argparse.Namespace) -> list[int]:
    from pdopt.plan import DEFAULT_TPS

    try:
        given = sorted({int(t) for t in args.tp.split(",") if t.strip()})
    except ValueError as exc:
        raise ConfigError(f"--tp {args.tp!r} must be integers such as 1,2,4") from exc
    if any(t < 1 for t in given):
        raise ConfigError(f"--tp {args.tp!r}: TP degrees must be >= 1")
    return given or list(DEFAULT_TPS)


def writable_problem(path: Path) -> str | None:
    """Why ``path`` cannot be written (None when it can): checked before any work starts, so
    an unwritable output path fails at once, not after the whole run (issue 37)."""
    import os

    if path.is_dir():
        return "is a folder; give a file path"
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        return f"folder {parent} does not exist; create it or give another path"
    if not parent.is_dir():
        return f"{parent} is not a folder"
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "is not writable; give a path in a folder you can write"
    return None


def _check_outputs(args: argparse.Namespace) -> None:
    """Output options refused before any work (exit 2, as a bad option value)."""
    if args.emit_out is not None and args.emit is None:
        args.parser.error("argument --emit-out: give --emit FORMAT too")
    if args.emit is not None and args.emit_out is None:
        args.emit_out = f"launch-{args.emit}.{'yaml' if args.emit == 'dynamo' else 'sh'}"
    if args.sweep is not None and (args.out or args.emit):
        args.parser.error("argument --sweep: plans several points: drop --out and --emit")
    if args.sweep_chart is not None and args.sweep is None:
        args.parser.error("argument --sweep-chart: give --sweep NAME=V1,V2,... too")
    if args.out is not None and args.no_sim:
        args.parser.error("argument --out: writes the verified plan: drop --no-sim")
    outputs = (("--out", args.out), ("--emit-out", args.emit_out),
               ("--sweep-chart", args.sweep_chart))  # fmt: skip
    for option, path in outputs:
        problem = None if path is None else writable_problem(Path(path))
        if problem is not None:
            args.parser.error(f"argument {option}: {path} {problem}")


def _plan(args: argparse.Namespace) -> int:
    _check_outputs(args)
    if args.sweep is not None:
        from pdopt.cli._plan_sweep import run_sweep

        return run_sweep(args, lambda point: _plan_result(point)[0])
    payload = _plan_payload(args)
    from pdopt.cli._plan_report import print_text

    if args.json:
        print_json(payload)
    else:
        print_text(payload)
    return 0 if payload["verdict"]["meets"] else EXIT_MISSES


def _prefix_cache_entry(
    workload: Any, off: bool, cache_tokens: float | None, assumed: float, simulated: Any
) -> dict[str, Any]:
    """What the plan assumed of prefix caching and what its simulation measured."""
    if workload.prefix_blocks is None:
        return {"used": False, "text": "none (the workload has no prefix blocks)"}
    if off:
        return {"used": False, "text": "off (--no-prefix-cache): prefill sized on every token"}
    measured = "" if simulated is None else f", simulated {simulated * 100:.1f}%"
    return {
        "used": True,
        "cache_tokens_per_worker": cache_tokens,
        "assumed_hit_fraction": assumed,
        "simulated_hit_fraction": simulated,
        "text": (
            f"on: assumed {assumed * 100:.1f}% of prompt tokens hit (LRU of "
            f"{cache_tokens:,.0f} tokens per prefill worker){measured}"
        ),
    }


def _plan_payload(args: argparse.Namespace) -> dict[str, Any]:
    """Plan as the options say (:func:`pdopt.plan.plan_deployment`), export: the report's
    payload."""
    started = time.perf_counter()
    result, inputs = _plan_result(args)
    return _payload(args, result, inputs, started)


def _plan_result(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The options read (profiles, calibrations, model, workload) and
    :func:`pdopt.plan.plan_deployment`'s answer; what was read, for the report."""
    from pdopt.hardware import get_gpu
    from pdopt.plan import plan_deployment
    from pdopt.plan._profiles import gemm_calibrations, profile_costs

    given = _given_model(args)
    profiled = profile_costs(args.profile, given)
    costs, fits = profiled.costs, profiled.fits
    calibrations = gemm_calibrations(args.calibrate_gemm)
    spec = _model(args, given, profiled.model)
    if args.max_context is not None:
        spec = dataclasses.replace(spec, max_context_tokens=args.max_context)
    inventory = args.gpus
    gpus = list(dict.fromkeys([g for g, _ in costs] + list(inventory)))
    if not gpus:
        args.parser.error("give --profile CSV or --gpus TYPE=N")
    planned = {get_gpu(g).name for g in gpus}
    for gpu, calibration in calibrations.items():
        if gpu not in planned:
            raise ConfigError(
                f"--calibrate-gemm {', '.join(calibration.sources)}: measured on {gpu}, which "
                f"the plan does not consider; add it to --gpus (or leave the profiles out)"
            )
    full, used = _workload(args)
    rate = args.rate if args.rate is not None else full.rate_per_s
    if args.peak_rate is not None and args.peak_rate < rate:
        named = "--rate" if args.rate is not None else "the trace's rate"
        args.parser.error(f"argument --peak-rate: {args.peak_rate:g} must be >= {named} {rate:.4g}")
    layouts = {"off": (False,), "on": (True,), "both": (False, True)}[args.expert_parallel]
    result = plan_deployment(
        full, spec, {g: inventory.get(g, math.inf) for g in gpus},
        ttft_slo_s=args.ttft_slo, tpot_slo_s=args.tpot_slo, rate_per_s=args.rate,
        arrival_cv=_arrival_cv(args), quantile=args.quantile, draws=_draws(args),
        tps=_tps(args), prices=args.prices, costs=costs, expert_parallel=layouts,
        max_gpus=args.max_gpus, too_long=args.too_long, slo_margin=args.slo_margin,
        max_gpu_types=args.max_gpu_types, one_type_per_role=args.one_type_per_role,
        seed=args.seed, max_iterations=args.max_iterations, headroom=args.headroom,
        prefix_caching=not args.no_prefix_cache, peak_rate_per_s=args.peak_rate,
        max_samples=args.sample,
        compute_efficiency={g: c.compute_efficiency for g, c in calibrations.items()},
        verify=not args.no_sim, compare_modes=args.compare_modes, steps=_step_bars(args),
        dask=dask_of(args),
        cost_model_error=profiled.errors,
    )  # fmt: skip
    inputs = {"costs": costs, "fits": fits, "calibrations": calibrations, "spec": spec,
              "used": used, "rate": rate}  # fmt: skip
    return result, inputs


def _payload(
    args: argparse.Namespace, result: Any, inputs: dict[str, Any], started: float
) -> dict[str, Any]:
    """The report's payload of ``result`` (notes, provenance, what was written)."""
    from pdopt.cli._plan_report import plan_report, provenance
    from pdopt.plan import sampled_quantile_error
    from pdopt.plan._context import extrapolation_warning
    from pdopt.plan._workers import option_name

    costs, fits, calibrations = inputs["costs"], inputs["fits"], inputs["calibrations"]
    spec, used, rate = inputs["spec"], inputs["used"], inputs["rate"]
    traffic, workload, demand = result.traffic, result.traffic.sized, result.demand
    notes = [w for path, f in fits.items() for w in f["warnings"]]
    notes += _alias_notes(args)
    if (args.verify_draws or 1) > 1 and used["source"].startswith("trace"):
        notes.append(
            f"--verify-draws {args.verify_draws} does not apply to a trace: a trace is one "
            "draw, and the plan was verified on it as given"
        )
    notes += filter(None, (
        extrapolation_warning(f"--profile {path}", f["measured_prompt_tokens"], workload)
        for path, f in fits.items()
    ))  # fmt: skip
    if args.sample is not None and args.sample < len(workload):
        eps = sampled_quantile_error(args.sample)
        used["sampled_lengths"] = args.sample
        used["sample_quantile_error"] = eps
        notes.append(
            f"sized from {args.sample} of {len(workload)} request lengths (--sample): any "
            f"length quantile may be off by up to ±{eps * 100:.1f} percentage points (DKW, "
            "95%); the simulation ran every request"
        )
    payload: dict[str, Any] = {"model": spec.name, "workload": {**used, "name": workload.name}}
    payload["workload"]["too_long"] = traffic.to_dict()
    payload["context_window_tokens"] = spec.max_context_tokens or None
    payload["rejected_by_reason"] = result.rejected_by_reason
    payload.update(plan_report(result, args.workload, (args.max_gpu_types, args.one_type_per_role)))
    payload["demand"]["offered_rate_per_s"] = rate
    payload["demand"]["slo_margin"] = args.slo_margin
    payload["demand"]["prefix_cache"] = _prefix_cache_entry(
        workload, args.no_prefix_cache, result.cache_tokens, demand.hit_fraction,
        payload.get("check", {}).get("sim_prefix_hit_fraction"),
    )  # fmt: skip
    payload["demand"]["given_slo_s"] = {"ttft": args.ttft_slo, "tpot": args.tpot_slo}
    payload["options"] = provenance(payload["options"], costs, fits, set(calibrations))
    if calibrations:
        payload["calibration"] = [dataclasses.asdict(c) for c in calibrations.values()]
        notes += [c.describe() for c in calibrations.values()]
    priced = sorted(
        option_name(o["gpu"], o["tp"], o["expert_parallel"])
        for o in payload["options"]
        if o["cost_model"].startswith("roofline prior")
    )
    if priced:
        notes.append(
            f"{', '.join(priced)} priced by the roofline prior, not a measurement: the "
            "simulation checks the plan against the same costs. README 'The roofline prior's "
            "presets' gives its error against measured engines (dense models mostly within "
            "10%, MoE and MLA models further); for a plan to rely on, give --profile "
            "measured on your engine (pdopt profile import-aic or import-vidur, or "
            "calibration/profile_gpu.py on the GPU)"
        )
    payload["notes"] = notes
    scenario, holds = result.scenario()
    if args.out and scenario is not None:
        payload["scenario_holds"] = holds
        payload["scenario_out"] = str(scenario.to_toml(args.out))
        payload["scenario_workload"] = _workload_by_reference(
            Path(payload["scenario_out"]), scenario, args, traffic
        )
        _head_comment(Path(payload["scenario_out"]), payload)
    if args.emit:
        payload["emitted"] = _emit(args, payload, spec, result.options, workload)
    payload["wall_s"] = time.perf_counter() - started
    return payload


def _workload_by_reference(
    path: Path, scenario: Any, args: argparse.Namespace, traffic: Any
) -> str:
    """Rewrite the exported scenario's ``[workload]`` as a reference (the trace file, or the
    archetype, rate, count and CV its seed regenerates) when that reads back to exactly the
    workload simulated; else keep the arrays inline. Says which."""
    import numpy as np

    from pdopt.scenario import Scenario
    from pdopt.workload import ARCHETYPES

    wl = scenario.workload
    if args.workload in ARCHETYPES:
        ref = [
            f"archetype = {_toml_str(args.workload)}",
            f"rate_per_s = {args.rate!r}",
            f"n_requests = {args.requests or ARCHETYPE_REQUESTS}",
            f"cv = {args.cv or 1.0!r}",
        ]
    else:
        target = Path(args.workload).resolve()
        try:
            rel = target.relative_to(path.resolve().parent)
        except ValueError:
            rel = target
        ref = [f"trace = {_toml_str(str(rel))}"]
    text = path.read_text(encoding="utf-8")
    head, sep, _ = text.partition("\n[workload]")
    if not sep or traffic.treatment == "drop":
        return "inline"
    path.write_text(head + "\n[workload]\n" + "\n".join(ref) + "\n", encoding="utf-8")
    try:
        again = Scenario.from_toml(path).workload
        same = all(
            np.array_equal(getattr(again, c), getattr(wl, c))
            for c in ("arrival_s", "input_tokens", "output_tokens")
        )
    except (PdoptError, OSError, ValueError):  # any reading problem: keep the arrays
        same = False
    if same:
        return "reference: " + ", ".join(ref)
    path.write_text(text, encoding="utf-8")
    return "inline (the trace as simulated differs from the file: shifted, cut or rescaled)"


def _toml_str(text: str) -> str:
    import json

    return json.dumps(text)


def _emit(
    args: argparse.Namespace, payload: dict[str, Any], spec: Any, options: Any, workload: Any
) -> dict[str, Any]:
    """Write ``--emit``'s launch configuration of the recommended deployment (nothing when
    no plan is recommended); what was written."""
    from pdopt.cli._plan_report import recommended_mode
    from pdopt.plan._emit import emit, role_launches

    mode = recommended_mode(payload)
    plan = mode or payload["recommendation"]
    if plan is None:
        return {"format": args.emit, "path": None, "why": "no plan recommended: nothing written"}
    launches = role_launches(
        plan["counts"], {o.key: o.max_running for o in options},
        longest_prompt_tokens=int(workload.input_tokens.max()),
        max_model_len=spec.max_context_tokens,
    )  # fmt: skip
    header = [f"verdict: {payload['verdict']['text']}"] if mode is None else [
        f"recommended {mode['mode']}: {mode['option']} (pdopt plan --compare-modes)"]  # fmt: skip
    text = emit(args.emit, spec.name, launches, header)
    Path(args.emit_out).write_text(text, encoding="utf-8")
    return {"format": args.emit, "path": args.emit_out, "roles": [x.name for x in launches]}


def _head_comment(path: Path, payload: dict[str, Any]) -> None:
    """Say at the top of an exported scenario what it holds and what of the offered traffic
    it leaves out or changes (``--too-long``)."""
    lines = [f"pdopt plan: {payload['scenario_holds']}",
             f"workload: {payload['scenario_workload']}"]  # fmt: skip
    text = payload["workload"]["too_long"]["text"]
    if text:
        lines.append(f"offered traffic: {text}")
    head = "".join(f"# {line}\n" for line in lines)
    path.write_text(head + path.read_text(encoding="utf-8"), encoding="utf-8")


@contextlib.contextmanager
def _bar(args: argparse.Namespace, total: int, desc: str, unit: str) -> Iterator[Any]:
    """A progress bar on stderr over at most ``total`` steps, drawn only on a terminal and
    without ``--quiet`` (tqdm's ``disable=None``: pipes and ``--json`` stay clean); a thread
    redraws it every second, so the elapsed time moves while one long step runs."""
    import sys

    from tqdm import tqdm

    from pdopt.cli._runs import ticking

    bar = tqdm(
        total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
        disable=True if args.quiet else None,
    )  # fmt: skip
    with ticking(bar):
        yield bar.update


def _step_bars(args: argparse.Namespace) -> Steps:
    """The library's long steps (:data:`pdopt.plan._pipeline.Steps`) as progress bars."""

    def steps(description: str, total: int, unit: str) -> AbstractContextManager[Tick]:
        return _bar(args, total, description, unit)

    return steps
