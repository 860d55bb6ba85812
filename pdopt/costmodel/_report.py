"""Fit reports: goodness of fit of a latency model against the measurements it was fitted on.

Every ``fit_*`` function of :mod:`pdopt.costmodel` returns its model and a :class:`FitReport`.
Errors are taken in latency space (seconds), whatever space the fit itself solved in.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

FloatArray = npt.NDArray[np.float64]

MIN_R2 = 0.95
"""Below this R² a fit raises :class:`~pdopt.errors.FitQualityWarning`."""

MIN_POINTS = 5
"""With fewer points than this a fit raises :class:`~pdopt.errors.FitQualityWarning`."""

CV_FOLDS = 5
"""Folds of the cross-validated MAPE (fewer when there are fewer points)."""

CV_SEED = 0
"""Seed of the fold assignment, so the same profile always gives the same CV MAPE."""

BATCH_REGION_EDGES: tuple[float, ...] = (0.0, 8.0, 32.0, 128.0, float("inf"))
"""Edges of the batch-size regions of :func:`error_by_batch_region`: B in (0, 8], (8, 32],
(32, 128], above 128. Small batches stream weights, large ones approach the compute roof, so a
decode form's error is read per region, not only on average (issue 18, item 5)."""


@dataclass(frozen=True, slots=True, eq=False)
class FitReport:
    """How well a fitted latency model reproduces the measurements.

    Attributes
    ----------
    kind : str
        Which model: ``"prefill"``, ``"ttft"``, ``"decode"``, ``"hybrid"`` or
        ``"prefill-transfer"`` (a model fitted elsewhere, evaluated on these measurements without
        refitting).
    n_points : int
        Measurements compared.
    r2 : float
        Coefficient of determination ``1 − SS_res / SS_tot`` of latency; may be negative for a
        transferred model. NaN when every measurement is equal (SS_tot = 0).
    mape : float
        Mean absolute percentage error of latency, **in percent** (5.0 means 5 %).
    cv_mape : float
        The same, out of sample: k-fold cross-validation (k = min(5, n_points), folds drawn with a
        fixed seed), each point predicted by the model refitted without its fold; percent. NaN
        when a fold would leave fewer training points than parameters, or for a transfer.
    max_abs_pct_error : float
        Largest absolute percentage error, percent.
    residuals : ndarray of float, shape (n_points,)
        ``measured − predicted`` latency, seconds, in the profile's row order.
    measured_s, predicted_s : ndarray of float, shape (n_points,)
        The measured and predicted latencies, seconds.
    """

    kind: str
    n_points: int
    r2: float
    mape: float
    cv_mape: float
    max_abs_pct_error: float
    residuals: FloatArray
    measured_s: FloatArray
    predicted_s: FloatArray
    by_batch_region: pd.DataFrame | None = None

    @classmethod
    def from_predictions(
        cls,
        kind: str,
        measured_s: FloatArray,
        predicted_s: FloatArray,
        cv_abs_pct: FloatArray | float,
        batch_size: FloatArray | None = None,
    ) -> FitReport:
        """The report of ``predicted_s`` against ``measured_s`` (both seconds, > 0 measured).

        ``cv_abs_pct`` is each point's cross-validated absolute error in percent
        (:func:`cross_validated_abs_pct`), or one NaN when there is none; with ``batch_size``
        (one per point) the report holds the error per batch-size region.
        """
        measured = np.asarray(measured_s, dtype=np.float64)
        predicted = np.asarray(predicted_s, dtype=np.float64)
        cv_pct = np.broadcast_to(np.asarray(cv_abs_pct, dtype=np.float64), measured.shape)
        residuals = measured - predicted
        pct = 100.0 * np.abs(residuals) / measured
        regions = None
        if batch_size is not None:
            regions = error_by_batch_region(measured, predicted, batch_size, cv_pct)
        return cls(
            kind=kind,
            n_points=int(measured.size),
            r2=r_squared(measured, predicted),
            mape=float(np.mean(pct)),
            cv_mape=float(np.mean(cv_pct)),
            max_abs_pct_error=float(np.max(pct)),
            residuals=residuals,
            measured_s=measured,
            predicted_s=predicted,
            by_batch_region=regions,
        )

    def to_dict(self, *, residuals: bool = True) -> dict[str, Any]:
        """Plain values (NaN kept as float NaN); the arrays as lists unless ``residuals=False``;
        ``by_batch_region`` as a list of records (the open last region's ``b_high`` None)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "n_points": self.n_points,
            "r2": self.r2,
            "mape_pct": self.mape,
            "cv_mape_pct": self.cv_mape,
            "max_abs_pct_error": self.max_abs_pct_error,
        }
        if self.by_batch_region is not None:
            records = self.by_batch_region.to_dict(orient="records")
            for record in records:  # the open last region: no upper edge (JSON has no inf)
                record["b_high"] = None if math.isinf(record["b_high"]) else record["b_high"]
            out["by_batch_region"] = records
        if residuals:
            out["residuals_s"] = self.residuals.tolist()
        return out

    def as_frame(self) -> pd.DataFrame:
        """One row per point: measured_s, predicted_s, residual_s, pct_error (signed, percent)."""
        return pd.DataFrame(
            {
                "measured_s": self.measured_s,
                "predicted_s": self.predicted_s,
                "residual_s": self.residuals,
                "pct_error": 100.0 * self.residuals / self.measured_s,
            }
        )


def r_squared(measured: FloatArray, predicted: FloatArray) -> float:
    """``1 − Σ(y − ŷ)² / Σ(y − ȳ)²``; NaN when all ``y`` are equal."""
    total = float(np.sum((measured - np.mean(measured)) ** 2))
    if total == 0.0:
        return float("nan")
    return 1.0 - float(np.sum((measured - predicted) ** 2)) / total


Solver = Callable[[FloatArray, FloatArray], FloatArray]


def cross_validated_abs_pct(design: FloatArray, target_s: FloatArray, solve: Solver) -> FloatArray:
    """Each point's k-fold cross-validated absolute error (percent) of ``target ≈ design @ coef``.

    ``solve(design_train, target_train)`` returns the coefficients. k = min(:data:`CV_FOLDS`, n),
    folds drawn with :data:`CV_SEED`; each point is predicted by the model refitted without its
    fold. All NaN when a training set would hold fewer rows than ``design`` has columns.
    """
    n, p = design.shape
    folds = min(CV_FOLDS, n)
    pct = np.full(n, np.nan, dtype=np.float64)
    if folds < 2 or n - int(np.ceil(n / folds)) < p:
        return pct
    assignment = np.random.default_rng(CV_SEED).permutation(n) % folds
    for fold in range(folds):
        test = assignment == fold
        coef = solve(design[~test], target_s[~test])
        predicted = design[test] @ coef
        pct[test] = 100.0 * np.abs(target_s[test] - predicted) / target_s[test]
    return pct


def error_by_batch_region(
    measured_s: FloatArray,
    predicted_s: FloatArray,
    batch_size: FloatArray,
    cv_abs_pct: FloatArray | None = None,
    edges: tuple[float, ...] = BATCH_REGION_EDGES,
) -> pd.DataFrame:
    """A latency model's error per batch-size region, one row per region holding points.

    Region ``i`` holds the points with ``edges[i] < B <= edges[i + 1]``. With the signed error
    ``e = 100·(predicted − measured) / measured`` (percent; positive: the model is slower than
    the measurement), the columns are ``region`` (e.g. ``"9-32"``, ``">128"``), ``b_low`` and
    ``b_high`` (the edges), ``n_points``, ``bias_pct`` (mean e), ``mape_pct`` (mean |e|),
    ``max_abs_pct_error`` (max |e|) and ``cv_mape_pct`` (mean of ``cv_abs_pct`` over the
    region; NaN when not given).

    Parameters
    ----------
    measured_s, predicted_s : ndarray of float, shape (n,)
        Latencies, seconds (measured > 0).
    batch_size : ndarray of float, shape (n,)
        Each point's batch size B.
    cv_abs_pct : ndarray of float, shape (n,), optional
        Each point's cross-validated absolute error, percent (:func:`cross_validated_abs_pct`).
    edges : tuple of float
        Increasing region edges; :data:`BATCH_REGION_EDGES` by default.
    """
    measured = np.asarray(measured_s, dtype=np.float64)
    signed = 100.0 * (np.asarray(predicted_s, dtype=np.float64) - measured) / measured
    batch = np.asarray(batch_size, dtype=np.float64)
    cv = np.full_like(measured, np.nan) if cv_abs_pct is None else np.asarray(cv_abs_pct)
    rows: list[dict[str, Any]] = []
    for low, high in itertools.pairwise(edges):
        inside = (batch > low) & (batch <= high)
        if not inside.any():
            continue
        err = signed[inside]
        rows.append(
            {
                "region": _region_label(low, high),
                "b_low": low,
                "b_high": high,
                "n_points": int(inside.sum()),
                "bias_pct": float(np.mean(err)),
                "mape_pct": float(np.mean(np.abs(err))),
                "max_abs_pct_error": float(np.max(np.abs(err))),
                "cv_mape_pct": float(np.mean(cv[inside])),
            }
        )
    return pd.DataFrame(rows, columns=list(_REGION_COLUMNS))


_REGION_COLUMNS = (
    "region",
    "b_low",
    "b_high",
    "n_points",
    "bias_pct",
    "mape_pct",
    "max_abs_pct_error",
    "cv_mape_pct",
)


def _region_label(low: float, high: float) -> str:
    """``"1-8"`` for (0, 8], ``"9-32"`` for (8, 32] (integer batch sizes), ``">128"``."""
    if np.isinf(high):
        return f">{low:g}"
    return f"{np.floor(low) + 1:g}-{high:g}"
