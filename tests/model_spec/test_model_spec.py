"""Model catalogue and derived sizes, checked against published numbers and closed forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdopt.errors import ConfigError, ParameterError
from pdopt.hardware import get_gpu
from pdopt.model_spec import (
    MODELS,
    ModelSpec,
    decode_step_bytes,
    decode_step_cost,
    decode_step_flops,
    gemm_param_count,
    get_model,
    kv_bytes_per_token,
    kv_capacity_blocks,
    kv_capacity_tokens,
    param_count,
    prefill_cost,
    prefill_flop_coefficients,
    prefill_flops,
    weight_bytes,
)

# Published sizes (model cards / papers), parameters.
PUBLISHED = {
    "Qwen2.5-7B": 7.61e9,
    "Llama-2-7B": 6.74e9,
    "Llama-3-8B": 8.03e9,
    "Llama-30B": 32.5e9,
    "CodeLlama-34B": 33.7e9,
    "Qwen2-72B": 72.7e9,
    "Llama-2-70B": 6.9e10,
    "Llama-3-70B": 70.6e9,
}


@pytest.mark.parametrize(("name", "published"), PUBLISHED.items())
def test_param_count_matches_published_size(name: str, published: float) -> None:
    assert param_count(get_model(name)) == pytest.approx(published, rel=0.01)


def test_param_count_exact_for_llama_2_7b() -> None:
    # Hugging Face reports 6,738,415,616 parameters for meta-llama/Llama-2-7b-hf.
    assert param_count(get_model("Llama-2-7B")) == 6_738_415_616


def test_qwen_biases_are_counted() -> None:
    qwen = get_model("Qwen2.5-7B")
    without = ModelSpec(**{**_fields(qwen), "qkv_bias": False})
    biases = qwen.num_layers * qwen.head_dim * (qwen.num_heads + 2 * qwen.num_kv_heads)
    assert param_count(qwen) - param_count(without) == biases


def _fields(model: ModelSpec) -> dict[str, object]:
    return {name: getattr(model, name) for name in model.__slots__}


def test_tied_embeddings_drop_the_lm_head() -> None:
    llama = get_model("Llama-2-7B")
    tied = ModelSpec(**{**_fields(llama), "tied_embeddings": True})
    assert param_count(llama) - param_count(tied) == llama.vocab_size * llama.hidden_size


@pytest.mark.parametrize(
    ("name", "kv_bytes"),
    [("Llama-2-7B", 524_288), ("Llama-3-8B", 131_072), ("Qwen2.5-7B", 57_344)],
)
def test_kv_bytes_per_token(name: str, kv_bytes: int) -> None:
    model = get_model(name)
    assert model.kv_bytes_per_token == kv_bytes
    assert kv_bytes_per_token(model) == kv_bytes


def test_kv_bytes_per_token_under_tp_splits_then_replicates() -> None:
    llama3 = get_model("Llama-3-8B")  # 8 KV heads
    assert kv_bytes_per_token(llama3, tp=2) == 131_072 // 2
    assert kv_bytes_per_token(llama3, tp=8) == 131_072 // 8
    qwen = get_model("Qwen2.5-7B")  # 4 KV heads, 28 query heads: tp=4 splits, tp=7 is invalid
    assert kv_bytes_per_token(qwen, tp=4) == 57_344 // 4
    with pytest.raises(ParameterError, match="'tp' parameter of kv_bytes_per_token"):
        kv_bytes_per_token(qwen, tp=3)


@pytest.mark.parametrize("alias", ["LLAMA-3-8B", "llama-3-8b", "meta-llama/Meta-Llama-3-8B"])
def test_get_model_aliases(alias: str) -> None:
    assert get_model(alias) is MODELS["Llama-3-8B"]


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(ParameterError) as info:
        get_model("GPT-5")
    assert str(info.value).startswith(
        f"unknown model 'GPT-5': expected one of {sorted(MODELS)} (optionally followed by "
        "@WEIGHTS[/KV], e.g. @fp8/fp8), a model spec file"
    )


def test_gqa_and_mha_shapes() -> None:
    assert get_model("Llama-30B").num_kv_heads == get_model("Llama-30B").num_heads == 52
    assert get_model("CodeLlama-34B").num_kv_heads == 8
    assert all(MODELS[name].head_dim == 128 for name in PUBLISHED)


def test_weight_bytes_divides_by_tp() -> None:
    model = get_model("Qwen2-72B")
    assert weight_bytes(model) == param_count(model) * 2
    assert weight_bytes(model, tp=4) == pytest.approx(param_count(model) * 2 / 4)


def test_kv_capacity_arithmetic() -> None:
    """Tokens and blocks follow the terms; the previous default (a fixed 1 GiB reserve) is
    ``activation_bytes=2**30``. The published-number cases are in test_kv_capacity.py."""
    gpu, model = get_gpu("A100-80GB"), get_model("Llama-2-7B")
    free = 80 * 2**30 * 0.9 - param_count(model) * 2 - 2**30
    tokens = kv_capacity_tokens(gpu, model, activation_bytes=2**30)
    assert tokens == int(free // 524_288)
    assert kv_capacity_blocks(gpu, model, activation_bytes=2**30) == tokens // 16
    assert kv_capacity_blocks(gpu, model, activation_bytes=2**30, block_tokens=32) == tokens // 32
    no_reserve = kv_capacity_tokens(gpu, model, activation_bytes=0)
    assert no_reserve == int((free + 2**30) // 524_288)


def test_kv_capacity_with_tp_counts_per_gpu_shares() -> None:
    gpu, model = get_gpu("A800-80GB"), get_model("Qwen2-72B")
    free = 80 * 2**30 * 0.9 - param_count(model) * 2 / 4 - 2**30
    tokens = kv_capacity_tokens(gpu, model, tp=4, activation_bytes=2**30)
    assert tokens == int(free // (327_680 / 4))


def test_weights_that_do_not_fit_raise_config_error() -> None:
    with pytest.raises(ConfigError, match=r"Llama-2-70B at tp=1 does not fit on V100-32GB"):
        kv_capacity_tokens(get_gpu("V100-32GB"), get_model("Llama-2-70B"))


def test_kv_capacity_rejects_bad_utilization() -> None:
    with pytest.raises(ParameterError, match="'memory_utilization' parameter"):
        kv_capacity_tokens(get_gpu("H100"), get_model("Llama-3-8B"), memory_utilization=1.5)


def test_prefill_flops_are_quadratic_plus_linear() -> None:
    model = get_model("Llama-2-7B")
    alpha, beta = prefill_flop_coefficients(model)
    assert alpha == 2 * 128 * 32 * 32
    assert beta == 2 * gemm_param_count(model) + alpha
    lm_head = 2 * model.vocab_size * model.hidden_size
    for length in (1, 128, 4096):
        expected = alpha * length**2 + beta * length + lm_head
        assert prefill_flops(model, length) == pytest.approx(expected, rel=1e-12)


def test_prefill_linear_part_is_two_flop_per_nonembedding_parameter() -> None:
    model = get_model("Llama-3-8B")
    nonembedding = param_count(model) - 2 * model.vocab_size * model.hidden_size
    # gemm params exclude only the norm weights (2·hidden per layer + final norm).
    norms = (2 * model.num_layers + 1) * model.hidden_size
    assert gemm_param_count(model) == nonembedding - norms
    assert prefill_cost(model, 1000).gemm_flops == 2 * gemm_param_count(model) * 1000


def test_prefill_batch_scales_linearly() -> None:
    model = get_model("Qwen2.5-7B")
    assert prefill_flops(model, 512, batch_size=4) == pytest.approx(4 * prefill_flops(model, 512))


def test_tp_divides_flops() -> None:
    model = get_model("Llama-2-70B")
    assert prefill_flops(model, 2048, tp=4) == pytest.approx(prefill_flops(model, 2048) / 4)
    one, four = decode_step_cost(model, 8, 8000), decode_step_cost(model, 8, 8000, tp=4)
    assert four.flops == pytest.approx(one.flops / 4)
    assert four.weight_bytes == pytest.approx(one.weight_bytes / 4)


def test_decode_step_closed_form() -> None:
    model = get_model("Llama-3-8B")
    batch, context = 16, 16 * 1024
    cost = decode_step_cost(model, batch, context)
    attention = 4 * 128 * 32 * 32 * context
    assert cost.attention_flops == attention
    lm_head = model.vocab_size * model.hidden_size
    assert decode_step_flops(model, batch, context) == pytest.approx(
        2 * (gemm_param_count(model) + lm_head) * batch + attention
    )
    weights = (gemm_param_count(model) + lm_head) * 2
    assert decode_step_bytes(model, batch, context) == weights + 131_072 * (context + batch)


@given(
    batch=st.integers(1, 256),
    context=st.integers(1, 8192),
    extra=st.integers(1, 4096),
)
def test_decode_cost_monotone(batch: int, context: int, extra: int) -> None:
    model = get_model("Qwen2.5-7B")
    total = batch * context
    base = decode_step_cost(model, batch, total)
    more_context = decode_step_cost(model, batch, total + extra)
    assert more_context.flops > base.flops and more_context.bytes > base.bytes
    more_batch = decode_step_cost(model, batch + 1, total + context)
    assert more_batch.flops > base.flops


def test_model_spec_validates_shape() -> None:
    with pytest.raises(ParameterError, match="'num_kv_heads' parameter of ModelSpec"):
        ModelSpec("bad", 2, 64, 8, 3, 128, 100)
    with pytest.raises(ParameterError, match="'dtype' parameter of ModelSpec"):
        ModelSpec("bad", 2, 64, 8, 8, 128, 100, dtype="float64")
