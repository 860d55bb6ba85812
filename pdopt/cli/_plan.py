"""``pdopt plan``: size a P/D cluster for a workload and SLOs, then check it in the simulator.

Steps: fit each ``--profile`` (a GPU × model × TP profile CSV; other GPU types in ``--gpus`` get
the roofline prior of the same model), derive per-worker capacities from the queueing models,
size the cheapest homogeneous plan analytically (exact queueing model, one option) and the
cheapest plan over all options by MILP (cvxpy + HiGHS), predict its latency, and simulate it on
the workload (least_loaded routing, prefill batch 1 as the model assumes).

Example (the demo, a few seconds)::

    pdopt plan --profile profiles/v100-32gb_qwen2.5-7b_roofline.csv --workload sharegpt \\
        --rate 12 --ttft-slo 1.0 --tpot-slo 0.1 --gpus V100-32GB=16
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path
from typing import Any

from pdopt.cli._output import add_json_flag, print_json
from pdopt.errors import ConfigError


def register(subparsers: Any) -> None:
    """Add ``pdopt plan``."""
    p = subparsers.add_parser(
        "plan",
        help="size prefill/decode workers by MILP and check the plan in the simulator",
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
    p.add_argument("--model", help="model name when no --profile is given (roofline prior)")
    p.add_argument(
        "--workload",
        required=True,
        help="an archetype name (listed by pdopt workload generate --help) or a trace file",
    )
    p.add_argument("--rate", type=float, help="mean rate, req/s (archetypes: required)")
    p.add_argument("--cv", type=float, help="inter-arrival CV (default: 1, or the trace's)")
    p.add_argument(
        "--requests",
        type=int,
        default=4000,
        help="requests generated for an archetype and simulated (default 4000)",
    )
    p.add_argument("--peak-rate", type=float, help="forecast peak rate: adds a Mixed pool")
    p.add_argument("--ttft-slo", type=float, required=True, help="TTFT SLO, seconds")
    p.add_argument("--tpot-slo", type=float, required=True, help="TPOT SLO, seconds")
    p.add_argument(
        "--quantile",
        type=float,
        default=0.99,
        help="the TTFT SLO holds at this quantile (default 0.99)",
    )
    p.add_argument(
        "--gpus",
        default="",
        metavar="TYPE=N,...",
        help="GPU types and inventory, e.g. A100-80GB=16,H100-SXM=8 (N may be 'inf')",
    )
    p.add_argument(
        "--tp",
        default="",
        metavar="1,2,...",
        help="TP degrees to consider (default: each profile's own TP, else 1)",
    )
    p.add_argument("--max-gpus", type=int, help="most GPUs in all")
    p.add_argument(
        "--prices",
        default="",
        metavar="TYPE=USD,...",
        help="USD per GPU-hour (default: the catalogue's cost_per_hour)",
    )
    p.add_argument("--seed", type=int, default=0, help="workload and simulation seed")
    p.add_argument("--no-sim", action="store_true", help="skip the simulation check")
    add_json_flag(p)  # fmt: skip
    p.set_defaults(handler=_plan, parser=p)


def _pairs(text: str, what: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = (
                math.inf if value.strip() == "inf" else float(value) if sep else math.inf
            )
        except ValueError as exc:
            raise ConfigError(f"--{what}: {item!r} must be TYPE=NUMBER") from exc
    return out


def _costs(paths: list[str]) -> tuple[dict[tuple[str, int], Any], str | None, dict[str, Any]]:
    from pdopt.costmodel import fit_cost_model
    from pdopt.hardware import get_gpu
    from pdopt.profile import read_profile

    costs: dict[tuple[str, int], Any] = {}
    model: str | None = None
    fits: dict[str, Any] = {}
    for path in paths:
        profile = read_profile(Path(path))
        if model is not None and profile.meta.model.lower() != model.lower():
            raise ConfigError(f"{path}: model {profile.meta.model} differs from {model}")
        model = profile.meta.model
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cost, reports = fit_cost_model(profile)
        gpu = get_gpu(profile.meta.gpu).name
        costs[(gpu, profile.meta.tp)] = cost
        fits[path] = {
            "gpu": gpu, "tp": profile.meta.tp,
            "prefill_r2": reports["prefill"].r2, "decode_r2": reports["decode"].r2,
            "warnings": [str(w.message) for w in caught],
        }  # fmt: skip
    return costs, model, fits


def _workload(args: argparse.Namespace) -> Any:
    from pdopt.workload import ARCHETYPES, archetype_workload, read_trace

    if args.workload in ARCHETYPES:
        if args.rate is None:
            raise ConfigError(f"--workload {args.workload} is an archetype: give --rate")
        cv = 1.0 if args.cv is None else args.cv
        return archetype_workload(
            args.workload, args.rate, n_requests=args.requests, cv=cv, seed=args.seed
        )
    path = Path(args.workload)
    if not path.exists():
        raise ConfigError(
            f"--workload {args.workload!r} is neither an archetype ({sorted(ARCHETYPES)}) "
            "nor an existing trace file"
        )
    trace = read_trace(path).shifted_to_zero()
    if args.rate is not None:
        trace = trace.scale_rate(args.rate / trace.rate_per_s)
    return trace[: args.requests] if len(trace) > args.requests else trace


def _arrival_cv(args: argparse.Namespace) -> float | None:
    from pdopt.workload import ARCHETYPES

    if args.cv is not None:
        return float(args.cv)
    # An archetype is generated with CV 1; a trace's own CV is estimated from its gaps.
    return 1.0 if args.workload in ARCHETYPES else None


def _plan(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from pdopt.model_spec import get_model, kv_bytes_per_token
    from pdopt.plan import demand_from_workload, worker_options

    costs, model, fits = _costs(args.profile)
    model = model or args.model
    if model is None:
        args.parser.error("give --profile CSV (or --model NAME with --gpus)")
    inventory = _pairs(args.gpus, "gpus")
    gpus = list(dict.fromkeys([g for g, _ in costs] + list(inventory)))
    if not gpus:
        args.parser.error("give --profile CSV or --gpus TYPE=N")
    tps = sorted({int(t) for t in args.tp.split(",") if t.strip()} or {t for _, t in costs} or {1})
    workload = _workload(args)
    demand = demand_from_workload(
        workload, ttft_slo_s=args.ttft_slo, tpot_slo_s=args.tpot_slo, rate_per_s=args.rate,
        arrival_cv=_arrival_cv(args), ttft_quantile=args.quantile, peak_rate_per_s=args.peak_rate,
        seed=args.seed,
    )  # fmt: skip
    options = worker_options(gpus, model, tps, prices=_pairs(args.prices, "prices"), costs=costs)
    if not options:
        raise ConfigError(f"{model} fits on none of {gpus} at TP {tps}; try larger --tp")
    limits = {g: int(n) for g, n in inventory.items() if math.isfinite(n)}
    payload = _size(demand, options, limits, args.max_gpus)
    payload["fits"] = fits
    if not args.no_sim:
        kv_bytes = max(kv_bytes_per_token(get_model(model), o.tp) for o in options)
        payload["check"] = _check(payload, demand, workload, kv_bytes, args.seed)
    payload.pop("_plan")
    payload.pop("_caps")
    payload["wall_s"] = time.perf_counter() - started
    payload["model"] = model
    if args.json:
        print_json(payload)
    else:
        _print_text(payload)
    return 0


def _size(
    demand: Any, options: Any, limits: dict[str, int], max_gpus: int | None
) -> dict[str, Any]:
    from pdopt.plan import capacities_for, solve_pd_sizing

    caps = capacities_for(options, demand, max_gpus)
    plan = solve_pd_sizing(demand, options, inventory=limits, max_gpus=max_gpus)
    return {
        "demand": {
            "rate_per_s": demand.rate_per_s, "peak_rate_per_s": demand.peak_rate_per_s,
            "arrival_cv": math.sqrt(demand.arrival_scv), "ttft_slo_s": demand.ttft_slo_s,
            "tpot_slo_s": demand.tpot_slo_s, "ttft_quantile": demand.ttft_quantile,
        },
        "options": [_option_row(c, demand) for c in caps],
        "analytic": _analytic(caps, demand),
        "milp": plan.to_dict(),
        "_plan": plan,
        "_caps": caps,
    }  # fmt: skip


def _option_row(cap: Any, demand: Any) -> dict[str, Any]:
    from pdopt.plan import prefill_workers_needed

    n_p = prefill_workers_needed(cap, demand.rate_per_s, demand)
    rate_d = cap.decode_rate_per_worker
    n_d = math.ceil(demand.rate_per_s / rate_d * (1 - 1e-9)) if 0 < rate_d < math.inf else 0
    ok = cap.fits and n_p > 0 and (rate_d > 0)
    workers = n_p + n_d
    return {
        "option": cap.option.name, "price_per_hour": cap.option.price_per_hour,
        "prefill_rps_per_worker_alone": cap.prefill_rate_per_worker[0],
        "decode_rps_per_worker": rate_d, "decode_batch": cap.decode_batch,
        "decode_limited_by": cap.decode_limited_by, "idle_ttft_s": cap.idle_ttft_s,
        "homogeneous_prefill": n_p if ok else None, "homogeneous_decode": n_d if ok else None,
        "homogeneous_cost_per_hour": workers * cap.option.price_per_hour if ok else None,
    }  # fmt: skip


def _analytic(caps: Any, demand: Any) -> dict[str, Any] | None:
    rows = [(_option_row(c, demand), c) for c in caps]
    ok = [(r, c) for r, c in rows if r["homogeneous_cost_per_hour"] is not None]
    if not ok:
        return None
    row, cap = min(ok, key=lambda rc: (rc[0]["homogeneous_cost_per_hour"], rc[1].option.tp))
    gpus = (row["homogeneous_prefill"] + row["homogeneous_decode"]) * cap.option.tp
    return {
        "option": row["option"], "prefill": row["homogeneous_prefill"],
        "decode": row["homogeneous_decode"], "gpus": gpus,
        "cost_per_hour": row["homogeneous_cost_per_hour"],
    }  # fmt: skip


def _check(payload: dict[str, Any], demand: Any, workload: Any, kv_bytes: float, seed: int) -> Any:
    from pdopt.plan._verify import check_plan

    check = check_plan(payload["_plan"], payload["_caps"], demand, workload, kv_bytes, seed=seed)
    out = check.to_dict()
    plan = payload["_plan"]
    # Goodput at the offered rate: the simulator's goodput_rps divides by the span up to the
    # last finish, which a long decode tail stretches past the arrivals.
    good = check.sim_attainment * demand.rate_per_s
    out["sim_goodput_at_rate_rps"] = good
    out["sim_cost_per_1k_good_requests"] = (
        plan.cost_per_hour / (good * 3600.0) * 1000.0 if good > 0 else None
    )
    return out


def _print_text(payload: dict[str, Any]) -> None:
    d, plan = payload["demand"], payload["milp"]
    print(
        f"pdopt plan: {payload['model']}, {d['rate_per_s']:.4g} req/s (CV {d['arrival_cv']:.2g}), "
        f"P{d['ttft_quantile'] * 100:g} TTFT <= {d['ttft_slo_s']:g} s, "
        f"TPOT <= {d['tpot_slo_s'] * 1e3:g} ms"
    )
    a = payload["analytic"]
    if a:
        print(
            f"  analytic (one option): {a['prefill']} P + {a['decode']} D × {a['option']}, "
            f"{a['gpus']} GPUs, ${a['cost_per_hour']:.2f}/h"
        )
    parts = [f"{c['workers']} × {c['gpu']}/tp{c['tp']} {c['role']}" for c in plan["counts"]]
    print(
        f"  MILP ({plan['status']}, gap {plan['gap']:.2g}, {plan['runtime_s'] * 1e3:.0f} ms): "
        f"{' + '.join(parts)}, {plan['n_gpus']} GPUs, ${plan['cost_per_hour']:.2f}/h, "
        f"${plan['cost_per_1k_requests']:.4f} per 1k requests"
    )
    check = payload.get("check")
    if check:
        p = check["predicted"]
        rows = [
            ("TTFT mean (s)", p["ttft_mean_s"], check["sim_ttft_mean_s"]),
            ("TTFT P99 (s)", p["ttft_p99_s"], check["sim_ttft_p99_s"]),
            ("TPOT mean (s)", p["tpot_s"], check["sim_tpot_mean_s"]),
            ("TPOT P99 (s)", p["tpot_s"], check["sim_tpot_p99_s"]),
            ("SLO attainment", p["attainment"], check["sim_attainment"]),
        ]
        print(f"  {'':16s} {'predicted':>10s} {'simulated':>10s}  ({check['sim_requests']} "
              f"requests, {check['policy']}, {check['sim_wall_s']:.2f} s)")  # fmt: skip
        for name, pred, sim in rows:
            print(f"  {name:16s} {pred:10.4g} {sim:10.4g}")
        per_1k = check["sim_cost_per_1k_good_requests"] or math.nan
        print(
            f"  goodput {check['sim_goodput_at_rate_rps']:.4g} req/s; simulated cost "
            f"${per_1k:.4f} per 1k good requests"
        )
    print(f"  total {payload['wall_s']:.2f} s")
