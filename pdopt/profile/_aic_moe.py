"""AIConfigurator's MoE and MLA tables for :func:`pdopt.profile.import_aic`.

* Routed experts: ``moe/<backend>/<v>/moe_perf`` holds the whole fused MoE kernel (expert
  gate/up GEMMs, activation, down GEMMs, top-k combine) of one GPU, measured per model shape
  (``hidden_size, inter_size, num_experts, topk``), expert dtype (``moe_dtype``), expert
  sharding (``moe_tp_size × moe_ep_size``) and routing skew (``distribution``), at
  ``num_tokens`` tokens entering the layer. As in AIConfigurator's ``MOEModel`` and
  ``DeepSeekModel``, the router is a separate BF16 GEMM ``(m = tokens, n = num_experts,
  k = hidden)``.
* MLA (DeepSeek-V3/R1): ``mla/<backend>/<v>/mla_context_module_perf`` and
  ``mla_generation_module_perf`` measure the whole attention block of one GPU (the fused
  Q/KV down-projection, the Q and KV up-projections, attention over the cached latent and the
  output projection: what AIConfigurator's ``MLAModule`` replaces) at ``(batch_size, isl)``
  and ``(batch_size, step)``, for the GPU's ``num_heads``, the KV-cache dtype and the
  projections' ``gemm_type``. They are measured for DeepSeek-V3's shape only, so other MLA
  shapes are refused.

Routing skew: AIConfigurator's default is a power law, ``power_law_1.2`` for its ``MOEModel``
family (Qwen3 MoE, Mixtral, gpt-oss) and ``power_law_1.01`` for ``DeepSeekModel``; the same
defaults apply here (:func:`default_distribution`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdopt.errors import InputError
from pdopt.model_spec import ModelSpec
from pdopt.profile._aic_data import Grid, TableSource

LoadTable = Callable[[str, str], TableSource]
"""``load(family, table)`` on the import's system × backend × version."""

MakeGrid = Callable[..., Grid]
"""``grid(source, keys, prefer, **equal)``: the selected rows as a :class:`Grid` (noted)."""

EXPERT_TABLE_DTYPES: dict[str, str] = {"mxfp4": "w4a16_mxfp4", "int4": "int4_wo"}
"""Stored expert dtypes (:data:`pdopt.model_spec.DTYPE_BYTES`) that have their own ``moe_dtype``
in AIConfigurator; other experts run at the GEMM precision."""

DEEPSEEK_V3_MLA: dict[str, int] = {
    "hidden_size": 7168,
    "num_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "head_dim": 192,
    "v_head_dim": 128,
}
"""The MLA shape AIConfigurator's module tables were measured at (``model`` column
``deepseek-ai/DeepSeek-V3``; config.json of DeepSeek-V3/R1)."""


def default_distribution(model: ModelSpec) -> str:
    """AIConfigurator's routing skew for ``model``'s family: ``power_law_1.01`` for DeepSeek
    (MLA + MoE, its ``DeepSeekModel``), ``power_law_1.2`` for other MoE models (``MOEModel``)."""
    return "power_law_1.01" if model.is_mla else "power_law_1.2"


def expert_table_dtype(model: ModelSpec, gemm_dtype: str) -> str:
    """The ``moe_dtype`` of ``model``'s routed experts at GEMM precision ``gemm_dtype``."""
    return EXPERT_TABLE_DTYPES.get(model.expert_dtype, gemm_dtype)


class RoutedExperts:
    """The router GEMM and the fused routed-expert kernel of one MoE layer on one GPU.

    Parameters
    ----------
    load, grid : callable
        Table loader and grid maker of the import (:data:`LoadTable`, :data:`MakeGrid`).
    router_gemm : Grid
        The BF16 GEMM grid (``m, n, k``; ms).
    model : ModelSpec
        An MoE model.
    tp : int
        GPUs of the instance; experts are split ``tp`` ways (``moe_tp_size = tp``) or, with
        ``expert_parallel``, placed whole on ``tp`` GPUs (``moe_ep_size = tp``).
    moe_dtype, distribution : str
        ``moe_dtype`` and ``distribution`` of the rows to read.
    """

    def __init__(
        self,
        load: LoadTable,
        grid: MakeGrid,
        router_gemm: Grid,
        model: ModelSpec,
        tp: int,
        *,
        moe_dtype: str,
        distribution: str,
        expert_parallel: bool,
    ) -> None:
        self.model, self.router_gemm = model, router_gemm
        source = load("moe", "moe_perf")
        shape = {
            "hidden_size": model.hidden_size,
            "inter_size": model.moe_intermediate_size,
            "num_experts": model.num_experts,
            "topk": model.experts_per_token,
        }
        _require_shape(source, shape, model.name)
        self.experts = grid(
            source,
            ("num_tokens",),
            "",
            **shape,
            moe_dtype=moe_dtype,
            distribution=distribution,
            moe_tp_size=1 if expert_parallel else tp,
            moe_ep_size=tp if expert_parallel else 1,
        )

    def routed_s(self, tokens: float) -> float:
        """Router GEMM plus routed experts for ``tokens`` tokens, seconds."""
        model = self.model
        router_ms = self.router_gemm(tokens, model.num_experts, model.hidden_size)
        return (router_ms + self.experts(tokens)) / 1e3


class MlaModule:
    """The measured MLA attention block (projections included) of one layer on one GPU."""

    def __init__(
        self,
        load: LoadTable,
        grid: MakeGrid,
        model: ModelSpec,
        tp: int,
        gemm_dtype: str,
        kv_dtype: str,
    ) -> None:
        differs = {
            field: (getattr(model, field), value)
            for field, value in DEEPSEEK_V3_MLA.items()
            if getattr(model, field) != value
        }
        if differs:
            listed = ", ".join(
                f"{f}={have} (tables: {want})" for f, (have, want) in differs.items()
            )
            raise InputError(
                f"import_aic: AIConfigurator's MLA module tables are measured for DeepSeek-V3's "
                f"shape only; {model.name} differs: {listed}"
            )
        equal = {
            "num_heads": model.num_heads // tp,
            "kv_cache_dtype": kv_dtype,
            "gemm_type": gemm_dtype,
        }
        self.context = grid(
            load("mla", "mla_context_module_perf"), ("batch_size", "isl"), "", **equal
        )
        self.generation = grid(
            load("mla", "mla_generation_module_perf"), ("batch_size", "step"), "", **equal
        )


def _require_shape(source: TableSource, shape: dict[str, Any], name: str) -> None:
    """Raise unless ``source`` has rows at the MoE ``shape``; the message lists the shapes it
    has."""
    frame = source.frame
    missing = [column for column in shape if column not in frame.columns]
    if missing:
        raise InputError(f"{source.path}: no {', '.join(map(repr, missing))} column")
    mask = (frame[list(shape)] == list(shape.values())).all(axis=1)
    if mask.any():
        return
    have = sorted({tuple(int(v) for v in row) for row in frame[list(shape)].to_numpy()})
    listed = "; ".join(
        ", ".join(f"{c}={v}" for c, v in zip(shape, row, strict=True)) for row in have
    )
    wanted = ", ".join(f"{c}={v}" for c, v in shape.items())
    raise InputError(
        f"{source.path}: no MoE rows for {name} ({wanted}); the table measures: {listed}"
    )
