"""``pdopt calibrate PROFILE.csv [--reference-model NAME] [--json]``: fit the cost models.

Reads the profile, fits prefill, TTFT and decode (:func:`pdopt.costmodel.fit_cost_model`) and
prints the fitted parameters with their fit reports, as a table or as JSON
(``CostModel.to_dict()``, the reports without per-point residuals unless ``--residuals``, and
the fit-quality warnings, which also go to stderr).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import asdict
from typing import Any

from pdopt.cli._output import add_json_flag, print_json
from pdopt.costmodel import CostModel, FitReport, fit_cost_model
from pdopt.errors import FitQualityWarning
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
        model, reports = fit_cost_model(profile, reference_params=reference)
    messages = [str(w.message) for w in caught if issubclass(w.category, FitQualityWarning)]
    for message in messages:
        print(f"pdopt: warning: {message}", file=sys.stderr)
    if args.json:
        payload = _payload(profile, model, reports, args.residuals)
        print_json({**payload, "warnings": messages})
    else:
        _print_table(profile, model, reports)
    return 0


def _payload(
    profile: Profile, model: CostModel, reports: dict[str, FitReport], residuals: bool
) -> dict[str, Any]:
    return {
        "path": profile.path,
        "meta": asdict(profile.meta),
        "cost_model": model.to_dict(),
        "reports": {name: r.to_dict(residuals=residuals) for name, r in reports.items()},
    }


def _print_table(profile: Profile, model: CostModel, reports: dict[str, FitReport]) -> None:
    meta = profile.meta
    pre, dec = model.prefill, model.decode
    print(f"{profile.path}: {meta.gpu} × {meta.model}, tp={meta.tp}, source {meta.source}")
    print()
    print("Prefill  T = t0 + Σ_i (α·l_i² + β·P_m·l_i) / P_peak")
    print(f"  P_peak  {pre.p_peak_flops / 1e12:12.2f} TFLOP/s")
    print(f"  α       {pre.alpha_flop_per_token2:12.4g} FLOP/token²")
    print(f"  β       {pre.beta_flop_per_token:12.4g} FLOP/token")
    print(f"  P_m     {pre.p_m:12.4g}")
    print(f"  t0      {pre.intercept_s * 1e3:12.4f} ms")
    if model.ttft is not None:
        ttft = model.ttft
        print("TTFT     a·l² + b·l + c")
        print(f"  a       {ttft.a_s_per_token2:12.4g} s/token²")
        print(f"  b       {ttft.b_s_per_token:12.4g} s/token")
        print(f"  c       {ttft.c_s * 1e3:12.4f} ms")
    print("Decode   τ(B, C) = d0 + d1·B + d2·C")
    print(f"  d0      {dec.d0_s * 1e3:12.4f} ms")
    print(f"  d1      {dec.d1_s_per_request * 1e6:12.4f} µs/request")
    print(f"  d2      {dec.d2_s_per_token * 1e9:12.4f} ns/context token")
    print()
    header = ("fit", "points", "R²", "MAPE %", "CV MAPE %", "max |err| %")
    print("  {:<8} {:>6} {:>8} {:>8} {:>10} {:>12}".format(*header))
    for name, report in reports.items():
        print(
            f"  {name:<8} {report.n_points:>6d} {report.r2:>8.4f} {report.mape:>8.2f} "
            f"{report.cv_mape:>10.2f} {report.max_abs_pct_error:>12.2f}"
        )
