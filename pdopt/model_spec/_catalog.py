"""The model catalogue: shapes copied from each model's public Hugging Face ``config.json``.

Each row names the repository whose ``config.json`` it copies: ``num_hidden_layers``,
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads`` (absent = MHA),
``intermediate_size``, ``vocab_size``, ``torch_dtype`` and ``tie_word_embeddings``. Qwen2 and
Qwen2.5 have biases on the Q, K and V projections (``qkv_bias=True``); they are counted exactly
by :func:`pdopt.model_spec.param_count`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pdopt.model_spec._model import ModelSpec

_MODEL_LIST: tuple[ModelSpec, ...] = (
    # Qwen/Qwen2.5-7B: 28 layers, 3584 hidden, 28 heads / 4 KV heads, 18944 MLP, vocab 152064,
    # bfloat16, untied embeddings, QKV biases. Published size 7.61B (HF card "7.62B").
    ModelSpec("Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, "bfloat16", qkv_bias=True),
    # meta-llama/Llama-2-7b-hf: 32 layers, 4096 hidden, 32 heads (MHA), 11008 MLP, vocab 32000,
    # float16. 6.74B parameters.
    ModelSpec("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, "float16"),
    # meta-llama/Meta-Llama-3-8B (Llama-3.1-8B has the same shape): 32 layers, 4096 hidden,
    # 32 heads / 8 KV heads, 14336 MLP, vocab 128256, bfloat16. 8.03B parameters.
    ModelSpec("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, "bfloat16"),
    # huggyllama/llama-30b (LLaMA-1 "33B"): 60 layers, 6656 hidden, 52 heads (MHA), 17920 MLP,
    # vocab 32000, float16. 32.5B parameters.
    ModelSpec("Llama-30B", 60, 6656, 52, 52, 17920, 32000, "float16"),
    # codellama/CodeLlama-34b-hf: 48 layers, 8192 hidden, 64 heads / 8 KV heads (GQA), 22016 MLP,
    # vocab 32000, bfloat16. 33.7B parameters.
    ModelSpec("CodeLlama-34B", 48, 8192, 64, 8, 22016, 32000, "bfloat16"),
    # Qwen/Qwen2-72B: 80 layers, 8192 hidden, 64 heads / 8 KV heads, 29568 MLP, vocab 152064,
    # bfloat16, untied, QKV biases. 72.7B parameters.
    ModelSpec("Qwen2-72B", 80, 8192, 64, 8, 29568, 152064, "bfloat16", qkv_bias=True),
    # meta-llama/Llama-2-70b-hf: 80 layers, 8192 hidden, 64 heads / 8 KV heads, 28672 MLP,
    # vocab 32000, float16. 69.0B parameters.
    ModelSpec("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, "float16"),
    # meta-llama/Meta-Llama-3-70B: as Llama-2-70B with vocab 128256, bfloat16. 70.6B parameters.
    ModelSpec("Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, "bfloat16"),
)

MODELS: Mapping[str, ModelSpec] = MappingProxyType({m.name: m for m in _MODEL_LIST})
"""Every catalogued model by its name (read-only)."""

# Other spellings of the same shapes (Hugging Face repository names, LLaMA-1 "33B", Llama 3.1).
_ALIASES: dict[str, str] = {
    "qwen/qwen2.5-7b": "Qwen2.5-7B",
    "qwen2.5-7b-instruct": "Qwen2.5-7B",
    "llama-2-7b-hf": "Llama-2-7B",
    "meta-llama/llama-2-7b-hf": "Llama-2-7B",
    "llama-3.1-8b": "Llama-3-8B",
    "meta-llama-3-8b": "Llama-3-8B",
    "meta-llama/meta-llama-3-8b": "Llama-3-8B",
    "meta-llama/llama-3.1-8b": "Llama-3-8B",
    "llama-33b": "Llama-30B",
    "huggyllama/llama-30b": "Llama-30B",
    "codellama-34b-hf": "CodeLlama-34B",
    "codellama/codellama-34b-hf": "CodeLlama-34B",
    "qwen/qwen2-72b": "Qwen2-72B",
    "llama-2-70b-hf": "Llama-2-70B",
    "meta-llama/llama-2-70b-hf": "Llama-2-70B",
    "llama-3.1-70b": "Llama-3-70B",
    "meta-llama-3-70b": "Llama-3-70B",
    "meta-llama/meta-llama-3-70b": "Llama-3-70B",
}


def get_model(name: str) -> ModelSpec:
    """The catalogued :class:`ModelSpec` called ``name`` (case-insensitive; aliases such as
    ``Llama-3.1-8B`` or Hugging Face repository names).

    Raises
    ------
    ParameterError
        When ``name`` is neither in the catalogue nor a user's spec file (a ``.toml``/``.json``
        path, or a name in the files of ``$PDOPT_SPECS``: :mod:`pdopt._specs_file`); the message
        lists the known names.

    Examples
    --------
    >>> get_model("llama-3.1-8b").name
    'Llama-3-8B'
    """
    key = str(name).strip().lower()
    by_lower = {model_name.lower(): model_name for model_name in MODELS}
    resolved = by_lower.get(key) or _ALIASES.get(key)
    if resolved is None:  # a user's spec file, or a name from $PDOPT_SPECS (pdopt._specs_file)
        from pdopt._specs_file import user_model

        return user_model(name, sorted(MODELS))
    return MODELS[resolved]
