"""The roofline prior: a synthetic profile of any GPU × model × TP from FLOPs and bytes.

Each op takes the smooth roofline ``(t_c^p + t_m^p)^(1/p)`` of ``t_c = flops /
(compute_efficiency · peak)`` and ``t_m = bytes / (bandwidth_efficiency · hbm_bw)`` plus, for
prefill and decode forward passes, the elementwise traffic, a fixed ``overhead_s``, a fixed
``kernel_latency_s`` per kernel (eight per layer, more for MLA: :func:`_kernels_per_layer`),
for decode ``attention_head_latency_s`` per sequence, query head and layer,
and (TP > 1) the all-reduces
(:func:`all_reduce_s`); an MoE model's routed-expert GEMMs take a roofline of their own
(:func:`_routed_expert_cost`, exponent ``moe_ridge_exponent``) with ``2·moe_reduction_overhead``
more FLOPs per output element (:func:`_expert_overhead_flops`), each MoE layer
``moe_layer_latency_s``;
dequantised (MXFP4) experts more FLOPs and a time per weight element read
(:func:`_dequant_weight_s`); FP8 (W8A8) weight GEMMs stream their weights at
``fp8_bandwidth_fraction`` of the bandwidth and quantise their inputs in a kernel each
(:func:`_w8a8`). FLOPs and bytes come from :mod:`pdopt.model_spec` (conventions
there); the knobs default to the GPU generation's preset (:mod:`pdopt.profile._knobs`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import numpy as np

from pdopt._validation import check_non_negative
from pdopt.errors import ParameterError
from pdopt.hardware import GpuSpec, get_gpu
from pdopt.model_spec import (
    ModelSpec,
    OpCost,
    decode_step_cost,
    expected_experts_touched,
    get_model,
    kv_capacity_tokens,
    prefill_cost,
)
from pdopt.model_spec._params import (
    check_expert_parallel,
    check_tp,
    expert_params,
    kv_heads_per_gpu,
    query_heads_per_gpu,
    routed_expert_bytes_read,
    routed_expert_gemm_params,
)
from pdopt.profile._format import Profile, ProfileMeta
from pdopt.profile._io import profile_from_records
from pdopt.profile._knobs import (
    DEQUANTISED_EXPERT_DTYPES,
    FP8_GEMM_EXTRA_KERNELS,
    KERNELS_PER_LAYER,
    MLA_DECODE_EXTRA_KERNELS,
    MLA_PREFILL_EXTRA_KERNELS,
    RooflineKnobs,
    roofline_knobs,
)

PREFILL_INPUT_TOKENS: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8)
DECODE_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXT_TOKENS: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
GEMM_M_TOKENS: tuple[int, ...] = (16, 64, 256, 1024, 4096, 8192)
DEFAULT_NOISE_SIGMA = 0.03


def roofline_profile(
    gpu: GpuSpec | str,
    model: ModelSpec | str,
    tp: int = 1,
    *,
    compute_efficiency: float | None = None,
    bandwidth_efficiency: float | None = None,
    overhead_s: float | None = None,
    memory_utilization: float = 0.9,
    seed: int | None = None,
    noise_sigma: float = DEFAULT_NOISE_SIGMA,
    expert_parallel: bool = False,
    all_reduce_latency_s: float | None = None,
    elementwise_bytes: float | None = None,
    ridge_exponent: float | None = None,
    kernel_latency_s: float | None = None,
    all_reduce_peer_latency_s: float | None = None,
    all_reduce_bandwidth_efficiency: float | None = None,
    moe_reduction_overhead: float | None = None,
    moe_layer_latency_s: float | None = None,
    moe_dequant_reduction_overhead: float | None = None,
    moe_dequant_weight_latency_s: float | None = None,
    all_reduce_switch_min_gpus: float | None = None,
    all_reduce_switch_latency_s: float | None = None,
    all_reduce_switch_efficiency: float | None = None,
    moe_ridge_exponent: float | None = None,
    moe_fp8_peak_fraction: float | None = None,
    attention_head_latency_s: float | None = None,
    fp8_peak_fraction: float | None = None,
    fp8_bandwidth_fraction: float | None = None,
) -> Profile:
    """A synthetic profile of ``model`` on ``gpu`` at tensor parallelism ``tp``.

    Rows:

    * ``gemm``: the model's four projection GEMMs per TP shard (QKV, O, gate+up, down) at
      ``m`` in :data:`GEMM_M_TOKENS`: the smooth roofline of ``2mnk / (eff_c·peak)`` and
      ``(mk + kn + mn)·dtype / (eff_b·bw)`` plus one ``kernel_latency_s``, so large GEMMs
      approach ``eff_c · peak`` and small ones the latency.
    * ``prefill``: batch 1, 2, 4, 8 × input 128 … 8192 (:func:`pdopt.model_spec.prefill_cost`).
    * ``decode``: batch 1 … 256 × context per request 128 … 8192, ``total_context_tokens`` =
      batch × context (:func:`pdopt.model_spec.decode_step_cost`).

    Prefill and decode rows over ``T`` tokens add (none overlapped) ``elementwise_bytes · T ·
    layers · hidden / (eff_b·bw)``, ``overhead_s``, ``KERNELS_PER_LAYER · layers ·
    kernel_latency_s`` (:data:`pdopt.profile._knobs.KERNELS_PER_LAYER`, 8; MLA layers run 4
    more in prefill and 5 more in decode, ``_kernels_per_layer``), for decode ``batch ·
    layers · num_heads / tp · attention_head_latency_s`` and, when ``tp > 1``,
    two all-reduces per layer of ``T · hidden · activation_bytes`` bytes, each
    :func:`all_reduce_s`; with ``expert_parallel`` an MoE layer's MLP all-reduce becomes a
    dispatch and a combine all-to-all (``_all_to_all_s``). An MoE model's step prices its
    routed-expert GEMMs as a roofline of their own (:func:`_routed_expert_cost`, exponent
    ``moe_ridge_exponent``) with the fused-MoE kernels' per-output-element overhead FLOPs
    (:func:`_expert_overhead_flops`), and adds ``moe_layers · moe_layer_latency_s``; routed experts
    stored dequantised (:data:`pdopt.profile._knobs.DEQUANTISED_EXPERT_DTYPES`, MXFP4) add
    the dequantisation time of the weights read (:func:`_dequant_weight_s`).

    Precision: the weight GEMMs compute at :meth:`pdopt.hardware.GpuSpec.peak_flops_for` the
    weight dtype (for FP8 weights where the GPU has FP8 tensor cores the FP8 peak times
    ``fp8_peak_fraction``), attention's QKᵀ and AV products (activations by activations) at the
    16-bit peak whatever the weights (:func:`_pass_rates`); weights are read in their own dtype
    and KV in the KV dtype (:mod:`pdopt.model_spec`); FP8 weight GEMMs there (W8A8) stream
    their weights at ``fp8_bandwidth_fraction`` of the bandwidth and each quantises its input
    in a kernel of its own (:func:`_w8a8`). MoE: FLOPs of the active parameters, bytes
    of the experts a batch touches, memory (KV capacity) from all of them.

    Points whose KV would not fit in the instance's KV capacity at ``memory_utilization`` are
    left out, as a real profiler could not run them; ``meta.notes``
    says how many.

    Parameters
    ----------
    gpu, model : GpuSpec or str, ModelSpec or str
        Specs or catalogue names.
    tp : int
        Tensor-parallel degree; every time is per GPU of the TP group.
    compute_efficiency, bandwidth_efficiency : float in (0, 1], optional
        Sustained fractions of the data-sheet peaks.
    overhead_s : float, optional
        Fixed time per forward pass, seconds.
    all_reduce_latency_s, elementwise_bytes, ridge_exponent, kernel_latency_s : float, optional
        Fixed time of one all-reduce call (seconds); HBM bytes per token × layer × hidden of
        norms, residual adds and the activation (not split across TP ranks); ``p`` of the
        smooth roofline (``math.inf``: the hard max); fixed time of one kernel (seconds).
    all_reduce_peer_latency_s, all_reduce_bandwidth_efficiency : float, optional
        Time an all-reduce call adds per peer GPU (seconds) and the fraction of the link
        bandwidth it sustains (:func:`all_reduce_s`; e.g. set from a measured NCCL table when
        the serving engine all-reduces with NCCL rather than a custom kernel).
    all_reduce_switch_min_gpus, all_reduce_switch_latency_s, all_reduce_switch_efficiency : \
float, optional
        From how many GPUs an all-reduce may reduce in the NVLink switch (``math.inf``:
        never), that path's fixed time (seconds) and sustained fraction of the link
        (:func:`all_reduce_s`).
    moe_reduction_overhead, moe_layer_latency_s, moe_ridge_exponent : float, optional
        Multiply-adds per routed-expert GEMM output element added to its reduction depth;
        fixed time of one MoE layer, seconds; ``p`` of the routed experts' own roofline
        (:class:`pdopt.profile.RooflineKnobs`; MoE models only).
    moe_fp8_peak_fraction : float in (0, 1], optional
        Fraction of the FP8 peak routed experts stored in FP8 compute at (block-scaled
        fused-MoE kernels; :class:`pdopt.profile.RooflineKnobs`).
    attention_head_latency_s : float, optional
        Fixed time of decode attention per sequence, query head on one GPU and layer, seconds
        (:class:`pdopt.profile.RooflineKnobs`).
    fp8_peak_fraction : float in (0, 1], optional
        Fraction of the FP8 peak the weight GEMMs of an FP8 model compute at (scaled FP8
        GEMMs; :class:`pdopt.profile.RooflineKnobs`).
    fp8_bandwidth_fraction : float in (0, 1], optional
        Fraction of the bandwidth at which an FP8 model's weight GEMMs stream their weights
        (:class:`pdopt.profile.RooflineKnobs`); each also runs
        :data:`~pdopt.profile._knobs.FP8_GEMM_EXTRA_KERNELS` more kernel (its input's
        quantisation).
    moe_dequant_reduction_overhead, moe_dequant_weight_latency_s : float, optional
        Multiply-adds per routed-expert output element added to ``moe_reduction_overhead`` and
        seconds per routed-expert weight element read, for experts stored in a dequantised
        dtype (MXFP4; :class:`pdopt.profile.RooflineKnobs`).
        Every knob left None comes from the preset of ``gpu.generation``
        (:data:`pdopt.profile.ROOFLINE_PRESETS`, fitted on measurements: README "The roofline
        prior's presets"); ``meta.notes`` lists the knobs used.
    expert_parallel : bool
        For an MoE model at ``tp > 1``: experts spread over the ``tp`` GPUs (expert parallelism,
        attention still tensor-parallel) instead of each expert split ``tp`` ways; ``tp`` must
        divide ``num_experts`` (:func:`pdopt.model_spec._params.check_expert_parallel`).
    seed : int or None
        None: exact roofline times. An int: each latency is multiplied by
        ``exp(N(0, noise_sigma²))`` drawn from ``numpy.random.default_rng(seed)``.

    Raises
    ------
    ConfigError
        When the weights do not fit on the GPU at this ``tp``.
    ParameterError
        With ``expert_parallel``, when the model is dense or ``tp`` does not divide its experts;
        when ``tp`` spans more GPUs than one node holds (:meth:`GpuSpec.check_tp`).

    Examples
    --------
    >>> p = roofline_profile("V100-32GB", "Qwen2.5-7B")
    >>> sorted(p.rows["kind"].unique())
    ['decode', 'gemm', 'prefill']
    """
    owner = "roofline_profile"
    gpu_spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    spec = get_model(model) if isinstance(model, str) else model
    tp = gpu_spec.check_tp(check_tp(spec, tp, owner), owner)
    knobs = _knobs_of(
        gpu_spec,
        compute_efficiency=compute_efficiency,
        bandwidth_efficiency=bandwidth_efficiency,
        overhead_s=overhead_s,
        all_reduce_latency_s=all_reduce_latency_s,
        elementwise_bytes=elementwise_bytes,
        ridge_exponent=ridge_exponent,
        kernel_latency_s=kernel_latency_s,
        all_reduce_peer_latency_s=all_reduce_peer_latency_s,
        all_reduce_bandwidth_efficiency=all_reduce_bandwidth_efficiency,
        moe_reduction_overhead=moe_reduction_overhead,
        moe_layer_latency_s=moe_layer_latency_s,
        moe_dequant_reduction_overhead=moe_dequant_reduction_overhead,
        moe_dequant_weight_latency_s=moe_dequant_weight_latency_s,
        all_reduce_switch_min_gpus=all_reduce_switch_min_gpus,
        all_reduce_switch_latency_s=all_reduce_switch_latency_s,
        all_reduce_switch_efficiency=all_reduce_switch_efficiency,
        moe_ridge_exponent=moe_ridge_exponent,
        moe_fp8_peak_fraction=moe_fp8_peak_fraction,
        attention_head_latency_s=attention_head_latency_s,
        fp8_peak_fraction=fp8_peak_fraction,
        fp8_bandwidth_fraction=fp8_bandwidth_fraction,
    )
    rates = _pass_rates(spec, gpu_spec, knobs)
    if expert_parallel:
        check_expert_parallel(spec, tp, owner)
    fixed = _FixedTerms(knobs, expert_parallel)
    check_non_negative(noise_sigma, "noise_sigma", owner)
    capacity = kv_capacity_tokens(gpu_spec, spec, tp, memory_utilization)
    records = _gemm_records(spec, gpu_spec, tp, rates, knobs)
    prefill, skipped_prefill = _prefill_records(spec, gpu_spec, tp, rates, fixed, capacity)
    decode, skipped_decode = _decode_records(spec, gpu_spec, tp, rates, fixed, capacity)
    records += prefill + decode
    if seed is not None:
        noise = np.random.default_rng(seed).lognormal(0.0, noise_sigma, size=len(records))
        for record, factor in zip(records, noise, strict=True):
            record["latency_s"] *= float(factor)
    notes = (
        f"knobs ({gpu_spec.generation} preset unless given): "
        f"{knobs.describe(moe=spec.is_moe)} seed={seed}"
        + (" expert_parallel=True" if expert_parallel else "")
        + f"; KV capacity {capacity} tokens at "
        f"memory_utilization={memory_utilization}: {skipped_prefill} prefill and "
        f"{skipped_decode} decode points beyond it left out"
    )
    meta = ProfileMeta(gpu_spec.name, spec.name, spec.dtype, tp, "roofline", notes)
    return profile_from_records(meta, records)


def _knobs_of(gpu: GpuSpec, **given: float | None) -> RooflineKnobs:
    """The preset of ``gpu``'s generation with every knob given (not None) replaced; the
    knobs' own checks name a bad value (a ``roofline_profile`` parameter)."""
    preset = roofline_knobs(gpu)
    try:
        return dataclasses.replace(
            preset, **{name: value for name, value in given.items() if value is not None}
        )
    except ParameterError as exc:
        raise ParameterError(str(exc).replace("RooflineKnobs", "roofline_profile")) from exc


class _Rates(NamedTuple):
    """Sustained compute (FLOP/s of the weight GEMMs) and memory (B/s) rates, the smooth
    roofline's ``p``, and the FLOP/s of attention's products (:func:`_pass_rates`)."""

    flops_per_s: float
    bytes_per_s: float
    ridge_exponent: float
    attention_flops_per_s: float


def _pass_rates(model: ModelSpec, gpu: GpuSpec, knobs: RooflineKnobs) -> _Rates:
    """The rates of a forward pass of ``model`` on ``gpu``: ``compute_efficiency`` of the peak
    its weight dtype computes at (:func:`_gemm_peak` with ``fp8_peak_fraction``); attention's
    products at ``compute_efficiency`` of the 16-bit peak, as their operands are activations
    and KV (read from an FP8 cache, they are converted to 16 bits first);
    ``bandwidth_efficiency`` of the HBM bandwidth."""
    return _Rates(
        knobs.compute_efficiency * _gemm_peak(gpu, model.dtype, knobs.fp8_peak_fraction),
        knobs.bandwidth_efficiency * gpu.hbm_bw_bytes_per_s,
        knobs.ridge_exponent,
        knobs.compute_efficiency * gpu.peak_flops,
    )


def _gemm_peak(gpu: GpuSpec, weight_dtype: str, fp8_fraction: float) -> float:
    """The tensor peak GEMMs of weights stored as ``weight_dtype`` compute at, FLOP/s:
    :meth:`pdopt.hardware.GpuSpec.peak_flops_for`, times ``fp8_fraction`` where that is the FP8
    peak (scaled FP8 kernels reach only part of it: :class:`pdopt.profile.RooflineKnobs`)."""
    peak = gpu.peak_flops_for(weight_dtype)
    if weight_dtype == "fp8" and gpu.fp8_peak_flops > 0:
        peak *= fp8_fraction
    return peak


class _FixedTerms(NamedTuple):
    """What a forward pass adds to its roofline time (see :func:`roofline_profile`): the
    knobs' fixed terms and all-reduce law, and whether MoE experts are spread over the GPUs."""

    knobs: RooflineKnobs
    expert_parallel: bool


def _roofline_s(flops: float, bytes_: float, rates: _Rates) -> float:
    """``(t_c^p + t_m^p)^(1/p)`` of the compute and memory times (``p = inf``: their max)."""
    compute, memory = flops / rates.flops_per_s, bytes_ / rates.bytes_per_s
    p = rates.ridge_exponent
    if math.isinf(p) or compute == 0.0 or memory == 0.0:
        return max(compute, memory)
    # NOTE: scaled by the larger time so the power cannot overflow at large p.
    top = max(compute, memory)
    return float(top * ((compute / top) ** p + (memory / top) ** p) ** (1.0 / p))


def _step_s(
    cost: OpCost,
    tokens: float,
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    rates: _Rates,
    fixed: _FixedTerms,
    *,
    decode: bool,
) -> float:
    """One forward pass (a decode step when ``decode``, else a prefill) over ``tokens`` tokens
    of FLOPs and bytes ``cost``: roofline of the GEMM/attention FLOPs (each at its rate,
    :func:`_pass_rates`) and bytes,
    then (not overlapped) the elementwise bytes at the same bandwidth, the fixed overhead, the
    kernels' fixed latencies and the TP communication. An MoE model's routed-expert GEMMs
    (:func:`_routed_expert_cost`) leave that roofline for one of their own at
    ``moe_ridge_exponent``, with the fused-MoE overhead FLOPs (:func:`_expert_overhead_flops`)
    in its compute time; its MoE layers' fixed latency and dequantised experts' time per weight
    element read (:func:`_dequant_weight_s`) join the sum, and a decode step's
    ``attention_head_latency_s`` per sequence, query head on one GPU and layer. FP8 (W8A8)
    weights (:func:`_w8a8`) count their bytes ``1 / fp8_bandwidth_fraction`` times and add
    :data:`~pdopt.profile._knobs.FP8_GEMM_EXTRA_KERNELS` kernel latencies per weight GEMM
    (:func:`_weight_gemms_per_pass`)."""
    knobs = fixed.knobs
    expert_flops, expert_bytes = _routed_expert_cost(model, tp, tokens)
    flops = cost.flops - expert_flops
    # attention's products run at their own rate: counted at the weight GEMMs' rate, each of
    # their FLOPs is worth rate_w / rate_attention of the GEMMs' (exactly 1 with 16-bit weights)
    flops += cost.attention_flops * (rates.flops_per_s / rates.attention_flops_per_s - 1.0)
    bytes_ = cost.bytes - expert_bytes
    latency = 0.0
    if _w8a8(model, gpu):
        # the same trick for FP8 weights streamed at fp8_bandwidth_fraction of the rate
        weight_bytes = cost.weight_bytes - expert_bytes
        bytes_ += weight_bytes * (1.0 / knobs.fp8_bandwidth_fraction - 1.0)
        gemms = _weight_gemms_per_pass(model, decode)
        latency += FP8_GEMM_EXTRA_KERNELS * gemms * knobs.kernel_latency_s
    latency += _roofline_s(flops, bytes_, rates)
    if expert_flops or expert_bytes:
        expert_flops += _expert_overhead_flops(model, tp, tokens, knobs)
        latency += _roofline_s(expert_flops, expert_bytes, _expert_rates(model, gpu, rates, knobs))
    latency += knobs.overhead_s
    latency += _dequant_weight_s(model, tp, tokens, knobs.moe_dequant_weight_latency_s)
    latency += model.moe_layers * knobs.moe_layer_latency_s
    latency += _kernels_per_layer(model, decode) * model.num_layers * knobs.kernel_latency_s
    if decode:  # a decode step's tokens are its sequences, one query token each
        latency += _attention_head_s(model, tp, tokens, knobs.attention_head_latency_s)
    if knobs.elementwise_bytes:
        per_token = knobs.elementwise_bytes * model.num_layers * model.hidden_size
        latency += per_token * tokens / rates.bytes_per_s
    return latency + _communication_s(model, gpu, tp, tokens, fixed)


def _w8a8(model: ModelSpec, gpu: GpuSpec) -> bool:
    """Whether ``model``'s weight GEMMs run as W8A8 FP8 GEMMs on ``gpu``: FP8 weights on a GPU
    with FP8 tensor cores (elsewhere FP8 weights are dequantised to 16 bits, weight-only)."""
    return model.dtype == "fp8" and gpu.fp8_peak_flops > 0


def _weight_gemms_per_pass(model: ModelSpec, decode: bool) -> int:
    """Weight-GEMM kernels of one forward pass besides the routed experts' fused-MoE kernels
    (counted): per layer the attention projections (GQA/MHA: QKV and O; MLA: the fused
    down-projection, the Q and KV up-projections and O in prefill, the KV up-projection
    absorbed into 16-bit batched GEMMs in decode), and each dense layer's and each MoE layer's
    shared experts' gate+up and down."""
    attention = (3 if decode else 4) if model.is_mla else 2
    mlp_layers = model.num_layers - model.moe_layers
    if model.num_shared_experts:
        mlp_layers = model.num_layers
    return model.num_layers * attention + 2 * mlp_layers


def _attention_head_s(
    model: ModelSpec, tp: int, sequences: float, attention_head_latency_s: float
) -> float:
    """Decode attention's fixed time besides its bytes and FLOPs on one GPU, seconds::

        t = attention_head_latency_s · sequences · layers · num_heads / tp

    (:class:`pdopt.profile.RooflineKnobs`: each sequence's output row per query head)."""
    heads = query_heads_per_gpu(model, tp)
    return attention_head_latency_s * sequences * model.num_layers * heads


def _kernels_per_layer(model: ModelSpec, decode: bool) -> int:
    """Kernels of one layer's forward pass that each pay ``kernel_latency_s``:
    :data:`~pdopt.profile._knobs.KERNELS_PER_LAYER`, plus for MLA the latent norms and extra
    projections (:data:`~pdopt.profile._knobs.MLA_PREFILL_EXTRA_KERNELS`,
    :data:`~pdopt.profile._knobs.MLA_DECODE_EXTRA_KERNELS`), one fewer without a Q LoRA
    (``q_lora_rank`` 0, DeepSeek-V2-Lite: one Q projection in place of the Q-latent norm and
    up-projection)."""
    if not model.is_mla:
        return KERNELS_PER_LAYER
    extra = MLA_DECODE_EXTRA_KERNELS if decode else MLA_PREFILL_EXTRA_KERNELS
    if model.q_lora_rank == 0:
        extra -= 1
    return KERNELS_PER_LAYER + extra


def _routed_expert_cost(model: ModelSpec, tp: int, tokens: float) -> tuple[float, float]:
    """FLOPs and weight bytes of the routed-expert GEMMs of one forward pass over ``tokens``
    tokens on one GPU (``(0, 0)`` for a dense model), the part of
    :func:`pdopt.model_spec.prefill_cost`'s and :func:`~pdopt.model_spec.decode_step_cost`'s
    totals that :func:`_step_s` prices as a roofline of its own::

        flops = 2 · moe_layers · k · P_e / tp · tokens
        bytes = moe_layers · touched(tokens) · P_e / tp · expert_dtype_bytes

    ``P_e`` one expert's matrices, ``k`` experts per token, ``touched`` =
    :func:`pdopt.model_spec.expected_experts_touched` (owners:
    :func:`pdopt.model_spec._params.routed_expert_gemm_params` and
    :func:`~pdopt.model_spec._params.routed_expert_bytes_read`); split ``tp`` ways, or
    expert-parallel ``E / tp`` whole experts per GPU: the same first-order count."""
    flops = 2.0 * routed_expert_gemm_params(model, tp) * tokens
    return flops, routed_expert_bytes_read(model, tp, tokens)


def _expert_rates(model: ModelSpec, gpu: GpuSpec, rates: _Rates, knobs: RooflineKnobs) -> _Rates:
    """The routed experts' own roofline rates: the pass's bandwidth, ``moe_ridge_exponent``, and
    ``compute_efficiency`` of the peak their stored dtype computes at (:func:`_gemm_peak` with
    ``moe_fp8_peak_fraction``)."""
    peak = _gemm_peak(gpu, model.expert_dtype, knobs.moe_fp8_peak_fraction)
    return _Rates(
        knobs.compute_efficiency * peak,
        rates.bytes_per_s,
        knobs.moe_ridge_exponent,
        rates.attention_flops_per_s,
    )


def _expert_overhead_flops(model: ModelSpec, tp: int, tokens: float, knobs: RooflineKnobs) -> float:
    """Extra FLOPs of the routed-expert GEMMs of one forward pass over ``tokens`` tokens on one
    GPU, fused-MoE (grouped GEMM) kernels' per-output-tile cost counted as ``K0`` more
    multiply-adds per output element (``K0`` = ``moe_reduction_overhead``, plus
    ``moe_dequant_reduction_overhead`` for experts stored in a
    :data:`pdopt.profile._knobs.DEQUANTISED_EXPERT_DTYPES` dtype,
    :class:`pdopt.profile.RooflineKnobs`)::

        flops = 2 · K0 · moe_layers · copies · (n_up + n_down)

    ``n_up``, ``n_down``: output widths of one expert's gate+up and down projections
    (:func:`_mlp_shapes`: ``2·I/tp`` and ``hidden`` for a gated expert of width ``I``, split
    ``tp`` ways); ``copies = tokens · experts_per_token`` routed token copies per GPU. 0 for
    dense models or ``K0 = 0``.

    The same under ``expert_parallel``: whole experts on ``tokens · k / tp`` copies per GPU would
    count fewer output elements under uniform routing, but the measured fused-MoE kernels of an
    expert-parallel layout are slower than the tensor-parallel ones, not faster (H200 vLLM at
    8192 tokens over 4 GPUs: 1.25× for Qwen3-30B-A3B, 1.39× for Qwen3-235B-A22B, 2.6× for
    Mixtral-8x7B; skewed routing loads one GPU's experts most), which this first-order term
    does not model; so expert parallelism gains nothing from it.
    """
    k0 = knobs.moe_reduction_overhead
    if model.expert_dtype in DEQUANTISED_EXPERT_DTYPES:
        k0 += knobs.moe_dequant_reduction_overhead
    if not model.is_moe or not k0:
        return 0.0
    copies = tokens * model.experts_per_token
    widths = sum(n for n, _ in _mlp_shapes(model, model.moe_intermediate_size, tp))
    return 2.0 * k0 * model.moe_layers * copies * widths


def _dequant_weight_s(
    model: ModelSpec, tp: int, tokens: float, moe_dequant_weight_latency_s: float
) -> float:
    """Dequantisation time of the routed-expert weights one forward pass over ``tokens`` tokens
    reads on one GPU, for experts stored in a :data:`pdopt.profile._knobs.DEQUANTISED_EXPERT_DTYPES`
    dtype (W4A16 kernels unpack and scale every weight element to 16 bits), seconds::

        t = c_dq · moe_layers · touched(tokens) · expert_params / tp

    ``c_dq`` = ``moe_dequant_weight_latency_s`` (seconds per weight element),
    ``touched`` = :func:`pdopt.model_spec.expected_experts_touched`, ``expert_params`` the
    matrix weights of one expert (:func:`pdopt.model_spec._params.expert_params`), split ``tp``
    ways (or, expert-parallel, ``E / tp`` whole experts per GPU: the same count). The weights
    read are those the bytes count (:func:`pdopt.model_spec.layer_weight_bytes_read`). 0 for
    other expert dtypes and dense models.
    """
    if model.expert_dtype not in DEQUANTISED_EXPERT_DTYPES or not model.is_moe:
        return 0.0
    touched = expected_experts_touched(model, tokens)
    return moe_dequant_weight_latency_s * model.moe_layers * touched * expert_params(model) / tp


def _gemm_shapes(model: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """(n, k) of the QKV, O, gate+up and down projections on one TP shard (MoE: of one expert;
    MLA: the query up-projection stands for QKV)."""
    hidden, head_dim = model.hidden_size, model.head_dim
    heads = query_heads_per_gpu(model, tp)
    if model.is_mla:
        qkv = (heads * head_dim, model.q_lora_rank or hidden)
    else:
        qkv = (head_dim * (heads + 2 * kv_heads_per_gpu(model, tp)), hidden)
    width = model.moe_intermediate_size if model.is_moe else model.intermediate_size
    return [qkv, (hidden, model.v_head_dim * heads), *_mlp_shapes(model, width, tp)]


def _mlp_shapes(model: ModelSpec, width: int, tp: int) -> list[tuple[int, int]]:
    """(n, k) of an MLP's gate+up (or up) and down projections of intermediate ``width`` on one
    TP shard (a dense MLP, one expert, or the shared experts side by side)."""
    up = (2 if model.gated_mlp else 1) * width // tp
    return [(up, model.hidden_size), (model.hidden_size, width // tp)]


def gemm_flops_bytes(
    m: Any, n: Any, k: Any, activation_bytes: float, weight_bytes: float
) -> tuple[Any, Any]:
    """FLOPs and HBM bytes of an ``(m × k) · (k × n)`` GEMM (scalars or numpy arrays)::

        flops = 2·m·n·k
        bytes = (m·k + m·n)·activation_bytes + k·n·weight_bytes

    (the input and output activations once, the weights once)."""
    return 2.0 * m * n * k, (m * k + m * n) * activation_bytes + k * n * weight_bytes


def _gemm_records(
    model: ModelSpec, gpu: GpuSpec, tp: int, rates: _Rates, knobs: RooflineKnobs
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    weight_bytes, kernels = model.dtype_bytes, 1
    if _w8a8(model, gpu):
        # a W8A8 GEMM streams its weights at fp8_bandwidth_fraction and quantises its input
        weight_bytes /= knobs.fp8_bandwidth_fraction
        kernels += FP8_GEMM_EXTRA_KERNELS
    for n, k in _gemm_shapes(model, tp):
        for m in GEMM_M_TOKENS:
            flops, bytes_ = gemm_flops_bytes(
                float(m), float(n), float(k), model.activation_bytes, weight_bytes
            )
            latency = _roofline_s(flops, bytes_, rates) + kernels * knobs.kernel_latency_s
            records.append({"kind": "gemm", "m": m, "n": n, "k": k, "latency_s": latency})
    return records


def all_reduce_s(
    message_bytes: float | np.ndarray,
    tp: int | np.ndarray,
    link_bytes_per_s: float,
    latency_s: float,
    peer_latency_s: float,
    efficiency: float,
    *,
    switch_min_gpus: float = math.inf,
    switch_latency_s: float = 0.0,
    switch_efficiency: float = 1.0,
) -> float | np.ndarray:
    """One all-reduce of ``message_bytes`` (``S``) over ``tp`` (``n``) GPUs, first order::

        α + β·(n−1) + min( (n−1)·S / (η·link),  α + 2(n−1)/n · S / (η·link) )

    the faster of a one-shot all-reduce (one barrier; every rank reads its ``n−1`` peers' whole
    buffers over its link and sums them) and a two-shot one (reduce-scatter then all-gather:
    ``2(n−1)/n · S`` over each link, as a ring (Thakur et al. 2005), and a second barrier).
    vLLM's and TensorRT-LLM's custom all-reduces switch from one-shot to two-shot as the message
    grows (vLLM ``csrc/custom_all_reduce.cuh``); NCCL's ring moves the two-shot volume. ``α``
    (``latency_s``) is a call's barrier and launch, ``β`` (``peer_latency_s``) what each peer
    adds to it, ``η`` (``efficiency``) the sustained fraction of the one-direction link
    bandwidth ``link_bytes_per_s``. Seconds; vectorised over ``message_bytes`` and ``tp``
    (the calibration fits ``α, β, η`` on measured all-reduce tables with it).

    From ``switch_min_gpus`` GPUs on (default never) the engine may instead reduce in the
    switch (NVLink SHARP, NCCL's NVLS algorithm: each rank sends its buffer to the switch once
    and receives the sum once, whatever ``n``), and takes the faster::

        min( the above,  α_s + S / (η_s·link) )

    ``α_s`` (``switch_latency_s``) is that path's own fixed time and ``η_s``
    (``switch_efficiency``) its sustained fraction of the link; both are fitted on a measured
    table at ``switch_min_gpus`` GPUs (:class:`pdopt.profile.RooflineKnobs`).
    """
    peers = np.asarray(tp, dtype=float) - 1.0
    link = efficiency * link_bytes_per_s
    one_shot = peers * message_bytes / link
    two_shot = latency_s + 2.0 * peers / (peers + 1.0) * message_bytes / link
    total = latency_s + peer_latency_s * peers + np.minimum(one_shot, two_shot)
    if not math.isinf(switch_min_gpus):
        in_switch = switch_latency_s + message_bytes / (switch_efficiency * link_bytes_per_s)
        total = np.where(peers + 1.0 >= switch_min_gpus, np.minimum(total, in_switch), total)
    # no peers, no all-reduce
    result = np.where(peers > 0, total, 0.0)
    return float(result) if result.ndim == 0 else result


def _all_to_all_s(model: ModelSpec, gpu: GpuSpec, tp: int, tokens: float) -> float:
    """One MoE dispatch or combine under expert parallelism over the ``tp`` GPUs, first order:
    each GPU sends its ``tokens / tp`` tokens' ``experts_per_token`` copies of the hidden state,
    of which ``(tp − 1)/tp`` go to experts on other GPUs, at the link bandwidth (uniform routing,
    all GPUs sending at once over a full-bisection NVLink switch)."""
    copies = tokens / tp * model.experts_per_token * (tp - 1) / tp
    return copies * model.hidden_size * model.activation_bytes / gpu.link_bw_bytes_per_s


def _communication_s(
    model: ModelSpec, gpu: GpuSpec, tp: int, tokens: float, fixed: _FixedTerms
) -> float:
    """TP communication of one forward pass over ``tokens`` tokens (Megatron TP): two
    all-reduces per layer (:func:`all_reduce_s`) of ``tokens · hidden · activation_bytes`` bytes
    (after attention and after the MLP). With ``fixed.expert_parallel``, an MoE layer's MLP
    all-reduce is replaced by a dispatch and a combine all-to-all (:func:`_all_to_all_s`)."""
    if tp == 1:
        return 0.0
    knobs = fixed.knobs
    one = float(
        all_reduce_s(
            tokens * model.hidden_size * model.activation_bytes,
            tp,
            gpu.link_bw_bytes_per_s,
            knobs.all_reduce_latency_s,
            knobs.all_reduce_peer_latency_s,
            knobs.all_reduce_bandwidth_efficiency,
            switch_min_gpus=knobs.all_reduce_switch_min_gpus,
            switch_latency_s=knobs.all_reduce_switch_latency_s,
            switch_efficiency=knobs.all_reduce_switch_efficiency,
        )
    )
    if not (fixed.expert_parallel and model.is_moe):
        return 2.0 * model.num_layers * one
    dense_layers = model.num_layers - model.moe_layers
    moe = model.moe_layers * (one + 2.0 * _all_to_all_s(model, gpu, tp, tokens))
    return 2.0 * dense_layers * one + moe


def _prefill_records(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    rates: _Rates,
    fixed: _FixedTerms,
    capacity: int,
) -> tuple[list[dict[str, Any]], int]:
    records: list[dict[str, Any]] = []
    skipped = 0
    for batch in PREFILL_BATCH_SIZES:
        for length in PREFILL_INPUT_TOKENS:
            if batch * length > capacity:
                skipped += 1
                continue
            cost = prefill_cost(model, length, batch, tp)
            tokens = batch * length
            latency = _step_s(cost, tokens, model, gpu, tp, rates, fixed, decode=False)
            records.append(
                {
                    "kind": "prefill",
                    "batch_size": batch,
                    "input_tokens": length,
                    "latency_s": latency,
                }
            )
    return records, skipped


def _decode_records(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    rates: _Rates,
    fixed: _FixedTerms,
    capacity: int,
) -> tuple[list[dict[str, Any]], int]:
    records: list[dict[str, Any]] = []
    skipped = 0
    for batch in DECODE_BATCH_SIZES:
        for context in DECODE_CONTEXT_TOKENS:
            total = batch * context
            # capacity counts tokens held in every layer; sliding layers hold only the window
            if batch * model.kv_context_tokens(context) > capacity:
                skipped += 1
                continue
            cost = decode_step_cost(model, batch, total, tp)
            latency = _step_s(cost, batch, model, gpu, tp, rates, fixed, decode=True)
            records.append(
                {
                    "kind": "decode",
                    "batch_size": batch,
                    "total_context_tokens": total,
                    "latency_s": latency,
                }
            )
    return records, skipped
