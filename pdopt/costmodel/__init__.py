"""Latency models fitted from profiles: prefill, TTFT, decode, hybrid; their fit reports."""

from pdopt.costmodel._fit import (
    PEAK_TOP_N,
    fit_cost_model,
    fit_decode,
    fit_hybrid,
    fit_prefill,
    fit_ttft,
    gemm_peak_flops,
    transfer_error,
    transfer_prefill,
)
from pdopt.costmodel._hybrid import HybridModel, fused_iteration_s
from pdopt.costmodel._models import CostModel, DecodeModel, PrefillModel, TtftModel
from pdopt.costmodel._overhead import VLLM_V1_OVERHEAD, ServerOverhead
from pdopt.costmodel._published import (
    PublishedParameters,
    published_cost_model,
    read_parameter_file,
    write_parameter_file,
)
from pdopt.costmodel._report import (
    BATCH_REGION_EDGES,
    MIN_POINTS,
    MIN_R2,
    FitReport,
    error_by_batch_region,
)
from pdopt.costmodel._roofline import roofline_cost_model

__all__ = [
    "BATCH_REGION_EDGES",
    "MIN_POINTS",
    "MIN_R2",
    "PEAK_TOP_N",
    "VLLM_V1_OVERHEAD",
    "CostModel",
    "DecodeModel",
    "FitReport",
    "HybridModel",
    "PrefillModel",
    "PublishedParameters",
    "ServerOverhead",
    "TtftModel",
    "error_by_batch_region",
    "fit_cost_model",
    "fit_decode",
    "fit_hybrid",
    "fit_prefill",
    "fit_ttft",
    "fused_iteration_s",
    "gemm_peak_flops",
    "published_cost_model",
    "read_parameter_file",
    "roofline_cost_model",
    "transfer_error",
    "transfer_prefill",
    "write_parameter_file",
]
