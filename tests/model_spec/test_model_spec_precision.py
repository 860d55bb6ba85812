"""Precision rules: a float32 config is served at 16 bits, ``@WEIGHTS`` moves a KV that followed
the weights, and ``mxfp4`` KV caches and empty ``@`` suffixes are refused.

vLLM's documented behaviour is the reference: ``--dtype auto`` serves a float32 checkpoint at
BF16 (FP16 on GPUs without BF16), and ``--kv-cache-dtype auto`` keeps the KV at the model's dtype.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdopt.errors import ParameterError
from pdopt.model_spec import ModelSpec, from_hf_config, get_model, with_precision

# google/gemma-2-9b config.json (its torch_dtype is float32).
GEMMA_2_9B: dict[str, Any] = {
    "model_type": "gemma2",
    "num_hidden_layers": 42,
    "hidden_size": 3584,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "intermediate_size": 14336,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "torch_dtype": "float32",
}


def test_a_float32_config_is_served_at_bf16() -> None:
    spec = from_hf_config(GEMMA_2_9B)
    assert (spec.dtype, spec.kv_dtype) == ("bfloat16", "bfloat16")
    assert spec.kv_bytes_per_token == 2 * 42 * 8 * 256 * 2


def test_an_explicit_fp32_suffix_still_gives_float32(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA_2_9B))
    spec = get_model(f"{path}@fp32")
    assert (spec.dtype, spec.kv_dtype) == ("float32", "float32")
    assert get_model(f"{path}@fp32/bf16").kv_dtype == "bfloat16"


def test_a_weight_override_moves_a_kv_that_followed_the_weights() -> None:
    wide = ModelSpec("wide", 2, 64, 4, 4, 128, 100, "float32")
    assert wide.kv_dtype == "float32"
    assert with_precision(wide, "bf16").name == "wide@bfloat16/bfloat16"
    assert with_precision(wide, "fp8").kv_dtype == "bfloat16"  # quantized: vLLM's auto KV
    assert get_model("Llama-3.1-8B@fp16").kv_dtype == "float16"
    assert get_model("Llama-3.1-8B@fp8").kv_dtype == "bfloat16"


def test_a_kv_dtype_the_model_fixed_is_kept() -> None:
    # compressed-tensors with an FP8 kv_cache_scheme: requantizing the weights keeps the FP8 KV.
    config = {
        **GEMMA_2_9B,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
            "kv_cache_scheme": {"num_bits": 8, "type": "float"},
        },
    }
    spec = from_hf_config(config)
    assert (spec.dtype, spec.kv_dtype) == ("fp8", "fp8")
    assert with_precision(spec, "int4").kv_dtype == "fp8"
    assert with_precision(get_model("Llama-3.1-8B@fp8/fp8"), "bf16").kv_dtype == "fp8"


@pytest.mark.parametrize("name", ["Llama-3.1-8B@fp8/mxfp4", "Llama-3.1-8B@/mxfp4"])
def test_mxfp4_is_not_a_kv_dtype(name: str) -> None:
    with pytest.raises(ParameterError, match="'kv_dtype' parameter of with_precision"):
        get_model(name)
    with pytest.raises(ParameterError, match="kv_dtype"):
        ModelSpec("m", 2, 64, 4, 4, 128, 100, kv_dtype="mxfp4")
    assert get_model("gpt-oss-20b@mxfp4").kv_dtype == "bfloat16"  # still a weight dtype


@pytest.mark.parametrize("name", ["Llama-3.1-8B@", "Llama-3.1-8B@ ", "Llama-3.1-8B@/"])
def test_an_empty_precision_suffix_is_refused(name: str) -> None:
    with pytest.raises(ParameterError, match="dtype after '@'"):
        get_model(name)
