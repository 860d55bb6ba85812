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
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdopt.cli._args import integer, number
from pdopt.cli._output import add_json_flag, print_json
from pdopt.errors import ConfigError, InputError, ParameterError, PdoptError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from pdopt.model_spec import ModelSpec

EXIT_MISSES = 3
"""Exit code when every plan tried misses its SLOs in simulation."""

ARCHETYPE_REQUESTS = 4000
"""Requests generated for an archetype workload when ``--requests`` is not given."""

MAX_SIMULATED_GPUS = 10_000
"""Most GPUs a verified plan may need (by :func:`pdopt.plan._pd.gpus_lower_bound`): the check
simulates every worker request by request; 20,000 workers took minutes (issue 37)."""

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
"""What ``--sweep`` varies (``price``: a factor on every GPU type's price)."""


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


def _calibrations(paths: list[str]) -> dict[str, Any]:
    """The compute-efficiency calibration of each GPU the ``--calibrate-gemm`` profiles were
    measured on (their GEMMs pooled per GPU)."""
    from pdopt.hardware import get_gpu
    from pdopt.profile import calibrate_compute_efficiency, read_profile

    by_gpu: dict[str, list[Any]] = {}
    for path in paths:
        profile = read_profile(Path(path))
        try:
            gpu = get_gpu(profile.meta.gpu).name
        except ParameterError as exc:
            raise ConfigError(f"--calibrate-gemm {path}: {exc}") from exc
        by_gpu.setdefault(gpu, []).append(profile)
    return {gpu: calibrate_compute_efficiency(group, gpu) for gpu, group in by_gpu.items()}


def _costs(
    paths: list[str], given: ModelSpec | None
) -> tuple[dict[tuple[str, int], Any], ModelSpec | None, dict[str, Any]]:
    """Fitted cost models by (GPU, TP), the profiles' model and per-profile fit facts. A
    profile's model is ``given`` (``--model``, resolved) when its header names it, so a profile
    of a spec file or a Hugging Face config plans with ``--model`` pointing at that file; else
    its header's name is resolved."""
    from pdopt.costmodel import fit_cost_model
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import profiled_model
    from pdopt.plan._context import measured_prompt_tokens
    from pdopt.profile import read_profile

    costs: dict[tuple[str, int], Any] = {}
    model: ModelSpec | None = None
    fits: dict[str, Any] = {}
    for path in paths:
        profile = read_profile(Path(path))
        try:
            spec = profiled_model(profile.meta.model, given)
        except ParameterError as exc:
            raise ConfigError(
                f"--profile {path}: {exc}; a profile made from a spec file or a Hugging Face "
                "config plans with --model pointing at that file"
            ) from exc
        if model is not None and spec.name != model.name:
            raise ConfigError(f"--profile {path}: model {spec.name} differs from {model.name}")
        model = spec
        gpu = get_gpu(profile.meta.gpu).name
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                cost, reports = fit_cost_model(profile, model=spec)
                decode_r2: float | None = reports["decode"].r2
            except InputError as exc:
                if "decode" not in str(exc):
                    raise
                cost, reports = _roofline_decode(profile, spec, gpu, str(exc))
                decode_r2 = None
        costs[(gpu, profile.meta.tp)] = cost
        fits[path] = {
            "gpu": gpu, "tp": profile.meta.tp, "source": profile.meta.source,
            "prefill_r2": reports["prefill"].r2, "decode_r2": decode_r2,
            "measured_prompt_tokens": measured_prompt_tokens(profile.rows),
            "warnings": [str(w.message) for w in caught],
        }  # fmt: skip
    return costs, model, fits


def _roofline_decode(
    profile: Any, spec: ModelSpec, gpu: str, why: str
) -> tuple[Any, dict[str, Any]]:
    """A profile that measured no usable decode (e.g. Vidur's MLP-only tables): its prefill
    fit beside the roofline prior's decode for the same GPU, model and TP, the prior's compute
    efficiency calibrated on the profile's own compute-bound GEMMs when it has some; a
    :class:`~pdopt.errors.DataWarning` says so (the plan's notes and provenance show it)."""
    import dataclasses

    from pdopt.costmodel import fit_prefill, fit_ttft, roofline_cost_model
    from pdopt.errors import DataWarning
    from pdopt.hardware import get_gpu
    from pdopt.profile import gemm_compute_efficiency

    prefill, prefill_report = fit_prefill(profile)
    reports: dict[str, Any] = {"prefill": prefill_report}
    ttft = None
    if (profile.of_kind("prefill")["batch_size"] == 1).any():
        ttft, reports["ttft"] = fit_ttft(profile)
    gemm = profile.of_kind("gemm")
    efficiency, n = gemm_compute_efficiency(gemm, get_gpu(gpu)) if len(gemm) else (float("nan"), 0)
    calibrated = n > 0 and math.isfinite(efficiency)
    prior = roofline_cost_model(
        gpu, spec, profile.meta.tp, compute_efficiency=efficiency if calibrated else None
    )
    how = (
        f"compute efficiency {efficiency:.3f} from its {n} compute-bound GEMM rows"
        if calibrated
        else "its preset efficiencies"
    )
    warnings.warn(
        f"{profile.path}: decode from the roofline prior of {gpu} tp{profile.meta.tp} ({how}), "
        f"prefill from the profile: {why}",
        DataWarning,
        stacklevel=2,
    )
    cost = dataclasses.replace(prior, prefill=prefill, ttft=ttft, hybrid=None)
    return cost, reports


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


def _traffic(args: argparse.Namespace, full: Any, spec: ModelSpec) -> Any:
    """``full`` under the model's context window as ``--too-long`` says; refused when nothing
    reaches a GPU, or when the requests counted as misses alone break the SLO quantile."""
    from pdopt.plan._context import offered_traffic, rejections_allowed

    traffic = offered_traffic(full, spec.max_context_tokens, args.too_long)
    window = spec.max_context_tokens
    knobs = (
        "plan a model with a longer context window (--model), give the deployment's window if "
        "it serves a longer one (--max-context TOKENS), or say what happens to them: "
        "--too-long truncate (cut to fit) or --too-long drop (plan the others only)"
    )
    if not len(traffic.sized):
        raise ConfigError(
            f"--workload: every request exceeds {spec.name}'s {window:,}-token context window; "
            + knobs.replace(" or --too-long drop (plan the others only)", "")
        )
    if not rejections_allowed(traffic, args.quantile):
        n, r = traffic.offered, traffic.over_window
        allowed = n - math.ceil(args.quantile * n - 1e-9)
        raise ConfigError(
            f"--workload: {r:,} of {n:,} requests ({r / n:.1%}) exceed {spec.name}'s "
            f"{window:,}-token context window; each is rejected and counted as a miss "
            f"(--too-long miss), so they alone break the P{args.quantile * 100:g} SLOs (at most "
            f"{allowed:,} requests may miss): {knobs}"
        )
    return traffic


def _draws(args: argparse.Namespace, spec: ModelSpec) -> list[Any]:
    """The further draws of an archetype (seeds ``--seed`` + 1, …), over-long requests treated
    as in the first (``--too-long``); none for a trace."""
    from pdopt.plan._context import offered_traffic
    from pdopt.workload import ARCHETYPES, archetype_workload

    if args.workload not in ARCHETYPES:
        return []
    n = ARCHETYPE_REQUESTS if args.requests is None else args.requests
    cv = 1.0 if args.cv is None else args.cv
    count = VERIFY_DRAWS if args.verify_draws is None else args.verify_draws
    return [
        offered_traffic(
            archetype_workload(args.workload, args.rate, n_requests=n, cv=cv, seed=args.seed + i),
            spec.max_context_tokens,
            args.too_long,
        ).served
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


def _fit_hint(spec: ModelSpec, named: str, gpus: Sequence[str], tps: Sequence[int]) -> str:
    """What would make ``spec`` (given as ``named``) fit where no GPU type × TP degree holds it:
    the reason at the largest TP tried, the smallest larger TP at which one GPU type does, and
    FP8 weights where the weights are wider and that is enough."""
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import DTYPE_BYTES, kv_capacity_tokens, with_precision

    def holds(model: ModelSpec, tp: int) -> bool:
        for name in gpus:
            try:
                kv_capacity_tokens(get_gpu(name), model, tp)
            except (ConfigError, ParameterError):
                continue
            return True
        return False

    reason = ""
    try:
        kv_capacity_tokens(get_gpu(gpus[0]), spec, max(tps))
    except (ConfigError, ParameterError) as exc:
        reason = str(exc).split(";")[0].split(". ")[0] + "; "
    ways = []
    node = max(get_gpu(name).gpus_per_node for name in gpus)
    larger = next(
        (t for t in (2, 4, 8, 16, 32, 64) if max(tps) < t <= node and holds(spec, t)), None
    )
    if larger is not None:
        ways.append(f"--tp {larger}")
    if DTYPE_BYTES[spec.dtype] > 1 and any(holds(with_precision(spec, "fp8"), t) for t in tps):
        ways.append(f"FP8 weights (--model {named.partition('@')[0]}@fp8)")
    ways = ways or [
        f"a GPU type with more memory (--gpus): no TP group within one {node}-GPU node holds it "
        "(pdopt models neither multi-node tensor parallelism nor pipeline parallelism)"
    ]
    return f"{reason}try {' or '.join(ways)}"


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

        return run_sweep(args, _plan_payload)
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
    """Size, verify and export as the options say: the report's payload."""
    from pdopt.cli._plan_report import provenance
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import kv_bytes_per_token
    from pdopt.plan import (
        SizingInfeasibleError,
        demand_from_workload,
        sampled_quantile_error,
        worker_options,
    )
    from pdopt.plan._context import extrapolation_warning
    from pdopt.plan._demand import plan_cache_tokens
    from pdopt.plan._knobs import knob_hint
    from pdopt.plan._workers import option_name

    started = time.perf_counter()
    given = _given_model(args)
    costs, profiled, fits = _costs(args.profile, given)
    calibrations = _calibrations(args.calibrate_gemm)
    spec = _model(args, given, profiled)
    if args.max_context is not None:
        spec = dataclasses.replace(spec, max_context_tokens=args.max_context)
    model = spec.name
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
    traffic = _traffic(args, full, spec)
    workload = traffic.sized
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
    rate = args.rate if args.rate is not None else workload.rate_per_s
    if args.peak_rate is not None and args.peak_rate < rate:
        named = "--rate" if args.rate is not None else "the trace's rate"
        args.parser.error(f"argument --peak-rate: {args.peak_rate:g} must be >= {named} {rate:.4g}")
    tps = _tps(args)
    layouts = {"off": (False,), "on": (True,), "both": (False, True)}[args.expert_parallel]
    options = worker_options(
        gpus, spec, tps, prices=args.prices, costs=costs,
        expert_parallel=layouts,
        compute_efficiency={g: c.compute_efficiency for g, c in calibrations.items()},
    )  # fmt: skip
    if not options:
        raise ConfigError(
            f"{model} fits on none of {gpus} at TP {tps}; "
            + _fit_hint(spec, args.model or model, gpus, tps)
        )
    cache_tokens = plan_cache_tokens(workload, options, not args.no_prefix_cache)
    # the GPUs see the requests that reach them: the offered rate less the rejected share
    share = len(workload) / traffic.offered
    demand = demand_from_workload(
        workload, ttft_slo_s=args.ttft_slo * (1.0 - args.slo_margin),
        tpot_slo_s=args.tpot_slo * (1.0 - args.slo_margin),
        rate_per_s=None if args.rate is None else args.rate * share,
        arrival_cv=_arrival_cv(args), ttft_quantile=args.quantile,
        peak_rate_per_s=None if args.peak_rate is None else args.peak_rate * share,
        max_samples=args.sample, seed=args.seed, cache_tokens=cache_tokens,
    )  # fmt: skip
    limits = {g: int(n) for g, n in inventory.items() if math.isfinite(n)}
    _guard_demand(args, demand, options, inventory)
    kv_bytes = max(kv_bytes_per_token(spec, o.tp) for o in options)
    payload: dict[str, Any] = {"model": model, "workload": {**used, "name": workload.name}}
    payload["workload"]["too_long"] = traffic.to_dict()
    payload["context_window_tokens"] = spec.max_context_tokens or None
    payload["rejected_by_reason"] = (
        dict(traffic.split.rejected_by_reason) if traffic.treatment == "miss" else {}
    )
    draws = [traffic.served, *_draws(args, spec)]
    try:
        sized = _size(args, demand, options, limits, draws, kv_bytes)
    except SizingInfeasibleError as exc:
        hint = knob_hint(exc.binding, demand, spec, options)
        if hint is None:
            raise
        error = SizingInfeasibleError(f"{exc}; {hint}", exc.binding, exc.closest,
                                      exc.closest_slo_s)  # fmt: skip
        error.unconstrained = exc.unconstrained
        raise error from exc
    payload.update(sized.pop("payload"))
    _add_token_economics(payload, options, demand)
    payload["demand"]["offered_rate_per_s"] = rate
    payload["demand"]["slo_margin"] = args.slo_margin
    payload["demand"]["prefix_cache"] = _prefix_cache_entry(
        workload, args.no_prefix_cache, cache_tokens, demand.hit_fraction,
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
    for reason, n in sized["sim_rejected"].items():
        if "context window" in reason:
            continue  # counted from the offered traffic above (draw seed --seed)
        payload["rejected_by_reason"][reason] = payload["rejected_by_reason"].get(reason, 0) + n
    payload["notes"] = notes
    if args.out and sized["scenario"] is not None:
        payload["scenario_out"] = str(sized["scenario"].to_toml(args.out))
        payload["scenario_workload"] = _workload_by_reference(
            Path(payload["scenario_out"]), sized["scenario"], args, traffic
        )
        _head_comment(Path(payload["scenario_out"]), payload)
    else:
        payload.pop("scenario_holds", None)
    if args.emit:
        payload["emitted"] = _emit(args, payload, spec, options, workload)
    payload["wall_s"] = time.perf_counter() - started
    return payload


def _add_token_economics(payload: dict[str, Any], options: Any, demand: Any) -> None:
    """USD per million input/output/total tokens and joules per token of each deployment in
    the payload (:func:`pdopt.plan._economics.token_economics`)."""
    from pdopt.plan._economics import token_economics

    prices = {(o.gpu, o.tp): o.price_per_hour for o in options}
    for key in ("recommendation", "milp"):
        if payload.get(key):
            payload[key]["tokens"] = token_economics(payload[key]["counts"], prices, demand)
    for row in payload.get("modes", []):
        row["tokens"] = token_economics(row["counts"], prices, demand)


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


def _guard_demand(
    args: argparse.Namespace, demand: Any, options: Any, inventory: dict[str, float]
) -> None:
    """Refuse at once a demand whose plan is beyond what the check can simulate (the sizing
    alone, ``--no-sim``, takes seconds at any rate)."""
    from pdopt.plan._pd import gpus_lower_bound

    allowed = sum(inventory.values()) if inventory else math.inf
    if args.max_gpus is not None:
        allowed = min(allowed, args.max_gpus)
    if args.no_sim or allowed <= MAX_SIMULATED_GPUS:
        return  # within these limits the sizing answers (or refuses) in seconds
    need = gpus_lower_bound(options, demand)
    if need <= MAX_SIMULATED_GPUS:
        return
    rate = demand.peak_rate_per_s
    share = max(2, math.ceil(need / MAX_SIMULATED_GPUS))
    raise ConfigError(
        f"{_num_text(rate)} req/s needs at least {_num_text(need)} GPUs (each request's prefill "
        "and decode at full utilisation on the most efficient option), beyond the "
        f"{MAX_SIMULATED_GPUS:,} GPUs a plan's simulation covers: plan one of {share:,} "
        f"deployments that share the traffic (--rate {_num_text(demand.rate_per_s / share)}), "
        "or size without the check (--no-sim, seconds at any rate)"
    )


def _num_text(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.4g}"


def _size(
    args: argparse.Namespace,
    demand: Any,
    options: Any,
    limits: dict[str, int],
    workloads: list[Any],
    kv_bytes: float,
) -> dict[str, Any]:
    """Solve (and unless ``--no-sim`` verify on each of ``workloads``, independent draws): the
    payload parts, the scenario to export and the simulation's rejections by reason."""
    from pdopt.cli._plan_report import analytic, demand_dict, option_row, verdict_dict
    from pdopt.plan import capacities_for, solve_pd_sizing, solve_verified

    caps = capacities_for(options, demand, args.max_gpus, limits)
    base: dict[str, Any] = {
        "demand": demand_dict(demand),
        "options": [option_row(c, demand) for c in caps],
        "analytic": analytic(caps, demand),
    }
    choice = _type_choice(args, demand, options, limits)
    role_gpus = None if choice is None else choice.role_gpus
    if choice is not None:
        base["gpu_types"] = {
            "max_gpu_types": args.max_gpu_types, "one_type_per_role": args.one_type_per_role,
            "chosen": {r: sorted(t) for r, t in choice.role_gpus.items()},
            "priced": [{"types": t, "cost_per_hour": c} for t, c in choice.tried],
        }  # fmt: skip
    if args.no_sim:
        plan = (
            solve_pd_sizing(demand, options, inventory=limits, max_gpus=args.max_gpus)
            if choice is None
            else choice.plan
        )
        text = "not verified (--no-sim): the queueing model's plan, unsimulated"
        verdict = {"meets": True, "verified": False, "text": text}
        payload = {**base, "verdict": verdict, "recommendation": plan.to_dict(),
                   "milp": plan.to_dict(), "iterations": []}  # fmt: skip
        return {"payload": payload, "scenario": None, "sim_rejected": {}}
    sims = args.max_iterations * len(workloads) * (2 if demand.has_peak else 1)
    with _bar(args, sims, "plan: size, simulate, correct", "simulation") as bar:
        out = solve_verified(
            demand, options, workloads, kv_bytes, inventory=limits, max_gpus=args.max_gpus,
            seed=args.seed, max_iterations=args.max_iterations, progress=bar.update,
            role_gpus=role_gpus,
        )  # fmt: skip
    final = out.final
    check = final.check.to_dict()
    good = final.check.sim_attainment * demand.rate_per_s
    check["sim_goodput_at_offered_rate_rps"] = good
    check["sim_cost_per_1k_good_requests"] = (
        final.plan.cost_per_hour / (good * 3600.0) * 1000.0 if good > 0 else None
    )
    payload = {
        **base,
        "verdict": verdict_dict(out, args.workload),
        "recommendation": final.plan.to_dict() if out.meets else None,
        "milp": final.plan.to_dict(),
        "check": check,
        "peak_check": None if final.peak_check is None else final.peak_check.to_dict(),
        "iterations": [it.to_dict() for it in out.iterations],
    }
    if args.headroom and out.meets:
        payload["headroom"] = _headroom(args, final.plan, caps, demand, workloads, kv_bytes)
    scenario = out.scenario
    seed = out.seeds[final.binding_draw]
    holds = f"the {'recommended' if out.meets else 'last (missing)'} P/D plan on draw seed {seed}"
    if args.compare_modes:
        modes, option = _compare(args, demand, caps, limits, workloads, kv_bytes, payload)
        payload["modes"] = modes
        scenario, holds = _export_choice(args, demand, workloads, kv_bytes, payload, option,
                                         scenario, holds)  # fmt: skip
    payload["scenario_holds"] = holds
    rejected = dict(final.check.rejected_by_reason)
    return {"payload": payload, "scenario": scenario, "sim_rejected": rejected}


def _headroom(
    args: argparse.Namespace,
    plan: Any,
    caps: Any,
    demand: Any,
    workloads: list[Any],
    kv_bytes: float,
) -> dict[str, Any]:
    """``--headroom``: :func:`pdopt.plan._headroom.plan_headroom` of the verified plan."""
    from pdopt.plan._headroom import STEPS, plan_headroom

    total = (len(STEPS) + 5) * len(workloads)
    with _bar(args, total, "plan --headroom: load factor crossing", "simulation") as bar:
        found = plan_headroom(plan, caps, demand, workloads, kv_bytes, seed=args.seed,
                              progress=bar.update)  # fmt: skip
    text = found.describe(demand.rate_per_s)
    return {"load_factor_met": found.met, "load_factor_missed": found.missed,
            "simulations": found.simulations, "text": text}  # fmt: skip


def _type_choice(
    args: argparse.Namespace, demand: Any, options: Any, limits: dict[str, int]
) -> Any:
    """The GPU types per role ``--max-gpu-types`` / ``--one-type-per-role`` allow, the cheapest
    by the sizing model (None without either option)."""
    from pdopt.plan._types import cheapest_types, type_choices

    if args.max_gpu_types is None and not args.one_type_per_role:
        return None
    types = [o.gpu for o in options]
    choices = type_choices(types, args.max_gpu_types, args.one_type_per_role)
    choice = cheapest_types(demand, options, choices, inventory=limits, max_gpus=args.max_gpus)
    if choice is None:
        named = "--max-gpu-types" if not args.one_type_per_role else "--one-type-per-role"
        raise ConfigError(
            f"no plan meets the demand with the GPU types {named} allows "
            f"({len(choices)} assignments of {', '.join(dict.fromkeys(types))} tried): "
            f"drop {named} or raise the limits (--gpus, --max-gpus)"
        )
    return choice


def _export_choice(
    args: argparse.Namespace,
    demand: Any,
    workloads: list[Any],
    kv_bytes: float,
    payload: dict[str, Any],
    option: Any,
    scenario: Any,
    holds: str,
) -> tuple[Any, str]:
    """The scenario ``--out`` writes: the recommended deployment's check (its binding draw), a
    compared mode's when that is the recommendation, else the P/D plan's."""
    from pdopt.cli._plan_report import recommended_mode
    from pdopt.plan._modes import mode_scenario

    row = recommended_mode(payload)
    if row is None:
        return scenario, holds
    i = row["binding_draw"]
    chosen = mode_scenario(row["policy"], option, row["workers"], demand, workloads[i], kv_bytes,
                           args.seed + i)  # fmt: skip
    return chosen, f"the recommended {row['mode']}: {row['option']}, on draw seed {args.seed + i}"


def _compare(
    args: argparse.Namespace,
    demand: Any,
    caps: Any,
    limits: dict[str, int],
    workloads: list[Any],
    kv_bytes: float,
    payload: dict[str, Any],
) -> tuple[list[dict[str, Any]], Any]:
    """Full P/D (the verified plan) and each colocated mode on the cheapest single option
    (the analytic row), sized by simulation from the P/D plan's size, each on the same draws;
    the rows and that option (None when there is none)."""
    from pdopt.cli._plan_report import count_option_name
    from pdopt.plan._modes import COLOCATED_MODES

    plan, check = payload["milp"], payload["check"]
    final = payload["iterations"][-1]
    n_draws = len(workloads)
    rows = [{
        "mode": "full P/D disaggregation", "policy": check["policy"],
        "option": " + ".join(f"{c['workers']} × {count_option_name(c)} {c['role']}"
                             for c in plan["counts"]),
        "gpus": plan["n_gpus"], "cost_per_hour": plan["cost_per_hour"],
        "cost_per_1k_requests": plan["cost_per_1k_requests"],
        "meets": payload["verdict"]["meets"], "attainment": check["sim_attainment"],
        "ttft_q_s": final["sim_ttft_q_s"], "tpot_q_s": final["sim_tpot_q_s"], "simulations": 0,
        "draws": n_draws, "draws_run": n_draws, "draws_met": final["draws_met"],
        "binding_draw": final["binding_draw"], "counts": plan["counts"],
    }]  # fmt: skip
    single = payload["analytic"]
    if single is None:
        return rows, None
    cap = next(c for c in caps if c.option.name == single["option"])
    option = cap.option
    most = limits.get(option.gpu, 10**6) // option.tp
    if args.max_gpus is not None:
        most = min(most, args.max_gpus // option.tp)
    if most < 1:
        return rows, None
    # NOTE: every mode starts from the P/D plan's size, so the three searches are independent
    # and run in parallel processes: the wall time is the slowest mode's (EcoServe's, whose
    # policy's tick work dominates its runs), not the sum.
    start = max(1, plan["n_gpus"] // option.tp)
    most = max(1, min(most, 4 * start + 8))
    jobs = [(mode, policy, option, demand, workloads, kv_bytes, start, most, args.seed)
            for mode, policy in COLOCATED_MODES]  # fmt: skip
    with _bar(args, len(jobs), "plan --compare-modes: size colocated modes", "mode") as bar:
        results = _map(_size_mode, jobs, bar.update)
    for res in results:
        rows.append({
            "mode": res.mode, "policy": res.policy, "option": f"{res.workers} × {res.option} mixed",
            "workers": res.workers, "gpus": res.gpus, "cost_per_hour": res.cost_per_hour,
            "cost_per_1k_requests": res.cost_per_1k_requests, "meets": res.meets,
            "attainment": res.check.sim_attainment, "ttft_q_s": res.check.sim_ttft_q_s,
            "tpot_q_s": res.check.sim_tpot_q_s, "simulations": res.simulations,
            "draws": res.draws, "draws_run": res.draws_run, "draws_met": res.draws_met,
            "binding_draw": res.binding_draw,
            "counts": [{"gpu": option.gpu, "tp": option.tp, "role": "colocated",
                        "workers": res.workers}],
        })  # fmt: skip
    return rows, option


def _size_mode(job: tuple[Any, ...]) -> Any:
    """One mode's sizing (a picklable top-level function for the process pool)."""
    from pdopt.plan._modes import size_colocated

    mode, policy, option, demand, workloads, kv_bytes, start, most, seed = job
    return size_colocated(mode, policy, option, demand, workloads, kv_bytes, start=start,
                          most=most, seed=seed)  # fmt: skip


def _map(function: Any, jobs: list[Any], done: Any = None) -> list[Any]:
    """``function`` over ``jobs`` in worker processes (in order), or in this one on one core;
    ``done()`` is called as each job finishes."""
    import os

    workers = min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        out = []
        for job in jobs:
            out.append(function(job))
            if done is not None:
                done()
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(function, job) for job in jobs]
        for future in as_completed(futures):
            future.result()
            if done is not None:
                done()
        return [f.result() for f in futures]


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
        yield bar
