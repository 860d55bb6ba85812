"""Fit reports: goodness of fit of a latency model against the measurements it was fitted on.

Every ``fit_*`` function of :mod:`pdopt.costmodel` returns its model and a :class:`FitReport`.
Errors are taken in latency space (seconds), whatever space the fit itself solved in.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True, eq=False)
class FitReport:
    """How well a fitted latency model reproduces the measurements.

    Attributes
    ----------
    kind : str
        Which model: ``"prefill"``, ``"ttft"``, ``"decode"`` or ``"prefill-transfer"`` (a model
        fitted elsewhere, evaluated on these measurements without refitting).
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

    @classmethod
    def from_predictions(
        cls, kind: str, measured_s: FloatArray, predicted_s: FloatArray, cv_mape: float
    ) -> FitReport:
        """The report of ``predicted_s`` against ``measured_s`` (both seconds, > 0 measured)."""
        measured = np.asarray(measured_s, dtype=np.float64)
        predicted = np.asarray(predicted_s, dtype=np.float64)
        residuals = measured - predicted
        pct = 100.0 * np.abs(residuals) / measured
        return cls(
            kind=kind,
            n_points=int(measured.size),
            r2=r_squared(measured, predicted),
            mape=float(np.mean(pct)),
            cv_mape=float(cv_mape),
            max_abs_pct_error=float(np.max(pct)),
            residuals=residuals,
            measured_s=measured,
            predicted_s=predicted,
        )

    def to_dict(self, *, residuals: bool = True) -> dict[str, Any]:
        """Plain values (NaN kept as float NaN); the arrays as lists unless ``residuals=False``."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "n_points": self.n_points,
            "r2": self.r2,
            "mape_pct": self.mape,
            "cv_mape_pct": self.cv_mape,
            "max_abs_pct_error": self.max_abs_pct_error,
        }
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


def cross_validated_mape(design: FloatArray, target_s: FloatArray, solve: Solver) -> float:
    """k-fold CV MAPE (percent) of the linear model ``target ≈ design @ coef``.

    ``solve(design_train, target_train)`` returns the coefficients. k = min(:data:`CV_FOLDS`, n);
    NaN when a training set would hold fewer rows than ``design`` has columns.
    """
    n, p = design.shape
    folds = min(CV_FOLDS, n)
    if folds < 2 or n - int(np.ceil(n / folds)) < p:
        return float("nan")
    assignment = np.random.default_rng(CV_SEED).permutation(n) % folds
    pct = np.empty(n, dtype=np.float64)
    for fold in range(folds):
        test = assignment == fold
        coef = solve(design[~test], target_s[~test])
        predicted = design[test] @ coef
        pct[test] = 100.0 * np.abs(target_s[test] - predicted) / target_s[test]
    return float(np.mean(pct))
