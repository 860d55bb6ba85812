"""Transformer model configurations (from public config files) and what follows from them."""

from __future__ import annotations

from dataclasses import dataclass

from pdopt._validation import check_int_at_least

DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape.

    ``head_dim`` defaults to ``hidden_size // num_heads``; ``num_kv_heads < num_heads`` is GQA.
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

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token: 2 · layers · kv_heads · head_dim · dtype_bytes (DESIGN.md)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes
