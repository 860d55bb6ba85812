"""What follows from a model's shape: KV bytes, FLOPs and bytes of a forward pass.

Parameter counts and weight bytes live in :mod:`pdopt.model_spec._params` (conventions there),
KV capacity in :mod:`pdopt.model_spec._kv`.

* FLOPs count multiply-adds as 2 FLOP. Per GPU under tensor parallelism (TP) of degree ``tp``:
  query heads and MLP columns are split ``tp`` ways, KV heads too while ``tp <= num_kv_heads``
  and replicated (one per GPU) beyond, as vLLM does. Norms, rotary embedding, activation
  functions, residual adds, biases and softmax are elementwise and left out (< 1% of the FLOPs).
* MoE: the GEMM FLOPs are those of the active parameters (router, shared experts and
  ``experts_per_token`` routed experts per MoE layer); the weight bytes read are those of the
  experts the batch touches (:func:`pdopt.model_spec.expected_experts_touched`); memory holds all.
* MLA: the KV cache holds the latent and rotary key (``kv_lora_rank + qk_rope_head_dim`` values
  per token and layer), replicated on every TP rank (vLLM); prefill attention runs per head on
  the decompressed keys and values (``qk + v`` head widths), decode attention on the latent with
  the up-projections absorbed (DeepSeek-V2 §2.1.2): ``2·kv_lora_rank + rope`` per head.
* The LM head runs for the tokens that produce logits: one per request in prefill (the last
  position), one per request per decode step. The embedding lookup is a gather, 0 FLOP.
* Bytes count HBM traffic that cannot be avoided: every weight read once per forward pass, KV
  written for new tokens and read for context tokens, each in its own dtype (weights: ``dtype``,
  routed experts: ``expert_dtype``, KV: ``kv_dtype``). Activations are left out here (they stay
  in cache or are small next to the weights for decode; prefill is compute-bound); the roofline
  prior may add them (:func:`pdopt.profile.roofline_profile`).
* Sliding-window layers (:attr:`ModelSpec.sliding_window_tokens`): in prefill, query ``i`` of a
  sliding layer attends to ``min(i, W)`` keys, and every prompt token's KV is still written
  (vLLM writes a chunk's KV before freeing what left the window); in decode a request with
  ``L`` context tokens reads :meth:`ModelSpec.kv_context_tokens` ``(L)`` tokens' worth of KV and
  attends over as many, the batch's requests taken at the same context ``C / B``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdopt.model_spec._model import ModelSpec
from pdopt.model_spec._params import (
    check_tp,
    gemm_param_count,
    kv_heads_per_gpu,
    layer_weight_bytes_read,
    query_heads_per_gpu,
)


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


def kv_bytes_per_token(model: ModelSpec, tp: int = 1) -> int:
    """KV bytes per token held by one GPU: ``2 · layers · kv_heads_per_gpu · head_dim ·
    kv_dtype_bytes``; for MLA ``layers · (kv_lora_rank + qk_rope_head_dim) · kv_dtype_bytes``,
    the latent replicated on every TP rank. With sliding-window layers, a token held in every
    layer (the per-token maximum); a request of ``L`` tokens holds this times
    :meth:`ModelSpec.kv_context_tokens` ``(L)``.

    At ``tp=1`` this is :attr:`ModelSpec.kv_bytes_per_token` (DESIGN.md).
    """
    tp = check_tp(model, tp, "kv_bytes_per_token")
    if model.is_mla:
        return model.kv_bytes_per_token
    values = 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim
    return round(values * model.kv_dtype_bytes)


def prefill_flop_coefficients(model: ModelSpec, tp: int = 1) -> tuple[float, float]:
    """``(alpha, beta)`` with prefill FLOPs of one request = ``alpha·l² + beta·l`` (+ LM head).

    Causal attention: query i (1-based) attends to i keys, so QKᵀ and AV cost
    ``4·head_dim·heads·layers · l(l+1)/2``; hence ``alpha = 2·head_dim·heads_per_gpu·layers`` and
    ``beta = 2·gemm_param_count + alpha`` (the linear GEMMs plus attention's linear term). With a
    value head width of its own (MLA), ``2·head_dim`` reads ``head_dim + v_head_dim``.
    These are the roofline counterparts of Phasor's α and β (DESIGN.md "Cost model").

    Sliding windows (``S`` of ``N`` layers keep ``W`` tokens, ``F = N − S`` full; ``a`` =
    ``alpha / N``, one layer's coefficient): a sliding layer's query i attends to ``min(i, W)``
    keys, so for ``l >= W`` its attention ``a·(2W − 1)·l − a·W(W − 1)`` is linear in ``l``, and
    the exact attention FLOPs (:func:`prefill_cost`) are::

        a·F·l² + a·(N + S·(2W − 1))·l − a·S·W(W − 1)        (l >= W)
        a·N·(l² + l)                                        (l <= W)

    The coefficients are the long-prompt form: ``alpha = a·F``, ``beta = 2·gemm_param_count +
    a·(N + S·(2W − 1))``. For ``l >= W`` they overstate the exact FLOPs by the constant
    ``a·S·W(W − 1)`` only, for ``l < W`` by ``a·S·l·(2W − 1 − l)``, never more than that constant
    (gpt-oss-120b at tp=1: 2.4 GFLOP per request, of the layers' GEMM and attention FLOPs
    0.41% at ``l = 1``, 0.20% at 128, 0.003% at 8192). Counting every layer as full attention
    (the upper bound these coefficients were before) overstates them by 1.2% at ``l = 1024``,
    11.3% at 8192 and 34% at 32768.
    """
    tp = check_tp(model, tp, "prefill_flop_coefficients")
    if model.has_sliding_window:
        per_layer = _prefill_attention_per_layer(model, tp)
        sliding, window = model.sliding_window_layers, model.sliding_window_tokens or 0
        alpha = per_layer * (model.num_layers - sliding)
        linear = per_layer * (model.num_layers + sliding * (2 * window - 1))
        return alpha, 2.0 * gemm_param_count(model, tp) + linear
    alpha = _prefill_attention_per_layer(model, tp) * model.num_layers
    beta = 2.0 * gemm_param_count(model, tp) + alpha
    return alpha, beta


def _prefill_attention_per_layer(model: ModelSpec, tp: int) -> float:
    """One layer's ``alpha``: ``(head_dim + v_head_dim) · heads_per_gpu`` FLOPs per ``l² + l``
    (half of the ``2·(qk + v)·heads`` FLOPs per query-key pair, the causal sum's ``1/2``)."""
    return float(model.head_dim + model.v_head_dim) * query_heads_per_gpu(model, tp)


def _lm_head_params(model: ModelSpec, tp: int) -> float:
    return model.vocab_size * model.hidden_size / tp


def _weights_read_bytes(model: ModelSpec, tp: int, tokens: float) -> float:
    """Layer and LM-head weight bytes a forward pass over ``tokens`` tokens reads on one GPU."""
    lm_head = _lm_head_params(model, tp)
    if not model.is_moe:
        return (gemm_param_count(model, tp) + lm_head) * model.dtype_bytes
    return layer_weight_bytes_read(model, tp, tokens) + lm_head * model.dtype_bytes


def _decode_attention_flops_per_token(model: ModelSpec, tp: int) -> float:
    """Attention FLOPs per context token per decode query, all layers, one GPU: ``2·heads·(qk +
    v)`` per layer, or with MLA's absorbed up-projections ``2·heads·(2·kv_lora_rank + rope)``."""
    heads = query_heads_per_gpu(model, tp)
    if model.is_mla:
        width = 2 * model.kv_lora_rank + model.qk_rope_head_dim
        return 2.0 * width * heads * model.num_layers
    return 2.0 * (model.head_dim + model.v_head_dim) * heads * model.num_layers


def _window_saved_keys(model: ModelSpec, input_tokens: float) -> float:
    """Key positions the sliding layers of a causal prefill of ``l`` tokens skip, all such
    layers: ``S · (l(l+1)/2 − Σ_{i<=l} min(i, W))`` = ``S · (l − W)(l − W + 1)/2`` for ``l > W``
    (0 without windows, or for ``l <= W``)."""
    window = model.sliding_window_tokens
    if window is None or input_tokens <= window:
        return 0.0
    beyond = input_tokens - window
    return model.sliding_window_layers * beyond * (beyond + 1) / 2.0


def _decode_context_tokens(model: ModelSpec, batch_size: int, total_context_tokens: float) -> float:
    """The context decode attention reads: ``C``, or with sliding windows ``B ·
    kv_context_tokens(C / B)`` (each of the ``B`` requests at the mean context)."""
    if not model.has_sliding_window or batch_size < 1:
        return total_context_tokens
    return batch_size * float(model.kv_context_tokens(total_context_tokens / batch_size))


def prefill_cost(model: ModelSpec, input_tokens: float, batch_size: int = 1, tp: int = 1) -> OpCost:
    """FLOPs and bytes of prefilling ``batch_size`` requests of ``input_tokens`` each, per GPU.

    Attention is ``B · a·N · (l² + l)`` (``a`` one layer's ``alpha``,
    :func:`prefill_flop_coefficients`) less, with sliding windows, ``2·a`` per key position the
    window skips (exact; the coefficients' long-prompt form approximates it).
    """
    tp = check_tp(model, tp, "prefill_cost")
    tokens = batch_size * input_tokens
    per_layer = _prefill_attention_per_layer(model, tp)
    gemm = 2.0 * gemm_param_count(model, tp) * tokens
    every_layer = per_layer * model.num_layers
    attention = batch_size * every_layer * (input_tokens**2 + input_tokens)
    if model.has_sliding_window:
        attention -= batch_size * 2.0 * per_layer * _window_saved_keys(model, input_tokens)
    lm_head = 2.0 * _lm_head_params(model, tp) * batch_size
    weights = _weights_read_bytes(model, tp, tokens)
    kv = kv_bytes_per_token(model, tp) * tokens
    return OpCost(gemm, attention, lm_head, weights, kv)


def prefill_flops(model: ModelSpec, input_tokens: float, batch_size: int = 1, tp: int = 1) -> float:
    """Prefill FLOPs per GPU: ``B·(alpha·l² + beta·l) + B·2·vocab·hidden/tp`` (LM head once per
    request); see :func:`prefill_flop_coefficients` (with sliding windows exact attention,
    which the coefficients approximate)."""
    return prefill_cost(model, input_tokens, batch_size, tp).flops


def prefill_bytes(model: ModelSpec, input_tokens: float, batch_size: int = 1, tp: int = 1) -> float:
    """Prefill HBM bytes per GPU: weights once plus the KV written for ``B·l`` tokens."""
    return prefill_cost(model, input_tokens, batch_size, tp).bytes


def decode_step_cost(
    model: ModelSpec, batch_size: int, total_context_tokens: float, tp: int = 1
) -> OpCost:
    """FLOPs and bytes of one decode iteration of ``batch_size`` requests holding
    ``total_context_tokens`` (the C of τ(B, C)) in all, per GPU.

    GEMMs ``2·gemm_params·B``; attention ``4·head_dim·heads·layers·C`` (MLA: see
    :func:`_decode_attention_flops_per_token`); LM head ``2·vocab·hidden·B``; bytes: all layer
    weights (MoE: the experts the B tokens touch) and the LM head, the KV of the C context tokens
    read and of the B new tokens written. With sliding windows ``C`` reads ``B ·
    kv_context_tokens(C / B)`` in the attention FLOPs and KV bytes (module docstring).
    """
    tp = check_tp(model, tp, "decode_step_cost")
    context = _decode_context_tokens(model, batch_size, total_context_tokens)
    gemm = 2.0 * gemm_param_count(model, tp) * batch_size
    attention = _decode_attention_flops_per_token(model, tp) * context
    lm_head = 2.0 * _lm_head_params(model, tp) * batch_size
    weights = _weights_read_bytes(model, tp, batch_size)
    kv = kv_bytes_per_token(model, tp) * (context + batch_size)
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
