"""What the harness writes and what reads it back agree on, without torch: the layer's weight
GEMM shapes and the columns of the mixed-batch CSV (``profile_gpu --mixed``)."""

from __future__ import annotations

from pdopt.model_spec import ModelSpec

MIXED_COLUMNS: tuple[str, ...] = (
    "batch_size",
    "context_tokens",
    "chunk_tokens",
    "latency_s",
    "decode_only_s",
    "prefill_only_s",
    "ratio",
    "modes",
)
"""Columns of the mixed-batch CSV: the fused pass (``B`` decodes at ``context_tokens`` each
plus one chunk), the decode-only step ``(B, C)`` and the chunk's prefill ``(1, P)`` timed beside
it, ``ratio = latency_s / (decode_only_s + prefill_only_s)``, and how each of the three ran
(``fused/decode/prefill``, each ``graph`` or ``eager``)."""


def layer_weight_shapes(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """The layer's weight GEMMs ``(n outputs, k inputs)``: QKV, output, gate/up, down."""
    hidden, hd = spec.hidden_size, spec.head_dim
    return (
        ((spec.num_heads + 2 * spec.num_kv_heads) * hd, hidden),
        (hidden, spec.num_heads * hd),
        (2 * spec.intermediate_size, hidden),
        (hidden, spec.intermediate_size),
    )
