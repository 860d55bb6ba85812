"""Model configurations and derived sizes (parameters, KV bytes per token, FLOPs)."""

from pdopt.model_spec._catalog import MODELS, get_model
from pdopt.model_spec._derived import (
    DEFAULT_RESERVE_BYTES,
    OpCost,
    decode_step_bytes,
    decode_step_cost,
    decode_step_flops,
    gemm_param_count,
    kv_bytes_per_token,
    kv_capacity_blocks,
    kv_capacity_tokens,
    param_count,
    prefill_bytes,
    prefill_cost,
    prefill_flop_coefficients,
    prefill_flops,
    weight_bytes,
)
from pdopt.model_spec._model import DTYPE_BYTES, ModelSpec

__all__ = [
    "DEFAULT_RESERVE_BYTES",
    "DTYPE_BYTES",
    "MODELS",
    "ModelSpec",
    "OpCost",
    "decode_step_bytes",
    "decode_step_cost",
    "decode_step_flops",
    "gemm_param_count",
    "get_model",
    "kv_bytes_per_token",
    "kv_capacity_blocks",
    "kv_capacity_tokens",
    "param_count",
    "prefill_bytes",
    "prefill_cost",
    "prefill_flop_coefficients",
    "prefill_flops",
    "weight_bytes",
]
