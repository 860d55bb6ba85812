"""AIConfigurator's MoE tables for :func:`pdopt.profile.import_aic` (MLA:
:mod:`pdopt.profile._aic_mla`).

* Routed experts: ``moe/<backend>/<v>/moe_perf`` holds the whole fused MoE kernel (expert
  gate/up GEMMs, activation, down GEMMs, top-k combine) of one GPU, measured per model shape
  (``hidden_size, inter_size, num_experts, topk``), expert dtype (``moe_dtype``), expert
  sharding (``moe_tp_size × moe_ep_size``) and routing skew (``distribution``), at
  ``num_tokens`` tokens entering the layer. As in AIConfigurator's ``MOEModel`` and
  ``DeepSeekModel``, the router is a separate BF16 GEMM ``(m = tokens, n = num_experts,
  k = hidden)``.

Routing skew: AIConfigurator's default is a power law, ``power_law_1.2`` for its ``MOEModel``
family (Qwen3 MoE, Mixtral, gpt-oss) and ``power_law_1.01`` for ``DeepSeekModel``; the same
defaults apply here (:func:`default_distribution`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from pdopt.errors import InputError
from pdopt.model_spec import ModelSpec
from pdopt.profile._aic_data import Grid, LoadTable, MakeGrid, TableSource, other_versions

EXPERT_TABLE_DTYPES: dict[str, str] = {"mxfp4": "w4a16_mxfp4", "int4": "int4_wo"}
"""Stored expert dtypes (:data:`pdopt.model_spec.DTYPE_BYTES`) that have their own ``moe_dtype``
in AIConfigurator; other experts run at the GEMM precision."""


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


def _measures(frame: pd.DataFrame, shape: dict[str, Any]) -> bool:
    """Whether ``frame`` has rows at the MoE ``shape`` (its columns all present)."""
    if any(column not in frame.columns for column in shape):
        return False
    return bool((frame[list(shape)] == list(shape.values())).all(axis=1).any())


def _require_shape(source: TableSource, shape: dict[str, Any], name: str) -> None:
    """Raise unless ``source`` has rows at the MoE ``shape``; the message lists the shapes it
    has."""
    frame = source.frame
    missing = [column for column in shape if column not in frame.columns]
    if missing:
        raise InputError(f"{source.path}: no {', '.join(map(repr, missing))} column")
    if _measures(frame, shape):
        return
    have = sorted({tuple(int(v) for v in row) for row in frame[list(shape)].to_numpy()})
    listed = "; ".join(
        ", ".join(f"{c}={v}" for c, v in zip(shape, row, strict=True)) for row in have
    )
    wanted = ", ".join(f"{c}={v}" for c, v in shape.items())
    elsewhere = [o.version for o in other_versions(source) if _measures(o.frame, shape)]
    hint = (
        f"; this backend measures it at version{'s' * (len(elsewhere) > 1)} "
        f"{', '.join(elsewhere)}: give --version {elsewhere[-1]}"
        if elsewhere
        else ""
    )
    raise InputError(
        f"{source.path}: no MoE rows for {name} ({wanted}); the table measures: {listed}{hint}"
    )
