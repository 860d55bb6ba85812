"""What follows from a model's shape: parameters, weight and KV bytes, KV capacity, FLOPs.

Counting conventions (exact, so tests can check them against published sizes):

* :func:`param_count` counts every stored parameter: the input embedding, the LM head (unless
  tied), per layer the Q/K/V/O and MLP matrices, the Q/K/V biases when the model has them
  (Qwen2/Qwen2.5), the two RMSNorm weights, and the final norm.
* FLOPs count multiply-adds as 2 FLOP. Per GPU under tensor parallelism (TP) of degree ``tp``:
  query heads and MLP columns are split ``tp`` ways, KV heads too while ``tp <= num_kv_heads``
  and replicated (one per GPU) beyond, as vLLM does. Norms, rotary embedding, activation
  functions, residual adds, biases and softmax are elementwise and left out (< 1% of the FLOPs).
* The LM head runs for the tokens that produce logits: one per request in prefill (the last
  position), one per request per decode step. The embedding lookup is a gather, 0 FLOP.
* Bytes count HBM traffic that cannot be avoided: every weight read once per forward pass, KV
  written for new tokens and read for context tokens. Activations are left out (they stay in
  cache or are small next to the weights for decode; prefill is compute-bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdopt._validation import (
    check_fraction,
    check_int_at_least,
    check_non_negative,
    param_error,
)
from pdopt.errors import ConfigError
from pdopt.hardware._gpu import GpuSpec
from pdopt.model_spec._model import ModelSpec

DEFAULT_RESERVE_BYTES: float = float(2**30)
"""Memory kept back from the KV cache for activations, CUDA graphs and allocator slack (1 GiB).

An assumption: vLLM measures this in a profiling run; for 7-8B models at 8192 batched tokens
the peak activation memory is of this order. Pass your own ``reserve_bytes`` when you know it.
"""


@dataclass(frozen=True, slots=True)
class OpCost:
    """FLOPs and HBM bytes of one forward pass on one GPU, split by where they come from.

    ``gemm_flops`` are the layers' weight GEMMs, ``attention_flops`` the QKᵀ and AV products,
    ``lm_head_flops`` the logits GEMM. ``weight_bytes`` are the weights read, ``kv_bytes`` the
    KV cache written (new tokens) and read (context tokens).
    """

    gemm_flops: float
    attention_flops: float
    lm_head_flops: float
    weight_bytes: float
    kv_bytes: float

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.attention_flops + self.lm_head_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes


def _check_tp(model: ModelSpec, tp: int, owner: str) -> int:
    tp = check_int_at_least(tp, 1, "tp", owner)
    kv_ok = model.num_kv_heads % tp == 0 or tp % model.num_kv_heads == 0
    if model.num_heads % tp != 0 or not kv_ok:
        rule = (
            f"a divisor of num_heads={model.num_heads} that divides or is a multiple of "
            f"num_kv_heads={model.num_kv_heads} ({model.name})"
        )
        raise param_error("tp", owner, rule, tp)
    return tp


def _kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    # Beyond tp = num_kv_heads each GPU keeps one replicated KV head (vLLM's rule).
    return max(1, model.num_kv_heads // tp)


def _layer_matrix_params(model: ModelSpec, tp: int = 1) -> float:
    """Weights of one layer's GEMMs held on one GPU (Q, K, V, O and the MLP matrices)."""
    q_heads = model.num_heads // tp
    kv_heads = _kv_heads_per_gpu(model, tp)
    attention = model.hidden_size * model.head_dim * (2 * q_heads + 2 * kv_heads)
    mlp_matrices = 3 if model.gated_mlp else 2
    mlp = mlp_matrices * model.hidden_size * model.intermediate_size / tp
    return attention + mlp


def param_count(model: ModelSpec) -> int:
    """Every stored parameter of ``model`` (embeddings, LM head unless tied, norms, QKV biases).

    Examples
    --------
    >>> from pdopt.model_spec import get_model
    >>> param_count(get_model("Llama-2-7B"))
    6738415616
    """
    hidden = model.hidden_size
    embeddings = model.vocab_size * hidden * (1 if model.tied_embeddings else 2)
    biases = model.head_dim * (model.num_heads + 2 * model.num_kv_heads) if model.qkv_bias else 0
    per_layer = int(_layer_matrix_params(model)) + biases + 2 * hidden
    return embeddings + model.num_layers * per_layer + hidden


def gemm_param_count(model: ModelSpec, tp: int = 1) -> float:
    """Weights multiplied per token in the layers (no embeddings, norms or biases), per GPU.

    ``2 · gemm_param_count`` is the linear FLOP per prefill token (the β term).
    """
    tp = _check_tp(model, tp, "gemm_param_count")
    return model.num_layers * _layer_matrix_params(model, tp)


def weight_bytes(model: ModelSpec, tp: int = 1) -> float:
    """Weight bytes held by one GPU: ``param_count · dtype_bytes / tp``.

    Norm weights, replicated on every GPU, are counted once (they are < 0.01% of the total).
    """
    tp = _check_tp(model, tp, "weight_bytes")
    return param_count(model) * model.dtype_bytes / tp


def kv_bytes_per_token(model: ModelSpec, tp: int = 1) -> int:
    """KV bytes per token held by one GPU: ``2 · layers · kv_heads_per_gpu · head_dim · dtype``.

    At ``tp=1`` this is :attr:`ModelSpec.kv_bytes_per_token` (DESIGN.md).
    """
    tp = _check_tp(model, tp, "kv_bytes_per_token")
    kv_heads = _kv_heads_per_gpu(model, tp)
    return 2 * model.num_layers * kv_heads * model.head_dim * model.dtype_bytes


def kv_capacity_tokens(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int = 1,
    memory_utilization: float = 0.9,
    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
) -> int:
    """Tokens of KV cache one TP instance holds (each GPU holding its share of every token).

    ``floor((memory · memory_utilization − weight_bytes(model, tp) − reserve_bytes) /
    kv_bytes_per_token(model, tp))`` (DESIGN.md "Cost model").

    Raises
    ------
    ConfigError
        When the weights (plus reserve) do not fit in the usable memory of one GPU.
    """
    owner = "kv_capacity_tokens"
    check_fraction(memory_utilization, "memory_utilization", owner)
    check_non_negative(reserve_bytes, "reserve_bytes", owner)
    usable = gpu.memory_bytes * memory_utilization
    weights = weight_bytes(model, tp)
    free = usable - weights - reserve_bytes
    per_token = kv_bytes_per_token(model, tp)
    if free < per_token:
        raise ConfigError(
            f"{model.name} at tp={tp} does not fit on {gpu.name}: weights need "
            f"{weights / 2**30:.2f} GiB per GPU and the reserve {reserve_bytes / 2**30:.2f} GiB, "
            f"but only {usable / 2**30:.2f} GiB is usable (memory_utilization="
            f"{memory_utilization}); no room is left for KV. Raise tp or use a larger GPU."
        )
    return int(free // per_token)


def kv_capacity_blocks(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int = 1,
    memory_utilization: float = 0.9,
    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
    block_tokens: int = 16,
) -> int:
    """Whole KV blocks of ``block_tokens`` tokens one TP instance holds (see
    :func:`kv_capacity_tokens`)."""
    block_tokens = check_int_at_least(block_tokens, 1, "block_tokens", "kv_capacity_blocks")
    tokens = kv_capacity_tokens(gpu, model, tp, memory_utilization, reserve_bytes)
    return tokens // block_tokens


def prefill_flop_coefficients(model: ModelSpec, tp: int = 1) -> tuple[float, float]:
    """``(alpha, beta)`` with prefill FLOPs of one request = ``alpha·l² + beta·l`` (+ LM head).

    Causal attention: query i (1-based) attends to i keys, so QKᵀ and AV cost
    ``4·head_dim·heads·layers · l(l+1)/2``; hence ``alpha = 2·head_dim·heads_per_gpu·layers`` and
    ``beta = 2·gemm_param_count + alpha`` (the linear GEMMs plus attention's linear term).
    These are the roofline counterparts of Phasor's α and β (DESIGN.md "Cost model").
    """
    tp = _check_tp(model, tp, "prefill_flop_coefficients")
    alpha = 2.0 * model.head_dim * (model.num_heads // tp) * model.num_layers
    beta = 2.0 * gemm_param_count(model, tp) + alpha
    return alpha, beta


def _lm_head_params(model: ModelSpec, tp: int) -> float:
    return model.vocab_size * model.hidden_size / tp


def prefill_cost(model: ModelSpec, input_tokens: float, batch_size: int = 1, tp: int = 1) -> OpCost:
    """FLOPs and bytes of prefilling ``batch_size`` requests of ``input_tokens`` each, per GPU."""
    tp = _check_tp(model, tp, "prefill_cost")
    tokens = batch_size * input_tokens
    alpha, _ = prefill_flop_coefficients(model, tp)
    gemm = 2.0 * gemm_param_count(model, tp) * tokens
    attention = batch_size * alpha * (input_tokens**2 + input_tokens)
    lm_head = 2.0 * _lm_head_params(model, tp) * batch_size
    weights = (gemm_param_count(model, tp) + _lm_head_params(model, tp)) * model.dtype_bytes
    kv = kv_bytes_per_token(model, tp) * tokens
    return OpCost(gemm, attention, lm_head, weights, kv)


def prefill_flops(model: ModelSpec, input_tokens: float, batch_size: int = 1, tp: int = 1) -> float:
    """Prefill FLOPs per GPU: ``B·(alpha·l² + beta·l) + B·2·vocab·hidden/tp`` (LM head once per
    request); see :func:`prefill_flop_coefficients`."""
    return prefill_cost(model, input_tokens, batch_size, tp).flops


def prefill_bytes(model: ModelSpec, input_tokens: float, batch_size: int = 1, tp: int = 1) -> float:
    """Prefill HBM bytes per GPU: weights once plus the KV written for ``B·l`` tokens."""
    return prefill_cost(model, input_tokens, batch_size, tp).bytes


def decode_step_cost(
    model: ModelSpec, batch_size: int, total_context_tokens: float, tp: int = 1
) -> OpCost:
    """FLOPs and bytes of one decode iteration of ``batch_size`` requests holding
    ``total_context_tokens`` (the C of τ(B, C)) in all, per GPU.

    GEMMs ``2·gemm_params·B``; attention ``4·head_dim·heads·layers·C``; LM head
    ``2·vocab·hidden·B``; bytes: all layer and LM-head weights, the KV of the C context tokens
    read and of the B new tokens written.
    """
    tp = _check_tp(model, tp, "decode_step_cost")
    gemm = 2.0 * gemm_param_count(model, tp) * batch_size
    heads = model.num_heads // tp
    attention = 4.0 * model.head_dim * heads * model.num_layers * total_context_tokens
    lm_head = 2.0 * _lm_head_params(model, tp) * batch_size
    weights = (gemm_param_count(model, tp) + _lm_head_params(model, tp)) * model.dtype_bytes
    kv = kv_bytes_per_token(model, tp) * (total_context_tokens + batch_size)
    return OpCost(gemm, attention, lm_head, weights, kv)


def decode_step_flops(
    model: ModelSpec, batch_size: int, total_context_tokens: float, tp: int = 1
) -> float:
    """Decode-iteration FLOPs per GPU (see :func:`decode_step_cost`)."""
    return decode_step_cost(model, batch_size, total_context_tokens, tp).flops


def decode_step_bytes(
    model: ModelSpec, batch_size: int, total_context_tokens: float, tp: int = 1
) -> float:
    """Decode-iteration HBM bytes per GPU (see :func:`decode_step_cost`)."""
    return decode_step_cost(model, batch_size, total_context_tokens, tp).bytes
