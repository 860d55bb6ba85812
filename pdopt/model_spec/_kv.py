"""KV cache capacity of one serving instance, accounted as vLLM does (DESIGN.md "Cost model").

vLLM sizes its paged KV cache once at start-up (``Worker.determine_num_available_blocks``; in
V1 ``determine_available_memory``): it loads the weights, runs one profiling forward pass over
``max_num_batched_tokens`` tokens split into ``max_num_seqs`` sequences, and gives the KV cache
what is left of ``gpu_memory_utilization`` (default 0.9) of the GPU's memory::

    kv_bytes = memory · memory_utilization − weight_bytes − activation_bytes
    blocks   = floor(kv_bytes / (block_tokens · kv_bytes_per_token))

per GPU of a tensor-parallel (TP) group; every GPU holds its share of every token, so an
instance holds ``blocks`` blocks. The terms:

* ``memory``: the GPU's memory (:attr:`pdopt.hardware.GpuSpec.memory_bytes`).
* ``weight_bytes``: :func:`pdopt.model_spec.weight_bytes` — every parameter, embeddings and LM
  head included, split ``tp`` ways, as vLLM's ``VocabParallelEmbedding`` and ``ParallelLMHead``
  shard the vocabulary over TP ranks (norm weights, replicated, are < 0.01%).
* ``activation_bytes``: the peak activation memory of the profiling pass,
  :func:`activation_peak_bytes` (first order), unless given (e.g. read off vLLM's start-up log,
  "activation peak memory takes X GiB").
* ``kv_bytes_per_token``: :func:`pdopt.model_spec.kv_bytes_per_token` at this TP.

Left out: memory outside PyTorch's allocator (CUDA context, NCCL buffers; vLLM ≥ 0.6 subtracts
it as ``non_torch_memory``, typically 0.3–1 GiB) — add it to ``activation_bytes`` when it matters.
pdopt's earlier default subtracted a fixed 1 GiB (``activation_bytes=2**30`` reproduces it).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdopt._validation import check_fraction, check_int_at_least, check_non_negative
from pdopt.errors import ConfigError
from pdopt.hardware._gpu import GpuSpec
from pdopt.model_spec._derived import kv_bytes_per_token
from pdopt.model_spec._model import ModelSpec
from pdopt.model_spec._params import (
    check_tp,
    kv_heads_per_gpu,
    mlp_matrices,
    query_heads_per_gpu,
    weight_bytes,
)

DEFAULT_MEMORY_UTILIZATION: float = 0.9
"""vLLM's default ``gpu_memory_utilization``."""

DEFAULT_BATCHED_TOKENS: int = 8192
"""Tokens of the profiling forward pass: pdopt's default prefill budget ``max_batch_tokens``
(vLLM's ``max_num_batched_tokens``; V1's OpenAI server uses 8192 on 80 GB-class GPUs)."""

DEFAULT_MAX_SEQS: int = 256
"""Sequences of the profiling pass (vLLM's ``max_num_seqs``; pdopt's ``max_running``): the one
owner of pdopt's running-request default, read above this layer as
:data:`pdopt.cluster.DEFAULT_MAX_RUNNING`."""

DEFAULT_BLOCK_TOKENS: int = 16
"""Tokens per KV block (vLLM's and SGLang's default ``block_size``): the one owner of pdopt's
block size default, read above this layer as :data:`pdopt.cluster.DEFAULT_BLOCK_TOKENS` (it
lives here, the lowest layer that counts blocks, so that ``pdopt.cluster`` can import it)."""

_LOGIT_BYTES = 4  # the sampler works on float32 logits


@dataclass(frozen=True, slots=True)
class KvCapacity:
    """The terms of one instance's KV capacity, per GPU (see the module docstring).

    Parameters
    ----------
    memory_bytes : float
        GPU memory, bytes.
    memory_utilization : float
        Fraction of it the engine may use, in (0, 1].
    weight_bytes : float
        Weights held by one GPU, bytes.
    activation_bytes : float
        Peak activation memory of the profiling pass, bytes.
    bytes_per_token : int
        KV bytes one GPU holds per token.
    block_tokens : int
        Tokens per KV block.
    tp : int
        GPUs of the instance (for the description only).
    """

    memory_bytes: float
    memory_utilization: float
    weight_bytes: float
    activation_bytes: float
    bytes_per_token: int
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    tp: int = 1

    def __post_init__(self) -> None:
        owner = "KvCapacity"
        check_fraction(self.memory_utilization, "memory_utilization", owner)
        check_non_negative(self.weight_bytes, "weight_bytes", owner)
        check_non_negative(self.activation_bytes, "activation_bytes", owner)
        check_int_at_least(self.bytes_per_token, 1, "bytes_per_token", owner)
        check_int_at_least(self.block_tokens, 1, "block_tokens", owner)

    @property
    def kv_bytes(self) -> float:
        """``memory · memory_utilization − weight_bytes − activation_bytes`` (may be < 0)."""
        return (
            self.memory_bytes * self.memory_utilization - self.weight_bytes - self.activation_bytes
        )

    @property
    def tokens(self) -> int:
        """Whole tokens of KV: ``floor(kv_bytes / bytes_per_token)`` (0 when none fit)."""
        return max(int(self.kv_bytes // self.bytes_per_token), 0)

    @property
    def blocks(self) -> int:
        """Whole blocks: ``floor(kv_bytes / (block_tokens · bytes_per_token))``."""
        return self.tokens // self.block_tokens

    def describe(self) -> str:
        """One line with every term, in GiB, e.g. ``KV per worker (per GPU of tp=2): 80 GiB ×
        0.90 − 64.24 GiB weights − 0.94 GiB activations = 6.82 GiB = 2794 blocks of 16
        tokens``."""
        gib = float(2**30)
        where = "KV per worker" + ("" if self.tp == 1 else f" (per GPU of tp={self.tp})")
        return (
            f"{where}: {self.memory_bytes / gib:.4g} GiB × {self.memory_utilization:.2f} − "
            f"{self.weight_bytes / gib:.2f} GiB weights − {self.activation_bytes / gib:.2f} GiB "
            f"activations = {self.kv_bytes / gib:.2f} GiB = {self.blocks} blocks of "
            f"{self.block_tokens} tokens"
        )

    def to_dict(self) -> dict[str, float | int]:
        """Every term and result, JSON-ready (bytes, tokens, blocks)."""
        return {
            "memory_bytes": self.memory_bytes,
            "memory_utilization": self.memory_utilization,
            "weight_bytes": self.weight_bytes,
            "activation_bytes": self.activation_bytes,
            "kv_bytes": self.kv_bytes,
            "bytes_per_token": self.bytes_per_token,
            "block_tokens": self.block_tokens,
            "tp": self.tp,
            "tokens": self.tokens,
            "blocks": self.blocks,
        }


def activation_peak_bytes(
    model: ModelSpec,
    tp: int = 1,
    batched_tokens: int = DEFAULT_BATCHED_TOKENS,
    max_seqs: int = DEFAULT_MAX_SEQS,
) -> float:
    """Peak activation memory of a forward pass over ``batched_tokens`` tokens on one GPU, bytes.

    First order: layers run one after another and free their intermediates, so the peak is one
    layer's widest moment plus the logits::

        peak = T · a · (2·hidden + max(w_attn, w_mlp)) + min(S, T) · vocab · 4

    with ``T = batched_tokens``, ``S = max_seqs`` (one logits row per sequence, float32, the
    vocabulary gathered whole on every GPU), ``a`` the activation bytes (16-bit, or the weight
    dtype when wider), ``2·hidden`` the residual stream and the normed hidden state, and per GPU:

    * ``w_attn = (q_heads + kv_heads) · (head_dim + v_head_dim)``: Q, K, V and the attention
      output (MLA: ``2 · q_heads · (head_dim + v_head_dim)``, keys and values decompressed);
    * ``w_mlp = m · intermediate / tp`` with ``m = 3`` for a gated MLP (gate-up output and the
      activated half) or 2; an MoE layer holds for each token's ``k`` routed experts their
      ``m · moe_intermediate / tp`` plus a ``hidden``-wide output, and the shared experts'.

    Examples
    --------
    >>> from pdopt.model_spec import get_model
    >>> round(activation_peak_bytes(get_model("Llama-2-70B"), tp=2) / 2**30, 3)
    0.937
    """
    owner = "activation_peak_bytes"
    tp = check_tp(model, tp, owner)
    tokens = check_int_at_least(batched_tokens, 1, "batched_tokens", owner)
    seqs = check_int_at_least(max_seqs, 1, "max_seqs", owner)
    width = 2 * model.hidden_size + max(_attention_width(model, tp), _mlp_width(model, tp))
    act_bytes = max(model.dtype_bytes, 2.0)
    return tokens * act_bytes * width + min(seqs, tokens) * model.vocab_size * _LOGIT_BYTES


def _attention_width(model: ModelSpec, tp: int) -> float:
    q_heads = query_heads_per_gpu(model, tp)
    heads = 2 * q_heads if model.is_mla else q_heads + kv_heads_per_gpu(model, tp)
    return float(heads * (model.head_dim + model.v_head_dim))


def _mlp_width(model: ModelSpec, tp: int) -> float:
    m = mlp_matrices(model)
    dense = m * model.intermediate_size / tp if model.moe_layers < model.num_layers else 0.0
    if not model.is_moe:
        return dense
    expert = m * model.moe_intermediate_size / tp
    moe = model.experts_per_token * (expert + model.hidden_size)
    return max(dense, moe + model.num_shared_experts * expert)


def kv_capacity(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int = 1,
    *,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    activation_bytes: float | None = None,
    batched_tokens: int = DEFAULT_BATCHED_TOKENS,
    max_seqs: int = DEFAULT_MAX_SEQS,
) -> KvCapacity:
    """The KV capacity terms of ``model`` on ``gpu`` × ``tp`` (module docstring).

    ``activation_bytes`` None: :func:`activation_peak_bytes` at ``batched_tokens`` and
    ``max_seqs``.

    Raises
    ------
    ConfigError
        When not even one block fits beside the weights and activations.

    Examples
    --------
    >>> from pdopt.hardware import get_gpu
    >>> from pdopt.model_spec import get_model
    >>> kv_capacity(get_gpu("A100-80GB"), get_model("Llama-2-70B"), tp=2).blocks
    2794
    """
    owner = "kv_capacity"
    tp = check_tp(model, tp, owner)
    if activation_bytes is None:
        activation_bytes = activation_peak_bytes(model, tp, batched_tokens, max_seqs)
    check_non_negative(activation_bytes, "activation_bytes", owner)
    terms = KvCapacity(
        gpu.memory_bytes,
        check_fraction(memory_utilization, "memory_utilization", owner),
        weight_bytes(model, tp),
        float(activation_bytes),
        kv_bytes_per_token(model, tp),
        check_int_at_least(block_tokens, 1, "block_tokens", owner),
        tp,
    )
    if terms.blocks < 1:
        gib = float(2**30)
        raise ConfigError(
            f"{model.name} at tp={tp} does not fit on {gpu.name}: weights need "
            f"{terms.weight_bytes / gib:.2f} GiB per GPU and activations "
            f"{terms.activation_bytes / gib:.2f} GiB, but only "
            f"{terms.memory_bytes * memory_utilization / gib:.2f} GiB is usable "
            f"(memory_utilization={memory_utilization}); no room is left for one KV block. "
            "Raise tp or use a larger GPU."
        )
    return terms


def kv_capacity_tokens(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int = 1,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    activation_bytes: float | None = None,
) -> int:
    """Tokens of KV one TP instance holds: :attr:`KvCapacity.tokens` of :func:`kv_capacity`."""
    return kv_capacity(
        gpu, model, tp, memory_utilization=memory_utilization, activation_bytes=activation_bytes
    ).tokens


def kv_capacity_blocks(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int = 1,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    activation_bytes: float | None = None,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
) -> int:
    """Whole KV blocks one TP instance holds: :attr:`KvCapacity.blocks` of :func:`kv_capacity`."""
    return kv_capacity(
        gpu,
        model,
        tp,
        memory_utilization=memory_utilization,
        block_tokens=block_tokens,
        activation_bytes=activation_bytes,
    ).blocks
