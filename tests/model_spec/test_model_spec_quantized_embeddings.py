"""Quantized checkpoints keep the input embedding and the LM head at 16 bits.

vLLM quantizes the linear layers only: ``VocabParallelEmbedding`` and the LM head stay at the
activation dtype for FP8 (``fp8``, ``fbgemm_fp8``, compressed-tensors, ModelOpt), AWQ/GPTQ,
INT8 and bitsandbytes; DeepSeek-V3's FP8 checkpoint stores them in BF16.
"""

from __future__ import annotations

import pytest

from pdopt.model_spec import get_model, param_count, weight_bytes
from pdopt.model_spec._params import embedding_dtype_bytes, embedding_params


def test_llama_31_8b_fp8_and_int4_weight_bytes() -> None:
    # Llama-3.1-8B: 8.03e9 parameters, of which 2 x 128256 x 4096 = 1.05e9 embedding + LM head.
    # FP8: 6.98e9 layer bytes + 2.10e9 BF16 = 9.08 GB (neuralmagic's FP8 checkpoint: ~9.1 GB).
    assert weight_bytes(get_model("Llama-3.1-8B@fp8")) / 1e9 == pytest.approx(9.08, abs=0.01)
    # INT4 (W4A16): 3.49e9 + 2.10e9 = 5.59 GB (AWQ/GPTQ INT4 checkpoints: 5.4-5.7 GB).
    assert 5.4e9 < weight_bytes(get_model("Llama-3.1-8B@int4")) < 5.7e9


@pytest.mark.parametrize("dtype", ["fp8", "int8", "int4"])
def test_every_quantized_dtype_keeps_16_bit_embeddings(dtype: str) -> None:
    base = get_model("Qwen3-8B")
    spec = get_model(f"Qwen3-8B@{dtype}")
    assert embedding_dtype_bytes(spec) == 2.0
    embeddings = embedding_params(spec)
    layers = (param_count(spec) - embeddings) * spec.dtype_bytes
    assert weight_bytes(spec, tp=2) == pytest.approx((layers + 2.0 * embeddings) / 2)
    assert weight_bytes(spec) < weight_bytes(base)


def test_16_and_32_bit_models_are_unchanged() -> None:
    for name in ("Llama-3.1-8B", "Llama-2-7B", "Llama-3.1-8B@fp32"):
        spec = get_model(name)
        assert weight_bytes(spec) == pytest.approx(param_count(spec) * spec.dtype_bytes)
