"""Parameter counts of a model: total, active per token, per-GPU GEMM weights and weight bytes.

Counting conventions (exact, so tests can check them against published sizes):

* :func:`param_count` counts every stored parameter: the input embedding, the LM head (unless
  tied), per layer the attention projections (Q/K/V/O; for MLA the low-rank Q and KV
  down/up projections and their two norms), their biases when the model has them, Qwen3's Q/K
  norms, gpt-oss's attention sinks, the dense MLP or the MoE block (router, its bias, every
  routed and shared expert, expert biases), the two RMSNorm weights, and the final norm.
* :func:`active_param_count` drops the routed experts a token does not use (``num_experts −
  experts_per_token`` per MoE layer). Publishers differ on the input embedding (a lookup, no
  multiply): Mistral (Mixtral "12.9B") and Qwen ("3.3B") count it, OpenAI (gpt-oss "5.13B")
  does not; hence ``include_embedding``.
* Under tensor parallelism (TP) of degree ``tp``, query heads and MLP/expert columns are split
  ``tp`` ways, KV heads too while ``tp <= num_kv_heads`` and replicated (one per GPU) beyond, as
  vLLM does. MLA's projections are counted split ``tp`` ways (first order: vLLM replicates its
  small down-projections).
"""

from __future__ import annotations

from pdopt._validation import check_int_at_least, param_error
from pdopt.model_spec._coverage import expert_coverage
from pdopt.model_spec._model import DTYPE_BYTES, ModelSpec


def check_tp(model: ModelSpec, tp: int, owner: str) -> int:
    """``tp`` if it divides the query heads and divides or is a multiple of the KV heads."""
    tp = check_int_at_least(tp, 1, "tp", owner)
    kv_ok = model.num_kv_heads % tp == 0 or tp % model.num_kv_heads == 0
    if model.num_heads % tp != 0 or not kv_ok:
        rule = (
            f"a divisor of num_heads={model.num_heads} that divides or is a multiple of "
            f"num_kv_heads={model.num_kv_heads} ({model.name})"
        )
        raise param_error("tp", owner, rule, tp)
    return tp


def check_expert_parallel(model: ModelSpec, tp: int, owner: str) -> int:
    """``tp`` if ``model``'s experts can be placed whole on ``tp`` GPUs (expert parallelism,
    ``moe_ep_size = tp``): an MoE model whose ``num_experts`` ``tp`` divides, so that every GPU
    holds ``num_experts / tp`` of them, as :func:`weight_bytes` and the roofline's all-to-all
    assume (and vLLM's expert map balances). More GPUs than experts would leave some without.

    Raises
    ------
    ParameterError
        When ``model`` is dense (``expert_parallel`` applies to MoE models), or ``tp`` exceeds
        or does not divide ``num_experts``.

    Examples
    --------
    >>> from pdopt.model_spec import get_model
    >>> check_expert_parallel(get_model("Mixtral-8x7B"), 8, "roofline_profile")
    8
    """
    tp = check_int_at_least(tp, 1, "tp", owner)
    if not model.is_moe:
        rule = f"False for a dense model ({model.name} is dense; it applies to MoE models)"
        raise param_error("expert_parallel", owner, rule, True)
    if model.num_experts % tp != 0:
        rule = (
            f"a divisor of num_experts={model.num_experts} with expert_parallel (each GPU holds "
            f"num_experts/tp whole experts; {model.name}): use a smaller tp or drop "
            "expert_parallel"
        )
        raise param_error("tp", owner, rule, tp)
    return tp


def query_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """Query heads one GPU holds (``tp`` divides them: :func:`check_tp`)."""
    return model.num_heads // tp


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU holds: beyond ``tp = num_kv_heads`` each keeps one replica (vLLM)."""
    return max(1, model.num_kv_heads // tp)


def attention_matrix_params(model: ModelSpec, tp: int = 1) -> float:
    """Weights of one layer's attention projections held on one GPU (no biases or norms)."""
    hidden, heads = model.hidden_size, model.num_heads
    if model.is_mla:
        rope = model.qk_rope_head_dim
        nope = model.head_dim - rope
        if model.q_lora_rank:
            query = hidden * model.q_lora_rank + model.q_lora_rank * heads * model.head_dim
        else:
            query = hidden * heads * model.head_dim
        kv_down = hidden * (model.kv_lora_rank + rope)
        kv_up = model.kv_lora_rank * heads * (nope + model.v_head_dim)
        out = heads * model.v_head_dim * hidden
        return (query + kv_down + kv_up + out) / tp
    q_heads = heads // tp
    kv_heads = kv_heads_per_gpu(model, tp)
    return float(hidden * model.head_dim * (2 * q_heads + 2 * kv_heads))


def _attention_extra_params(model: ModelSpec) -> int:
    """Biases, Q/K norms, MLA's latent norms and sinks of one layer (whole model, tp = 1)."""
    extra = 0
    if model.qkv_bias:
        extra += model.head_dim * (model.num_heads + 2 * model.num_kv_heads)
    if model.o_bias:
        extra += model.hidden_size
    if model.qk_norm:
        extra += 2 * model.head_dim
    if model.is_mla:
        extra += model.kv_lora_rank + model.q_lora_rank
    if model.attention_sinks:
        extra += model.num_heads
    return extra


def mlp_matrices(model: ModelSpec) -> int:
    return 3 if model.gated_mlp else 2


def expert_params(model: ModelSpec) -> int:
    """Matrix weights of one expert (routed or shared), whole model."""
    return mlp_matrices(model) * model.hidden_size * model.moe_intermediate_size


def _expert_bias_params(model: ModelSpec) -> int:
    if not model.expert_bias:
        return 0
    return (mlp_matrices(model) - 1) * model.moe_intermediate_size + model.hidden_size


def _router_params(model: ModelSpec) -> int:
    return model.hidden_size * model.num_experts


def dense_mlp_params(model: ModelSpec, tp: int = 1) -> float:
    """Weights of one dense (non-MoE) layer's MLP on one GPU."""
    return mlp_matrices(model) * model.hidden_size * model.intermediate_size / tp


def param_count(model: ModelSpec) -> int:
    """Every stored parameter of ``model`` (embeddings, LM head unless tied, norms, biases, every
    expert).

    Examples
    --------
    >>> from pdopt.model_spec import get_model
    >>> param_count(get_model("Llama-2-7B"))
    6738415616
    >>> param_count(get_model("DeepSeek-V3"))  # "671B" (DeepSeek-V3 report, without MTP)
    671026419200
    """
    hidden = model.hidden_size
    embeddings = embedding_params(model)
    attention = int(attention_matrix_params(model)) + _attention_extra_params(model)
    dense_layers = model.num_layers - model.moe_layers
    total = embeddings + hidden + model.num_layers * (attention + 2 * hidden)
    total += dense_layers * int(dense_mlp_params(model))
    if model.is_moe:
        experts = (model.num_experts + model.num_shared_experts) * expert_params(model)
        biases = model.num_experts * _expert_bias_params(model)
        router = _router_params(model) + (model.num_experts if model.router_bias else 0)
        total += model.moe_layers * (experts + biases + router)
    return total


def unused_expert_params(model: ModelSpec) -> int:
    """Parameters of the routed experts one token does not use, summed over the MoE layers."""
    unused = model.num_experts - model.experts_per_token
    return model.moe_layers * unused * (expert_params(model) + _expert_bias_params(model))


def active_param_count(model: ModelSpec, *, include_embedding: bool = True) -> int:
    """Parameters one token uses: :func:`param_count` less the unused routed experts, and less
    the input embedding when ``include_embedding`` is False (it is a lookup; kept when tied, as
    it is then also the LM head). Equal to :func:`param_count` for a dense model.

    Examples
    --------
    >>> from pdopt.model_spec import get_model
    >>> round(active_param_count(get_model("Mixtral-8x7B")) / 1e9, 1)  # Mistral: "12.9B"
    12.9
    """
    active = param_count(model) - unused_expert_params(model)
    if not include_embedding and not model.tied_embeddings:
        active -= model.vocab_size * model.hidden_size
    return active


def _moe_always_on_params(model: ModelSpec, tp: int) -> float:
    """Per MoE layer and GPU: the router GEMM and the shared experts."""
    return (_router_params(model) + model.num_shared_experts * expert_params(model)) / tp


def gemm_param_count(model: ModelSpec, tp: int = 1) -> float:
    """Weights multiplied per token in the layers (no embeddings, norms or biases), per GPU:
    attention and dense MLPs, and per MoE layer the router, the shared experts and
    ``experts_per_token`` routed experts. ``2 · gemm_param_count`` is the linear FLOP per token.
    """
    tp = check_tp(model, tp, "gemm_param_count")
    attention = attention_matrix_params(model, tp)
    if not model.is_moe:
        return model.num_layers * (attention + dense_mlp_params(model, tp))
    dense_layers = model.num_layers - model.moe_layers
    total = model.num_layers * attention + dense_layers * dense_mlp_params(model, tp)
    always_on = model.moe_layers * _moe_always_on_params(model, tp)
    return total + always_on + routed_expert_gemm_params(model, tp)


def routed_expert_gemm_params(model: ModelSpec, tp: int) -> float:
    """Routed-expert weights multiplied per token, all MoE layers, per GPU: ``moe_layers · k ·
    expert_params / tp`` (0 when dense); the routed part of :func:`gemm_param_count`."""
    return model.moe_layers * model.experts_per_token * expert_params(model) / tp


def routed_expert_bytes_read(model: ModelSpec, tp: int, tokens: float) -> float:
    """HBM bytes of routed-expert weights a forward pass over ``tokens`` tokens reads on one
    GPU: per MoE layer the experts the tokens touch (:func:`expected_experts_touched`), split
    ``tp`` ways, in the expert dtype (0 when dense); the routed part of
    :func:`layer_weight_bytes_read`."""
    touched = expected_experts_touched(model, tokens) * expert_params(model) / tp
    return model.moe_layers * touched * DTYPE_BYTES[model.expert_dtype]


def expected_experts_touched(model: ModelSpec, tokens: float) -> float:
    """Distinct routed experts a batch of ``tokens`` tokens uses in one MoE layer, expected:
    :func:`~pdopt.model_spec._coverage.expert_coverage` of the model's ``E`` experts and ``k``
    per token (uniform routing, first order: real routers are skewed, so fewer are touched).
    0 when dense."""
    if not model.is_moe:
        return 0.0
    return float(expert_coverage(max(tokens, 0.0), model.num_experts, model.experts_per_token))


def layer_weight_bytes_read(model: ModelSpec, tp: int, tokens: float) -> float:
    """HBM bytes of layer weights one forward pass over ``tokens`` tokens reads on one GPU: every
    non-expert GEMM weight, and per MoE layer only the experts the tokens touch
    (:func:`expected_experts_touched`), each in its stored dtype."""
    tp = check_tp(model, tp, "layer_weight_bytes_read")
    if not model.is_moe:
        return gemm_param_count(model, tp) * model.dtype_bytes
    dense_layers = model.num_layers - model.moe_layers
    always = model.num_layers * attention_matrix_params(model, tp)
    always += dense_layers * dense_mlp_params(model, tp)
    always += model.moe_layers * _moe_always_on_params(model, tp)
    return always * model.dtype_bytes + routed_expert_bytes_read(model, tp, tokens)


def embedding_params(model: ModelSpec) -> int:
    """Parameters of the input embedding and the LM head (one matrix when tied)."""
    return model.vocab_size * model.hidden_size * (1 if model.tied_embeddings else 2)


def embedding_dtype_bytes(model: ModelSpec) -> float:
    """Bytes per stored value of the input embedding and the LM head: the weight dtype's, but
    at least 2 (16-bit). Quantized checkpoints keep both unquantized: vLLM's FP8 (``fp8``,
    ``fbgemm_fp8``, compressed-tensors, ModelOpt), AWQ/GPTQ, INT8 and bitsandbytes methods
    quantize the linear layers only (``VocabParallelEmbedding`` and the LM head stay at the
    activation dtype; GPTQ's ``lm_head: true`` is the rare exception, not modelled), and
    DeepSeek-V3's FP8 checkpoint stores them in BF16. The one owner of that rule: every sum
    of embedding or LM-head weight bytes uses it.

    Examples
    --------
    >>> from pdopt.model_spec import get_model
    >>> embedding_dtype_bytes(get_model("Llama-3.1-8B@fp8")), embedding_dtype_bytes(
    ...     get_model("Llama-3.1-8B@int4"))
    (2.0, 2.0)
    """
    return max(model.dtype_bytes, 2.0)


def weight_bytes(model: ModelSpec, tp: int = 1) -> float:
    """Weight bytes held by one GPU: the input embedding and LM head at
    :func:`embedding_dtype_bytes` (16-bit for a quantized model), the routed experts at
    ``expert_dtype``, everything else at ``dtype``, all split ``tp`` ways (experts by TP or by
    expert parallelism alike)::

        (embeddings · embedding_dtype_bytes + routed · expert_dtype_bytes
         + (param_count − embeddings − routed) · dtype_bytes) / tp

    Norm weights, replicated on every GPU, are counted once (they are < 0.01% of the total).

    Examples
    --------
    >>> from pdopt.model_spec import get_model
    >>> round(weight_bytes(get_model("Llama-3.1-8B@fp8")) / 1e9, 2)  # 1.05 GB of BF16 embeddings
    9.08
    """
    tp = check_tp(model, tp, "weight_bytes")
    per_expert = expert_params(model) + _expert_bias_params(model)
    routed = model.moe_layers * model.num_experts * per_expert
    embeddings = embedding_params(model)
    rest = param_count(model) - routed - embeddings
    total = embeddings * embedding_dtype_bytes(model) + rest * model.dtype_bytes
    return (total + routed * DTYPE_BYTES[model.expert_dtype]) / tp
