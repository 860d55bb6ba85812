"""``from_hf_config`` and the 2025 catalogue rows against published sizes and KV footprints.

The config dicts copy the fields of each model's public Hugging Face ``config.json`` (no
download). The published numbers are the model cards' and papers' (cited on each line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdopt.errors import InputError, ParameterError
from pdopt.model_spec import (
    MODELS,
    ModelSpec,
    active_param_count,
    decode_step_cost,
    expected_experts_touched,
    from_hf_config,
    get_model,
    kv_bytes_per_token,
    param_count,
    prefill_cost,
    weight_bytes,
    with_precision,
)

# meta-llama/Llama-3.1-70B config.json (dense GQA).
LLAMA_31_70B: dict[str, Any] = {
    "model_type": "llama",
    "num_hidden_layers": 80,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "attention_bias": False,
}
# meta-llama/Llama-2-7b-hf config.json (dense MHA).
LLAMA_2_7B: dict[str, Any] = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
}
# Qwen/Qwen3-8B config.json (dense GQA, Q/K norms).
QWEN3_8B: dict[str, Any] = {
    "model_type": "qwen3",
    "num_hidden_layers": 36,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "attention_bias": False,
}
# deepseek-ai/DeepSeek-V3 config.json (MLA + MoE, FP8 checkpoint).
DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}
# Qwen/Qwen3-30B-A3B config.json (GQA + MoE).
QWEN3_30B_A3B: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# Qwen/Qwen3-235B-A22B config.json.
QWEN3_235B_A22B: dict[str, Any] = {
    **QWEN3_30B_A3B,
    "num_hidden_layers": 94,
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
}
# mistralai/Mixtral-8x7B-v0.1 config.json (GQA + MoE).
MIXTRAL_8X7B: dict[str, Any] = {
    "model_type": "mixtral",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# openai/gpt-oss-120b config.json (GQA + MoE, MXFP4 experts, biases, sinks).
GPT_OSS_120B: dict[str, Any] = {
    "model_type": "gpt_oss",
    "num_hidden_layers": 36,
    "hidden_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 2880,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "vocab_size": 201088,
    "max_position_embeddings": 131072,
    "attention_bias": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4"},
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}
GPT_OSS_20B: dict[str, Any] = {
    **GPT_OSS_120B,
    "num_hidden_layers": 24,
    "num_local_experts": 32,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
}

# (config, catalogue name, published total, published active, significant figures printed).
# Active counts include the input embedding except for gpt-oss, whose card leaves it out.
PUBLISHED = [
    (LLAMA_31_70B, "Llama-3.1-70B", 70.6e9, 70.6e9, True),  # HF: 70.6B
    (QWEN3_8B, "Qwen3-8B", 8.2e9, 8.2e9, True),  # HF card: 8.2B
    (DEEPSEEK_V3, "DeepSeek-V3", 671e9, 37e9, True),  # DeepSeek-V3 report: 671B / 37B
    (QWEN3_30B_A3B, "Qwen3-30B-A3B", 30.5e9, 3.3e9, True),  # HF card: 30.5B / 3.3B
    (QWEN3_235B_A22B, "Qwen3-235B-A22B", 235e9, 22e9, True),  # HF card: 235B / 22B
    (MIXTRAL_8X7B, "Mixtral-8x7B", 46.7e9, 12.9e9, True),  # Mistral: 46.7B / 12.9B
    (GPT_OSS_120B, "gpt-oss-120b", 116.83e9, 5.13e9, False),  # OpenAI card: 116.83B / 5.13B
    (GPT_OSS_20B, "gpt-oss-20b", 20.91e9, 3.61e9, False),  # OpenAI card: 20.91B / 3.61B
]  # fmt: skip


def _published_precision(value: float) -> float:
    """Half a unit of the last printed digit of ``value`` (e.g. 3.3e9 -> 0.05e9)."""
    text = f"{value / 1e9:g}"
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** (9 - decimals)


@pytest.mark.parametrize(("config", "name", "total", "active", "with_embedding"), PUBLISHED)
def test_parameter_counts_match_published_figures(
    config: dict[str, Any], name: str, total: float, active: float, with_embedding: bool
) -> None:
    spec = from_hf_config(config, name=name)
    # Exact to the published figure: the count rounds to it at the printed precision (Qwen's
    # 3.35B is printed "3.3B", truncated, hence <= one unit rather than half).
    assert abs(param_count(spec) - total) <= _published_precision(total)
    counted = active_param_count(spec, include_embedding=with_embedding)
    assert abs(counted - active) <= 2 * _published_precision(active)


@pytest.mark.parametrize(("config", "name", "total", "active", "with_embedding"), PUBLISHED)
def test_catalogue_rows_equal_their_configs(
    config: dict[str, Any], name: str, total: float, active: float, with_embedding: bool
) -> None:
    assert from_hf_config(config, name=name) == MODELS[name]


def test_exact_counts() -> None:
    # DeepSeek-V3 main model without the 14B MTP module: 671,026,419,200 (the figure vLLM and
    # the safetensors index give for the non-MTP tensors).
    assert param_count(get_model("DeepSeek-V3")) == 671_026_419_200
    assert param_count(from_hf_config(LLAMA_2_7B)) == 6_738_415_616  # HF, Llama-2-7b-hf
    # Qwen3-8B card: 6.95B non-embedding.
    qwen = get_model("Qwen3-8B")
    non_embedding = param_count(qwen) - 2 * qwen.vocab_size * qwen.hidden_size
    assert round(non_embedding / 1e9, 2) == 6.95


@pytest.mark.parametrize(
    ("config", "kv_bytes"),
    [
        (LLAMA_2_7B, 524_288),  # MHA: 2·32·32·128·2 B (0.5 MiB per token)
        (LLAMA_31_70B, 327_680),  # GQA: 2·80·8·128·2 B = 320 KiB per token
        # MLA: DeepSeek-V2 paper Table 1, (d_c + d_h^R)·l = (512 + 64)·61 elements, BF16 KV.
        (DEEPSEEK_V3, 576 * 61 * 2),
        (MIXTRAL_8X7B, 131_072),  # MoE with GQA: 2·32·8·128·2 B
    ],
)
def test_kv_bytes_per_token_match_published(config: dict[str, Any], kv_bytes: int) -> None:
    spec = from_hf_config(config)
    assert spec.kv_bytes_per_token == kv_bytes == kv_bytes_per_token(spec)


def test_mla_kv_is_replicated_not_split_by_tp() -> None:
    spec = get_model("DeepSeek-V3")
    assert kv_bytes_per_token(spec, tp=8) == spec.kv_bytes_per_token
    # versus MHA with the same 128 heads of 128+64 keys and 128 values: ~70x more.
    assert 61 * 128 * (192 + 128) * 2 / spec.kv_bytes_per_token > 70


def test_max_context_from_config() -> None:
    assert from_hf_config(DEEPSEEK_V3).max_context_tokens == 163840
    assert from_hf_config(LLAMA_31_70B).max_context_tokens == 131072
    assert all(m.max_context_tokens for m in MODELS.values())


def test_from_hf_config_reads_a_file_and_a_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_8B, "_name_or_path": "q/q3"}))
    assert from_hf_config(tmp_path).name == "q/q3"
    assert from_hf_config(tmp_path / "config.json") == from_hf_config(tmp_path)


def test_model_spec_from_hf_config_is_the_module_function(tmp_path: Path) -> None:
    # The classmethod the README and the issue name delegates to the module-level reader.
    assert ModelSpec.from_hf_config(MIXTRAL_8X7B, name="Mixtral-8x7B") == MODELS["Mixtral-8x7B"]
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    assert ModelSpec.from_hf_config(tmp_path) == from_hf_config(tmp_path)
    assert ModelSpec.from_hf_config(tmp_path, "mine").name == "mine"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({k: v for k, v in QWEN3_8B.items() if k != "hidden_size"}, "field 'hidden_size'"),
        ({**QWEN3_8B, "num_hidden_layers": "36"}, "num_hidden_layers='36' must be an integer"),
        ({**QWEN3_30B_A3B, "decoder_sparse_step": 2}, "decoder_sparse_step=2"),
        ({**QWEN3_8B, "quantization_config": {"quant_method": "bitnet"}}, "bitnet"),
        ({**QWEN3_8B, "num_key_value_heads": 5}, "num_kv_heads"),
    ],
)
def test_bad_configs_raise_input_errors(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        from_hf_config(config)


def test_missing_or_bad_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        from_hf_config(tmp_path / "nope.json")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not a readable JSON"):
        from_hf_config(tmp_path)


def test_precision_changes_weights_and_kv_separately() -> None:
    base = get_model("Llama-3.1-70B")
    fp8 = get_model("Llama-3.1-70B@fp8")
    assert fp8.name == "Llama-3.1-70B@fp8/bfloat16"
    # The layers halve; the embedding and LM head stay 16-bit (vLLM keeps them unquantized).
    embeddings = 2 * base.vocab_size * base.hidden_size
    assert weight_bytes(fp8) == pytest.approx(
        (weight_bytes(base) - 2 * embeddings) / 2 + 2 * embeddings
    )
    assert fp8.kv_bytes_per_token == base.kv_bytes_per_token
    both = get_model("llama-3.1-70b@fp8/fp8")
    assert both.kv_bytes_per_token == base.kv_bytes_per_token // 2
    int4 = get_model("Llama-3.1-70B@int4/int8")
    assert weight_bytes(int4) == pytest.approx(
        (param_count(base) - embeddings) * 0.5 + 2 * embeddings
    )
    assert int4.kv_bytes_per_token == base.kv_bytes_per_token // 2
    assert get_model(both.name) == both  # the name reads back
    assert with_precision(base, kv_dtype="fp8") == get_model("Llama-3.1-70B@/fp8")


def test_unknown_dtype_is_a_parameter_error() -> None:
    with pytest.raises(ParameterError, match="'weight_dtype' parameter of with_precision"):
        get_model("Qwen3-8B@fp6")


def test_quantized_checkpoint_defaults_to_bf16_kv() -> None:
    spec = get_model("DeepSeek-V3")  # FP8 weights, KV as vLLM's kv_cache_dtype="auto"
    assert (spec.dtype, spec.kv_dtype) == ("fp8", "bfloat16")
    # FP8 layers, BF16 embedding and LM head (as the checkpoint stores them): 671.03e9 + 1.85e9.
    embeddings = 2 * spec.vocab_size * spec.hidden_size
    assert weight_bytes(spec) == pytest.approx(param_count(spec) + embeddings)


def test_gpt_oss_experts_are_mxfp4() -> None:
    spec = get_model("gpt-oss-120b")
    # The published checkpoint is about 65 GB: MXFP4 experts, BF16 attention and embeddings.
    assert 60e9 < weight_bytes(spec) < 66e9


def test_moe_flops_from_active_memory_from_total() -> None:
    spec = get_model("Qwen3-30B-A3B")
    cost = prefill_cost(spec, 1000)
    non_embedding_active = active_param_count(spec, include_embedding=False)
    lm_head = spec.vocab_size * spec.hidden_size
    norms = (2 * spec.num_layers + 1) * spec.hidden_size + 2 * spec.num_layers * spec.head_dim
    assert cost.gemm_flops == pytest.approx(2 * (non_embedding_active - lm_head - norms) * 1000)
    assert weight_bytes(spec) == pytest.approx(param_count(spec) * 2)


def test_decode_reads_only_the_experts_touched() -> None:
    spec = get_model("DeepSeek-V3")
    one, many = decode_step_cost(spec, 1, 1000), decode_step_cost(spec, 256, 256_000)
    # batch 1 reads ~8 of 256 experts per layer; batch 256 nearly all of them.
    assert expected_experts_touched(spec, 1) == pytest.approx(8)
    assert expected_experts_touched(spec, 256) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 256))
    assert one.weight_bytes < 0.1 * weight_bytes(spec) < many.weight_bytes
    assert many.weight_bytes <= weight_bytes(spec)


# EleutherAI/pythia-1.4b config.json: GPT-NeoX, a two-matrix GELU MLP (no gate), MHA.
PYTHIA_1_4B: dict[str, Any] = {
    "model_type": "gpt_neox", "num_hidden_layers": 24, "hidden_size": 2048,
    "num_attention_heads": 16, "intermediate_size": 8192, "vocab_size": 50304,
    "tie_word_embeddings": False, "max_position_embeddings": 2048, "torch_dtype": "float16",
    "rotary_pct": 0.25,
}  # fmt: skip


def test_an_ungated_mlp_is_counted_with_two_matrices() -> None:
    spec = from_hf_config(PYTHIA_1_4B)
    assert not spec.gated_mlp
    # Pythia's card: 1,414,647,808 parameters; pdopt leaves out the linear layers' and the
    # LayerNorms' biases (0.04%). Read as gated it would count 805M more.
    assert param_count(spec) == pytest.approx(1_414_647_808, rel=5e-4)
    assert from_hf_config(LLAMA_31_70B).gated_mlp


def test_a_multimodal_config_reads_its_language_model() -> None:
    # the shape of mistralai/Mistral-Small-3.1-24B's config.json: the LLM under text_config,
    # quantization and dtype at the top
    text = {
        "model_type": "mistral", "num_hidden_layers": 40, "hidden_size": 5120,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 32768, "vocab_size": 131072, "max_position_embeddings": 131072,
    }  # fmt: skip
    nested = {
        "model_type": "mistral3", "text_config": text, "torch_dtype": "bfloat16",
        "vision_config": {"model_type": "pixtral", "num_hidden_layers": 24},
        "quantization_config": {"quant_method": "fp8"},
    }  # fmt: skip
    spec = from_hf_config(nested, name="m")
    assert spec == from_hf_config({**text, "quantization_config": {"quant_method": "fp8"}}, "m")
    assert spec.num_layers == 40 and spec.dtype == "fp8"
    # Transformers fills a sparse text_config from its class defaults; pdopt asks for them
    with pytest.raises(InputError, match="field 'vocab_size' is missing; add it"):
        from_hf_config({"text_config": {k: v for k, v in text.items() if k != "vocab_size"}})


def test_gemma_ties_its_embeddings_when_the_config_omits_the_key() -> None:
    gemma = {**LLAMA_31_70B, "model_type": "gemma3_text"}
    del gemma["tie_word_embeddings"]
    assert from_hf_config(gemma).tied_embeddings
    assert not from_hf_config({**gemma, "model_type": "llama"}).tied_embeddings


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"attention_chunk_size": 8192}, "chunked attention"),  # Llama-4
        ({"hybrid_override_pattern": "M-M-M*-"}, "state-space"),  # Nemotron-H
        ({"attn_layer_period": 8, "attn_layer_offset": 4}, "Jamba"),
        ({"linear_num_key_heads": 16, "full_attention_interval": 4}, "linear-attention"),
        ({"interleave_moe_layer_step": 2}, "interleave_moe_layer_step=2"),  # Llama-4 Maverick
    ],
)
def test_layers_pdopt_does_not_model_are_refused_by_name(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        from_hf_config({**QWEN3_8B, **extra})


# weights group of llm-compressor's compressed-tensors quantization_config
def _compressed(bits: int, kind: str, kv: dict[str, Any] | None = None) -> dict[str, Any]:
    weights = {"num_bits": bits, "type": kind, "strategy": "channel", "symmetric": True}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": None}
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": kv,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("quantization", "dtype", "kv_dtype"),
    [
        ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, "fp8", "bfloat16"),
        (_compressed(8, "float"), "fp8", "bfloat16"),
        (_compressed(8, "float", {"num_bits": 8, "type": "float"}), "fp8", "fp8"),
        (_compressed(4, "int"), "int4", "bfloat16"),
        (_compressed(8, "int"), "int8", "bfloat16"),
        ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
         "fp8", "fp8"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4", "bfloat16"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4", "bfloat16"),
    ],
)  # fmt: skip
def test_quantization_formats_set_weight_and_kv_dtypes(
    quantization: dict[str, Any], dtype: str, kv_dtype: str
) -> None:
    spec = from_hf_config({**LLAMA_31_70B, "quantization_config": quantization})
    assert (spec.dtype, spec.kv_dtype) == (dtype, kv_dtype)


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        (_compressed(4, "float"), "num_bits=4 type='float'"),  # NVFP4
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "quant_algo='NVFP4'"),
        ({**_compressed(8, "float"), "config_groups": {}}, "no config_groups"),
    ],
)
def test_unmodelled_quantization_says_how_to_give_the_precision(
    quantization: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message) as info:
        from_hf_config({**LLAMA_31_70B, "quantization_config": quantization})
    assert "config.json@fp8" in str(info.value) or "config_groups" in message
