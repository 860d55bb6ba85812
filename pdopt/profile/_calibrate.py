"""Calibrate the roofline prior's compute efficiency on one machine's measured GEMMs.

Two measured A100s can differ where the prior has one number: the compute-bound 16-bit GEMMs
of Vidur's A100 (Sarathi-Serve kernels) run at a median 0.70 of the tensor peak,
AIConfigurator's A100 (TensorRT-LLM) at 0.83; at identical ``m, n, k`` their memory-bound GEMMs
agree (median ratio 0.97–1.03 from 1 to 512 tokens), their compute-bound ones do not. A preset
fitted on one of them is 11–16% fast on the other's large prefills. The user's own GEMM timings
(``gemm`` rows of an imported or measured profile) move the preset by the ratio of the two GEMM
speeds:

    compute_efficiency = preset.compute_efficiency · η_measured / η_reference

``η`` is :func:`gemm_compute_efficiency` of the user's rows and of the rows the preset was
fitted on (:data:`pdopt.profile._knobs.PRESET_GEMM_EFFICIENCY`, by the same estimator). The
ratio, not ``η_measured`` itself, because the preset's efficiency is a step-level fit that
also prices attention's slower products at it (each fit system's GEMMs alone run 1.5–5%
above its preset). Checked in ``calibration/roofline_validation.py`` (README "Calibrating the
prior on your GPU's GEMMs").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd

from pdopt.errors import InputError, ParameterError
from pdopt.hardware import GpuSpec, get_gpu
from pdopt.profile._format import Profile
from pdopt.profile._knobs import PRESET_GEMM_EFFICIENCY, roofline_knobs
from pdopt.profile._roofline import gemm_flops_bytes

COMPUTE_BOUND_RATIO = 4.0
"""A GEMM row counts as compute-bound when its roofline compute time (at the preset's
``compute_efficiency``) is at least this many times its memory time (at the preset's
``bandwidth_efficiency``): far enough past the ridge that the smooth roofline's bend and the
kernel latency change its time by a few percent at most."""

MIN_COMPUTE_BOUND_GEMMS = 3
"""Compute-bound GEMM rows a calibration needs (a median of fewer is one kernel's quirk)."""

SIXTEEN_BIT_DTYPES = frozenset({"float16", "bfloat16"})
"""Profile dtypes whose GEMMs compute at the GPU's 16-bit tensor peak (``GpuSpec.peak_flops``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ComputeCalibration:
    """The compute efficiency of one GPU's roofline prior, calibrated on measured GEMMs.

    Attributes
    ----------
    gpu : str
        The catalogued GPU the GEMMs were measured on.
    gemm_efficiency : float
        ``η_measured``: median FLOP/s ÷ 16-bit tensor peak of the compute-bound GEMM rows.
    reference_gemm_efficiency : float
        ``η_reference``: the same estimator on the GEMMs the GPU generation's preset was
        fitted on.
    preset_compute_efficiency, compute_efficiency : float
        The preset's knob and the calibrated one, ``preset · η_measured / η_reference``.
    gemm_points : int
        Compute-bound GEMM rows the median is over.
    sources : tuple of str
        The profiles' paths (``meta.source`` for one not read from a file), each once.
    """

    gpu: str
    gemm_efficiency: float
    reference_gemm_efficiency: float
    preset_compute_efficiency: float
    compute_efficiency: float
    gemm_points: int
    sources: tuple[str, ...]

    def describe(self) -> str:
        """One line for a profile's notes."""
        return (
            f"compute_efficiency calibrated on {self.gemm_points} compute-bound GEMMs of "
            f"{', '.join(self.sources)}: {self.preset_compute_efficiency:.4g} (preset) x "
            f"{self.gemm_efficiency:.3f} (measured) / {self.reference_gemm_efficiency:.3f} "
            f"(preset's fit GEMMs) = {self.compute_efficiency:.4g}"
        )


def gemm_compute_efficiency(gemm: pd.DataFrame, gpu: GpuSpec) -> tuple[float, int]:
    """``(η, n)``: the median of ``2mnk / (latency_s · gpu.peak_flops)`` over the ``n`` rows
    of ``gemm`` (columns ``m, n, k, latency_s``, 16-bit operands) that are compute-bound
    (:data:`COMPUTE_BOUND_RATIO`); ``η`` is NaN when ``n`` is 0."""
    knobs = roofline_knobs(gpu)
    m, n, k = (gemm[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    flops, bytes_ = gemm_flops_bytes(m, n, k, 2.0, 2.0)
    compute_s = flops / (knobs.compute_efficiency * gpu.peak_flops)
    memory_s = bytes_ / (knobs.bandwidth_efficiency * gpu.hbm_bw_bytes_per_s)
    bound = compute_s >= COMPUTE_BOUND_RATIO * memory_s
    speed = flops[bound] / gemm["latency_s"].to_numpy(dtype=float)[bound] / gpu.peak_flops
    return (float(np.median(speed)) if len(speed) else float("nan")), int(bound.sum())


def calibrate_compute_efficiency(
    profiles: Profile | Sequence[Profile], gpu: GpuSpec | str | None = None
) -> ComputeCalibration:
    """The roofline prior's ``compute_efficiency`` for the GPU ``profiles`` were measured on
    (module docstring): pass it to :func:`pdopt.profile.roofline_profile` for any model and TP.

    Parameters
    ----------
    profiles : Profile or sequence of Profile
        Measured profiles of one GPU with 16-bit ``gemm`` rows (``pdopt profile import-vidur``,
        ``import-aic``, or the calibration harness); their compute-bound rows are pooled.
    gpu : GpuSpec or str, optional
        The GPU; default the profiles' ``meta.gpu``. Every profile must name it.

    Raises
    ------
    InputError
        A profile has no ``gemm`` rows, another GPU or a dtype other than 16-bit; fewer than
        :data:`MIN_COMPUTE_BOUND_GEMMS` compute-bound rows in all; or GEMMs faster than the
        data-sheet peak allows. The message names the file and what to do.
    """
    group = [profiles] if isinstance(profiles, Profile) else list(profiles)
    if not group:
        raise ParameterError("calibrate_compute_efficiency needs at least one profile.")
    spec = _resolve_gpu(group[0], gpu)
    frames = [_gemm_rows(profile, spec) for profile in group]
    efficiency, points = gemm_compute_efficiency(pd.concat(frames, ignore_index=True), spec)
    sources = tuple(dict.fromkeys(_name(profile) for profile in group))
    if points < MIN_COMPUTE_BOUND_GEMMS:
        raise InputError(
            f"{', '.join(sources)}: {points} compute-bound gemm rows on {spec.name}, "
            f"{MIN_COMPUTE_BOUND_GEMMS} needed (rows whose 2mnk FLOPs take at least "
            f"{COMPUTE_BOUND_RATIO:g}x their bytes' time at the preset's rates). Add GEMMs of "
            f"large m (1024 tokens or more) and n, k (4096 or more)."
        )
    preset = roofline_knobs(spec).compute_efficiency
    reference = PRESET_GEMM_EFFICIENCY[spec.generation]
    calibrated = preset * efficiency / reference
    if calibrated > 1.0:
        raise InputError(
            f"{', '.join(sources)}: the compute-bound GEMMs run at {efficiency:.3f} of "
            f"{spec.name}'s 16-bit peak, which calibrates compute_efficiency to "
            f"{calibrated:.3f} > 1: check that the profiles were measured on {spec.name} "
            f"with 16-bit weights (meta gpu and dtype)."
        )
    return ComputeCalibration(spec.name, efficiency, reference, preset, calibrated, points, sources)


def _name(profile: Profile) -> str:
    return profile.meta.source if profile.path == "<memory>" else profile.path


def _resolve_gpu(first: Profile, gpu: GpuSpec | str | None) -> GpuSpec:
    if isinstance(gpu, GpuSpec):
        return gpu
    name = first.meta.gpu if gpu is None else gpu
    try:
        return get_gpu(name)
    except ParameterError as exc:
        if gpu is not None:
            raise
        raise InputError(
            f"{first.path}: its GPU {name!r} is not catalogued ({exc}); pass the GPU "
            f"(gpu=... or --gpu) and name it in the profile (import-vidur --gpu NAME)."
        ) from None


def _gemm_rows(profile: Profile, gpu: GpuSpec) -> pd.DataFrame:
    meta = profile.meta
    try:
        measured_on = get_gpu(meta.gpu).name
    except ParameterError:
        measured_on = meta.gpu
    if measured_on != gpu.name:
        raise InputError(
            f"{profile.path}: measured on {meta.gpu!r}, not {gpu.name}: calibrate each GPU "
            f"on its own GEMMs."
        )
    if meta.dtype not in SIXTEEN_BIT_DTYPES:
        raise InputError(
            f"{profile.path}: dtype {meta.dtype!r}; the calibration reads 16-bit GEMMs "
            f"({', '.join(sorted(SIXTEEN_BIT_DTYPES))}): import or measure the model's BF16 "
            f"GEMMs."
        )
    rows = profile.of_kind("gemm")
    if rows.empty:
        raise InputError(
            f"{profile.path}: no gemm rows to calibrate on (a profile from import-vidur, "
            f"import-aic or the calibration harness has them)."
        )
    return rows
