"""Sliding-window attention: KV per request, config reading, validation, roofline costs.

Ground truth: hand computations from the public configs (gpt-oss-120b: 36 layers, 18 of them
``sliding_attention`` with ``sliding_window`` 128, 8 KV heads of 64, bf16 KV; Mistral-7B-v0.1:
every layer with ``sliding_window`` 4096) and a brute-force count of attended key positions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from pdopt.errors import InputError, ParameterError
from pdopt.model_spec import (
    MODELS,
    ModelSpec,
    SlidingWindow,
    decode_step_cost,
    from_hf_config,
    gemm_param_count,
    get_model,
    kv_bytes_per_token,
    prefill_cost,
    prefill_flop_coefficients,
)

# per layer and token: K and V (2) × 8 KV heads × head_dim 64 × 2 bytes (bf16)
GPT_OSS_LAYER_TOKEN_BYTES = 2 * 8 * 64 * 2

# openai/gpt-oss-20b config.json, the fields that matter here.
GPT_OSS_LIKE: dict[str, Any] = {
    "model_type": "gpt_oss",
    "num_hidden_layers": 24,
    "hidden_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 2880,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "vocab_size": 201088,
    "max_position_embeddings": 131072,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
}
# mistralai/Mistral-7B-v0.1 config.json (no layer_types: the window applies to every layer).
MISTRAL_LIKE: dict[str, Any] = {
    "model_type": "mistral",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
}


def test_gpt_oss_120b_kv_bytes_at_128_and_8192_tokens_match_a_hand_computation() -> None:
    model = get_model("gpt-oss-120b")
    assert (model.sliding_window_tokens, model.sliding_window_layers) == (128, 18)
    # At L = W every layer holds every token: 36 layers.
    assert model.kv_bytes_for_context(128) == 36 * GPT_OSS_LAYER_TOKEN_BYTES * 128 == 9_437_184
    # At L = 8192: 18 full layers hold 8192 tokens, 18 sliding layers 128.
    hand = (18 * 8192 + 18 * 128) * GPT_OSS_LAYER_TOKEN_BYTES
    assert hand == 306_708_480
    assert model.kv_bytes_for_context(8192) == hand
    # Per token: 73,728 B at 128 tokens (unchanged kv_bytes_per_token), 37,440 B at 8192.
    assert model.kv_bytes_per_token == 73_728
    assert model.kv_bytes_for_context(8192) / 8192 == 37_440
    assert model.kv_bytes_per_token_long == 36_864  # the asymptote: full layers only
    assert kv_bytes_per_token(model, tp=1) == model.kv_bytes_per_token


def test_gpt_oss_20b_holds_12_sliding_layers() -> None:
    model = get_model("gpt-oss-20b")
    assert (model.sliding_window_tokens, model.sliding_window_layers) == (128, 12)
    assert model.kv_context_tokens(1000) == (12 * 1000 + 12 * 128) / 24


def test_kv_context_tokens_is_vectorised_and_equal_to_scalar_calls() -> None:
    model = get_model("gpt-oss-120b")
    lengths = np.array([1, 127, 128, 129, 8192, 131072])
    got = model.kv_context_tokens(lengths)
    assert list(got) == [model.kv_context_tokens(int(x)) for x in lengths]
    assert got[0] == 1 and got[2] == 128  # within the window: every token in every layer


@pytest.mark.parametrize("name", [n for n, m in MODELS.items() if not m.has_sliding_window])
def test_full_attention_models_hold_every_context_token(name: str) -> None:
    model = MODELS[name]
    assert model.sliding_window is None
    assert model.kv_context_tokens(8192) == 8192
    assert model.kv_bytes_for_context(8192) == 8192 * model.kv_bytes_per_token
    assert model.kv_bytes_per_token_long == model.kv_bytes_per_token


def test_from_hf_config_reads_gpt_oss_layer_types() -> None:
    spec = from_hf_config(GPT_OSS_LIKE, name="gpt-oss-20b-like")
    assert (spec.sliding_window_tokens, spec.sliding_window_layers) == (128, 12)
    assert spec.kv_bytes_per_token == 24 * GPT_OSS_LAYER_TOKEN_BYTES


def test_from_hf_config_reads_a_mistral_window_on_every_layer() -> None:
    spec = from_hf_config(MISTRAL_LIKE, name="Mistral-7B-v0.1")
    assert (spec.sliding_window_tokens, spec.sliding_window_layers) == (4096, 32)
    # 32 layers × 2 × 8 × 128 × 2 B = 131,072 B per token, up to 4096 tokens held
    assert spec.kv_bytes_for_context(32768) == 4096 * 131_072
    assert spec.kv_bytes_per_token_long == 0.0


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"sliding_window": None}, None),  # Mistral-7B-v0.2 and later: no window
        ({"model_type": "qwen2", "use_sliding_window": False}, None),  # Qwen2/2.5/3 default
        ({"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 32}, None),
        ({"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 20}, 12),
        ({"model_type": "gemma2"}, 16),  # even layers slide
        ({"model_type": "gemma3", "sliding_window_pattern": 6}, 32 - 32 // 6),
        ({"layer_types": ["full_attention"] * 32}, None),
    ],
)
def test_from_hf_config_reads_which_layers_slide(
    extra: dict[str, Any], expected: int | None
) -> None:
    spec = from_hf_config({**MISTRAL_LIKE, **extra})
    if expected is None:
        assert spec.sliding_window is None
    else:
        assert spec.sliding_window == SlidingWindow(4096, expected, 32)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"sliding_window": 0}, "sliding_window=0 must be >= 1"),
        ({"sliding_window": "big"}, "must be an integer"),
        ({"layer_types": ["full_attention"] * 3}, "one attention type per layer"),
        ({"layer_types": ["chunked_attention"] * 32}, "'chunked_attention'] are not modelled"),
    ],
)
def test_from_hf_config_rejects_bad_window_fields_by_name(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        from_hf_config({**MISTRAL_LIKE, **extra})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sliding_window_layers": 2}, "'sliding_window_layers' parameter of ModelSpec must be 0"),
        ({"sliding_window_tokens": 0, "sliding_window_layers": 2}, "'sliding_window_tokens'"),
        ({"sliding_window_tokens": 128, "sliding_window_layers": 0}, r"in 1\.\.num_layers=4"),
        ({"sliding_window_tokens": 128, "sliding_window_layers": 5}, r"in 1\.\.num_layers=4"),
        ({"sliding_window_tokens": 128, "sliding_window_layers": -1}, "an integer >= 0"),
    ],
)
def test_model_spec_rejects_bad_windows(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        ModelSpec("tiny", 4, 256, 4, 4, 512, 1000, **fields)


def _brute_force_keys(layers: int, sliding: int, window: int, length: int) -> int:
    """Key positions attended in a causal prefill of ``length`` tokens, all layers, by loops."""
    full = sum(i for i in range(1, length + 1))
    windowed = sum(min(i, window) for i in range(1, length + 1))
    return (layers - sliding) * full + sliding * windowed


@pytest.mark.parametrize("length", [1, 100, 128, 129, 1000])
def test_prefill_attention_flops_count_the_window(length: int) -> None:
    model = get_model("gpt-oss-120b")
    tp = 2
    per_key = 2.0 * (model.head_dim + model.v_head_dim) * (model.num_heads // tp)
    got = prefill_cost(model, length, batch_size=3, tp=tp).attention_flops
    assert got == pytest.approx(3 * per_key * _brute_force_keys(36, 18, 128, length), rel=1e-12)
    full = replace(model, sliding_window_tokens=None, sliding_window_layers=0)
    alpha, _ = prefill_flop_coefficients(full, tp)  # every layer full: the upper bound
    assert got <= 3 * alpha * (length**2 + length) * (1 + 1e-12)


@pytest.mark.parametrize("length", [1, 50, 127, 128, 129, 1000, 8192])
def test_flop_coefficients_are_the_long_prompt_form(length: int) -> None:
    """alpha·l² + beta·l equals the brute-force FLOPs plus ``a·S·W(W − 1)`` for ``l >= W``
    and plus ``a·S·l(2W − 1 − l)`` (no more) below, ``a = (qk + v)·heads`` one layer's alpha."""
    model = get_model("gpt-oss-120b")
    tp = 2
    a = (model.head_dim + model.v_head_dim) * (model.num_heads // tp)
    alpha, beta = prefill_flop_coefficients(model, tp)
    assert alpha == a * 18  # the 18 full-attention layers only
    assert beta == 2 * gemm_param_count(model, tp) + a * (36 + 18 * 255)
    exact = 2 * gemm_param_count(model, tp) * length + 2 * a * _brute_force_keys(
        36, 18, 128, length
    )
    excess = a * 18 * (128 * 127 if length >= 128 else length * (255 - length))
    assert alpha * length**2 + beta * length - exact == pytest.approx(excess, rel=1e-9)
    assert excess <= a * 18 * 128 * 127


def test_decode_reads_the_windowed_kv() -> None:
    model = get_model("gpt-oss-120b")
    cost = decode_step_cost(model, batch_size=4, total_context_tokens=4 * 8192)
    # four requests of 8192 tokens each hold 4160 tokens' worth in every layer, plus 4 new tokens
    assert cost.kv_bytes == model.kv_bytes_per_token * (4 * 4160 + 4)
    no_window = replace(model, sliding_window_tokens=None, sliding_window_layers=0)
    full = decode_step_cost(no_window, batch_size=4, total_context_tokens=4 * 8192)
    assert cost.attention_flops == pytest.approx(full.attention_flops * 4160 / 8192, rel=1e-12)
    assert cost.gemm_flops == full.gemm_flops and cost.weight_bytes == full.weight_bytes
