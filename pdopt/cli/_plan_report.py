"""The report of ``pdopt plan``: payload rows and the text a planner reads.

The answer is in the first three lines: the recommendation (or that there is none), the verdict
of the plan's own simulation, and the demand it was sized for. Every number carries its unit;
seconds, rates and dollars are printed with four significant digits (``_num``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any


def _num(value: Any, unit: str = "") -> str:
    """One number format for the whole report: 4 significant digits, thousands separators."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf" + (f" {unit}" if unit else "")
    text = f"{value:,}" if isinstance(value, int) else f"{float(value):,.4g}"
    return f"{text} {unit}" if unit else text


def demand_dict(demand: Any) -> dict[str, Any]:
    """What the plan was sized for (units in the key names)."""
    return {
        "rate_per_s": demand.rate_per_s, "peak_rate_per_s": demand.peak_rate_per_s,
        "arrival_cv": math.sqrt(demand.arrival_scv), "ttft_slo_s": demand.ttft_slo_s,
        "tpot_slo_s": demand.tpot_slo_s, "quantile": demand.ttft_quantile,
        "length_samples": len(demand.input_tokens),
    }  # fmt: skip


def option_row(cap: Any, demand: Any) -> dict[str, Any]:
    """One candidate worker's capacities and its cheapest homogeneous plan (analytic;
    :func:`pdopt.plan._pipeline.homogeneous_row`)."""
    from pdopt.plan._pipeline import homogeneous_row

    return homogeneous_row(cap, demand)


def analytic(caps: Any, demand: Any) -> dict[str, Any] | None:
    """The cheapest single-option plan by the exact queueing model
    (:func:`pdopt.plan._pipeline.cheapest_homogeneous`)."""
    from pdopt.plan._pipeline import cheapest_homogeneous

    return cheapest_homogeneous(caps, demand)


def plan_report(result: Any, workload: str, type_limits: tuple[Any, bool]) -> dict[str, Any]:
    """The payload parts of a :class:`pdopt.plan.DeploymentPlan` (``workload``: the
    ``--workload`` given; ``type_limits``: ``--max-gpu-types`` and ``--one-type-per-role``):
    demand, options, the analytic plan, the GPU-type choice, the
    verdict, the plans, the check, the iterations, the headroom and the compared modes, each
    plan with its per-token cost and energy."""
    demand = result.demand
    out: dict[str, Any] = {
        "demand": demand_dict(demand),
        "options": result.option_rows(),
        "analytic": result.analytic,
    }
    choice = result.type_choice
    if choice is not None:
        out["gpu_types"] = {
            "max_gpu_types": type_limits[0], "one_type_per_role": type_limits[1],
            "chosen": {r: sorted(t) for r, t in choice.role_gpus.items()},
            "priced": [{"types": t, "cost_per_hour": c} for t, c in choice.tried],
        }  # fmt: skip
    plan = result.plan.to_dict()
    plan["tokens"] = result.tokens
    out["milp"] = plan
    out["recommendation"] = dict(plan) if result.meets else None
    out["iterations"] = []
    out_verified = result.verified
    if out_verified is None:
        text = "not verified (--no-sim): the queueing model's plan, unsimulated"
        out["verdict"] = {"meets": True, "verified": False, "text": text}
        return out
    final = out_verified.final
    check = final.check.to_dict()
    check["sim_goodput_at_offered_rate_rps"] = result.goodput_rps
    check["sim_cost_per_1k_good_requests"] = result.cost_per_1k_good_requests
    out["verdict"] = verdict_dict(out_verified, workload)
    confident, text = result.confidence()
    out["verdict"].update(confident=confident, confidence=text)
    out["verdict"]["cost_model_error"] = (
        None if result.cost_error is None else result.cost_error.to_dict()
    )
    out["check"] = check
    out["peak_check"] = None if final.peak_check is None else final.peak_check.to_dict()
    out["iterations"] = [it.to_dict() for it in out_verified.iterations]
    if result.headroom is not None:
        room = result.headroom
        out["headroom"] = {
            "load_factor_met": room.met, "load_factor_missed": room.missed,
            "simulations": room.simulations, "text": room.describe(demand.rate_per_s),
        }  # fmt: skip
    if result.modes_compared:
        out["modes"] = _mode_rows(result, out)
    return out


def _mode_rows(result: Any, payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Full P/D (the verified plan) and each compared colocated mode, one row each."""
    plan, check = payload["milp"], payload["check"]
    final = payload["iterations"][-1]
    n_draws = len(result.served)
    rows = [{
        "mode": "full P/D disaggregation", "policy": check["policy"],
        "option": " + ".join(f"{c['workers']} × {count_option_name(c)} {c['role']}"
                             for c in plan["counts"]),
        "gpus": plan["n_gpus"], "cost_per_hour": plan["cost_per_hour"],
        "cost_per_1k_requests": plan["cost_per_1k_requests"],
        "meets": payload["verdict"]["meets"], "attainment": check["sim_attainment"],
        "ttft_q_s": final["sim_ttft_q_s"], "tpot_q_s": final["sim_tpot_q_s"], "simulations": 0,
        "draws": n_draws, "draws_run": n_draws, "draws_met": final["draws_met"],
        "binding_draw": final["binding_draw"], "counts": plan["counts"], "tokens": plan["tokens"],
    }]  # fmt: skip
    option = result.mode_option
    for res in result.modes:
        counts = [{"gpu": option.gpu, "tp": option.tp, "role": "colocated",
                   "workers": res.workers}]  # fmt: skip
        rows.append({
            "mode": res.mode, "policy": res.policy, "option": f"{res.workers} × {res.option} mixed",
            "workers": res.workers, "gpus": res.gpus, "cost_per_hour": res.cost_per_hour,
            "cost_per_1k_requests": res.cost_per_1k_requests, "meets": res.meets,
            "attainment": res.check.sim_attainment, "ttft_q_s": res.check.sim_ttft_q_s,
            "tpot_q_s": res.check.sim_tpot_q_s, "simulations": res.simulations,
            "draws": res.draws, "draws_run": res.draws_run, "draws_met": res.draws_met,
            "binding_draw": res.binding_draw, "counts": counts,
            "tokens": result.economics(counts),
        })  # fmt: skip
    return rows


def provenance(
    rows: list[dict[str, Any]],
    costs: Mapping[tuple[str, int], Any],
    fits: Mapping[str, Any],
    calibrated: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Each option row with ``cost_model``: the profile it was fitted from, or the roofline
    prior of the model on that GPU and TP (saying so when its compute efficiency was
    calibrated: the GPUs of ``calibrated``)."""
    by_key = {(f["gpu"], f["tp"]): path for path, f in fits.items()}
    out = []
    for row in rows:
        path = by_key.get((row["gpu"], row["tp"]))
        measured = not row["expert_parallel"] and (row["gpu"], row["tp"]) in costs
        if path is not None and measured:
            src = fits[path]["source"]
            text = f"profile {path} (source: {src})"
            if fits[path].get("decode_r2", 0.0) is None:  # no usable decode rows in it
                text += "; decode: roofline prior"
        elif row["gpu"] in calibrated:
            text = "roofline prior (compute efficiency calibrated on measured GEMMs)"
        else:
            text = "roofline prior"
        out.append({**row, "cost_model": text})
    return out


def verdict_dict(out: Any, workload: str) -> dict[str, Any]:
    """The verdict of a :class:`pdopt.plan.VerifiedPlan` and what it covers: the draws of the
    workload each plan was simulated on (``workload``: the ``--workload`` given; a trace is one
    draw)."""
    from pdopt.workload import ARCHETYPES

    return {
        "meets": out.meets, "verified": True, "text": out.verdict(), "stop": out.stop,
        "iterations": len(out.iterations),
        "smaller_tried": [n.to_dict() for n in out.neighbours],
        "confident": out.confidence()[0], "confidence": out.confidence()[1],
        "covers": {
            "text": out.coverage(), "draws": len(out.seeds), "draws_met": out.final.draws_met,
            "seeds": list(out.seeds), "requests_per_draw": list(out.draw_requests),
            "workload": "generated" if workload in ARCHETYPES else "trace (one draw)",
        },
    }  # fmt: skip


def count_option_name(count: Mapping[str, Any]) -> str:
    """The option name of one of a plan's worker counts (its ``to_dict`` form)."""
    from pdopt.plan._workers import option_name

    return option_name(count["gpu"], count["tp"], count.get("expert_parallel", False))


def _plan_line(plan: Mapping[str, Any]) -> str:
    parts = [f"{c['workers']} × {count_option_name(c)} {c['role']}" for c in plan["counts"]]
    return (
        f"{' + '.join(parts)}: {plan['n_gpus']} GPUs, {_num(plan['cost_per_hour'], 'USD/h')}, "
        f"{_num(plan['cost_per_1k_requests'], 'USD')} per 1,000 requests"
    )


def print_text(payload: Mapping[str, Any]) -> None:
    """The human report (answer first: recommendation, verdict, demand)."""
    d, v = payload["demand"], payload["verdict"]
    rec = payload["recommendation"]
    cheaper = recommended_mode(payload)
    if cheaper is not None:
        print(
            f"pdopt plan: RECOMMENDED {cheaper['mode']}: {cheaper['option']}: {cheaper['gpus']} "
            f"GPUs, {_num(cheaper['cost_per_hour'], 'USD/h')}, "
            f"{_num(cheaper['cost_per_1k_requests'], 'USD')} per 1,000 requests"
        )
        q = f"P{d['quantile'] * 100:g}"
        worst = "; worst draw" if cheaper["draws"] > 1 else ""
        print(
            f"verdict: meets the SLOs in simulation on {_mode_coverage(payload, cheaper)}{worst}: "
            f"{q} TTFT {_num(cheaper['ttft_q_s'], 's')} <= {_num(d['ttft_slo_s'], 's')}, "
            f"{q} TPOT {_num(cheaper['tpot_q_s'], 's')} <= "
            f"{_num(d['tpot_slo_s'], 's')}; cheaper than full P/D (see modes)"
        )
    elif rec is not None:
        print(f"pdopt plan: RECOMMENDED {_plan_line(rec)}")
        print(f"verdict: {v['text']}")
    else:
        print(f"pdopt plan: NO PLAN RECOMMENDED (last tried: {_plan_line(payload['milp'])})")
        print(f"verdict: {v['text']}")
    q = f"P{d['quantile'] * 100:g}"
    wl = payload["workload"]
    print(
        f"demand: {payload['model']}, {_rate(d)} (arrival CV "
        f"{_num(d['arrival_cv'])}), {q} TTFT <= {_num(d['ttft_slo_s'], 's')}, {q} TPOT <= "
        f"{_num(d['tpot_slo_s'], 's')}; {wl['source']}: {_num(wl['requests'])} of "
        f"{_num(wl['of'])} requests{_too_long(wl)}{_margin(d)}"
    )
    cache = d.get("prefix_cache")
    if cache and (cache["used"] or "off" in cache["text"]):
        print(f"prefix cache: {cache['text']}")
    _print_tokens(payload, cheaper)
    if payload.get("headroom"):
        print(f"headroom (the P/D plan): {payload['headroom']['text']}")
    if v.get("confidence") and cheaper is None:
        print(f"confidence: {v['confidence']}")
    _print_modes(payload)
    _print_iterations(payload)
    _print_check(payload)
    _print_options(payload)
    _print_types(payload)
    rejected = payload["rejected_by_reason"]
    if rejected:
        print("rejected requests (not served; each a miss in the verdict):")
        for reason, n in rejected.items():
            print(f"  {_num(n):>8s}  {reason}")
    for note in payload["notes"]:
        print(f"note: {note}")
    if payload.get("scenario_out"):
        print(
            f"scenario written to {payload['scenario_out']}: {payload['scenario_holds']} "
            "(pdopt simulate replays that check)"
        )
    emitted = payload.get("emitted")
    if emitted:
        if emitted["path"] is None:
            print(f"--emit {emitted['format']}: {emitted['why']}")
        else:
            print(
                f"{emitted['format']} launch configuration written to {emitted['path']} "
                f"(roles: {', '.join(emitted['roles'])}; a starting point: check model id, "
                "hosts, ports and the KV connector)"
            )
    print(f"total {_num(payload['wall_s'], 's')}")


def _margin(d: Mapping[str, Any]) -> str:
    if not d.get("slo_margin"):
        return ""
    given = d["given_slo_s"]
    return (
        f"; SLOs held with a {d['slo_margin']:.0%} margin (--slo-margin; given TTFT "
        f"{_num(given['ttft'], 's')}, TPOT {_num(given['tpot'], 's')})"
    )


def _too_long(wl: Mapping[str, Any]) -> str:
    text = wl.get("too_long", {}).get("text")
    return f"; {text}" if text else ""


def _rate(d: Mapping[str, Any]) -> str:
    """The offered rate, and the rate that reaches the GPUs when requests are rejected."""
    offered = d.get("offered_rate_per_s", d["rate_per_s"])
    if math.isclose(offered, d["rate_per_s"], rel_tol=1e-9):
        return _num(d["rate_per_s"], "req/s")
    return f"{_num(offered, 'req/s')} offered ({_num(d['rate_per_s'], 'req/s')} reach the GPUs)"


def _print_tokens(payload: Mapping[str, Any], cheaper: Mapping[str, Any] | None) -> None:
    """Per-token cost and energy of the recommended deployment (or the last one tried)."""
    plan = cheaper or payload["recommendation"] or payload["milp"]
    t = plan.get("tokens")
    if not t:
        return
    which = "" if cheaper or payload["recommendation"] else " (last plan tried)"
    split = ""
    if t["usd_per_m_input_tokens"] is not None:
        split = (
            f"{_num(t['usd_per_m_input_tokens'], 'USD')} per million input tokens (prefill "
            f"GPUs), {_num(t['usd_per_m_output_tokens'], 'USD')} per million output tokens "
            "(decode GPUs), "
        )
    print(
        f"per token{which}: {split}{_num(t['usd_per_m_tokens'], 'USD')} per million tokens in "
        f"all; at most {_num(t['joules_per_token_at_tdp'], 'J')} per token "
        f"({_num(t['joules_per_output_token_at_tdp'], 'J')} per output token; "
        f"{_num(t['power_w_at_tdp'], 'W')}, every GPU at TDP){_simulated_energy(payload, cheaper)}"
    )


def _simulated_energy(payload: Mapping[str, Any], cheaper: Mapping[str, Any] | None) -> str:
    """The P/D check's energy per output token (its GPUs' idle and busy power), when known."""
    joules = (payload.get("check") or {}).get("sim_energy_per_output_token_j")
    if cheaper is not None or joules is None or not math.isfinite(joules):
        return ""
    return f"; simulated {_num(joules, 'J')} per output token"


def _mode_coverage(payload: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    """What a mode's verdict covers, as :meth:`pdopt.plan.VerifiedPlan.coverage` words it."""
    covers = payload["verdict"]["covers"]
    text = str(covers["text"])
    return f"{row['draws_met']} of {row['draws']}" + text[text.index(" draw") :]


def recommended_mode(payload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The cheapest compared mode that meets its SLOs on every draw, when it is not full P/D
    (:func:`pdopt.plan._pipeline.pick_mode`: what ``pdopt plan --compare-modes`` prints and
    ``--out`` writes)."""
    from pdopt.plan._pipeline import pick_mode

    rows = payload.get("modes", [])
    i = pick_mode([(bool(r["meets"]), r["cost_per_hour"], r["gpus"]) for r in rows])
    return None if i is None else rows[i]


def _print_modes(payload: Mapping[str, Any]) -> None:
    rows = payload.get("modes")
    if not rows:
        return
    q = f"P{payload['demand']['quantile'] * 100:g}"
    print(
        f"deployment modes, each verified by simulation ({q} over all requests, worst draw; "
        "draws: met of run, a count stops at its first draw that misses):"
    )
    print(f"  {'mode':38s} {'GPUs':>4s} {'USD/h':>8s} {'USD/1k req':>10s} {'attain.':>7s} "
          f"{'TTFT (s)':>9s} {'TPOT (s)':>9s}  draws  meets  deployment")  # fmt: skip
    for r in rows:
        draws = f"{r['draws_met']}/{r['draws_run']}"
        print(
            f"  {r['mode']:38s} {r['gpus']:>4d} {_num(r['cost_per_hour']):>8s} "
            f"{_num(r['cost_per_1k_requests']):>10s} {_num(r['attainment']):>7s} "
            f"{_num(r['ttft_q_s']):>9s} {_num(r['tpot_q_s']):>9s}  {draws:>5s}  "
            f"{'yes' if r['meets'] else 'no':5s}  {r['option']}"
        )


def _print_iterations(payload: Mapping[str, Any]) -> None:
    its = payload["iterations"]
    if not its:
        return
    q = f"P{payload['demand']['quantile'] * 100:g}"
    print(
        f"iterations (size by MILP, simulate each draw, correct capacities; {q} over all "
        "requests, worst draw):"
    )
    print(f"  {'#':>2s}  {'prefill×':>8s}  {'decode×':>8s}  {'TTFT (s)':>9s}  {'TPOT (s)':>9s}"
          f"  draws  {'meets':5s}  plan")  # fmt: skip
    for i, it in enumerate(its, 1):
        draws = f"{it['draws_met']}/{it['draws']}"
        step = "  (a smaller neighbour that meets)" if it.get("step") == "trim" else ""
        print(
            f"  {i:>2d}  {_num(it['prefill_factor']):>8s}  {_num(it['decode_factor']):>8s}  "
            f"{_num(it['sim_ttft_q_s']):>9s}  {_num(it['sim_tpot_q_s']):>9s}  {draws:>5s}  "
            f"{'yes' if it['meets'] else 'no':5s}  {_plan_line(it['plan'])}{step}"
        )
    tried = payload["verdict"].get("smaller_tried", [])
    if tried:
        met = sum(t["meets"] for t in tried)
        print(
            f"  smaller plans tried (one worker fewer or at a smaller TP, cheapest first; {met} "
            f"of {len(tried)} met and replaced the plan):"
        )
        for t in tried:
            print(
                f"    - {t['removed']}: {t['plan']['n_gpus']} GPUs, "
                f"{_num(t['plan']['cost_per_hour'], 'USD/h')}: "
                f"{'meets' if t['meets'] else 'misses'} (draws run {t['draws_run']})"
            )


def _print_check(payload: Mapping[str, Any]) -> None:
    check = payload.get("check")
    a = payload["analytic"]
    if a:
        print(
            f"analytic, one option: {a['prefill']} P + {a['decode']} D × {a['option']}, "
            f"{a['gpus']} GPUs, {_num(a['cost_per_hour'], 'USD/h')} (queueing model, unsimulated)"
        )
    if not check:
        return
    p = check["predicted"]
    final = payload["iterations"][-1]
    seed = payload["verdict"]["covers"]["seeds"][final["binding_draw"]]
    print(
        f"last plan, predicted vs simulated ({_num(check['sim_requests'])} requests, draw seed "
        f"{seed}, the binding draw; {check['policy']} routing, {_num(check['sim_wall_s'], 's')}):"
    )
    # The simulated quantiles are the verdict's (over all requests, a rejected one as late);
    # the prediction has a P99 only.
    q = check["quantile"]
    name = f"P{q * 100:g}"
    rows = [
        ("TTFT mean (s)", p["ttft_mean_s"], check["sim_ttft_mean_s"]),
        (f"TTFT {name} (s)", p["ttft_p99_s"] if q == 0.99 else None, check["sim_ttft_q_s"]),
        ("TPOT mean (s)", p["tpot_s"], check["sim_tpot_mean_s"]),
        (f"TPOT {name} (s)", p["tpot_s"] if q == 0.99 else None, check["sim_tpot_q_s"]),
        ("SLO attainment", p["attainment"], check["sim_attainment"]),
    ]
    print(f"  {'':16s} {'predicted':>10s} {'simulated':>10s}")
    for label, pred, sim in rows:
        print(f"  {label:16s} {_num(pred):>10s} {_num(sim):>10s}")
    per_1k = check["sim_cost_per_1k_good_requests"]
    print(
        f"  goodput at the offered rate (SLO attainment × {_num(payload['demand']['rate_per_s'])}"
        f" req/s): {_num(check['sim_goodput_at_offered_rate_rps'], 'req/s')}; "
        f"{_num(per_1k, 'USD')} per 1,000 requests meeting the SLOs"
    )
    peak = payload.get("peak_check")
    if peak:
        print(
            f"  at the peak {_num(peak['rate_per_s'], 'req/s')} (Mixed pool promoted): "
            f"TTFT {name} {_num(peak['sim_ttft_q_s'], 's')}, TPOT {name} "
            f"{_num(peak['sim_tpot_q_s'], 's')}, attainment {_num(peak['sim_attainment'])}"
        )


def _print_types(payload: Mapping[str, Any]) -> None:
    types = payload.get("gpu_types")
    if not types:
        return
    priced = ", ".join(
        f"{r['types']}: {_num(r['cost_per_hour'], 'USD/h') if r['cost_per_hour'] else 'no plan'}"
        for r in types["priced"]
    )
    print(f"GPU types (cheapest assignment by the sizing model, then verified): {priced}")


def _print_options(payload: Mapping[str, Any]) -> None:
    print("options (cost model source; per-worker capacity by the queueing model):")
    for row in payload["options"]:
        print(
            f"  {row['option']:16s} {_num(row['price_per_hour'], 'USD/h'):>11s}  prefill "
            f"{_num(row['prefill_rps_per_worker_alone'], 'req/s')}, decode "
            f"{_num(row['decode_rps_per_worker'], 'req/s')} ({row['decode_limited_by']})  "
            f"[{row['cost_model']}]"
        )
