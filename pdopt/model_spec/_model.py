"""Transformer model configurations (from public config files) and what follows from them."""

from __future__ import annotations

from dataclasses import dataclass

from pdopt._validation import check_int_at_least, check_one_of, param_error

DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape.

    ``head_dim`` defaults to ``hidden_size // num_heads``; ``num_kv_heads < num_heads`` is GQA.
    ``gated_mlp`` is a SwiGLU MLP (gate, up and down projections; two otherwise);
    ``tied_embeddings`` shares the input embedding with the LM head; ``qkv_bias`` adds biases to
    the Q, K and V projections (Qwen2 / Qwen2.5). ``max_context_tokens`` is the context window
    (prompt plus output tokens; ``max_position_embeddings`` of the public config), 0 when unknown.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "float16"
    head_dim: int = 0
    gated_mlp: bool = True
    tied_embeddings: bool = False
    qkv_bias: bool = False
    max_context_tokens: int = 0

    def __post_init__(self) -> None:
        for field_name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "vocab_size",
        ):
            check_int_at_least(getattr(self, field_name), 1, field_name, "ModelSpec")
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        check_int_at_least(self.head_dim, 1, "head_dim", "ModelSpec")
        check_one_of(self.dtype, DTYPE_BYTES, "dtype", "ModelSpec")
        if self.max_context_tokens < 0:
            raise param_error("max_context_tokens", "ModelSpec", ">= 0", self.max_context_tokens)
        if self.num_heads % self.num_kv_heads != 0:
            raise param_error(
                "num_kv_heads",
                "ModelSpec",
                f"a divisor of num_heads={self.num_heads}",
                self.num_kv_heads,
            )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token: 2 · layers · kv_heads · head_dim · dtype_bytes (DESIGN.md)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes
