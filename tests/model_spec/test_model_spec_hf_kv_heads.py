"""KV heads and MLP width of configs that name them with their own fields (Falcon, GPTBigCode,
ChatGLM), against Transformers' attention classes and the published sizes.

The Falcon dicts copy the fields of tiiuae/falcon-7b's and tiiuae/falcon-40b's public
``config.json`` (no ``intermediate_size``: FalconConfig defaults ``ffn_hidden_size`` to 4 ·
``hidden_size``; no ``num_kv_heads`` in falcon-7b, which is multi-query).
"""

from __future__ import annotations

from typing import Any

import pytest

from pdopt.model_spec import ModelSpec, param_count

FALCON_7B: dict[str, Any] = {
    "model_type": "falcon",
    "alibi": False,
    "bias": False,
    "hidden_size": 4544,
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 65024,
}
FALCON_40B: dict[str, Any] = {
    "model_type": "falcon",
    "alibi": False,
    "bias": False,
    "hidden_size": 8192,
    "new_decoder_architecture": True,
    "num_attention_heads": 128,
    "num_hidden_layers": 60,
    "num_kv_heads": 8,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 65024,
}


def test_falcon_40b_reads_its_grouped_kv_heads() -> None:
    spec = ModelSpec.from_hf_config(FALCON_40B)
    assert (spec.num_kv_heads, spec.head_dim) == (8, 64)
    assert spec.kv_bytes_per_token == 2 * 60 * 8 * 64 * 2 == 122_880


def test_falcon_7b_is_multi_query() -> None:
    spec = ModelSpec.from_hf_config(FALCON_7B)
    assert (spec.num_kv_heads, spec.head_dim) == (1, 64)
    assert spec.kv_bytes_per_token == 2 * 32 * 1 * 64 * 2 == 8192
    # FalconConfig's multi_query defaults to True: a config that omits it is multi-query too.
    omitted = {k: v for k, v in FALCON_7B.items() if k != "multi_query"}
    assert ModelSpec.from_hf_config(omitted).num_kv_heads == 1
    # Neither multi_query nor the new architecture (Falcon-RW): MHA, num_kv_heads absent.
    assert ModelSpec.from_hf_config({**FALCON_7B, "multi_query": False}).num_kv_heads == 71


@pytest.mark.parametrize(
    ("config", "published", "half_digit"),
    [
        (FALCON_7B, 7.22e9, 0.005e9),  # Hugging Face Hub, tiiuae/falcon-7b: 7.22B params
        (FALCON_40B, 41.8e9, 0.05e9),  # Hugging Face Hub, tiiuae/falcon-40b: 41.8B params
    ],
)
def test_falcon_parameter_counts_match_published(
    config: dict[str, Any], published: float, half_digit: float
) -> None:
    spec = ModelSpec.from_hf_config(config)
    assert spec.intermediate_size == 4 * spec.hidden_size  # FalconConfig's ffn_hidden_size
    assert not spec.gated_mlp and spec.tied_embeddings
    # The checkpoints store lm_head.weight beside the word embeddings, so the Hub's count has the
    # vocab x hidden matrix twice; Transformers (tie_word_embeddings defaults to True) and vLLM's
    # FalconForCausalLM tie them, and pdopt counts the memory an engine holds: once.
    stored = param_count(spec) + spec.vocab_size * spec.hidden_size
    assert abs(stored - published) <= half_digit


def test_falcon_reads_ffn_hidden_size_and_bias() -> None:
    spec = ModelSpec.from_hf_config({**FALCON_7B, "ffn_hidden_size": 9000, "bias": True})
    assert spec.intermediate_size == 9000
    assert spec.qkv_bias and spec.o_bias


def test_gpt_bigcode_multi_query_and_chatglm_groups() -> None:
    starcoder = {
        "model_type": "gpt_bigcode", "num_hidden_layers": 40, "hidden_size": 6144,
        "num_attention_heads": 48, "intermediate_size": 24576, "vocab_size": 49152,
    }  # fmt: skip
    assert ModelSpec.from_hf_config(starcoder).num_kv_heads == 1  # multi_query defaults to True
    assert ModelSpec.from_hf_config({**starcoder, "multi_query": False}).num_kv_heads == 48
    glm = {
        "model_type": "chatglm", "num_hidden_layers": 28, "hidden_size": 4096,
        "num_attention_heads": 32, "intermediate_size": 13696, "vocab_size": 65024,
        "multi_query_attention": True, "multi_query_group_num": 2,
    }  # fmt: skip
    assert ModelSpec.from_hf_config(glm).num_kv_heads == 2
    assert ModelSpec.from_hf_config({**glm, "multi_query_attention": False}).num_kv_heads == 32
