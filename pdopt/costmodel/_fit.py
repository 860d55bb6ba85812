"""Fitting the latency models of :mod:`pdopt.costmodel._models` from a :class:`Profile`.

Each ``fit_*`` returns ``(model, FitReport)``. Coefficients are found by non-negative least
squares (:func:`scipy.optimize.nnls`) so every fitted time grows with work, as the models require;
columns are scaled to unit norm before solving (NNLS is invariant to a positive column scaling,
and the scaling keeps ``l²`` ~ 1e7 and ``1`` on one footing numerically).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy.optimize import nnls

from pdopt._validation import check_positive
from pdopt.costmodel._hybrid import HybridModel
from pdopt.costmodel._models import CostModel, DecodeModel, PrefillModel, TtftModel
from pdopt.costmodel._report import (
    MIN_POINTS,
    MIN_R2,
    FitReport,
    FloatArray,
    cross_validated_abs_pct,
)
from pdopt.errors import FitQualityWarning, InputError, ParameterError
from pdopt.model_spec import ModelSpec, expert_coverage, get_model

if TYPE_CHECKING:
    # NOTE: type-only: pdopt.profile imports pdopt.costmodel (parameter files hold a PrefillModel).
    from pdopt.profile import Profile

PEAK_TOP_N = 3
"""P_peak is the median of this many highest achieved GEMM FLOP/s (:func:`gemm_peak_flops`)."""


def gemm_peak_flops(profile: Profile) -> float:
    """Sustained peak FLOP/s of the profile's ``gemm`` rows.

    Each row achieves ``2·m·n·k / latency_s`` FLOP/s; the sustained peak is the median of the
    :data:`PEAK_TOP_N` highest, so one lucky (or mistimed) GEMM does not set it alone.

    Raises
    ------
    InputError
        When the profile has no ``gemm`` rows.
    """
    gemm = profile.of_kind("gemm")
    if gemm.empty:
        raise InputError(
            f"{profile.path}: no gemm rows, so P_peak cannot be measured; add gemm rows or "
            "pass p_peak_flops (e.g. the GPU's data-sheet peak times an efficiency)"
        )
    achieved = 2.0 * gemm["m"] * gemm["n"] * gemm["k"] / gemm["latency_s"]
    top = np.sort(achieved.to_numpy(dtype=np.float64))[-PEAK_TOP_N:]
    return float(np.median(top))


def fit_prefill(
    profile: Profile,
    *,
    reference_params: float | None = None,
    model_params: float | None = None,
    p_peak_flops: float | None = None,
) -> tuple[PrefillModel, FitReport]:
    """Fit ``T = t0 + Σ_i (alpha·l_i² + beta·P_m·l_i) / P_peak`` to the ``prefill`` rows.

    What is fitted, exactly: a prefill row holds ``b`` requests of ``l`` tokens each and the
    batch latency ``T``. With ``U = T·P_peak`` (DESIGN.md "Cost model", Phasor Eq. 1)::

        U ≈ t0·P_peak + alpha·(b·l²) + beta·P_m·(b·l)

    is solved for ``t0, alpha, beta >= 0`` by non-negative least squares over all prefill rows
    (equivalently, T against the columns 1, b·l², P_m·b·l, since U is T times a constant). The
    fit minimises absolute errors, so long prompts weigh most; the report's MAPE shows how short
    ones fare.

    Parameters
    ----------
    profile : Profile
        Needs at least 3 prefill rows that separate 1, l² and l (several lengths), and gemm
        rows unless ``p_peak_flops`` is given.
    reference_params : float, optional
        Parameter count of the reference model β refers to. None: the profile's model is the
        reference (P_m = 1).
    model_params : float, optional
        Parameter count of the profiled model (per GPU of a TP group if you compare across TP
        degrees); by default ``param_count`` of the catalogue model named in the profile.
    p_peak_flops : float, optional
        Sustained peak FLOP/s; by default :func:`gemm_peak_flops` of the profile.

    Returns
    -------
    (PrefillModel, FitReport)
        The model with ``p_m = model_params / reference_params`` and its report on the rows.

    Examples
    --------
    >>> from pdopt.profile import read_profile
    >>> profile = read_profile("profiles/v100-32gb_qwen2.5-7b_roofline.csv")  # doctest: +SKIP
    >>> model, report = fit_prefill(profile)  # doctest: +SKIP
    >>> round(model.p_peak_flops / 1e12, 2), round(report.r2, 4)  # doctest: +SKIP
    (81.25, 1.0)
    """
    peak = gemm_peak_flops(profile) if p_peak_flops is None else p_peak_flops
    peak = check_positive(peak, "p_peak_flops", "fit_prefill")
    p_m = _p_m(profile, reference_params, model_params)
    rows = _rows(profile, "prefill", "input_tokens")
    batch, length = rows["batch_size"].to_numpy(), rows["input_tokens"].to_numpy()
    latency = rows["latency_s"].to_numpy(dtype=np.float64)
    design = np.column_stack([np.ones_like(length), batch * length**2, p_m * batch * length])
    coef, report = _fit_linear(profile, "prefill", design, latency, "t0 + b·(α·l² + β·P_m·l)")
    if profile.meta.prefill_without_attention:
        warnings.warn(
            f"{profile.path}: its prefill rows hold no attention ({profile.meta.source}: linear "
            "ops only), so α (the attention term, l²) is fitted on rows without it and the "
            "model leaves prompts' attention out; add the engine's attention measurements (or "
            "price prefill with the roofline prior)",
            FitQualityWarning,
            stacklevel=2,
        )
    model = PrefillModel(
        alpha_flop_per_token2=float(coef[1] * peak),
        beta_flop_per_token=float(coef[2] * peak),
        p_peak_flops=peak,
        p_m=p_m,
        intercept_s=float(coef[0]),
    )
    return model, report


def fit_ttft(profile: Profile) -> tuple[TtftModel, FitReport]:
    """Fit the TTFT predictor ``TTFT(l) = a·l² + b·l + c`` (Arrow §4) to batch-1 prefill rows.

    Only rows with ``batch_size == 1`` are used: TTFT is the latency of a prompt prefilled on its
    own. ``a, b, c >= 0`` by non-negative least squares on latency (seconds), so the predictor
    stays positive and increasing beyond the profiled lengths.

    Raises
    ------
    InputError
        No batch-1 prefill rows, fewer than 3, or fewer than 3 distinct lengths.
    """
    rows = _rows(profile, "prefill", "input_tokens", batch_one=True)
    length = rows["input_tokens"].to_numpy(dtype=np.float64)
    latency = rows["latency_s"].to_numpy(dtype=np.float64)
    design = np.column_stack([length**2, length, np.ones_like(length)])
    coef, report = _fit_linear(profile, "ttft", design, latency, "a·l² + b·l + c")
    return TtftModel(float(coef[0]), float(coef[1]), float(coef[2])), report


def fit_decode(
    profile: Profile, *, model: ModelSpec | None = None, expert_term: bool = True
) -> tuple[DecodeModel, FitReport]:
    """Fit the decode iteration time ``τ(B, C) = d0 + d1·B + d2·C [+ d3·cover(B)]`` (DESIGN.md
    "Cost model", :class:`~pdopt.costmodel.DecodeModel`).

    ``B`` is a decode row's ``batch_size`` and ``C`` its ``total_context_tokens``;
    ``d0, d1, d2 >= 0`` by non-negative least squares on the iteration latency (seconds). For a
    mixture-of-experts model the expert-coverage column ``cover(B) = E·(1 − (1 − k/E)^B)``
    (:func:`pdopt.model_spec.expert_coverage`) joins the design and ``d3 >= 0`` is fitted jointly
    with the others; a dense model keeps the three-term fit, unchanged. The report's
    ``by_batch_region`` gives the error per batch-size region
    (:func:`~pdopt.costmodel.error_by_batch_region`): one average can hide a form that is high
    at small batches and low at large ones.

    Parameters
    ----------
    profile : Profile
        Needs decode rows at several batch sizes and contexts per batch size.
    model : ModelSpec, optional
        The profiled model, which says whether it is MoE (``num_experts``,
        ``experts_per_token``); by default the model the profile's meta names
        (:func:`~pdopt.model_spec.get_model`), or dense, with a warning, when it is unknown.
    expert_term : bool
        False: fit the linear form even for an MoE model (to compare the two).

    Raises
    ------
    InputError
        Fewer than 3 decode rows (4 with the expert term), or rows that cannot separate the
        terms (e.g. one batch size only, or C always proportional to B as in an MLP-only import).
    """
    rows = _rows(profile, "decode", "batch_size")
    batch = rows["batch_size"].to_numpy(dtype=np.float64)
    context = rows["total_context_tokens"].to_numpy(dtype=np.float64)
    latency = rows["latency_s"].to_numpy(dtype=np.float64)
    per_request = context / batch
    if np.all(per_request == per_request[0]):
        raise InputError(
            f"{profile.path}: every decode row has total_context_tokens = {per_request[0]:g} × "
            "batch_size, so d1 (per request) and d2 (per context token) cannot be separated "
            "(an MLP-only import?): profile decode at several contexts per batch size"
        )
    columns = [np.ones_like(batch), batch, context]
    equation = "d0 + d1·B + d2·C"
    experts, per_token = _routing(profile, model) if expert_term else (0, 0)
    if experts:
        columns.append(expert_coverage(batch, experts, per_token))
        equation += " + d3·cover(B)"
    coef, report = _fit_linear(
        profile, "decode", np.column_stack(columns), latency, equation, batch_size=batch
    )
    d3 = float(coef[3]) if experts else 0.0
    decode = DecodeModel(float(coef[0]), float(coef[1]), float(coef[2]), d3, experts, per_token)
    return decode, report


def _routing(profile: Profile, model: ModelSpec | None) -> tuple[int, int]:
    """``(E, k)`` of the profiled model's routed experts; ``(0, 0)`` when it is dense, or when
    it is not given and :func:`~pdopt.model_spec.get_model` does not know the profile's model
    (with a :class:`~pdopt.errors.FitQualityWarning`: an MoE model would lose its term)."""
    if model is None:
        try:
            model = get_model(profile.meta.model)
        except ParameterError:
            warnings.warn(
                f"{profile.path}: model {profile.meta.model!r} is neither catalogued nor in a "
                "spec file, so decode is fitted as a dense model (no expert term); pass "
                "model=ModelSpec (pdopt plan: --model FILE) if it is a mixture of experts",
                FitQualityWarning,
                stacklevel=3,
            )
            return 0, 0
    return (model.num_experts, model.experts_per_token) if model.is_moe else (0, 0)


def fit_cost_model(
    profile: Profile,
    *,
    model: ModelSpec | None = None,
    reference_params: float | None = None,
    model_params: float | None = None,
    p_peak_flops: float | None = None,
) -> tuple[CostModel, dict[str, FitReport]]:
    """Fit prefill, decode and (when batch-1 prefill rows exist) TTFT models of one profile,
    and the fused hybrid iteration when it has ``hybrid`` rows.

    ``model`` goes to :func:`fit_decode` (the expert term of an MoE model), the other keyword
    arguments to :func:`fit_prefill`. Returns the :class:`CostModel` and the reports keyed
    ``"prefill"``, ``"decode"``, ``"ttft"`` (absent, with a
    :class:`~pdopt.errors.FitQualityWarning`, when the profile has no batch-1 prefill rows) and
    ``"hybrid"`` (absent, and ``CostModel.hybrid`` None, when it has no hybrid rows).
    """
    prefill, prefill_report = fit_prefill(
        profile,
        reference_params=reference_params,
        model_params=model_params,
        p_peak_flops=p_peak_flops,
    )
    decode, decode_report = fit_decode(profile, model=model)
    reports = {"prefill": prefill_report, "decode": decode_report}
    ttft: TtftModel | None = None
    if (profile.of_kind("prefill")["batch_size"] == 1).any():
        ttft, reports["ttft"] = fit_ttft(profile)
    else:
        warnings.warn(
            f"{profile.path}: no batch-1 prefill rows, so no TTFT predictor was fitted "
            "(CostModel.ttft is None); profile single prompts to get one",
            FitQualityWarning,
            stacklevel=2,
        )
    hybrid: HybridModel | None = None
    if not profile.of_kind("hybrid").empty:
        hybrid, reports["hybrid"] = fit_hybrid(profile)
    return CostModel(prefill, decode, ttft, hybrid), reports


def transfer_prefill(
    model: PrefillModel, target_params: float, reference_params: float
) -> PrefillModel:
    """``model`` moved to another model size through ``P_m = target / reference`` (no refit).

    ``reference_params`` is the parameter count ``model``'s β refers to (the fitted model's, when
    it was fitted with P_m = 1). Only the linear term scales; α, P_peak and t0 are kept, so the
    transfer is exact only when the attention work per token² and the GPU are the same.
    """
    target = check_positive(target_params, "target_params", "transfer_prefill")
    reference = check_positive(reference_params, "reference_params", "transfer_prefill")
    return model.with_p_m(target / reference)


def transfer_error(model: PrefillModel, target_profile: Profile) -> FitReport:
    """How well ``model`` (already transferred) predicts ``target_profile``'s prefill rows.

    Nothing is refitted: each row's batch time ``t0 + b·(α·l² + β·P_m·l)/P_peak`` is compared
    with its measured latency. The report's ``kind`` is ``"prefill-transfer"``, its ``cv_mape``
    NaN, and its R² may be negative (worse than predicting the mean).
    """
    rows = _rows(target_profile, "prefill", None, minimum=1)
    batch = rows["batch_size"].to_numpy(dtype=np.float64)
    per_request_s = model.work_flop(rows["input_tokens"].to_numpy()) / model.p_peak_flops
    predicted = model.intercept_s + batch * per_request_s
    measured = rows["latency_s"].to_numpy(dtype=np.float64)
    return FitReport.from_predictions("prefill-transfer", measured, predicted, float("nan"))


def fit_hybrid(profile: Profile) -> tuple[HybridModel, FitReport]:
    """Fit the fused iteration ``max(h0 + h1·B, h5 + h3·(B + c)) + h2·C + h4·c·(2d + c)`` to
    the ``hybrid`` rows (:class:`~pdopt.costmodel.HybridModel`, whose docstring justifies the
    form).

    Each row is one iteration of ``B = batch_size`` decodes holding ``C =
    total_context_tokens`` and one chunk of ``c = input_tokens`` tokens after ``d =
    prefix_tokens``. The ``max`` makes the model piecewise linear: each row is bound by one of
    the two passes, and given which, the fit is non-negative least squares (``h0 … h5 >= 0``).
    So the fit alternates (as a hinge regression does): assign each row to the pass the current
    coefficients make larger, refit, until no row changes side; it starts from three
    assignments (all decode-bound, all compute-bound, split at the median ``B + c``) and keeps
    the one of least squared error. The report's ``by_batch_region`` is the error per number
    of running decodes.

    Raises
    ------
    InputError
        Fewer than 6 hybrid rows, or rows that cannot separate the terms (vary B, C per
        decode, the chunk size and its prefix independently).
    """
    rows = _rows(profile, "hybrid", "input_tokens", minimum=6)
    batch, context, chunk, prefix = (
        rows[c].to_numpy(dtype=np.float64)
        for c in ("batch_size", "total_context_tokens", "input_tokens", "prefix_tokens")
    )
    latency = rows["latency_s"].to_numpy(dtype=np.float64)
    equation = "max(h0 + h1·B, h5 + h3·(B + c)) + h2·C + h4·c·(2d + c)"
    tokens = batch + chunk
    starts = (
        np.zeros(len(rows), dtype=bool),
        np.ones(len(rows), dtype=bool),
        tokens >= np.median(tokens),
    )
    best: tuple[float, FloatArray, FloatArray] | None = None
    for compute_bound in starts:
        coef, design = _fit_hinge(batch, context, chunk, prefix, latency, compute_bound)
        sse = float(np.sum((design @ coef - latency) ** 2))
        if best is None or sse < best[0]:
            best = (sse, coef, design)
    assert best is not None
    _, _, design = best
    # a pass no row is bound by leaves its own terms unmeasured: they stay 0
    used = np.any(design != 0, axis=0)
    fitted, report = _fit_linear(
        profile, "hybrid", design[:, used], latency, equation, batch_size=batch
    )
    coef = np.zeros(design.shape[1])
    coef[used] = fitted
    return HybridModel(*(float(v) for v in coef)), report


_HINGE_ROUNDS = 50
"""Most reassignments :func:`_fit_hinge` makes (each round moves rows to the larger pass; the
squared error does not increase, so it settles long before)."""


def _fit_hinge(
    batch: FloatArray,
    context: FloatArray,
    chunk: FloatArray,
    prefix: FloatArray,
    latency: FloatArray,
    compute_bound: npt.NDArray[np.bool_],
) -> tuple[FloatArray, FloatArray]:
    """Alternating NNLS of :func:`fit_hybrid` from one starting assignment: the coefficients
    ``(h0 … h5)`` and the design matrix of the final assignment."""
    attention = HybridModel.attention_term(chunk, prefix)
    ones = np.ones_like(batch)
    tokens = batch + chunk
    decode_cols = np.column_stack([ones, batch, context, 0 * ones, attention, 0 * ones])
    chunk_cols = np.column_stack([0 * ones, 0 * ones, context, tokens, attention, ones])
    side = compute_bound.copy()
    for _ in range(_HINGE_ROUNDS):
        design = np.where(side[:, None], chunk_cols, decode_cols)
        coef = _nnls(design, latency)
        moved = chunk_cols @ coef > decode_cols @ coef
        if np.array_equal(moved, side):
            break
        side = moved
    design = np.where(side[:, None], chunk_cols, decode_cols)
    return _nnls(design, latency), design


def _p_m(profile: Profile, reference_params: float | None, model_params: float | None) -> float:
    if reference_params is None:
        return 1.0
    reference = check_positive(reference_params, "reference_params", "fit_prefill")
    if model_params is None:
        from pdopt.model_spec import get_model, param_count

        try:
            model_params = float(param_count(get_model(profile.meta.model)))
        except ParameterError:
            raise InputError(
                f"{profile.path}: model {profile.meta.model!r} is not in the catalogue, so its "
                "parameter count is unknown; pass model_params"
            ) from None
    return check_positive(model_params, "model_params", "fit_prefill") / reference


def _rows(
    profile: Profile,
    kind: str,
    varied: str | None,
    *,
    batch_one: bool = False,
    minimum: int = 3,
) -> pd.DataFrame:
    """The rows a fit uses, or an InputError naming the profile and the kind.

    ``varied`` is a field that must take at least two values for the terms to separate.
    """
    rows = profile.of_kind(kind)
    what = f"{kind} rows"
    if batch_one:
        rows = rows[rows["batch_size"] == 1]
        what = "batch-1 prefill rows"
    if len(rows) < minimum:
        raise InputError(
            f"{profile.path}: {len(rows)} {what}; fitting needs at least {minimum} "
            "(one per parameter): profile more points"
        )
    if varied is not None and rows[varied].nunique() < 2:
        raise InputError(
            f"{profile.path}: all {len(rows)} {what} have {varied}={rows[varied].iloc[0]:g}, "
            f"so the terms of the model cannot be separated: profile several {varied} values"
        )
    return rows


def _fit_linear(
    profile: Profile,
    kind: str,
    design: FloatArray,
    latency_s: FloatArray,
    equation: str,
    *,
    batch_size: FloatArray | None = None,
) -> tuple[FloatArray, FitReport]:
    """NNLS of ``latency ≈ design @ coef``, its report (per batch-size region when
    ``batch_size`` is given), and the quality warnings."""
    scaled = design / _column_norms(design)
    if np.linalg.matrix_rank(scaled) < design.shape[1]:
        raise InputError(
            f"{profile.path}: the {kind} rows cannot separate the terms of {equation} (their "
            f"columns are linearly dependent): profile more varied points"
        )
    coef = _nnls(design, latency_s)
    cv = cross_validated_abs_pct(design, latency_s, _nnls)
    report = FitReport.from_predictions(kind, latency_s, design @ coef, cv, batch_size)
    _warn_quality(profile, report, equation)
    return coef, report


def _column_norms(design: FloatArray) -> FloatArray:
    norms = np.linalg.norm(design, axis=0)
    return np.where(norms > 0, norms, 1.0)


def _nnls(design: FloatArray, target: FloatArray) -> FloatArray:
    """Non-negative least squares with unit-norm columns and a unit-max target (conditioning)."""
    norms = _column_norms(design)
    target_scale = float(np.max(np.abs(target))) or 1.0
    coef, _ = nnls(design / norms, target / target_scale)
    return np.asarray(coef * target_scale / norms, dtype=np.float64)


def _warn_quality(profile: Profile, report: FitReport, equation: str) -> None:
    where = f"{report.kind} fit ({equation}) on {profile.path}"
    if report.n_points < MIN_POINTS:
        warnings.warn(
            f"{where} rests on {report.n_points} points (< {MIN_POINTS}): its R² and errors "
            "mean little; profile more points",
            FitQualityWarning,
            stacklevel=4,
        )
    if not report.r2 >= MIN_R2:
        warnings.warn(
            f"{where}: R² = {report.r2:.3f} < {MIN_R2} (MAPE {report.mape:.1f}%): the model "
            "does not describe these measurements well; check the profile for outliers or "
            "mixed sources, or restrict it to the range you plan for",
            FitQualityWarning,
            stacklevel=4,
        )
