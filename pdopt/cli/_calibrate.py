"""``pdopt calibrate PROFILE.csv [--reference-model NAME] [--json]``: fit the cost models.

Reads the profile, fits prefill, TTFT and decode (:func:`pdopt.costmodel.fit_prefill`,
:func:`~pdopt.costmodel.fit_ttft`, :func:`~pdopt.costmodel.fit_decode`, what
:func:`~pdopt.costmodel.fit_cost_model` combines) and prints the fitted parameters with their fit
reports, as a table or as JSON (``CostModel.to_dict()``'s shape, a part that could not be fitted
``null``; the reports without per-point residuals unless ``--residuals``, the decode report with
its error per batch-size region, ``by_batch_region``; the fit-quality warnings, which also go to
stderr). Each part is fitted when the data supports it: an MLP-only import (Vidur without
attention files) fits prefill, and the decode part is reported as not fitted, with the reason, in
``not_fitted`` and as a warning. No part fitted is an error. A profile with ``hybrid`` rows
(measured mixed iterations) also fits the fused iteration (:func:`~pdopt.costmodel.fit_hybrid`),
shown as the ``hybrid`` part; without them that part is left out (the iteration is then composed
from the prefill and decode fits), with no warning.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pdopt.cli._output import add_json_flag, print_json, print_warning
from pdopt.costmodel import FitReport, HybridModel, fit_decode, fit_hybrid, fit_prefill, fit_ttft
from pdopt.errors import FitQualityWarning, InputError
from pdopt.model_spec import get_model, param_count
from pdopt.profile import Profile, read_profile


def register(subparsers: Any) -> None:
    """Add ``pdopt calibrate``."""
    parser = subparsers.add_parser(
        "calibrate", help="fit the prefill, TTFT and decode models of a profile"
    )
    parser.add_argument("profile", help="profile CSV (see 'pdopt profile show')")
    parser.add_argument(
        "--reference-model",
        default=None,
        help="catalogue model that beta refers to (P_m = params(profile model) / params(this)); "
        "default: the profile's own model (P_m = 1)",
    )
    parser.add_argument(
        "--residuals", action="store_true", help="with --json, include per-point residuals"
    )
    add_json_flag(parser)
    parser.set_defaults(handler=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
    profile = read_profile(args.profile)
    reference = None
    if args.reference_model is not None:
        reference = float(param_count(get_model(args.reference_model)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FitQualityWarning)
        models, reports, not_fitted = _fit_parts(profile, reference)
    messages = [str(w.message) for w in caught if issubclass(w.category, FitQualityWarning)]
    messages += [f"{name} not fitted: {reason}" for name, reason in not_fitted.items()]
    if "decode" in not_fitted:
        messages.append(
            "this profile still plans: pdopt plan --profile prices its decode with the roofline "
            "prior of the same GPU, model and TP, calibrated on the profile's own GEMM rows"
        )
    for message in messages:
        print_warning(message)
    if args.json:
        print_json(
            {
                "path": profile.path,
                "meta": asdict(profile.meta),
                "cost_model": {k: None if m is None else m.to_dict() for k, m in models.items()},
                "reports": {
                    name: r.to_dict(residuals=args.residuals) for name, r in reports.items()
                },
                "not_fitted": not_fitted,
                "warnings": messages,
            }
        )
    else:
        _print_table(profile, models, reports, not_fitted)
    return 0


def _fit_parts(
    profile: Profile, reference: float | None
) -> tuple[dict[str, Any], dict[str, FitReport], dict[str, str]]:
    """Each part the data supports (models and reports by name, None when not fitted), and why
    the others could not be fitted; an InputError when none could."""
    fits: dict[str, Callable[[], tuple[Any, FitReport]]] = {
        "prefill": lambda: fit_prefill(profile, reference_params=reference),
        "decode": lambda: fit_decode(profile),
        "ttft": lambda: fit_ttft(profile),
    }
    if not profile.of_kind("hybrid").empty:
        fits["hybrid"] = lambda: fit_hybrid(profile)
    models: dict[str, Any] = {}
    reports: dict[str, FitReport] = {}
    not_fitted: dict[str, str] = {}
    for name, fit in fits.items():
        try:
            models[name], reports[name] = fit()
        except InputError as exc:
            models[name], not_fitted[name] = None, str(exc)
    if not reports:
        raise InputError("; ".join(f"{k}: {v}" for k, v in not_fitted.items()))
    return models, reports, not_fitted


def _print_table(
    profile: Profile,
    models: dict[str, Any],
    reports: dict[str, FitReport],
    not_fitted: dict[str, str],
) -> None:
    meta = profile.meta
    print(f"{profile.path}: {meta.gpu} × {meta.model}, tp={meta.tp}, source {meta.source}")
    print()
    if models["prefill"] is not None:
        _print_prefill(models["prefill"])
    if models["ttft"] is not None:
        ttft = models["ttft"]
        print("TTFT     a·l² + b·l + c")
        print(f"  a       {ttft.a_s_per_token2:12.4g} s/token²")
        print(f"  b       {ttft.b_s_per_token:12.4g} s/token")
        print(f"  c       {ttft.c_s * 1e3:12.4f} ms")
    if models["decode"] is not None:
        dec = models["decode"]
        moe = dec.experts > 0
        print("Decode   τ(B, C) = d0 + d1·B + d2·C" + (" + d3·cover(B)" if moe else ""))
        print(f"  d0      {dec.d0_s * 1e3:12.4f} ms")
        print(f"  d1      {dec.d1_s_per_request * 1e6:12.4f} µs/request")
        print(f"  d2      {dec.d2_s_per_token * 1e9:12.4f} ns/context token")
        if moe:
            cover = f"cover(B) = {dec.experts}·(1 − (1 − {dec.experts_per_token}/{dec.experts})^B)"
            print(f"  d3      {dec.d3_s_per_expert * 1e6:12.4f} µs/expert, {cover}")
    if models.get("hybrid") is not None:
        _print_hybrid(models["hybrid"])
    for name, reason in not_fitted.items():
        print(f"{name.capitalize():8s} not fitted: {reason}")
    print()
    header = ("fit", "points", "R²", "MAPE %", "CV MAPE %", "max |err| %")
    print("  {:<8} {:>6} {:>8} {:>8} {:>10} {:>12}".format(*header))
    for name, report in reports.items():
        print(
            f"  {name:<8} {report.n_points:>6d} {report.r2:>8.4f} {report.mape:>8.2f} "
            f"{report.cv_mape:>10.2f} {report.max_abs_pct_error:>12.2f}"
        )
    decode = reports.get("decode")
    if decode is not None and decode.by_batch_region is not None:
        _print_regions(decode.by_batch_region)


def _print_regions(regions: Any) -> None:
    """The decode fit's error per batch-size region (bias > 0: the model is slower)."""
    print()
    print("Decode error by batch region (bias > 0: model slower than measured)")
    header = ("B", "points", "bias %", "MAPE %", "CV MAPE %", "max |err| %")
    print("  {:<8} {:>6} {:>8} {:>8} {:>10} {:>12}".format(*header))
    for row in regions.itertuples(index=False):
        print(
            f"  {row.region:<8} {row.n_points:>6d} {row.bias_pct:>+8.2f} {row.mape_pct:>8.2f} "
            f"{row.cv_mape_pct:>10.2f} {row.max_abs_pct_error:>12.2f}"
        )


def _print_hybrid(hyb: HybridModel) -> None:
    print(
        "Hybrid   T = max(h0 + h1·B, h5 + h3·(B + c)) + h2·C + h4·((d + c)² − d²)"
        "  (one fused iteration)"
    )
    print(f"  h0      {hyb.h0_s * 1e3:12.4f} ms")
    print(f"  h1      {hyb.h1_s_per_decode * 1e6:12.4f} µs/decode")
    print(f"  h2      {hyb.h2_s_per_context_token * 1e9:12.4f} ns/context token")
    print(f"  h3      {hyb.h3_s_per_chunk_token * 1e6:12.4f} µs/chunk token")
    print(f"  h4      {hyb.h4_s_per_token2 * 1e12:12.4f} ps/token²")
    print(f"  h5      {hyb.h5_s * 1e3:12.4f} ms")


def _print_prefill(pre: Any) -> None:
    print("Prefill  T = t0 + Σ_i (α·l_i² + β·P_m·l_i) / P_peak")
    print(f"  P_peak  {pre.p_peak_flops / 1e12:12.2f} TFLOP/s")
    print(f"  α       {pre.alpha_flop_per_token2:12.4g} FLOP/token²")
    print(f"  β       {pre.beta_flop_per_token:12.4g} FLOP/token")
    print(f"  P_m     {pre.p_m:12.4g}")
    print(f"  t0      {pre.intercept_s * 1e3:12.4f} ms")
