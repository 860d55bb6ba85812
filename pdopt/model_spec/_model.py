"""Transformer model configurations (from public config files) and what follows from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_int_at_least, check_one_of, param_error
from pdopt.errors import InputError
from pdopt.model_spec._hf import hf_spec_fields
from pdopt.model_spec._window import window_held_tokens

ArrayLike: TypeAlias = float | npt.NDArray[Any]
FloatOrArray: TypeAlias = Any  # a float for a scalar argument, else an array of its shape

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
    "mxfp4": 4.25 / 8,
}
"""Bytes per stored value. ``mxfp4`` (OCP microscaling FP4, as gpt-oss ships its experts) stores
4 bits per value plus one 8-bit scale per block of 32 values: 4.25 bits. FP8 and INT8/INT4 block
or channel scales (DeepSeek-V3: one float32 per 128 × 128 block, 0.02%) are left out."""

DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "e4m3": "fp8",
    "w4a16": "int4",
}
"""Other spellings of :data:`DTYPE_BYTES` keys (lower case), as configs and engines write them."""

_WIDE_DTYPES = ("float32",)

KV_DTYPES: tuple[str, ...] = tuple(d for d in DTYPE_BYTES if d != "mxfp4")
"""Dtypes a KV cache may be stored as: no engine has an MXFP4 KV cache (vLLM's
``kv_cache_dtype`` offers ``auto``, ``bfloat16``, ``fp8`` variants and INT8/INT4 in some
backends), so ``mxfp4`` is a weight (expert) dtype only."""


def canonical_dtype(
    value: str, name: str, owner: str, allowed: tuple[str, ...] | None = None
) -> str:
    """``value`` as a :data:`DTYPE_BYTES` key (case-insensitive, :data:`DTYPE_ALIASES` allowed),
    one of ``allowed`` when given (e.g. :data:`KV_DTYPES`).

    Raises
    ------
    ParameterError
        When ``value`` names no known (or allowed) dtype; the message lists the allowed ones.
    """
    key = str(value).strip().lower()
    return check_one_of(DTYPE_ALIASES.get(key, key), allowed or DTYPE_BYTES, name, owner)


def default_kv_dtype(weight_dtype: str) -> str:
    """The KV-cache dtype of a model stored as ``weight_dtype`` when nothing fixes it: the
    weights' own for 16/32-bit weights, ``bfloat16`` for quantized ones (vLLM's
    ``kv_cache_dtype="auto"`` keeps the KV at the model's activation dtype).

    Examples
    --------
    >>> default_kv_dtype("float16"), default_kv_dtype("fp8")
    ('float16', 'bfloat16')
    """
    return weight_dtype if DTYPE_BYTES[weight_dtype] >= 2 else "bfloat16"


@dataclass(frozen=True, slots=True)
class SlidingWindow:
    """Which part of a context a model's KV cache holds when some layers use sliding-window
    attention: ``sliding_layers`` of ``num_layers`` layers keep the last ``window_tokens``.

    A request's KV with windows is :meth:`held_tokens`, the scalar formula of
    :func:`pdopt.model_spec._window.window_held_tokens` (which the compiled simulator compiles).
    """

    window_tokens: int
    sliding_layers: int
    num_layers: int

    def __post_init__(self) -> None:
        owner = "SlidingWindow"
        check_int_at_least(self.window_tokens, 1, "window_tokens", owner)
        check_int_at_least(self.num_layers, 1, "num_layers", owner)
        check_int_at_least(self.sliding_layers, 1, "sliding_layers", owner)
        if self.sliding_layers > self.num_layers:
            rule = f"at most num_layers={self.num_layers}"
            raise param_error("sliding_layers", owner, rule, self.sliding_layers)

    def held_tokens(self, context_tokens: ArrayLike) -> FloatOrArray:
        """Context tokens as tokens held in every layer: ``(F·L + S·min(L, W)) / N`` with ``F =
        N − S`` full-attention layers; vectorised over ``L`` (a float for a scalar).

        Examples
        --------
        >>> SlidingWindow(128, 18, 36).held_tokens(8192)  # gpt-oss-120b
        4160.0
        """
        sliding = self.sliding_layers
        full = self.num_layers - sliding
        if np.ndim(context_tokens) == 0:
            length = float(context_tokens)
            return window_held_tokens(length, self.window_tokens, sliding, self.num_layers)
        tokens = np.asarray(context_tokens, dtype=np.float64)
        held = full * tokens + sliding * np.minimum(tokens, self.window_tokens)
        return held / self.num_layers


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape and storage precision.

    Dense and GQA: ``head_dim`` defaults to ``hidden_size // num_heads``; ``num_kv_heads <
    num_heads`` is GQA. ``gated_mlp`` is a SwiGLU MLP (gate, up and down projections; two
    otherwise); ``tied_embeddings`` shares the input embedding with the LM head; ``qkv_bias`` adds
    biases to the Q, K and V projections (Qwen2 / Qwen2.5, gpt-oss), ``o_bias`` to the output
    projection (gpt-oss); ``qk_norm`` is a per-head RMSNorm on queries and keys (Qwen3);
    ``attention_sinks`` is one learned logit per head and layer (gpt-oss).

    Multi-head latent attention (MLA, DeepSeek-V2/V3) when ``kv_lora_rank > 0``: the KV cache
    holds the ``kv_lora_rank``-wide latent plus the ``qk_rope_head_dim`` decoupled rotary key per
    token and layer, shared by all heads; ``head_dim`` is the query/key head width (nope + rope),
    ``v_head_dim`` the value head width; ``q_lora_rank`` (0: none) the query's low-rank width.

    Mixture of experts (MoE) when ``num_experts > 0``: every layer but the first
    ``first_dense_layers`` (which keep a dense MLP of ``intermediate_size``) routes each token to
    ``experts_per_token`` of ``num_experts`` experts, each a (gated) MLP of
    ``moe_intermediate_size``, plus ``num_shared_experts`` always-active experts of the same width;
    ``router_bias`` is a per-expert bias on the router (gpt-oss's linear bias, DeepSeek-V3's
    ``e_score_correction_bias``), ``expert_bias`` biases on the expert projections (gpt-oss).

    Precision: ``dtype`` is the stored weight dtype, ``expert_dtype`` the routed experts' (empty:
    ``dtype``; gpt-oss stores them as ``mxfp4``), ``kv_dtype`` the KV cache's (empty:
    :func:`default_kv_dtype`: ``dtype``, or ``bfloat16`` when ``dtype`` is a quantized format,
    as vLLM's ``kv_cache_dtype="auto"``; one of :data:`KV_DTYPES`, never ``mxfp4``).
    ``max_context_tokens`` is the longest context the model supports (``max_position_embeddings``
    of its config; None when unknown).

    Sliding-window attention: ``sliding_window_layers`` of the ``num_layers`` layers attend to
    (and keep the KV of) only the last ``sliding_window_tokens`` tokens; the others attend to the
    whole context. gpt-oss alternates the two (``layer_types``, 18 of 36 layers with a 128-token
    window in gpt-oss-120b), Mistral-7B-v0.1 windows every layer (4096), Gemma-2/3 interleave
    them. Only the count of sliding layers matters to KV size and attention cost, so the pattern
    is not kept. None and 0 (the defaults): every layer is full attention. A request with ``L``
    context tokens holds :meth:`kv_bytes_for_context` bytes of KV.
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
    max_context_tokens: int | None = None
    kv_dtype: str = ""
    expert_dtype: str = ""
    o_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    router_bias: bool = False
    expert_bias: bool = False
    sliding_window_tokens: int | None = None
    sliding_window_layers: int = 0

    def __post_init__(self) -> None:
        owner = "ModelSpec"
        for field_name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "vocab_size",
        ):
            check_int_at_least(getattr(self, field_name), 1, field_name, owner)
        for field_name in (
            "kv_lora_rank",
            "q_lora_rank",
            "qk_rope_head_dim",
            "v_head_dim",
            "num_experts",
            "experts_per_token",
            "moe_intermediate_size",
            "num_shared_experts",
            "first_dense_layers",
            "sliding_window_layers",
        ):
            check_int_at_least(getattr(self, field_name), 0, field_name, owner)
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        check_int_at_least(self.head_dim, 1, "head_dim", owner)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.max_context_tokens is not None:
            check_int_at_least(self.max_context_tokens, 1, "max_context_tokens", owner)
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype, "dtype", owner))
        expert = self.expert_dtype or self.dtype
        object.__setattr__(self, "expert_dtype", canonical_dtype(expert, "expert_dtype", owner))
        kv = self.kv_dtype or default_kv_dtype(self.dtype)
        object.__setattr__(self, "kv_dtype", canonical_dtype(kv, "kv_dtype", owner, KV_DTYPES))
        self._check_structure()

    @classmethod
    def from_hf_config(
        cls, path_or_dict: str | Path | Mapping[str, Any], name: str | None = None
    ) -> ModelSpec:
        """A spec from a Hugging Face ``config.json`` (dense, GQA, MLA or MoE, with or without
        sliding-window layers; the fields read, the architectures refused and the precision
        rules: :mod:`pdopt.model_spec._hf`). Also :func:`pdopt.model_spec.from_hf_config`.

        Parameters
        ----------
        path_or_dict : str, Path or mapping
            A ``config.json`` file, a folder holding one, or the parsed dict. Nothing is
            downloaded.
        name : str, optional
            The spec's name; default the config's ``_name_or_path``, else the folder holding the
            ``config.json`` (or the file's stem), for a dict its ``model_type``.

        Raises
        ------
        InputError
            When the file is missing or unreadable, a required field is missing or not an
            integer, or the architecture has a feature pdopt does not model (the message names
            the field).

        Examples
        --------
        >>> spec = ModelSpec.from_hf_config({"num_hidden_layers": 32, "hidden_size": 4096,
        ...     "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        ...     "vocab_size": 128256, "max_position_embeddings": 131072}, name="Llama-3.1-8B")
        >>> spec.name, spec.kv_bytes_per_token, spec.max_context_tokens
        ('Llama-3.1-8B', 131072, 131072)
        """
        fields, label = hf_spec_fields(path_or_dict, name)
        try:
            return cls(**fields)
        except ValueError as exc:
            raise InputError(f"{label}: {exc}") from exc

    def _check_structure(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            rule = f"a divisor of num_heads={self.num_heads}"
            raise param_error("num_kv_heads", "ModelSpec", rule, self.num_kv_heads)
        if self.is_moe:
            if not 1 <= self.experts_per_token <= self.num_experts:
                rule = f"in 1..num_experts={self.num_experts} for an MoE model"
                raise param_error("experts_per_token", "ModelSpec", rule, self.experts_per_token)
            if self.moe_intermediate_size < 1:
                rule = "an integer >= 1 for an MoE model"
                raise param_error(
                    "moe_intermediate_size", "ModelSpec", rule, self.moe_intermediate_size
                )
        if self.first_dense_layers > self.num_layers:
            rule = f"at most num_layers={self.num_layers}"
            raise param_error("first_dense_layers", "ModelSpec", rule, self.first_dense_layers)
        self._check_window()

    def _check_window(self) -> None:
        owner, layers = "ModelSpec", self.sliding_window_layers
        if self.sliding_window_tokens is None:
            if layers:
                rule = "0 when sliding_window_tokens is None (give the window too)"
                raise param_error("sliding_window_layers", owner, rule, layers)
            return
        check_int_at_least(self.sliding_window_tokens, 1, "sliding_window_tokens", owner)
        if not 1 <= layers <= self.num_layers:
            rule = f"in 1..num_layers={self.num_layers} when sliding_window_tokens is set"
            raise param_error("sliding_window_layers", owner, rule, layers)

    @property
    def is_moe(self) -> bool:
        """Whether the model routes tokens to experts."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (a compressed, head-shared KV)."""
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (0 for a dense model)."""
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def dtype_bytes(self) -> float:
        """Bytes per stored weight (non-expert weights)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> float:
        """Bytes per KV-cache value."""
        return DTYPE_BYTES[self.kv_dtype]

    @property
    def activation_bytes(self) -> float:
        """Bytes per activation value: 4 for float32 models, else 2 (BF16/FP16 activations, also
        for quantized weights: W8A8 GEMMs still exchange 16-bit activations across TP ranks)."""
        return 4.0 if self.dtype in _WIDE_DTYPES else 2.0

    @property
    def kv_values_per_token_layer(self) -> int:
        """KV values one token stores per layer (all heads): ``2 · kv_heads · head_dim``, or for
        MLA the latent plus the rotary key, ``kv_lora_rank + qk_rope_head_dim`` (DeepSeek-V2
        paper, Table 1: ``(d_c + d_h^R) · l`` elements per token)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token: layers · :attr:`kv_values_per_token_layer` · KV dtype bytes
        (DESIGN.md; ``2 · layers · kv_heads · head_dim · dtype_bytes`` for MHA/GQA).

        With sliding-window layers this is the most one token can hold (in every layer: while it
        is within the window); a request's KV is :meth:`kv_bytes_for_context`, and per token it
        falls towards :attr:`kv_bytes_per_token_long` as its context grows past the window.
        """
        return round(self.num_layers * self.kv_values_per_token_layer * self.kv_dtype_bytes)

    @property
    def has_sliding_window(self) -> bool:
        """Whether some layers keep only a window of the context."""
        return self.sliding_window_tokens is not None

    @property
    def kv_bytes_per_token_long(self) -> float:
        """KV bytes per token of a context much longer than the window: the full-attention
        layers' share of :attr:`kv_bytes_per_token` (equal to it without sliding windows)."""
        full = self.num_layers - self.sliding_window_layers
        return self.kv_bytes_per_token * full / self.num_layers

    @property
    def sliding_window(self) -> SlidingWindow | None:
        """The sliding-window layout of the KV cache (None: every layer full attention)."""
        if self.sliding_window_tokens is None:
            return None
        return SlidingWindow(
            self.sliding_window_tokens, self.sliding_window_layers, self.num_layers
        )

    def kv_context_tokens(self, context_tokens: ArrayLike) -> FloatOrArray:
        """Context tokens as tokens held in every layer (:meth:`SlidingWindow.held_tokens`;
        ``context_tokens`` unchanged without sliding windows). KV capacities count tokens held
        in every layer (bytes / :attr:`kv_bytes_per_token`), so this is what a request of ``L``
        tokens takes of them.

        Examples
        --------
        >>> from pdopt.model_spec import get_model
        >>> float(get_model("gpt-oss-120b").kv_context_tokens(8192))  # (18·8192 + 18·128) / 36
        4160.0
        """
        window = self.sliding_window
        if window is None:
            return context_tokens if np.ndim(context_tokens) == 0 else np.asarray(context_tokens)
        return window.held_tokens(context_tokens)

    def kv_bytes_for_context(self, context_tokens: ArrayLike) -> FloatOrArray:
        """KV bytes one request with ``context_tokens`` tokens holds (all GPUs of its instance):
        ``kv_bytes_per_token · kv_context_tokens(L)`` = per-layer bytes per token · ``(F·L +
        S·min(L, W))``; ``kv_bytes_per_token · L`` without sliding windows.

        Examples
        --------
        >>> from pdopt.model_spec import get_model
        >>> m = get_model("gpt-oss-120b")  # 36 layers, 18 sliding (W=128), 8 KV heads × 64, bf16
        >>> m.kv_bytes_for_context(128) == 36 * 2 * 8 * 64 * 2 * 128
        True
        """
        return self.kv_bytes_per_token * self.kv_context_tokens(context_tokens)
