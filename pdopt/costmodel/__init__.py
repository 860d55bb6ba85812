"""Latency models fitted from profiles: prefill, TTFT, decode; their fit reports."""

from pdopt.costmodel._fit import (
    PEAK_TOP_N,
    fit_cost_model,
    fit_decode,
    fit_prefill,
    fit_ttft,
    gemm_peak_flops,
    transfer_error,
    transfer_prefill,
)
from pdopt.costmodel._models import CostModel, DecodeModel, PrefillModel, TtftModel
from pdopt.costmodel._report import MIN_POINTS, MIN_R2, FitReport

__all__ = [
    "MIN_POINTS",
    "MIN_R2",
    "PEAK_TOP_N",
    "CostModel",
    "DecodeModel",
    "FitReport",
    "PrefillModel",
    "TtftModel",
    "fit_cost_model",
    "fit_decode",
    "fit_prefill",
    "fit_ttft",
    "gemm_peak_flops",
    "transfer_error",
    "transfer_prefill",
]
