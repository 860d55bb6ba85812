"""KV capacity (vLLM's accounting): every term pinned against a hand computation from the
published model configs (Llama 2 paper, Table 1 / the Hugging Face config.json files) and the
A100-80GB data sheet, written out here without pdopt's parameter counter."""

from __future__ import annotations

import pytest

from pdopt.errors import ConfigError, ParameterError
from pdopt.hardware import get_gpu
from pdopt.model_spec import (
    activation_peak_bytes,
    get_model,
    kv_capacity,
    kv_capacity_blocks,
    kv_capacity_tokens,
)

A100_BYTES = 80 * 2**30  # A100-SXM4-80GB: 81920 MiB
USABLE = A100_BYTES * 0.9  # vLLM's default gpu_memory_utilization
T, S = 8192, 256  # profiling pass: max_batch_tokens, max_running (vLLM: max_num_seqs)


def _llama_params(hidden: int, layers: int, heads: int, kv_heads: int, inter: int) -> int:
    """Llama-family parameter count from the published shape (head_dim 128, vocab 32000, untied
    embedding and LM head, two RMSNorms per layer plus the final one)."""
    head_dim, vocab = 128, 32_000
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o, k, v
    mlp = 3 * hidden * inter  # gate, up, down
    return 2 * vocab * hidden + layers * (attention + mlp + 2 * hidden) + hidden


def test_llama_2_70b_tp2_on_a100() -> None:
    # Llama-2-70B: hidden 8192, 80 layers, 64 heads, 8 KV heads, intermediate 28672, fp16.
    params = _llama_params(8192, 80, 64, 8, 28_672)
    assert params == 68_976_648_192  # "70B"
    weights = params * 2 / 2  # fp16, every weight (embeddings and LM head too) split 2 ways
    # Per GPU at TP2: 32 query heads, 4 KV heads, 14336 MLP columns.
    width = 2 * 8192 + max((32 + 4) * (128 + 128), 3 * 28_672 // 2)
    activations = T * 2 * width + S * 32_000 * 4
    assert activations == 1_005_846_528  # 0.94 GiB
    per_token = 2 * 80 * 4 * 128 * 2  # K and V, 80 layers, 4 KV heads per GPU, fp16
    kv = USABLE - weights - activations
    terms = kv_capacity(get_gpu("A100-80GB"), get_model("Llama-2-70B"), tp=2)
    assert terms.memory_bytes == A100_BYTES
    assert terms.weight_bytes == weights
    assert terms.activation_bytes == activations
    assert terms.bytes_per_token == per_token
    assert terms.kv_bytes == pytest.approx(kv, abs=1.0)
    assert terms.blocks == int(kv // (16 * per_token)) == 2794
    # The previous default (a fixed 1 GiB instead of the activation peak) gave 2769 blocks.
    old = kv_capacity_blocks(get_gpu("A100-80GB"), get_model("Llama-2-70B"), 2, 0.9, 2**30)
    assert old == int((USABLE - weights - 2**30) // (16 * per_token)) == 2769


def test_llama_2_7b_tp1_on_a100() -> None:
    # Llama-2-7B: hidden 4096, 32 layers, 32 heads (no GQA), intermediate 11008, fp16.
    params = _llama_params(4096, 32, 32, 32, 11_008)
    assert params == 6_738_415_616  # "7B"
    width = 2 * 4096 + max((32 + 32) * (128 + 128), 3 * 11_008)
    activations = T * 2 * width + S * 32_000 * 4
    per_token = 2 * 32 * 32 * 128 * 2
    kv = USABLE - params * 2 - activations
    terms = kv_capacity(get_gpu("A100-80GB"), get_model("Llama-2-7B"))
    assert (terms.weight_bytes, terms.activation_bytes) == (params * 2, activations)
    assert (
        terms.tokens
        == int(kv // per_token)
        == kv_capacity_tokens(get_gpu("A100-80GB"), get_model("Llama-2-7B"))
    )
    assert terms.blocks == int(kv // (16 * per_token)) == 7525
    assert terms.describe() == (
        "KV per worker: 80 GiB × 0.90 − 12.55 GiB weights − 0.66 GiB activations = 58.79 GiB "
        "= 7525 blocks of 16 tokens"
    )


def test_terms_are_settable() -> None:
    gpu, model = get_gpu("A100-80GB"), get_model("Llama-2-7B")
    base = kv_capacity(gpu, model)
    half = kv_capacity(gpu, model, memory_utilization=0.45)
    assert half.kv_bytes == pytest.approx(base.kv_bytes - A100_BYTES * 0.45)
    assert kv_capacity(gpu, model, block_tokens=32).blocks == base.tokens // 32
    assert kv_capacity(gpu, model, activation_bytes=0).activation_bytes == 0
    small = kv_capacity(gpu, model, batched_tokens=2048, max_seqs=16)
    assert small.activation_bytes == 2048 * 2 * (2 * 4096 + 3 * 11_008) + 16 * 32_000 * 4
    table = base.to_dict()
    assert table["blocks"] == base.blocks and table["kv_bytes"] == base.kv_bytes


def test_activation_peak_grows_with_tokens_and_shrinks_with_tp() -> None:
    model = get_model("Llama-3-70B")
    peaks = [activation_peak_bytes(model, 1, t) for t in (512, 2048, 8192)]
    assert peaks == sorted(peaks)
    assert activation_peak_bytes(model, 4) < activation_peak_bytes(model, 1)


@pytest.mark.parametrize("name", ["Mixtral-8x7B", "DeepSeek-V3"])
def test_activation_peak_of_moe_and_mla_models_is_finite_and_positive(name: str) -> None:
    peak = activation_peak_bytes(get_model(name), 8)
    assert 0 < peak < 16 * 2**30


def test_bad_terms_raise() -> None:
    gpu, model = get_gpu("A100-80GB"), get_model("Llama-2-7B")
    with pytest.raises(ParameterError, match="'memory_utilization' parameter"):
        kv_capacity(gpu, model, memory_utilization=1.5)
    with pytest.raises(ParameterError, match="'activation_bytes' parameter"):
        kv_capacity(gpu, model, activation_bytes=-1.0)
    with pytest.raises(ParameterError, match="'block_tokens' parameter"):
        kv_capacity(gpu, model, block_tokens=0)
    with pytest.raises(ConfigError, match="no room is left for one KV block"):
        kv_capacity(gpu, model, activation_bytes=70 * 2**30)
