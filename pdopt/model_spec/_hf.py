"""Read a Hugging Face ``config.json`` (a file the user has, or its dict) into the fields of a
:class:`~pdopt.model_spec.ModelSpec` (:meth:`ModelSpec.from_hf_config` builds it).

Fields read (Transformers' names; anything else is ignored):

========================  =====================================================================
architecture              keys
========================  =====================================================================
every model               ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
                          ``intermediate_size``, ``vocab_size``; optional ``num_key_value_heads``
                          (absent: MHA; other KV-head fields below), ``head_dim``,
                          ``tie_word_embeddings`` (absent: the Transformers class default, True
                          for :data:`_TIED_TYPES`, else False),
                          ``max_position_embeddings``, ``torch_dtype`` / ``dtype``
                          (``float32``: served as ``bfloat16``, vLLM's ``--dtype auto``),
                          ``attention_bias`` (Q/K/V/O biases); the MLP is gated (SwiGLU, GeGLU)
                          except for ``model_type`` ``gpt_neox``, ``phi``, ``starcoder2`` and
                          the other two-matrix MLPs of :data:`_UNGATED_TYPES`
multimodal                ``text_config`` (Llama-4, Gemma-3, Mistral-3, …): its language model,
                          the top level's ``quantization_config`` and dtype kept; the vision
                          encoder's weights are not counted (about 0.4-1 B parameters)
Qwen2 / Qwen2.5           ``model_type`` ``qwen2`` or ``qwen2_moe``: Q/K/V biases
Qwen3                     ``model_type`` ``qwen3`` or ``qwen3_moe``: per-head Q/K RMSNorm
MLA (DeepSeek-V2/V3)      ``kv_lora_rank``, ``q_lora_rank`` (null: none), ``qk_rope_head_dim``,
                          ``qk_nope_head_dim``, ``v_head_dim``
MoE                       ``num_local_experts`` / ``num_experts`` / ``n_routed_experts``,
                          ``num_experts_per_tok`` / ``experts_per_token``, ``moe_intermediate_size``
                          (absent: ``intermediate_size``), ``n_shared_experts``,
                          ``first_k_dense_replace``, ``topk_method`` ``noaux_tc`` (router bias)
gpt-oss                   ``model_type`` ``gpt_oss``: router and expert biases, attention sinks
KV heads                  Falcon (``model_type`` ``falcon``): ``num_kv_heads`` when
                          ``new_decoder_architecture`` (Falcon-40B/180B), else one KV head when
                          ``multi_query`` (absent: true, FalconConfig's default; Falcon-7B),
                          else ``num_kv_heads`` (absent: MHA); GPTBigCode (StarCoder): one when
                          ``multi_query`` (absent: true); ChatGLM/GLM-4:
                          ``multi_query_group_num`` when ``multi_query_attention``
Falcon                    MLP width ``ffn_hidden_size`` when ``intermediate_size`` is absent
                          (absent too: 4 · ``hidden_size``, FalconConfig's default), two matrices
                          (GELU); ``bias``: Q/K/V/O biases (the MLP's biases, < 0.01%, are not
                          counted); embeddings tied unless ``tie_word_embeddings`` is false
sliding windows           ``sliding_window`` (null: none) and which layers use it: ``layer_types``
                          (``sliding_attention`` / ``full_attention``, as gpt-oss and recent
                          Transformers write it) when present; else Qwen2/Qwen3 (``model_type``
                          ``qwen*``): only with ``use_sliding_window`` true, layers from index
                          ``max_window_layers`` on; Gemma-2: even layers; Gemma-3:
                          ``sliding_window_pattern`` (every p-th layer full); else every layer
                          (Mistral-7B-v0.1)
quantization              ``quantization_config.quant_method``: ``fp8`` / ``fbgemm_fp8`` → FP8
                          weights; ``mxfp4`` → MXFP4 routed experts; ``bits`` 4 or 8 (GPTQ/AWQ)
                          → INT4/INT8 weights; ``bitsandbytes`` ``load_in_4bit`` /
                          ``load_in_8bit`` → INT4/INT8; ``compressed-tensors`` → its weight
                          scheme's ``num_bits`` and ``type`` (8 float: FP8, 8 int: INT8, 4 int:
                          INT4) and ``kv_cache_scheme`` (8 float: FP8 KV); ``modelopt``
                          ``quant_algo`` ``FP8`` (``kv_cache_quant_algo`` ``FP8``: FP8 KV)
========================  =====================================================================

Not modelled (a clear error, not a wrong number): Qwen2-MoE's shared-expert width
(``shared_expert_intermediate_size``), interleaved dense/MoE layers (``decoder_sparse_step`` > 1,
``mlp_only_layers``, ``moe_layer_freq`` > 1, ``interleave_moe_layer_step`` > 1,
``expert_layer_period`` > 1), other attention kinds in ``layer_types`` (chunked or linear
attention) or set by other keys (:data:`_UNMODELLED_KEYS`: Llama-4's chunked attention, the
state-space and linear-attention layers of hybrid models such as Jamba, Nemotron-H, Falcon-H1
and Qwen3-Next), FP4 weights (NVFP4) and quantization methods not listed above.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pdopt.errors import InputError

_QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")
_UNGATED_TYPES = (
    "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2",
    "mpt", "codegen",
)  # fmt: skip
"""``model_type`` values whose MLP is two matrices (up, down) with no gate (Transformers'
modelling code of each)."""
_TIED_TYPES = ("gemma", "gemma2", "gemma3", "gemma3_text", "starcoder2", "gpt2", "falcon")
"""``model_type`` values whose Transformers config class ties the embeddings by default (a
config that omits ``tie_word_embeddings`` has them tied)."""
_UNMODELLED_KEYS: dict[str, str] = {
    "attention_chunk_size": "chunked attention (Llama-4)",
    "hybrid_override_pattern": "state-space (Mamba) layers among the attention ones",
    "layers_block_type": "state-space (Mamba) layers among the attention ones",
    "attn_layer_period": "state-space (Mamba) layers among the attention ones (Jamba)",
    "mamba_d_state": "state-space (Mamba) layers",
    "ssm_cfg": "state-space (Mamba) layers",
    "linear_num_key_heads": "linear-attention layers (Qwen3-Next)",
    "full_attention_interval": "linear-attention layers among the full ones",
}
"""Config keys that declare layers pdopt does not model (present and not null: an error)."""
_QK_NORM_TYPES = ("qwen3", "qwen3_moe")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token")


def _read_config(
    path_or_dict: str | Path | Mapping[str, Any],
) -> tuple[dict[str, Any], str, str]:
    """The config as a dict, a label for messages (the file, or ``config``) and the spec's
    default name: ``_name_or_path``, else for a file its folder's name (``config.json``) or its
    stem, for a dict its ``model_type``."""
    if isinstance(path_or_dict, Mapping):
        config = dict(path_or_dict)
        fallback = str(config.get("model_type") or "hf-model")
        return config, "config", str(config.get("_name_or_path") or fallback)
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(f"{path}: no such file; give a Hugging Face config.json or its folder")
    try:
        config = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(config, dict):
        raise InputError(f"{path}: must hold a JSON object (a Hugging Face config.json)")
    folder = path.resolve().parent.name
    fallback = folder if path.name == "config.json" and folder else path.stem
    return config, str(path), str(config.get("_name_or_path") or fallback)


def is_hf_config(path: Path) -> bool:
    """Whether ``path`` is a Hugging Face ``config.json`` (the file or a folder holding one):
    False for no such file or folder, or for a pdopt spec file (a JSON object with a ``model``
    or ``gpu`` table, :mod:`pdopt._specs_file`). How the model catalogue tells a foreign spec
    file (:func:`pdopt.model_spec.get_model`)."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            return False
    elif path.suffix.lower() != ".json" or not path.is_file():
        return False
    config, _, _ = _read_config(path)
    return "model" not in config and "gpu" not in config


def _language_model(config: dict[str, Any], label: str) -> dict[str, Any]:
    """A multimodal config's ``text_config`` (the language model), with the top level's keys it
    lacks (``quantization_config``, dtype, name); a text-only config as it is."""
    text = config.get("text_config")
    if text is None or "num_hidden_layers" in config:
        return config
    if not isinstance(text, Mapping):
        raise InputError(f"{label}: field text_config must be an object")
    return {**{k: v for k, v in config.items() if k != "text_config"}, **text}


def _int(config: Mapping[str, Any], key: str, label: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise InputError(
            f"{label}: field {key!r} is missing; add it with the model's value (a config "
            "that omits a field relies on its Transformers class's default, which pdopt does "
            "not hold)"
        )
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise InputError(f"{label}: field {key}={value!r} must be an integer")
    return int(value)


def _first_int(config: Mapping[str, Any], keys: tuple[str, ...], label: str) -> int:
    for key in keys:
        if config.get(key) is not None:
            return _int(config, key, label)
    return 0


def _dtypes(config: Mapping[str, Any], label: str) -> dict[str, str]:
    """``dtype``, ``expert_dtype`` and ``kv_dtype`` from ``torch_dtype`` and
    ``quantization_config`` (module docstring, "quantization")."""
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype.strip().lower() in ("float32", "fp32"):
        # vLLM's --dtype auto serves a float32 checkpoint at 16 bits (BF16; FP16 on GPUs
        # without BF16), as Google's Gemma-2 configs say float32; @fp32 asks for float32.
        dtype = "bfloat16"
    quant = config.get("quantization_config") or {}
    if not isinstance(quant, Mapping):
        raise InputError(f"{label}: field quantization_config must be an object")
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return {"dtype": "fp8"}
    if method == "mxfp4":
        return {"dtype": dtype, "expert_dtype": "mxfp4"}
    if method == "compressed-tensors":
        return _compressed_tensors(quant, label)
    if method == "modelopt":
        return _modelopt(quant, label)
    if method == "bitsandbytes" and (quant.get("load_in_4bit") or quant.get("load_in_8bit")):
        return {"dtype": "int4" if quant.get("load_in_4bit") else "int8"}
    bits = quant.get("bits")
    if bits in (4, 8):
        return {"dtype": "int4" if bits == 4 else "int8"}
    if quant:
        raise _unmodelled_quantization(label, f"quant_method={method!r}")
    return {"dtype": dtype}


def _unmodelled_quantization(label: str, what: str) -> InputError:
    return InputError(
        f"{label}: quantization_config {what} is not modelled (pdopt models bf16, fp8, int8 and "
        "int4 weights); remove quantization_config and give the precision after the path, "
        "e.g. --model config.json@fp8 or @int4/fp8 (weights/KV)"
    )


# compressed-tensors' (num_bits, type) of a weight or KV scheme, as pdopt dtypes
_SCHEME_DTYPES = {(8, "float"): "fp8", (8, "int"): "int8", (4, "int"): "int4"}


def _scheme_dtype(scheme: Any, label: str, where: str) -> str:
    if not isinstance(scheme, Mapping):
        raise InputError(f"{label}: quantization_config {where} must be an object")
    key = (scheme.get("num_bits"), str(scheme.get("type", "")).lower())
    if key not in _SCHEME_DTYPES:
        raise _unmodelled_quantization(label, f"{where} num_bits={key[0]!r} type={key[1]!r}")
    return _SCHEME_DTYPES[key]


def _compressed_tensors(quant: Mapping[str, Any], label: str) -> dict[str, str]:
    """llm-compressor's format: every ``config_groups`` entry's ``weights`` scheme (one dtype
    for all), and ``kv_cache_scheme`` when set."""
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise InputError(f"{label}: compressed-tensors quantization_config has no config_groups")
    found = {
        _scheme_dtype(group.get("weights") if isinstance(group, Mapping) else None, label,
                      f"config_groups.{name}.weights")
        for name, group in groups.items()
    }  # fmt: skip
    if len(found) > 1:
        raise _unmodelled_quantization(label, f"with mixed weight dtypes {sorted(found)}")
    out = {"dtype": found.pop()}
    if quant.get("kv_cache_scheme") is not None:
        out["kv_dtype"] = _scheme_dtype(quant["kv_cache_scheme"], label, "kv_cache_scheme")
    return out


def _modelopt(quant: Mapping[str, Any], label: str) -> dict[str, str]:
    """NVIDIA ModelOpt's format: ``quant_algo`` ``FP8`` and ``kv_cache_quant_algo``."""
    algo = str(quant.get("quant_algo", "")).upper()
    if algo != "FP8":
        raise _unmodelled_quantization(label, f"modelopt quant_algo={algo!r}")
    out = {"dtype": "fp8"}
    kv = quant.get("kv_cache_quant_algo")
    if kv is not None:
        if str(kv).upper() != "FP8":
            raise _unmodelled_quantization(label, f"modelopt kv_cache_quant_algo={kv!r}")
        out["kv_dtype"] = "fp8"
    return out


def _reject_unmodelled(config: Mapping[str, Any], label: str) -> None:
    for key, what in _UNMODELLED_KEYS.items():
        if config.get(key) is not None:
            raise InputError(
                f"{label}: field {key} declares {what}, which pdopt does not model; it reads "
                "decoders whose every layer is attention (full or sliding-window) and an MLP "
                "or MoE"
            )
    every_layer = ("decoder_sparse_step", "moe_layer_freq", "interleave_moe_layer_step")
    for key in (*every_layer, "expert_layer_period"):
        if config.get(key, 1) not in (1, None):
            raise InputError(
                f"{label}: field {key}={config[key]!r} (MoE only every few layers) is not "
                "modelled; pdopt reads MoE in every layer after first_k_dense_replace"
            )
    if config.get("mlp_only_layers"):
        raise InputError(f"{label}: field mlp_only_layers (dense layers among MoE) not modelled")
    if config.get("shared_expert_intermediate_size"):
        raise InputError(
            f"{label}: field shared_expert_intermediate_size (Qwen2-MoE's wide shared expert) "
            "is not modelled"
        )


def _mla_fields(config: Mapping[str, Any], label: str) -> dict[str, Any]:
    if not config.get("kv_lora_rank"):
        return {}
    rope = _int(config, "qk_rope_head_dim", label)
    nope = _int(config, "qk_nope_head_dim", label)
    return {
        "kv_lora_rank": _int(config, "kv_lora_rank", label),
        "q_lora_rank": int(config.get("q_lora_rank") or 0),
        "qk_rope_head_dim": rope,
        "head_dim": nope + rope,
        "v_head_dim": _int(config, "v_head_dim", label),
    }


def _moe_fields(config: Mapping[str, Any], label: str, model_type: str) -> dict[str, Any]:
    experts = _first_int(config, _EXPERT_KEYS, label)
    if experts == 0:
        return {}
    top_k = _first_int(config, _TOP_K_KEYS, label)
    if top_k == 0:
        raise InputError(f"{label}: an MoE config needs num_experts_per_tok")
    width = config.get("moe_intermediate_size") or config.get("intermediate_size")
    return {
        "num_experts": experts,
        "experts_per_token": top_k,
        "moe_intermediate_size": int(width or 0),
        "num_shared_experts": int(config.get("n_shared_experts") or 0),
        "first_dense_layers": int(config.get("first_k_dense_replace") or 0),
        "router_bias": model_type == "gpt_oss" or config.get("topk_method") == "noaux_tc",
        "expert_bias": model_type == "gpt_oss",
    }


def _window_layers(config: Mapping[str, Any], label: str, layers: int, model_type: str) -> int:
    """How many layers keep only the sliding window (module docstring, "sliding windows")."""
    kinds = config.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers:
            raise InputError(
                f"{label}: field layer_types must list one attention type per layer "
                f"({layers}, num_hidden_layers)"
            )
        unknown = sorted({str(k) for k in kinds} - {"sliding_attention", "full_attention"})
        if unknown:
            raise InputError(
                f"{label}: layer_types {unknown} are not modelled; pdopt reads "
                "'sliding_attention' and 'full_attention' layers"
            )
        return sum(k == "sliding_attention" for k in kinds)
    if model_type.startswith("qwen"):  # Transformers' Qwen2/Qwen3 configs
        if not config.get("use_sliding_window"):
            return 0
        return max(layers - _int(config, "max_window_layers", label, 0), 0)
    if model_type == "gemma2":  # Gemma2DecoderLayer: even layers slide
        return (layers + 1) // 2
    pattern = config.get("sliding_window_pattern")
    if pattern is not None:  # Gemma-3: layer i is full when (i + 1) % pattern == 0
        period = _int(config, "sliding_window_pattern", label)
        if period < 1:
            raise InputError(f"{label}: field sliding_window_pattern={period} must be >= 1")
        return layers - layers // period
    return layers


def _window_fields(config: Mapping[str, Any], label: str, model_type: str) -> dict[str, Any]:
    if config.get("sliding_window") is None:
        return {}
    window = _int(config, "sliding_window", label)
    if window < 1:
        raise InputError(f"{label}: field sliding_window={window} must be >= 1 (or null)")
    layers = _int(config, "num_hidden_layers", label)
    sliding = _window_layers(config, label, layers, model_type)
    if sliding == 0:
        return {}
    return {"sliding_window_tokens": window, "sliding_window_layers": sliding}


def hf_spec_fields(
    path_or_dict: str | Path | Mapping[str, Any], name: str | None = None
) -> tuple[dict[str, Any], str]:
    """The :class:`~pdopt.model_spec.ModelSpec` fields of a Hugging Face ``config.json`` (a
    file, a folder holding one, or the parsed dict; module docstring) and the label its messages
    use (the file, or ``config``); ``name`` as in :meth:`ModelSpec.from_hf_config
    <pdopt.model_spec.ModelSpec.from_hf_config>`, which builds the spec.

    Raises
    ------
    InputError
        When the file is missing or unreadable, a required field is missing or not an integer,
        or the architecture has a feature pdopt does not model (the message names the field).
    """
    config, label, default_name = _read_config(path_or_dict)
    return _fields_of(config, label, name or default_name), label


def _kv_heads(config: Mapping[str, Any], label: str, model_type: str, heads: int) -> int:
    """KV heads per layer (module docstring, "KV heads"): the field each architecture's
    Transformers attention class reads, with that config class's defaults."""
    if model_type == "falcon":
        # FalconAttention: num_kv_heads when new_decoder_architecture (Falcon-40B/180B: GQA),
        # else 1 when multi_query (FalconConfig's default: Falcon-7B), else num_kv_heads (MHA).
        if config.get("new_decoder_architecture") or not config.get("multi_query", True):
            return _int(config, "num_kv_heads", label, heads)
        return 1
    if model_type == "gpt_bigcode":  # GPTBigCodeConfig: multi_query defaults to True (MQA)
        return 1 if config.get("multi_query", True) else heads
    if config.get("multi_query_group_num") is not None:  # ChatGLM2/3, GLM-4: grouped KV heads
        if config.get("multi_query_attention"):
            return _int(config, "multi_query_group_num", label)
        return heads
    return _int(config, "num_key_value_heads", label, heads)


def _mlp_width(config: Mapping[str, Any], label: str, model_type: str) -> int:
    """The dense MLP's width: ``intermediate_size``; Falcon's ``ffn_hidden_size``, which
    FalconConfig defaults to 4 · ``hidden_size`` (its configs before 2024 omit it)."""
    if model_type == "falcon" and config.get("intermediate_size") is None:
        return _int(config, "ffn_hidden_size", label, 4 * _int(config, "hidden_size", label))
    return _int(config, "intermediate_size", label)


def _attention_bias(config: Mapping[str, Any], model_type: str) -> bool:
    """Biases on the attention projections: ``attention_bias``, or Falcon's ``bias`` (which also
    biases the MLP's two matrices: hidden + width values per layer, < 0.01% and not counted)."""
    if model_type == "falcon":
        return bool(config.get("bias"))
    return bool(config.get("attention_bias"))


def _fields_of(config: dict[str, Any], label: str, name: str) -> dict[str, Any]:
    """The spec fields, named ``name``, of the parsed ``config`` (``label`` in messages)."""
    config = _language_model(config, label)
    _reject_unmodelled(config, label)
    model_type = str(config.get("model_type", "")).lower()
    heads = _int(config, "num_attention_heads", label)
    fields: dict[str, Any] = {
        "name": name,
        "num_layers": _int(config, "num_hidden_layers", label),
        "hidden_size": _int(config, "hidden_size", label),
        "num_heads": heads,
        "num_kv_heads": _kv_heads(config, label, model_type, heads),
        "intermediate_size": _mlp_width(config, label, model_type),
        "vocab_size": _int(config, "vocab_size", label),
        "head_dim": int(config.get("head_dim") or 0),
        "gated_mlp": model_type not in _UNGATED_TYPES,
        "tied_embeddings": bool(config.get("tie_word_embeddings", model_type in _TIED_TYPES)),
        "qkv_bias": _attention_bias(config, model_type) or model_type in _QKV_BIAS_TYPES,
        "o_bias": _attention_bias(config, model_type),
        "qk_norm": model_type in _QK_NORM_TYPES,
        "attention_sinks": model_type == "gpt_oss",
        "max_context_tokens": config.get("max_position_embeddings"),
    }
    fields.update(_dtypes(config, label))
    fields.update(_mla_fields(config, label))
    fields.update(_moe_fields(config, label, model_type))
    fields.update(_window_fields(config, label, model_type))
    return fields
