"""Cost models for a plan from measured profiles (issue 37, "library first"): what ``pdopt plan
--profile`` and ``--calibrate-gemm`` read, as a library call (:func:`profile_costs`,
:func:`gemm_calibrations`), so a notebook plans from the same profiles to the same answer.

Each profile is fitted (:func:`pdopt.costmodel.fit_cost_model`); a profile whose decode rows
cannot be fitted (Vidur's MLP-only tables) prices decode with the roofline prior of the same GPU,
model and TP, its compute efficiency calibrated on the profile's own compute-bound GEMMs
(:func:`roofline_decode`). Each fit's error (:func:`fit_error`) is what the plan's confidence
slows the cost model by (:mod:`pdopt.plan._uncertainty`). Messages name the command's options.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdopt.errors import ConfigError, InputError, ParameterError
from pdopt.model_spec import ModelSpec
from pdopt.plan._uncertainty import ROOFLINE_PRIOR_ERROR


@dataclass(frozen=True, slots=True)
class ProfileCosts:
    """Fitted cost models by (GPU, TP), the profiles' model (None without profiles) and per
    profile path its fit facts (``gpu``, ``tp``, ``source``, ``prefill_r2``, ``decode_r2``:
    None when decode is the roofline prior's, ``error``, ``measured_prompt_tokens``,
    ``warnings``)."""

    costs: dict[tuple[str, int], Any]
    model: ModelSpec | None
    fits: dict[str, dict[str, Any]]

    @property
    def errors(self) -> dict[tuple[str, int], float]:
        """Each profiled option's cost-model error (``plan_deployment(cost_model_error=...)``)."""
        return {(f["gpu"], f["tp"]): f["error"] for f in self.fits.values()}


def gemm_calibrations(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The compute-efficiency calibration of each GPU the ``--calibrate-gemm`` profiles were
    measured on (their GEMMs pooled per GPU)."""
    from pdopt.hardware import get_gpu
    from pdopt.profile import calibrate_compute_efficiency, read_profile

    by_gpu: dict[str, list[Any]] = {}
    for path in map(str, paths):
        profile = read_profile(Path(path))
        try:
            gpu = get_gpu(profile.meta.gpu).name
        except ParameterError as exc:
            raise ConfigError(f"--calibrate-gemm {path}: {exc}") from exc
        by_gpu.setdefault(gpu, []).append(profile)
    return {gpu: calibrate_compute_efficiency(group, gpu) for gpu, group in by_gpu.items()}


def profile_costs(paths: Sequence[str | Path], given: ModelSpec | None = None) -> ProfileCosts:
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
    fits: dict[str, dict[str, Any]] = {}
    for path in map(str, paths):
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
                cost, reports = roofline_decode(profile, spec, gpu, str(exc))
                decode_r2 = None
        costs[(gpu, profile.meta.tp)] = cost
        fits[path] = {
            "gpu": gpu, "tp": profile.meta.tp, "source": profile.meta.source,
            "prefill_r2": reports["prefill"].r2, "decode_r2": decode_r2,
            "error": fit_error(reports, decode_r2 is None),
            "measured_prompt_tokens": measured_prompt_tokens(profile.rows),
            "warnings": [str(w.message) for w in caught],
        }  # fmt: skip
    return ProfileCosts(costs, model, fits)


def fit_error(reports: dict[str, Any], prior_decode: bool) -> float:
    """A profile's cost-model error for the plan's confidence: the larger cross-validated MAPE
    of its prefill and decode fits, as a fraction (a decode from the roofline prior: the
    prior's documented error, :data:`pdopt.plan._uncertainty.ROOFLINE_PRIOR_ERROR`)."""
    errors = [r.cv_mape / 100.0 for k, r in reports.items() if k in ("prefill", "decode")]
    errors = [e for e in errors if math.isfinite(e)]
    if prior_decode:
        errors.append(ROOFLINE_PRIOR_ERROR)
    return max(errors, default=ROOFLINE_PRIOR_ERROR)


def roofline_decode(
    profile: Any, spec: ModelSpec, gpu: str, why: str
) -> tuple[Any, dict[str, Any]]:
    """A profile that measured no usable decode (e.g. Vidur's MLP-only tables): its prefill
    fit beside the roofline prior's decode for the same GPU, model and TP, the prior's compute
    efficiency calibrated on the profile's own compute-bound GEMMs when it has some; a
    :class:`~pdopt.errors.DataWarning` says so (the plan's notes and provenance show it)."""
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
