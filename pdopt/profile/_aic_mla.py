"""AIConfigurator's MLA attention tables for :func:`pdopt.profile.import_aic` (DeepSeek-V3/R1).

Two ways AIConfigurator measures one layer's MLA attention block on one GPU of the TP group; as
in its ``DeepSeekModel`` (a ``FallbackOp``: the module when measured, else the ops), the module
tables are read where the backend has them (vLLM, TensorRT-LLM) and the per-op tables otherwise
(SGLang):

* **Module** (:class:`MlaModule`): ``mla/<backend>/<v>/mla_context_module_perf`` and
  ``mla_generation_module_perf`` measure the whole block (the fused Q/KV down-projection, the Q
  and KV up-projections, attention over the cached latent and the output projection) at
  ``(batch_size, isl)`` and ``(batch_size, step)``, for the GPU's ``num_heads``, the KV-cache
  dtype and the projections' ``gemm_type``.
* **Per op** (:class:`MlaPerOp`), with ``T`` tokens in the pass (prefill ``B·L``, decode ``B``),
  ``h`` heads on the GPU (``num_heads / tp``), ``r_q, r_kv`` the Q and KV LoRA ranks, ``d_r``
  the rotary width, ``d_n = head_dim − d_r`` the no-rotary width and ``d_v`` the value width::

      prefill = GEMM(T, r_q + r_kv + d_r, hidden)       fused Q/KV down-projection (replicated)
              + GEMM(T, h·head_dim, r_q)                 Q up-projection
              + GEMM(T, h·(d_n + d_v), r_kv)             KV up-projection (K, V of every token)
              + context MLA(B, isl = L)                  mla/.../context_mla_perf
              + GEMM(T, hidden, h·d_v)                   output projection
      decode  = GEMM(B, r_q + r_kv + d_r, hidden) + GEMM(B, h·head_dim, r_q)
              + BMM_pre(B) + generation MLA(B, step = C/B) + BMM_post(B)
              + GEMM(B, hidden, h·d_v)

  Decode absorbs the KV up-projection into two batched GEMMs per head (``mla_bmm/.../
  mla_bmm_perf``, ``op_name`` ``mla_gen_pre``/``mla_gen_post`` at ``num_tokens = B``, FP8 when
  the GEMMs are FP8, else the GEMM dtype) and attends over the latent itself. The attention
  tables (``context_mla_perf``, ``generation_mla_perf``) are read at ``num_heads = h``, the
  KV-cache dtype and ``mla_dtype`` BF16 (the only one measured); the GEMMs at the import's GEMM
  precision (:class:`pdopt.profile._aic_data.Grid` of ``gemm_perf``). The q/kv LayerNorms
  between the projections are left out, as in AIConfigurator's non-wide-EP graph.

Both kinds are measured for DeepSeek-V3's shape only (:data:`DEEPSEEK_V3_MLA`), so other MLA
shapes are refused.
"""

from __future__ import annotations

from pdopt.errors import InputError
from pdopt.model_spec import ModelSpec
from pdopt.model_spec._params import query_heads_per_gpu
from pdopt.profile._aic_data import Grid, LoadTable, MakeGrid

DEEPSEEK_V3_MLA: dict[str, int] = {
    "hidden_size": 7168,
    "num_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "head_dim": 192,
    "v_head_dim": 128,
}
"""The MLA shape AIConfigurator's MLA tables were measured at (``model`` column
``deepseek-ai/DeepSeek-V3``; config.json of DeepSeek-V3/R1)."""

_MLA_DTYPE = "bfloat16"  # the attention kernels' compute dtype, the only one measured


class MlaModule:
    """The measured MLA attention block (projections included) of one layer on one GPU."""

    kind = "module"

    def __init__(
        self,
        load: LoadTable,
        grid: MakeGrid,
        model: ModelSpec,
        tp: int,
        gemm_dtype: str,
        kv_dtype: str,
    ) -> None:
        equal = {
            "num_heads": query_heads_per_gpu(model, tp),
            "kv_cache_dtype": kv_dtype,
            "gemm_type": gemm_dtype,
        }
        self._context = grid(
            load("mla", "mla_context_module_perf"), ("batch_size", "isl"), "", **equal
        )
        self._generation = grid(
            load("mla", "mla_generation_module_perf"), ("batch_size", "step"), "", **equal
        )

    def prefill_ms(self, batch: int, length: int) -> float:
        """One layer's block for ``batch`` prompts of ``length`` tokens, ms."""
        return self._context(batch, length)

    def decode_ms(self, batch: int, context: int) -> float:
        """One layer's block for ``batch`` requests holding ``context`` KV tokens each, ms."""
        return self._generation(batch, context)


class MlaPerOp:
    """The MLA attention block of one layer on one GPU summed from its measured ops (module
    docstring: projections from ``gemm``, attention and the decode BMMs from their tables)."""

    kind = "per-op"

    def __init__(
        self,
        load: LoadTable,
        grid: MakeGrid,
        gemm: Grid,
        model: ModelSpec,
        tp: int,
        gemm_dtype: str,
        kv_dtype: str,
    ) -> None:
        self._gemm = gemm
        heads = query_heads_per_gpu(model, tp)
        q_lora, kv_lora = model.q_lora_rank, model.kv_lora_rank
        rope, v_dim = model.qk_rope_head_dim, model.v_head_dim
        nope = model.head_dim - rope
        self._down = (q_lora + kv_lora + rope, model.hidden_size)
        self._q_up = (heads * model.head_dim, q_lora)
        self._kv_up = (heads * (nope + v_dim), kv_lora)
        self._out = (model.hidden_size, heads * v_dim)
        attention = {"num_heads": heads, "kv_cache_dtype": kv_dtype, "mla_dtype": _MLA_DTYPE}
        self._context = grid(
            load("mla", "context_mla_perf"), ("batch_size", "isl"), "", **attention
        )
        self._generation = grid(
            load("mla", "generation_mla_perf"), ("batch_size", "step"), "", **attention
        )
        bmm = load("mla_bmm", "mla_bmm_perf")
        bmm_dtype = "fp8" if gemm_dtype.startswith("fp8") else gemm_dtype
        self._bmm_pre, self._bmm_post = (
            grid(bmm, ("num_tokens",), "", op_name=op, num_heads=heads, bmm_dtype=bmm_dtype)
            for op in ("mla_gen_pre", "mla_gen_post")
        )

    def _projections_ms(self, tokens: int, *shapes: tuple[int, int]) -> float:
        return sum(self._gemm(tokens, n, k) for n, k in (self._down, *shapes, self._out))

    def prefill_ms(self, batch: int, length: int) -> float:
        """One layer's block for ``batch`` prompts of ``length`` tokens, ms."""
        tokens = batch * length
        return self._projections_ms(tokens, self._q_up, self._kv_up) + self._context(batch, length)

    def decode_ms(self, batch: int, context: int) -> float:
        """One layer's block for ``batch`` requests holding ``context`` KV tokens each, ms."""
        return (
            self._projections_ms(batch, self._q_up)
            + self._bmm_pre(batch)
            + self._generation(batch, context)
            + self._bmm_post(batch)
        )


def mla_attention(
    load: LoadTable,
    grid: MakeGrid,
    gemm: Grid,
    model: ModelSpec,
    tp: int,
    gemm_dtype: str,
    kv_dtype: str,
) -> MlaModule | MlaPerOp:
    """The module tables where the backend has them, else the per-op tables (module
    docstring).

    Raises
    ------
    InputError
        ``model``'s MLA shape is not DeepSeek-V3's, or the backend has neither kind of table
        (the message quotes both lookups), or the per-op tables lack the rows.
    """
    _require_deepseek_v3(model)
    try:
        load("mla", "mla_context_module_perf")
    except InputError as module_missing:
        try:
            return MlaPerOp(load, grid, gemm, model, tp, gemm_dtype, kv_dtype)
        except InputError as per_op_missing:
            raise InputError(
                f"import_aic: {model.name}: the backend has no MLA module tables "
                f"({module_missing}); reading its per-op MLA tables instead: {per_op_missing}"
            ) from per_op_missing
    return MlaModule(load, grid, model, tp, gemm_dtype, kv_dtype)


def _require_deepseek_v3(model: ModelSpec) -> None:
    differs = {
        field: (getattr(model, field), value)
        for field, value in DEEPSEEK_V3_MLA.items()
        if getattr(model, field) != value
    }
    if differs:
        listed = ", ".join(f"{f}={have} (tables: {want})" for f, (have, want) in differs.items())
        raise InputError(
            f"import_aic: AIConfigurator's MLA tables are measured for DeepSeek-V3's shape only; "
            f"{model.name} differs: {listed}"
        )
