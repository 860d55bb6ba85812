"""A Llama/Qwen-shaped decoder with random weights, and a preallocated KV cache arena.

The decoder has the operations an inference engine runs per forward pass: token embedding, per
layer RMSNorm → fused QKV projection (grouped-query attention, optional Q/K/V biases) → rotary
position embedding → KV cache write → attention via
:func:`torch.nn.functional.scaled_dot_product_attention` (causal in prefill, over the whole
cached context in decode) → output projection → residual → RMSNorm → gated SiLU MLP (fused
gate/up, then down) → residual; then the final RMSNorm and the LM head on the positions that
produce logits (the last one per request, as vLLM does). Weights are random (no download) and
drawn from a seeded :class:`torch.Generator`, so the same seed builds the same model.

:meth:`Decoder.forward_mixed` runs one fused (chunked-prefill) pass: decode tokens and a prefill
chunk share the linear layers, attention runs per part.

Only ``num_layers`` layers are allocated; the harness may build fewer layers than the model has
and scale (see :mod:`calibration._sweeps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from pdopt.model_spec import ModelSpec

ROPE_THETA: float = 10_000.0
"""Rotary base; it changes the values, not the cost, so one value serves every model."""

_TORCH_HAS_GQA: bool = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)

KvPair = tuple[torch.Tensor, torch.Tensor]


def _normal(
    shape: tuple[int, ...], std: float, gen: torch.Generator, like: torch.Tensor
) -> nn.Parameter:
    data = torch.empty(shape, device=like.device, dtype=like.dtype).normal_(0.0, std, generator=gen)
    return nn.Parameter(data, requires_grad=False)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in float32 as Llama does."""

    def __init__(self, size: int, like: torch.Tensor, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=like.device, dtype=like.dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


def rotary_tables(
    max_positions: int, head_dim: int, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables, each ``[max_positions, head_dim]`` (RoFormer, Su et al. 2021)."""
    inv_freq = 1.0 / ROPE_THETA ** (
        torch.arange(0, head_dim, 2, device=like.device, dtype=torch.float32) / head_dim
    )
    angles = torch.outer(torch.arange(max_positions, device=like.device).float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(like.dtype), angles.sin().to(like.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` by the tables' rows ``[T, D]`` (the rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA over ``q`` ``[B, H, T, D]`` and ``k, v`` ``[B, H_kv, S, D]`` (GQA when H_kv < H)."""
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if _TORCH_HAS_GQA:
        # NOTE: enable_gqa lets the flash kernel read each KV head once for its query group,
        # so decode attention moves the real KV bytes, not repeat_interleave copies.
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer: GQA self-attention with rotary, then a gated SiLU MLP."""

    def __init__(self, spec: ModelSpec, gen: torch.Generator, like: torch.Tensor) -> None:
        super().__init__()
        hidden, hd = spec.hidden_size, spec.head_dim
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, hd
        qkv_out = (spec.num_heads + 2 * spec.num_kv_heads) * hd
        self.input_norm = RMSNorm(hidden, like)
        self.qkv = _normal((qkv_out, hidden), hidden**-0.5, gen, like)
        self.qkv_bias = _normal((qkv_out,), 0.02, gen, like) if spec.qkv_bias else None
        self.out = _normal((hidden, spec.num_heads * hd), (spec.num_heads * hd) ** -0.5, gen, like)
        self.post_norm = RMSNorm(hidden, like)
        inter = spec.intermediate_size
        self.gate_up = _normal((2 * inter, hidden), hidden**-0.5, gen, like)
        self.down = _normal((hidden, inter), inter**-0.5, gen, like)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        cache: KvPair | None,
        start: int,
    ) -> torch.Tensor:
        """``x`` ``[B, T, hidden]`` at positions ``start … start+T-1``; returns the same shape.

        With ``cache`` (keys and values ``[B, H_kv, S, D]``), the new keys and values are written
        at those positions and attention runs over positions ``0 … start+T-1``. ``T > 1`` is a
        prefill (``start`` must be 0, causal); ``T == 1`` a decode step (no mask needed).
        """
        tokens = x.shape[1]
        if tokens > 1 and start != 0:
            raise ValueError("a multi-token forward must start at position 0 (no chunked prefill)")
        qkv = F.linear(self.input_norm(x), self.qkv, self.qkv_bias)
        return self._residual_mlp(x, self._attention(qkv, rotary, cache, start))

    def forward_mixed(
        self,
        x: torch.Tensor,
        batch: int,
        decode: tuple[tuple[torch.Tensor, torch.Tensor], KvPair, int],
        chunk: tuple[tuple[torch.Tensor, torch.Tensor], KvPair],
    ) -> torch.Tensor:
        """One fused pass over ``x`` ``[batch + P, hidden]``: ``batch`` decode tokens, then one
        prefill chunk of ``P`` tokens (positions ``0 … P-1``), as a chunked-prefill engine runs
        them. The norms, projections and MLP see all ``batch + P`` rows at once (one GEMM each);
        attention runs per part: ``decode`` is (rotary rows, cache, position of the new token),
        the decodes attend over their cache; ``chunk`` is (rotary rows, cache), the chunk
        attends causally over itself. Returns the same shape as ``x``.
        """
        chunk_tokens = x.shape[0] - batch
        qkv = F.linear(self.input_norm(x), self.qkv, self.qkv_bias)
        decode_rotary, decode_cache, start = decode
        decode_attn = self._attention(
            qkv[:batch].view(batch, 1, -1), decode_rotary, decode_cache, start
        )
        chunk_attn = self._attention(qkv[batch:].view(1, chunk_tokens, -1), chunk[0], chunk[1], 0)
        attn = torch.cat((decode_attn.view(batch, -1), chunk_attn.view(chunk_tokens, -1)))
        return self._residual_mlp(x, attn)

    def _attention(
        self,
        qkv: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        cache: KvPair | None,
        start: int,
    ) -> torch.Tensor:
        """Attention output ``[B, T, heads·D]`` of the fused projections ``qkv`` ``[B, T, ·]``;
        with ``cache``, keys and values are written at ``start …`` and read back from ``0``."""
        batch, tokens, _ = qkv.shape
        q, k, v = self._heads(qkv, rotary)
        if cache is not None:
            cache[0][:, :, start : start + tokens] = k
            cache[1][:, :, start : start + tokens] = v
            k, v = cache[0][:, :, : start + tokens], cache[1][:, :, : start + tokens]
        attn = attend(q, k, v, causal=tokens > 1)
        return attn.transpose(1, 2).reshape(batch, tokens, -1)

    def _residual_mlp(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + F.linear(attn, self.out)
        gate, up = F.linear(self.post_norm(x), self.gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.down)

    def _heads(
        self, qkv: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = qkv.shape
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = torch.split(qkv, [q_size, kv_size, kv_size], dim=-1)
        q = q.view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(q, *rotary), apply_rotary(k, *rotary), v


class Decoder(nn.Module):
    """Embedding, ``num_layers`` :class:`DecoderLayer`, final RMSNorm and LM head.

    Parameters
    ----------
    spec : ModelSpec
        The shape (per GPU: see :func:`calibration._config.shard_for_tp`).
    num_layers : int
        Layers to allocate (``spec.num_layers`` for the whole model, fewer to measure and scale).
    max_positions : int
        Longest sequence (prompt plus generated tokens) the rotary tables cover.
    device, dtype : torch.device, torch.dtype
        Where the weights live and their type.
    seed : int
        Seed of the weights' generator.
    """

    rotary_cos: torch.Tensor
    rotary_sin: torch.Tensor
    embed: nn.Parameter

    def __init__(
        self,
        spec: ModelSpec,
        num_layers: int,
        max_positions: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        super().__init__()
        like = torch.empty(0, device=device, dtype=dtype)
        gen = torch.Generator(device=device).manual_seed(seed)
        self.embed = _normal((spec.vocab_size, spec.hidden_size), 1.0, gen, like)
        self.layers = nn.ModuleList(DecoderLayer(spec, gen, like) for _ in range(num_layers))
        self.final_norm = RMSNorm(spec.hidden_size, like)
        std = spec.hidden_size**-0.5
        tied = spec.tied_embeddings
        self.lm_head = self.embed if tied else _normal(self.embed.shape, std, gen, like)
        cos, sin = rotary_tables(max_positions, spec.head_dim, like)
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)

    def forward(
        self,
        tokens: torch.Tensor,
        start: int = 0,
        caches: list[KvPair] | None = None,
        all_logits: bool = False,
        run_layers: bool = True,
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of the last position (``[B, T, V]`` with ``all_logits``).

        ``tokens`` ``[B, T]`` sit at positions ``start … start+T-1``; ``caches`` holds one
        (keys, values) pair per layer. ``run_layers=False`` skips the layers (embedding, norm
        and LM head only), which the harness times to scale a few layers up to the model's count.
        """
        tokens_count = tokens.shape[1]
        if start + tokens_count > self.rotary_cos.shape[0]:
            raise ValueError(
                f"positions up to {start + tokens_count} exceed max_positions="
                f"{self.rotary_cos.shape[0]}"
            )
        rotary = (
            self.rotary_cos[start : start + tokens_count],
            self.rotary_sin[start : start + tokens_count],
        )
        x = F.embedding(tokens, self.embed)
        if run_layers:
            for index, layer in enumerate(self.layers):
                x = layer(x, rotary, None if caches is None else caches[index], start)
        x = self.final_norm(x if all_logits else x[:, -1])
        return F.linear(x, self.lm_head)

    def forward_mixed(
        self,
        decode_ids: torch.Tensor,
        context: int,
        decode_caches: list[KvPair],
        chunk_ids: torch.Tensor,
        chunk_caches: list[KvPair],
        run_layers: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One fused (chunked-prefill) forward pass: decode logits ``[B, V]`` and the chunk's
        last-position logits ``[1, V]``.

        ``decode_ids`` ``[B, 1]`` are ``B`` running requests' new tokens at position
        ``context − 1`` (caches ``decode_caches``, ``[B, H_kv, ≥context, D]`` per layer);
        ``chunk_ids`` ``[1, P]`` a first prefill chunk at positions ``0 … P-1`` (caches
        ``chunk_caches``). The linear layers run once over the ``B + P`` tokens; attention runs
        per part (:meth:`DecoderLayer.forward_mixed`). The results equal a decode step and a
        prefill of the chunk run separately (up to floating-point rounding).
        """
        batch, chunk = decode_ids.shape[0], chunk_ids.shape[1]
        if decode_ids.shape[1] != 1 or chunk_ids.shape[0] != 1:
            raise ValueError("forward_mixed takes decode_ids [B, 1] and chunk_ids [1, P]")
        if max(context, chunk) > self.rotary_cos.shape[0]:
            raise ValueError(
                f"positions up to {max(context, chunk)} exceed max_positions="
                f"{self.rotary_cos.shape[0]}"
            )
        start = context - 1
        decode_rotary = (self.rotary_cos[start:context], self.rotary_sin[start:context])
        chunk_rotary = (self.rotary_cos[:chunk], self.rotary_sin[:chunk])
        x = F.embedding(torch.cat((decode_ids.reshape(-1), chunk_ids.reshape(-1))), self.embed)
        if run_layers:
            for index, module in enumerate(self.layers):
                layer = cast(DecoderLayer, module)
                x = layer.forward_mixed(
                    x,
                    batch,
                    (decode_rotary, decode_caches[index], start),
                    (chunk_rotary, chunk_caches[index]),
                )
        logits = F.linear(self.final_norm(torch.cat((x[:batch], x[-1:]))), self.lm_head)
        return logits[:batch], logits[batch:]


@dataclass(frozen=True, slots=True)
class KvArena:
    """A preallocated KV cache: per layer one flat key and one flat value buffer.

    ``keys`` and ``values`` are ``[layers, capacity_elements]``; :meth:`views` lays a batch of
    equal-length sequences out contiguously at the buffer's start, ``[B, H_kv, S, D]`` per layer,
    so every measurement reads and writes real cache memory without allocating.
    """

    keys: torch.Tensor
    values: torch.Tensor
    kv_heads: int
    head_dim: int

    @property
    def capacity_tokens(self) -> int:
        """Tokens (summed over the batch) one layer's buffer holds."""
        return int(self.keys.shape[1]) // (self.kv_heads * self.head_dim)

    def views(self, batch: int, tokens: int, offset_tokens: int = 0) -> list[KvPair]:
        """Per layer, (keys, values) ``[batch, H_kv, tokens, D]`` views into the buffers,
        starting ``offset_tokens`` tokens into them (a second batch beside the first)."""
        if offset_tokens < 0 or offset_tokens + batch * tokens > self.capacity_tokens:
            raise ValueError(
                f"batch {batch} × {tokens} tokens after {offset_tokens} exceeds the arena's "
                f"{self.capacity_tokens}"
            )
        per_token = self.kv_heads * self.head_dim
        first = offset_tokens * per_token
        last = first + batch * tokens * per_token
        shape = (batch, self.kv_heads, tokens, self.head_dim)
        return [
            (self.keys[i, first:last].view(shape), self.values[i, first:last].view(shape))
            for i in range(self.keys.shape[0])
        ]


def allocate_kv_arena(
    spec: ModelSpec,
    num_layers: int,
    capacity_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 1,
) -> KvArena:
    """A :class:`KvArena` for ``num_layers`` layers of ``capacity_tokens`` tokens each.

    The buffers are filled with unit normals once, so attention reads finite values (timing
    with NaN or denormals in the cache would not be representative on some CPUs).
    """
    elements = max(1, capacity_tokens) * spec.num_kv_heads * spec.head_dim
    gen = torch.Generator(device=device).manual_seed(seed)

    def buffer() -> torch.Tensor:
        data = torch.empty((num_layers, elements), device=device, dtype=dtype)
        return data.normal_(0.0, 1.0, generator=gen)

    return KvArena(buffer(), buffer(), spec.num_kv_heads, spec.head_dim)


def decoder_weight_bytes(spec: ModelSpec, dtype_bytes: int) -> tuple[int, int]:
    """(bytes outside the layers: embedding and LM head, bytes per layer) of the weights."""
    hidden, hd, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    per_layer = (
        hidden * (spec.num_heads + 2 * spec.num_kv_heads) * hd
        + spec.num_heads * hd * hidden
        + 3 * hidden * inter
        + 2 * hidden
    )
    heads = 1 if spec.tied_embeddings else 2
    base = heads * spec.vocab_size * hidden + hidden
    return base * dtype_bytes, per_layer * dtype_bytes
