"""Model configurations and derived sizes (parameters, KV bytes per token, FLOPs)."""

from pdopt.model_spec._catalog import MODELS, get_model, profiled_model, with_precision
from pdopt.model_spec._coverage import expert_coverage
from pdopt.model_spec._derived import (
    OpCost,
    decode_step_bytes,
    decode_step_cost,
    decode_step_flops,
    kv_bytes_per_token,
    prefill_bytes,
    prefill_cost,
    prefill_flop_coefficients,
    prefill_flops,
)
from pdopt.model_spec._kv import (
    DEFAULT_BATCHED_TOKENS,
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_MAX_SEQS,
    DEFAULT_MEMORY_UTILIZATION,
    KvCapacity,
    activation_peak_bytes,
    kv_capacity,
    kv_capacity_blocks,
    kv_capacity_tokens,
)
from pdopt.model_spec._model import DTYPE_BYTES, ModelSpec, SlidingWindow
from pdopt.model_spec._params import (
    active_param_count,
    expected_experts_touched,
    gemm_param_count,
    param_count,
    weight_bytes,
)

from_hf_config = ModelSpec.from_hf_config
"""A :class:`ModelSpec` from a Hugging Face ``config.json``: :meth:`ModelSpec.from_hf_config`."""

__all__ = [
    "DEFAULT_BATCHED_TOKENS",
    "DEFAULT_BLOCK_TOKENS",
    "DEFAULT_MAX_SEQS",
    "DEFAULT_MEMORY_UTILIZATION",
    "DTYPE_BYTES",
    "MODELS",
    "KvCapacity",
    "ModelSpec",
    "OpCost",
    "SlidingWindow",
    "activation_peak_bytes",
    "active_param_count",
    "decode_step_bytes",
    "decode_step_cost",
    "decode_step_flops",
    "expected_experts_touched",
    "expert_coverage",
    "from_hf_config",
    "gemm_param_count",
    "get_model",
    "kv_bytes_per_token",
    "kv_capacity",
    "kv_capacity_blocks",
    "kv_capacity_tokens",
    "param_count",
    "prefill_bytes",
    "prefill_cost",
    "prefill_flop_coefficients",
    "prefill_flops",
    "profiled_model",
    "weight_bytes",
    "with_precision",
]
