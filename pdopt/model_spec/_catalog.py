"""The model catalogue: shapes copied from each model's public Hugging Face ``config.json``.

Each row names the repository whose ``config.json`` it copies: ``num_hidden_layers``,
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads`` (absent = MHA),
``intermediate_size``, ``vocab_size``, ``torch_dtype``, ``tie_word_embeddings`` and
``max_position_embeddings`` (as ``max_context_tokens``), ``sliding_window`` with the count of
``sliding_attention`` layers of ``layer_types`` (gpt-oss), and for MLA and MoE models the fields
:func:`pdopt.model_spec.from_hf_config` reads. Qwen2 and Qwen2.5 have biases on the Q, K and V
projections (``qkv_bias=True``); they are counted exactly by :func:`pdopt.model_spec.param_count`.
The tests rebuild every MoE/MLA row from its config values with ``from_hf_config`` and check the
published total and active sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from pdopt._validation import param_error
from pdopt.model_spec._hf import is_hf_config
from pdopt.model_spec._model import KV_DTYPES, ModelSpec, canonical_dtype, default_kv_dtype

_MODEL_LIST: tuple[ModelSpec, ...] = (
    # Qwen/Qwen2.5-7B: 28 layers, 3584 hidden, 28 heads / 4 KV heads, 18944 MLP, vocab 152064,
    # bfloat16, untied embeddings, QKV biases, max_position_embeddings 131072 (HF card:
    # "Context Length: 131,072 tokens"). Published size 7.61B (HF card "7.62B").
    ModelSpec(
        "Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, "bfloat16", qkv_bias=True,
        max_context_tokens=131072,
    ),
    # meta-llama/Llama-2-7b-hf: 32 layers, 4096 hidden, 32 heads (MHA), 11008 MLP, vocab 32000,
    # float16, max_position_embeddings 4096. 6.74B parameters.
    ModelSpec("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, "float16", max_context_tokens=4096),
    # meta-llama/Meta-Llama-3-8B: 32 layers, 4096 hidden, 32 heads / 8 KV heads, 14336 MLP,
    # vocab 128256, bfloat16, max_position_embeddings 8192. 8.03B parameters.
    ModelSpec(
        "Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, "bfloat16", max_context_tokens=8192
    ),
    # huggyllama/llama-30b (LLaMA-1 "33B"): 60 layers, 6656 hidden, 52 heads (MHA), 17920 MLP,
    # vocab 32000, float16, max_position_embeddings 2048. 32.5B parameters.
    ModelSpec("Llama-30B", 60, 6656, 52, 52, 17920, 32000, "float16", max_context_tokens=2048),
    # codellama/CodeLlama-34b-hf: 48 layers, 8192 hidden, 64 heads / 8 KV heads (GQA), 22016 MLP,
    # vocab 32000, bfloat16, max_position_embeddings 16384. 33.7B parameters.
    ModelSpec(
        "CodeLlama-34B", 48, 8192, 64, 8, 22016, 32000, "bfloat16", max_context_tokens=16384
    ),
    # Qwen/Qwen2-72B: 80 layers, 8192 hidden, 64 heads / 8 KV heads, 29568 MLP, vocab 152064,
    # bfloat16, untied, QKV biases, max_position_embeddings 32768. 72.7B parameters.
    ModelSpec(
        "Qwen2-72B", 80, 8192, 64, 8, 29568, 152064, "bfloat16", qkv_bias=True,
        max_context_tokens=32768,
    ),
    # meta-llama/Llama-2-70b-hf: 80 layers, 8192 hidden, 64 heads / 8 KV heads, 28672 MLP,
    # vocab 32000, float16, max_position_embeddings 4096. 69.0B parameters.
    ModelSpec(
        "Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, "float16", max_context_tokens=4096
    ),
    # meta-llama/Meta-Llama-3-70B: as Llama-2-70B with vocab 128256, bfloat16,
    # max_position_embeddings 8192. 70.6B parameters.
    ModelSpec(
        "Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, "bfloat16", max_context_tokens=8192
    ),
    # meta-llama/Llama-3.1-8B: Llama-3-8B's shape, max_position_embeddings 131072 (RoPE scaled).
    ModelSpec(
        "Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256, "bfloat16", max_context_tokens=131072
    ),
    # meta-llama/Llama-3.1-70B: Llama-3-70B's shape, max_position_embeddings 131072.
    ModelSpec(
        "Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256, "bfloat16", max_context_tokens=131072
    ),
    # meta-llama/Llama-3.3-70B-Instruct: the same shape and context as Llama-3.1-70B.
    ModelSpec(
        "Llama-3.3-70B", 80, 8192, 64, 8, 28672, 128256, "bfloat16", max_context_tokens=131072
    ),
    # meta-llama/Llama-3.1-405B: 126 layers, 16384 hidden, 128 heads / 8 KV heads, 53248 MLP,
    # vocab 128256, bfloat16, max_position_embeddings 131072. 405.85B parameters ("405B").
    ModelSpec(
        "Llama-3.1-405B", 126, 16384, 128, 8, 53248, 128256, "bfloat16",
        max_context_tokens=131072,
    ),
    # Qwen/Qwen3-8B: 36 layers, 4096 hidden, 32 heads / 8 KV heads, head_dim 128, 12288 MLP,
    # vocab 151936, bfloat16, untied, Q/K norms, max_position_embeddings 40960 (HF card: 32,768
    # native, 131,072 with YaRN). HF card: 8.2B parameters, 6.95B non-embedding.
    ModelSpec(
        "Qwen3-8B", 36, 4096, 32, 8, 12288, 151936, "bfloat16", head_dim=128, qk_norm=True,
        max_context_tokens=40960,
    ),
    # Qwen/Qwen3-32B: 64 layers, 5120 hidden, 64 heads / 8 KV heads, head_dim 128, 25600 MLP,
    # vocab 151936, bfloat16, Q/K norms, max_position_embeddings 40960. HF card: 32.8B.
    ModelSpec(
        "Qwen3-32B", 64, 5120, 64, 8, 25600, 151936, "bfloat16", head_dim=128, qk_norm=True,
        max_context_tokens=40960,
    ),
    # Qwen/Qwen3-30B-A3B: 48 layers, 2048 hidden, 32 heads / 4 KV heads, head_dim 128, 128
    # experts of 768 (8 per token) in every layer, vocab 151936, bfloat16, Q/K norms,
    # max_position_embeddings 40960. HF card: 30.5B total, 3.3B activated, 29.9B non-embedding.
    ModelSpec(
        "Qwen3-30B-A3B", 48, 2048, 32, 4, 6144, 151936, "bfloat16", head_dim=128, qk_norm=True,
        max_context_tokens=40960, num_experts=128, experts_per_token=8, moe_intermediate_size=768,
    ),
    # Qwen/Qwen3-235B-A22B: 94 layers, 4096 hidden, 64 heads / 4 KV heads, head_dim 128, 128
    # experts of 1536 (8 per token), vocab 151936, bfloat16, Q/K norms, max_position_embeddings
    # 40960. HF card: 235B total, 22B activated, 234B non-embedding.
    ModelSpec(
        "Qwen3-235B-A22B", 94, 4096, 64, 4, 12288, 151936, "bfloat16", head_dim=128,
        qk_norm=True, max_context_tokens=40960, num_experts=128, experts_per_token=8,
        moe_intermediate_size=1536,
    ),
    # deepseek-ai/DeepSeek-V3: 61 layers, 7168 hidden, 128 heads, MLA (q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope 128 + qk_rope 64, v_head_dim 128), first 3 layers dense (18432),
    # then 256 routed experts of 2048 (8 per token) + 1 shared, noaux_tc router bias, vocab
    # 129280, FP8 weights (quantization_config fp8, e4m3, 128×128 blocks), max_position_embeddings
    # 163840. DeepSeek-V3 report: 671B total (685B on HF with the 14B MTP module), 37B activated.
    ModelSpec(
        "DeepSeek-V3", 61, 7168, 128, 128, 18432, 129280, "fp8", head_dim=192,
        max_context_tokens=163840, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        v_head_dim=128, num_experts=256, experts_per_token=8, moe_intermediate_size=2048,
        num_shared_experts=1, first_dense_layers=3, router_bias=True,
    ),
    # mistralai/Mixtral-8x7B-v0.1: 32 layers, 4096 hidden, 32 heads / 8 KV heads, 8 experts of
    # 14336 (2 per token), vocab 32000, bfloat16, max_position_embeddings 32768. Mistral: 46.7B
    # total, 12.9B active.
    ModelSpec(
        "Mixtral-8x7B", 32, 4096, 32, 8, 14336, 32000, "bfloat16", max_context_tokens=32768,
        num_experts=8, experts_per_token=2, moe_intermediate_size=14336,
    ),
    # openai/gpt-oss-20b: 24 layers, 2880 hidden, 64 heads / 8 KV heads, head_dim 64, 32 experts
    # of 2880 (4 per token) stored MXFP4, the rest bfloat16, Q/K/V/O biases, attention sinks,
    # router and expert biases, vocab 201088, max_position_embeddings 131072, sliding_window 128
    # with layer_types alternating "sliding_attention" (even layers) and "full_attention": 12
    # sliding layers. Model card: 20.91B total, 3.61B active (input embedding not counted).
    ModelSpec(
        "gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, "bfloat16", head_dim=64, qkv_bias=True,
        o_bias=True, attention_sinks=True, expert_dtype="mxfp4", max_context_tokens=131072,
        num_experts=32, experts_per_token=4, moe_intermediate_size=2880, router_bias=True,
        expert_bias=True, sliding_window_tokens=128, sliding_window_layers=12,
    ),
    # openai/gpt-oss-120b: as gpt-oss-20b with 36 layers (18 sliding, window 128) and 128
    # experts. Model card: 116.83B total, 5.13B active.
    ModelSpec(
        "gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, "bfloat16", head_dim=64, qkv_bias=True,
        o_bias=True, attention_sinks=True, expert_dtype="mxfp4", max_context_tokens=131072,
        num_experts=128, experts_per_token=4, moe_intermediate_size=2880, router_bias=True,
        expert_bias=True, sliding_window_tokens=128, sliding_window_layers=18,
    ),
)  # fmt: skip

MODELS: Mapping[str, ModelSpec] = MappingProxyType({m.name: m for m in _MODEL_LIST})
"""Every catalogued model by its name (read-only)."""

# Other spellings of the same shapes (Hugging Face repository names, LLaMA-1 "33B", Llama 3.1).
_ALIASES: dict[str, str] = {
    "qwen/qwen2.5-7b": "Qwen2.5-7B",
    "qwen2.5-7b-instruct": "Qwen2.5-7B",
    "llama-2-7b-hf": "Llama-2-7B",
    "meta-llama/llama-2-7b-hf": "Llama-2-7B",
    "meta-llama-3-8b": "Llama-3-8B",
    "meta-llama/meta-llama-3-8b": "Llama-3-8B",
    "meta-llama/llama-3.1-8b": "Llama-3.1-8B",
    "meta-llama/llama-3.1-70b": "Llama-3.1-70B",
    "meta-llama/llama-3.3-70b-instruct": "Llama-3.3-70B",
    "meta-llama/llama-3.1-405b": "Llama-3.1-405B",
    "qwen/qwen3-8b": "Qwen3-8B",
    "qwen/qwen3-32b": "Qwen3-32B",
    "qwen/qwen3-30b-a3b": "Qwen3-30B-A3B",
    "qwen/qwen3-235b-a22b": "Qwen3-235B-A22B",
    "deepseek-ai/deepseek-v3": "DeepSeek-V3",
    "deepseek-r1": "DeepSeek-V3",
    "deepseek-ai/deepseek-r1": "DeepSeek-V3",
    "mistralai/mixtral-8x7b-v0.1": "Mixtral-8x7B",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "llama-33b": "Llama-30B",
    "huggyllama/llama-30b": "Llama-30B",
    "codellama-34b-hf": "CodeLlama-34B",
    "codellama/codellama-34b-hf": "CodeLlama-34B",
    "qwen/qwen2-72b": "Qwen2-72B",
    "llama-2-70b-hf": "Llama-2-70B",
    "meta-llama/llama-2-70b-hf": "Llama-2-70B",
    "meta-llama-3-70b": "Llama-3-70B",
    "meta-llama/meta-llama-3-70b": "Llama-3-70B",
}


def get_model(name: str) -> ModelSpec:
    """The catalogued :class:`ModelSpec` called ``name`` (case-insensitive; aliases such as
    Hugging Face repository names), optionally at another precision: ``NAME@WEIGHTS`` or
    ``NAME@WEIGHTS/KV`` (e.g. ``DeepSeek-V3@fp8/fp8``, ``Llama-3.1-70B@int4``) sets the weight
    dtype (routed experts included) and the KV-cache dtype; see :func:`with_precision`. A
    ``$PDOPT_SPECS`` entry named as a catalogued model replaces its row
    (:func:`pdopt._specs_file.env_spec`).

    Raises
    ------
    ParameterError
        When ``name`` is neither in the catalogue nor a user's spec file (a ``.toml``/``.json``
        path, or a name in the files of ``$PDOPT_SPECS``: :mod:`pdopt._specs_file`; the message
        lists the known names), or names an unknown dtype.
    InputError
        When ``name`` is a Hugging Face ``config.json`` (or its folder; read by
        :func:`pdopt.model_spec.from_hf_config`, as a path or a ``$PDOPT_SPECS`` entry) that
        pdopt cannot model: the message names the field.

    Examples
    --------
    >>> get_model("meta-llama/Llama-3.1-8B").name
    'Llama-3.1-8B'
    >>> get_model("llama-3.1-70b@fp8/fp8").kv_bytes_per_token
    163840
    """
    base, sep, precision = str(name).partition("@")
    key = base.strip().lower()
    by_lower = {model_name.lower(): model_name for model_name in MODELS}
    resolved = by_lower.get(key) or _ALIASES.get(key)
    from pdopt._specs_file import env_spec, user_spec

    if resolved is None:  # a user's spec file, or a name from $PDOPT_SPECS (pdopt._specs_file)
        model = user_spec(
            "model", base.strip(), ModelSpec, sorted(MODELS),
            foreign=_read_hf_config, foreign_hint="a Hugging Face config.json (or its folder)",
        )  # fmt: skip
    else:  # a $PDOPT_SPECS entry of a catalogued name replaces the row (pdopt._specs_file)
        names = (base.strip(), resolved)
        model = env_spec("model", names, ModelSpec, _read_hf_config) or MODELS[resolved]
    if not sep:
        return model
    weights, _, kv = precision.partition("/")
    if not weights.strip() and not kv.strip():
        rule = "NAME or NAME@WEIGHTS[/KV] with a dtype after '@' (e.g. @fp8, @bf16/fp8, @/fp8)"
        raise param_error("name", "get_model", rule, name)
    return with_precision(model, weights.strip() or None, kv.strip() or None)


def profiled_model(named: str, given: ModelSpec | None = None) -> ModelSpec:
    """The spec a profile whose header names ``named`` measures: ``given`` (the spec the user
    named for it, e.g. from a spec file or a Hugging Face config, whose name only that file
    defines) when the names match (case-insensitive), else :func:`get_model` ``(named)``.

    Raises
    ------
    ParameterError
        When ``named`` is not ``given``'s name and :func:`get_model` does not know it.
    """
    if given is not None and given.name.lower() == named.strip().lower():
        return given
    return get_model(named)


def with_precision(
    model: ModelSpec, weight_dtype: str | None = None, kv_dtype: str | None = None
) -> ModelSpec:
    """``model`` with its weights (routed experts included) stored as ``weight_dtype`` and its KV
    cache as ``kv_dtype`` (None: unchanged), named ``NAME@WEIGHTS/KV`` so that
    :func:`get_model` reads the name back.

    Weight dtypes: ``bf16``, ``fp16``, ``fp32``, ``fp8``, ``int8``, ``int4``, ``mxfp4`` (or the
    long names of :data:`pdopt.model_spec.DTYPE_BYTES`); KV dtypes the same but ``mxfp4``
    (:data:`~pdopt.model_spec._model.KV_DTYPES`: no engine has an MXFP4 KV cache). FP8 weights
    run the GEMMs at a GPU's FP8 peak (W8A8); INT8/INT4/MXFP4 weights are weight-only
    (W8A16/W4A16): fewer bytes, 16-bit peak.

    A new weight dtype without a ``kv_dtype`` moves the KV with it when the KV followed the
    weights (:func:`~pdopt.model_spec._model.default_kv_dtype`, as vLLM's
    ``kv_cache_dtype="auto"``: a float32 model served ``@bf16`` keeps a BF16 KV cache, a BF16
    one served ``@fp8`` a BF16 one); a KV dtype the model fixed otherwise (a config's
    ``kv_cache_scheme``, a spec file's ``kv_dtype``, an earlier ``/KV``) is kept.

    Examples
    --------
    >>> from pdopt.model_spec import get_model
    >>> with_precision(get_model("Qwen3-8B"), "fp8").name
    'Qwen3-8B@fp8/bfloat16'
    """
    owner = "with_precision"
    base = model.name.partition("@")[0]
    weights = canonical_dtype(weight_dtype, "weight_dtype", owner) if weight_dtype else None
    if kv_dtype:
        kv = canonical_dtype(kv_dtype, "kv_dtype", owner, KV_DTYPES)
    elif weights is not None and model.kv_dtype == default_kv_dtype(model.dtype):
        kv = default_kv_dtype(weights)  # the KV followed the weights: it still does
    else:
        kv = model.kv_dtype
    spec = replace(model, kv_dtype=kv)
    if weights is not None:
        spec = replace(spec, dtype=weights, expert_dtype=weights)
    return replace(spec, name=f"{base}@{spec.dtype}/{spec.kv_dtype}")


def _read_hf_config(path: Path) -> ModelSpec | None:
    """The spec of the Hugging Face ``config.json`` at ``path`` (the file or its folder), or None
    when ``path`` is not one (:func:`pdopt.model_spec._hf.is_hf_config`): how :func:`get_model`
    reads a foreign spec file."""
    return ModelSpec.from_hf_config(path) if is_hf_config(path) else None
