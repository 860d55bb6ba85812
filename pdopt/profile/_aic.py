"""Import NVIDIA AIConfigurator's measured per-operation latencies as a pdopt profile.

For a model × AIConfigurator system (GPU) × backend × version × TP × precision, each prefill and
decode iteration is composed from the measured tables the way AIConfigurator's own model
descriptions (``LLAMAModel``, ``MOEModel``, ``DeepSeekModel``) list the ops of one forward pass
on one GPU of the TP group, with ``T`` tokens in the pass (prefill ``B·L``, decode ``B``)::

    embedding + [all-reduce]
    + layers × ( add+norm + ATTENTION + [all-reduce] + add+norm + [all-reduce] )
    + dense layers × MLP(intermediate_size)
    + MoE layers × ( router GEMM + routed experts  (+ shared experts: MLP(shared width)) )
    + LM-head GEMM (m = B: logits of each sequence's last token only, in BF16)

    ATTENTION = QKV GEMM + attention + O GEMM        (GQA/MHA)
              | MLA module                           (MLA: projections included)
    MLP(w)    = gate/up GEMM + activation + down GEMM  (intermediate w split over TP)

* GEMMs: ``gemm/<backend>/<v>/gemm_perf`` at ``(m=T, n, k)`` of the model's shard shapes
  (:func:`pdopt.profile._roofline._gemm_shapes`), ``gemm_dtype`` the precision; where several
  kernels are measured (FP8 block-scaled), the fastest at each point
  (:func:`pdopt.profile._aic_data.fastest_per_point`).
* Prefill attention: ``attention/.../context_attention_perf`` at ``(batch_size=B, isl=L)``,
  decode attention: ``generation_attention_perf`` at ``(batch_size=B, step=C/B)`` (the KV length
  of each request; a decode row's ``total_context_tokens`` is ``C``), for the shard's query and
  KV heads, the head size and the KV-cache dtype. Full-attention layers read the rows at
  ``window_size`` 0; a model's sliding-window layers
  (:attr:`pdopt.model_spec.ModelSpec.sliding_window_layers`, gpt-oss: every other layer) the
  rows at its window (``window_size = sliding_window_tokens``, 128 for gpt-oss), measured with
  the windowed kernel at the same ``isl``/``step`` (decode attention flat beyond the window).
  A table without rows at the window is an error naming the window sizes it has (no silent
  full-attention fallback).
* All-reduce (``tp > 1``): ``comm/<backend>/<v>/custom_allreduce_perf`` among ``tp`` GPUs at
  ``message_size = T · hidden`` (elements: the H200 8-GPU row of 536,870,912 takes 4.5 ms, which
  is 1 GiB of BF16 at NVLink's bus bandwidth, not 512 MB), the CUDA-graph kernel where measured.
* MoE layers (the model's ``num_layers − first_dense_layers``; dense first layers keep the
  dense MLP): the BF16 router GEMM and the fused routed-expert kernel of
  ``moe/<backend>/<v>/moe_perf`` at ``num_tokens = T`` (:mod:`pdopt.profile._aic_moe`); shared
  experts are a dense MLP of ``num_shared_experts · moe_intermediate_size``, run after the routed
  experts in prefill and beside them in decode (``max``: separate CUDA streams, as
  AIConfigurator's ``DeepSeekModel`` overlaps them). Under TP the MoE output is all-reduced like
  a dense MLP's (vLLM without attention data parallelism; with ``expert_parallel`` too).
* MLA attention: the measured module tables, or, where the backend has none (SGLang), the
  block summed from its GEMMs, MLA attention and absorbed-projection BMM tables
  (:mod:`pdopt.profile._aic_mla`); the KV cache is the latent (``kv_lora_rank +
  qk_rope_head_dim`` per token and layer), as in the capacity filter.
* Norm/residual, activation and embedding: not tabulated by AIConfigurator either; memory-bound
  ``bytes / (mem_bw · mem_bw_empirical_scaling_factor) + mem_empirical_constant_latency`` with
  the system's ``<system>.yaml`` constants (bytes: ``T · (in + out) · 2``; add+norm reads and
  writes ``2·hidden`` per token, the gated activation reads ``2·I/tp`` and writes ``I/tp``).

No per-iteration framework or scheduler overhead is added (AIConfigurator's op sum has none).
Not composed, refused with the reason (:data:`UNCOMPOSED`): wide expert parallelism with
attention data parallelism (DeepEP all-to-all tables), pipeline parallelism and multi-token
prediction. The KV-capacity filter counts a
decode point's KV as :meth:`pdopt.model_spec.ModelSpec.kv_context_tokens` per request (sliding
layers hold only the window) and a prefill point's as every prompt token, as
:func:`pdopt.profile.roofline_profile` does.
Latencies between measured points are interpolated, beyond them extrapolated
(:class:`pdopt.profile._aic_data.Grid`); the notes count the extrapolated lookups.

The module runs past 500 lines because the op list above and the one class that evaluates it
(``_Ops``) read as one unit; the table-specific pieces live in ``_aic_data``, ``_aic_moe`` and
``_aic_mla``.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

from pdopt.errors import InputError, ParameterError
from pdopt.hardware import GPUS
from pdopt.model_spec import ModelSpec, get_model, kv_capacity_tokens, with_precision
from pdopt.model_spec._params import check_tp, kv_heads_per_gpu, query_heads_per_gpu
from pdopt.profile._aic_data import (
    AicDatabase,
    Grid,
    LoadTable,
    TableSource,
    availability,
    fastest_per_point,
    find_database,
    load_table,
    memory_constants,
    pick_kernel,
    select,
    systems,
    versions,
)
from pdopt.profile._aic_mla import MlaModule, MlaPerOp, mla_attention
from pdopt.profile._aic_moe import RoutedExperts, default_distribution, expert_table_dtype
from pdopt.profile._format import Profile, ProfileMeta
from pdopt.profile._io import profile_from_records
from pdopt.profile._roofline import (
    DECODE_BATCH_SIZES,
    DECODE_CONTEXT_TOKENS,
    GEMM_M_TOKENS,
    PREFILL_BATCH_SIZES,
    PREFILL_INPUT_TOKENS,
    _gemm_shapes,
    _mlp_shapes,
)

AIC_SYSTEM_GPUS: dict[str, str] = {
    "a100_sxm": "A100-80GB",
    "h100_sxm": "H100-SXM",
    "h200_sxm": "H200",
    "b200_sxm": "B200",
    "l40s": "L40S",
    "l4": "L4",
}
"""AIConfigurator systems and the catalogued pdopt GPU each is (the profile's ``gpu``; other
systems keep AIConfigurator's name and skip the KV-capacity filter)."""

PRECISIONS: dict[str, tuple[str, str]] = {
    "bf16": ("bfloat16", "bf16"),
    "fp16": ("float16", "fp16"),
    "fp8": ("fp8", "fp8"),
    "fp8_block": ("fp8_block", "fp8"),
}
"""``--precision`` → (AIConfigurator ``gemm_dtype``, pdopt weight dtype)."""

KV_DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp8": "fp8"}
"""``--kv-dtype`` → AIConfigurator ``kv_cache_dtype``."""

UNCOMPOSED: dict[str, str] = {
    "pp": "pipeline parallelism is not composed: pdopt has no pipeline-parallel concept (a "
    "profile and a planned instance are one tensor-parallel group, ProfileMeta.tp, with no "
    "stages or micro-batches); import one TP group with --tp (at most the GPUs AIConfigurator "
    "measured an all-reduce among, 8) and plan several instances",
    "attention_dp": "wide expert parallelism with attention data parallelism (AIConfigurator's "
    "DeepEP all-to-all tables, comm/<backend>/wideep_deepep_*, and its wideep_* MoE and MLA "
    "tables) is not composed: each of its ranks runs its own batch and the MoE layers exchange "
    "tokens all-to-all, which a profile row (one batch of one TP group per iteration) cannot "
    "express; import with --tp N, and --expert-parallel to place whole experts on the N GPUs",
    "mtp": "multi-token prediction (speculative decoding) is not composed: a decode row is one "
    "iteration emitting one token per request, and MTP's tokens per iteration depend on a draft "
    "acceptance rate the tables do not hold; import without --mtp (no speculation)",
}
"""Why :func:`import_aic` refuses these options and what to do instead (AIConfigurator's
``pp_size``, ``attention_dp_size`` with a DeepEP ``moe_comm_backend``, and ``nextn``)."""

_ACT_BYTES = 2  # BF16 activations, as AIConfigurator's memory ops assume
_FASTEST = "<fastest>"  # a _grid ``prefer`` value: the fastest kernel at each point
SMALL_M_FLOOR_RATIO = 2.0
"""A quantised GEMM table whose one-token GEMMs of the model's shard shapes take more than this
many times the BF16 ones (median) is flagged in the notes (:meth:`_Ops.small_m_floor_note`):
they read half the weight bytes or less, so a healthy kernel is no slower. AIConfigurator
0.12.0's vLLM 0.24.0 ``fp8_block`` tables measure 2.7–45× (a floor of 56–460 µs whatever the
shape, likely host-side time measured with the kernel), every SGLang and TensorRT-LLM
``fp8_block`` table 0.7–1.0×."""


def import_aic(
    aic_dir: str | Path,
    system: str,
    backend: str,
    model: ModelSpec | str,
    tp: int = 1,
    *,
    version: str | None = None,
    precision: str = "bf16",
    kv_dtype: str = "bf16",
    memory_utilization: float = 0.9,
    expert_parallel: bool = False,
    moe_distribution: str | None = None,
    pp: int = 1,
    attention_dp: int = 1,
    mtp: int = 0,
) -> Profile:
    """A pdopt profile of ``model`` composed from AIConfigurator's per-op tables.

    Parameters
    ----------
    aic_dir : str or Path
        The AIConfigurator data (see :func:`pdopt.profile._aic_data.find_database`), or
        ``"auto"`` for the installed package.
    system, backend : str
        An AIConfigurator system (``h200_sxm``) and backend (``vllm``, ``trtllm``, ``sglang``).
    model : ModelSpec or str
        Catalogue name or spec (e.g. from :func:`pdopt.model_spec.from_hf_config`): dense
        (GQA/MHA), MoE, or MLA at DeepSeek-V3's shape.
    tp : int
        Tensor-parallel degree; every latency is per iteration of the TP group.
    version : str or None
        Backend version; None: the newest with GEMM data. A family the version lacks comes
        from the newest older version that has it (the notes say which).
    precision, kv_dtype : str
        GEMM precision (:data:`PRECISIONS`; the LM head and router stay BF16; routed experts
        stored as ``mxfp4``/``int4`` use their own tables) and KV-cache dtype
        (:data:`KV_DTYPES`).
    memory_utilization : float
        Points whose KV exceeds the instance's KV capacity at this fraction of GPU memory are
        left out, as in :func:`pdopt.profile.roofline_profile` (catalogued GPUs only).
    expert_parallel : bool
        MoE: experts placed whole on the ``tp`` GPUs (``moe_ep_size = tp``) instead of split
        (``moe_tp_size = tp``).
    moe_distribution : str or None
        MoE routing skew of the rows read (``balanced``, ``power_law_1.01``,
        ``power_law_1.2``); None: AIConfigurator's default for the model's family
        (:func:`pdopt.profile._aic_moe.default_distribution`).
    pp, attention_dp, mtp : int
        Pipeline stages, attention data-parallel ranks (wide expert parallelism) and MTP
        draft tokens: AIConfigurator has tables for them, but pdopt's profile cannot represent
        them, so anything but 1, 1, 0 is refused (:data:`UNCOMPOSED`).

    Returns
    -------
    Profile
        ``gemm`` rows at the model's four shard shapes, ``prefill`` and ``decode`` rows on the
        roofline profile's grid; ``meta.source`` names the release, system, backend, version
        and precisions; ``meta.notes`` the tables read, kernels chosen and extrapolations.

    Raises
    ------
    InputError
        Missing database, system, backend, version, table or matching rows (an MoE shape, an
        expert dtype, an all-reduce GPU count, an MLA shape): each message says what is
        available.
    ParameterError
        An unknown precision, a ``tp`` the model's heads do not allow, or ``pp``,
        ``attention_dp`` or ``mtp`` set (the message says why and what to do instead).
    """
    owner = "import_aic"
    for option, value, default in (
        ("pp", pp, 1),
        ("attention_dp", attention_dp, 1),
        ("mtp", mtp, 0),
    ):
        if value != default:
            raise ParameterError(
                f"import_aic {option}={value} (--{option.replace('_', '-')} {value}): "
                f"{UNCOMPOSED[option]}"
            )
    spec = get_model(model) if isinstance(model, str) else model
    tp = check_tp(spec, tp, owner)
    gemm_dtype, weight_dtype = _choice(precision, PRECISIONS, "precision")
    kv_table_dtype = _choice(kv_dtype, KV_DTYPES, "kv_dtype")
    stored = with_precision(spec, weight_dtype, kv_dtype)
    if (stored.dtype, stored.kv_dtype) != (spec.dtype, spec.kv_dtype):
        spec = stored  # named NAME@W/KV only when the precision differs from the model's own
    db = find_database(aic_dir)
    version = _resolve(db, system, backend, version)
    moe = (
        {
            "moe_dtype": expert_table_dtype(spec, gemm_dtype),
            "distribution": moe_distribution or default_distribution(spec),
            "expert_parallel": expert_parallel,
        }
        if spec.is_moe
        else None
    )
    ops = _Ops(db, system, backend, version, spec, tp, gemm_dtype, kv_table_dtype, moe)
    gpu = GPUS.get(AIC_SYSTEM_GPUS.get(system, ""))
    capacity = kv_capacity_tokens(gpu, spec, tp, memory_utilization) if gpu else None
    records = ops.gemm_records()
    skipped = 0
    for batch in PREFILL_BATCH_SIZES:
        for length in PREFILL_INPUT_TOKENS:
            # a prefill writes every prompt token's KV, in sliding layers too (as the roofline)
            if capacity is not None and batch * length > capacity:
                skipped += 1
                continue
            records.append(
                {
                    "kind": "prefill",
                    "batch_size": batch,
                    "input_tokens": length,
                    "latency_s": ops.prefill_s(batch, length),
                }
            )
    for batch in DECODE_BATCH_SIZES:
        for context in DECODE_CONTEXT_TOKENS:
            # capacity counts tokens held in every layer; sliding layers hold only the window
            if capacity is not None and batch * spec.kv_context_tokens(context) > capacity:
                skipped += 1
                continue
            records.append(
                {
                    "kind": "decode",
                    "batch_size": batch,
                    "total_context_tokens": batch * context,
                    "latency_s": ops.decode_s(batch, context),
                }
            )
    source = (
        f"aiconfigurator:{db.release.replace(' ', '=')} system={system} "
        f"backend={backend}/{version} gemm={gemm_dtype} kv={kv_table_dtype}"
        + (f" moe={moe['moe_dtype']}/{moe['distribution']}" if moe else "")
        + (" expert_parallel=True" if moe and expert_parallel else "")
    )
    capacity_note = (
        f"KV capacity {capacity} tokens at memory_utilization={memory_utilization}: "
        f"{skipped} points beyond it left out"
        if capacity is not None
        else f"{system} is no catalogued pdopt GPU: no KV-capacity filter"
    )
    notes = [*ops.notes(), capacity_note]
    meta = ProfileMeta(
        gpu.name if gpu else system, spec.name, spec.dtype, tp, source, "\n".join(notes)
    )
    return profile_from_records(meta, records)


def _choice(value: str, table: dict[str, Any], name: str) -> Any:
    if value not in table:
        raise ParameterError(
            f"The {name!r} parameter of import_aic must be one of {', '.join(table)}. "
            f"Got {value!r}."
        )
    return table[value]


def _resolve(db: AicDatabase, system: str, backend: str, version: str | None) -> str:
    """The version to read: ``version`` if ``backend`` has GEMM data at it, else an error that
    lists what the database holds."""
    if system not in systems(db):
        raise InputError(
            f"{db.root}: no system {system!r}; available systems, backends and versions:\n"
            + availability(db)
        )
    have = versions(db, system, "gemm", backend)
    if not have:
        raise InputError(
            f"{db.root / system}: no GEMM data for backend {backend!r}; available:\n"
            + availability(db)
        )
    if version is None:
        return have[-1]
    if version not in have:
        raise InputError(
            f"{db.root / system / 'gemm' / backend}: no version {version!r}; available: "
            f"{', '.join(have)}"
        )
    return version


def _window(source: TableSource, window: int) -> dict[str, int]:
    """The ``window_size`` to select attention rows by: every table's full-attention rows are
    at 0, and a table without the column (the A100 vLLM and SGLang collections predate
    sliding windows) holds full-attention rows only, so a window > 0 still requires it."""
    if window == 0 and "window_size" not in source.frame.columns:
        return {}
    return {"window_size": window}


class _Ops:
    """The model's op lookups on one system × backend × version (latencies in seconds)."""

    def __init__(
        self,
        db: AicDatabase,
        system: str,
        backend: str,
        version: str,
        model: ModelSpec,
        tp: int,
        gemm_dtype: str,
        kv_dtype: str,
        moe: dict[str, Any] | None,
    ) -> None:
        self.model, self.tp = model, tp
        self._notes: list[str] = []
        self._grids: list[Grid] = []

        def load(family: str, table: str) -> TableSource:
            return load_table(db, system, family, backend, version, table)

        gemm = load("gemm", "gemm_perf")
        self.gemm = self._grid(gemm, ("m", "n", "k"), _FASTEST, gemm_dtype=gemm_dtype)
        self.gemm_bf16 = (
            self.gemm
            if gemm_dtype == "bfloat16"
            else self._grid(gemm, ("m", "n", "k"), _FASTEST, gemm_dtype="bfloat16")
        )
        # MLA: the block's time per layer; GQA/MHA: (layers, prefill grid, decode grid) per
        # kind of attention layer
        self.mla: MlaModule | MlaPerOp | None = None
        self._attention: list[tuple[int, Grid, Grid]] = []
        if model.is_mla:
            self.mla = mla_attention(load, self._grid, self.gemm, model, tp, gemm_dtype, kv_dtype)
            self._notes.append(f"MLA attention: {self.mla.kind} tables")
        else:
            self._attention = self._gqa_attention(load, kv_dtype)
        self.experts = (
            RoutedExperts(load, self._grid, self.gemm_bf16, model, tp, **moe) if moe else None
        )
        self.all_reduce = (
            self._all_reduce_grid(load("comm", "custom_allreduce_perf")) if tp > 1 else None
        )
        self.mem = memory_constants(db, system)
        if gemm_dtype != "bfloat16":
            self._notes.extend(self.small_m_floor_note(gemm_dtype))
        self._notes.append(
            f"memory ops: mem_bw={self.mem[0]:.4g} B/s x {self.mem[1]} + {self.mem[2]} s "
            f"({system}.yaml)"
        )

    def small_m_floor_note(self, gemm_dtype: str) -> list[str]:
        """A warning when the ``gemm_dtype`` GEMMs of the model's shard shapes at ``m = 1`` take
        over :data:`SMALL_M_FLOOR_RATIO` times the BF16 ones (median over the shapes): decode
        rows are built on them (empty list otherwise)."""
        shapes = _gemm_shapes(self.model, self.tp)
        quantised = [self.gemm(1, n, k) for n, k in shapes]
        bf16 = [self.gemm_bf16(1, n, k) for n, k in shapes]
        ratio = median(q / b for q, b in zip(quantised, bf16, strict=True))
        if ratio <= SMALL_M_FLOOR_RATIO:
            return []
        return [
            f"WARNING: at m=1 the {gemm_dtype} GEMMs of this model's shard shapes take "
            f"{min(quantised) * 1e3:.0f}-{max(quantised) * 1e3:.0f} us, {ratio:.1f}x the BF16 "
            f"ones ({min(bf16) * 1e3:.0f}-{max(bf16) * 1e3:.0f} us) though they read half the "
            f"weight bytes or less: the table sits on a floor its shapes do not change (likely "
            f"host-side time measured with the kernel), so the rows built on it, decode most, "
            f"are slower than the engine runs; compare another backend's table (sglang, trtllm)"
        ]

    def _gqa_attention(self, load: LoadTable, kv_dtype: str) -> list[tuple[int, Grid, Grid]]:
        """The attention tables' rows of the shard's heads: full layers at ``window_size`` 0,
        sliding-window layers at the model's window (module docstring)."""
        model, tp = self.model, self.tp
        heads = {
            "num_heads": query_heads_per_gpu(model, tp),
            "num_key_value_heads": kv_heads_per_gpu(model, tp),
            "head_dim": model.head_dim,
            "kv_cache_dtype": kv_dtype,
        }
        sliding = model.sliding_window_layers if model.has_sliding_window else 0
        kinds = [(model.num_layers - sliding, 0), (sliding, model.sliding_window_tokens or 0)]
        context = load("attention", "context_attention_perf")
        generation = load("attention", "generation_attention_perf")
        attention = []
        for layers, window in kinds:
            if layers == 0:
                continue
            try:
                prefill = self._grid(
                    context, ("batch_size", "isl"), "", **heads, **_window(context, window)
                )
                decode = self._grid(
                    generation, ("batch_size", "step"), "", **heads, **_window(generation, window)
                )
            except InputError as exc:
                if window == 0:
                    raise
                raise InputError(
                    f"import_aic: {model.name} has {layers} sliding-window layers of "
                    f"{window} tokens, but AIConfigurator has no attention rows at "
                    f"window_size={window} for its shard's heads; {exc}"
                ) from exc
            attention.append((layers, prefill, decode))
        return attention

    def _attention_ms(self, decode: bool, batch: int, length: int) -> float:
        """Attention time per layer, ms: the layers' mean over full and sliding layers at
        ``(batch, isl)`` (prefill) or ``(batch, step)`` (decode); MLA: its whole block."""
        if self.mla is not None:
            return (
                self.mla.decode_ms(batch, length) if decode else self.mla.prefill_ms(batch, length)
            )
        total = sum(
            layers * (decode_grid if decode else prefill_grid)(batch, length)
            for layers, prefill_grid, decode_grid in self._attention
        )
        return total / self.model.num_layers

    def _all_reduce_grid(self, source: TableSource) -> Grid:
        frame = source.frame
        gpus: list[Any] = frame["num_gpus"].unique().tolist() if "num_gpus" in frame.columns else []
        measured = sorted(int(n) for n in gpus)
        if self.tp not in measured:
            raise InputError(
                f"{source.path}: no all-reduce measured among tp={self.tp} GPUs "
                f"(measured GPU counts: {', '.join(map(str, measured)) or 'none'}); "
                f"use one of those --tp values"
            )
        return self._grid(source, ("message_size",), "graph", num_gpus=self.tp)

    def _grid(self, source: TableSource, keys: tuple[str, ...], prefer: str, **equal: Any) -> Grid:
        selected = select(source.frame, source.path, **equal)
        if prefer == _FASTEST:
            rows, kernel = fastest_per_point(selected, keys)
        else:
            rows, kernel = pick_kernel(selected, prefer)
        grid = Grid(rows, keys, source.path)
        fixed = " ".join(f"{c}={v}" for c, v in equal.items())
        self._notes.append(
            f"{source.path.parent.parent.parent.name}/{source.path.parent.parent.name}/"
            f"{source.version}/{source.path.name}: kernel {kernel}, {fixed}, {len(rows)} rows"
        )
        self._grids.append(grid)
        return grid

    def notes(self) -> list[str]:
        """Provenance: tables, kernels and how many lookups were extrapolated."""
        counts = ", ".join(f"{g.path.name} {g.extrapolated}" for g in self._grids)
        return [*self._notes, f"lookups extrapolated beyond measured points: {counts}"]

    def _memory_s(self, bytes_: float) -> float:
        bandwidth, scale, constant = self.mem
        return bytes_ / (bandwidth * scale) + constant

    def _all_reduce_s(self, tokens: float) -> float:
        if self.all_reduce is None:
            return 0.0
        return self.all_reduce(tokens * self.model.hidden_size) / 1e3

    def _attention_s(self, tokens: float, attention_ms: float) -> float:
        """One layer's attention block: the table's time plus, for GQA/MHA, the QKV and O
        GEMMs (the MLA block's time includes its projections)."""
        if self.mla is not None:
            return attention_ms / 1e3
        (qkv, o, _, _) = _gemm_shapes(self.model, self.tp)
        return (attention_ms + self.gemm(tokens, *qkv) + self.gemm(tokens, *o)) / 1e3

    def _mlp_s(self, tokens: float, width: int) -> float:
        """A (gated) MLP of intermediate ``width`` split over TP: its two GEMMs and the
        activation (reads ``2·width/tp``, writes ``width/tp`` per token when gated)."""
        up, down = _mlp_shapes(self.model, width, self.tp)
        act_out = up[0] // 2 if self.model.gated_mlp else up[0]
        gemm_ms = self.gemm(tokens, *up) + self.gemm(tokens, *down)
        return gemm_ms / 1e3 + self._memory_s(tokens * (up[0] + act_out) * _ACT_BYTES)

    def _moe_s(self, tokens: float, decode: bool) -> float:
        """One MoE layer's experts: routed, and shared ones after them (prefill) or beside
        them on another stream (decode)."""
        assert self.experts is not None  # only called for MoE models
        routed = self.experts.routed_s(tokens)
        model = self.model
        if model.num_shared_experts == 0:
            return routed
        shared = self._mlp_s(tokens, model.num_shared_experts * model.moe_intermediate_size)
        return max(routed, shared) if decode else routed + shared

    def _pass_s(self, tokens: float, rows: float, attention_ms: float, decode: bool) -> float:
        """One forward pass over ``tokens`` tokens with ``rows`` sequences' logits; attention
        given (ms per layer)."""
        model = self.model
        hidden = model.hidden_size
        layer_s = (
            self._attention_s(tokens, attention_ms)
            + 2 * self._memory_s(tokens * 4 * hidden * _ACT_BYTES)
            + 2 * self._all_reduce_s(tokens)
        )
        dense_layers = model.num_layers - model.moe_layers
        mlp_s = dense_layers * self._mlp_s(tokens, model.intermediate_size)
        if model.moe_layers:
            mlp_s += model.moe_layers * self._moe_s(tokens, decode)
        embedding_s = self._memory_s(tokens * hidden * _ACT_BYTES) + self._all_reduce_s(tokens)
        logits_s = self.gemm_bf16(rows, model.vocab_size // self.tp, hidden) / 1e3
        return model.num_layers * layer_s + mlp_s + embedding_s + logits_s

    def prefill_s(self, batch: int, length: int) -> float:
        """A prefill iteration of ``batch`` prompts of ``length`` tokens, seconds."""
        return self._pass_s(batch * length, batch, self._attention_ms(False, batch, length), False)

    def decode_s(self, batch: int, context: int) -> float:
        """A decode iteration of ``batch`` requests holding ``context`` KV tokens each, s."""
        return self._pass_s(batch, batch, self._attention_ms(True, batch, context), True)

    def gemm_records(self) -> list[dict[str, Any]]:
        """``gemm`` profile rows: the model's four shard GEMMs at :data:`GEMM_M_TOKENS`."""
        return [
            {"kind": "gemm", "m": m, "n": n, "k": k, "latency_s": self.gemm(m, n, k) / 1e3}
            for n, k in _gemm_shapes(self.model, self.tp)
            for m in GEMM_M_TOKENS
        ]
