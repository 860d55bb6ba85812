"""The roofline prior: a synthetic profile of any GPU × model × TP from FLOPs and bytes.

Each op takes ``max(flops / (compute_efficiency · peak), bytes / (bandwidth_efficiency · hbm_bw))``
plus, for prefill and decode forward passes, a fixed ``overhead_s`` and (TP > 1) the ring
all-reduces. FLOPs and bytes come from :mod:`pdopt.model_spec` (conventions there).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from pdopt._validation import check_fraction, check_non_negative
from pdopt.hardware import GpuSpec, get_gpu
from pdopt.model_spec import (
    ModelSpec,
    decode_step_cost,
    get_model,
    kv_capacity_tokens,
    prefill_cost,
)
from pdopt.model_spec._params import check_tp, kv_heads_per_gpu
from pdopt.profile._format import Profile, ProfileMeta
from pdopt.profile._io import profile_from_records

DEFAULT_COMPUTE_EFFICIENCY = 0.65
"""Sustained fraction of the data-sheet tensor peak. Vidur's A100 measurements of Llama-2-7B's
linear layers (``/work/shared/data/vidur-profiling``) sustain 195-205 TFLOP/s of 312 at
1024-4096 tokens, i.e. 0.63-0.65."""

DEFAULT_BANDWIDTH_EFFICIENCY = 0.7
"""Sustained fraction of the data-sheet HBM bandwidth. The same data: Llama-2-7B's layer weights
(405 MB/layer) are read in 0.29 ms at batch 1 (1.40 TB/s = 0.69 of 2.04 TB/s); decode attention
streams KV at 1.63 TB/s (0.80)."""

DEFAULT_OVERHEAD_S = 1e-3
"""Fixed cost of one forward pass (kernel launches and scheduling): about 10 kernels per layer
at a few microseconds each, for 32-80 layers. An assumption, not a measurement."""

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
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY,
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY,
    overhead_s: float = DEFAULT_OVERHEAD_S,
    memory_utilization: float = 0.9,
    seed: int | None = None,
    noise_sigma: float = DEFAULT_NOISE_SIGMA,
    expert_parallel: bool = False,
    all_reduce_latency_s: float = 0.0,
    elementwise_bytes: float = 0.0,
) -> Profile:
    """A synthetic profile of ``model`` on ``gpu`` at tensor parallelism ``tp``.

    Rows:

    * ``gemm``: the model's four projection GEMMs per TP shard (QKV, O, gate+up, down) at
      ``m`` in :data:`GEMM_M_TOKENS`: ``max(2mnk / (eff_c·peak), (mk + kn + mn)·dtype /
      (eff_b·bw))``, no overhead, so large GEMMs run at exactly ``eff_c · peak``.
    * ``prefill``: batch 1, 2, 4, 8 × input 128 … 8192 (:func:`pdopt.model_spec.prefill_cost`).
    * ``decode``: batch 1 … 256 × context per request 128 … 8192, ``total_context_tokens`` =
      batch × context (:func:`pdopt.model_spec.decode_step_cost`).

    Prefill and decode rows add ``overhead_s`` and, when ``tp > 1``, two ring all-reduces per
    layer of ``tokens · hidden · activation_bytes`` bytes taking ``2(tp−1)/tp · bytes / link_bw``
    each (not overlapped); with ``expert_parallel`` an MoE layer's MLP all-reduce becomes a
    dispatch and a combine all-to-all (``_all_to_all_s``).

    Precision: the compute peak is :meth:`pdopt.hardware.GpuSpec.peak_flops_for` the weight dtype
    (the FP8 peak for FP8 weights where the GPU has one), weights are read in their own dtype
    and KV in the KV dtype (:mod:`pdopt.model_spec`). MoE: FLOPs of the active parameters, bytes
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
    compute_efficiency, bandwidth_efficiency : float in (0, 1]
        Sustained fractions of the data-sheet peaks (defaults: :data:`DEFAULT_COMPUTE_EFFICIENCY`,
        :data:`DEFAULT_BANDWIDTH_EFFICIENCY`, measured on A100 data).
    overhead_s : float
        Fixed time per forward pass, seconds.
    expert_parallel : bool
        For an MoE model at ``tp > 1``: experts spread over the ``tp`` GPUs (expert parallelism,
        attention still tensor-parallel) instead of each expert split ``tp`` ways.
    all_reduce_latency_s : float
        Fixed time of one all-reduce call (launch and synchronisation), seconds, added to each
        of the ``2 · layers`` calls when ``tp > 1``. 0 (the default) keeps the bandwidth-only
        term; Vidur's A100 DGX measurements give about 46 µs for 2 GPUs at small messages,
        vLLM with CUDA graphs on H100/H200 about 12-20 µs (issue 20).
    elementwise_bytes : float
        HBM bytes per token × layer × hidden that norms, residual adds, rotary embedding and the
        activation function move (not split across TP ranks; about 20 for two RMSNorms, a
        residual add and SiLU·gate in 16-bit). 0 (the default) leaves them out.
    seed : int or None
        None: exact roofline times. An int: each latency is multiplied by
        ``exp(N(0, noise_sigma²))`` drawn from ``numpy.random.default_rng(seed)``.

    Raises
    ------
    ConfigError
        When the weights do not fit on the GPU at this ``tp``.

    Examples
    --------
    >>> p = roofline_profile("V100-32GB", "Qwen2.5-7B")
    >>> sorted(p.rows["kind"].unique())
    ['decode', 'gemm', 'prefill']
    """
    owner = "roofline_profile"
    gpu_spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    spec = get_model(model) if isinstance(model, str) else model
    tp = check_tp(spec, tp, owner)
    rates = (
        check_fraction(compute_efficiency, "compute_efficiency", owner)
        * gpu_spec.peak_flops_for(spec.dtype),
        check_fraction(bandwidth_efficiency, "bandwidth_efficiency", owner)
        * gpu_spec.hbm_bw_bytes_per_s,
    )
    check_non_negative(overhead_s, "overhead_s", owner)
    fixed = _FixedTerms(
        overhead_s,
        check_non_negative(all_reduce_latency_s, "all_reduce_latency_s", owner),
        check_non_negative(elementwise_bytes, "elementwise_bytes", owner),
        expert_parallel,
    )
    check_non_negative(noise_sigma, "noise_sigma", owner)
    capacity = kv_capacity_tokens(gpu_spec, spec, tp, memory_utilization)
    records = _gemm_records(spec, tp, rates)
    prefill, skipped_prefill = _prefill_records(spec, gpu_spec, tp, rates, fixed, capacity)
    decode, skipped_decode = _decode_records(spec, gpu_spec, tp, rates, fixed, capacity)
    records += prefill + decode
    if seed is not None:
        noise = np.random.default_rng(seed).lognormal(0.0, noise_sigma, size=len(records))
        for record, factor in zip(records, noise, strict=True):
            record["latency_s"] *= float(factor)
    notes = (
        f"compute_efficiency={compute_efficiency} bandwidth_efficiency={bandwidth_efficiency} "
        f"overhead_s={overhead_s} seed={seed}"
        + (" expert_parallel=True" if expert_parallel else "")
        + (f" all_reduce_latency_s={all_reduce_latency_s}" if all_reduce_latency_s else "")
        + (f" elementwise_bytes={elementwise_bytes}" if elementwise_bytes else "")
        + f"; KV capacity {capacity} tokens at "
        f"memory_utilization={memory_utilization}: {skipped_prefill} prefill and "
        f"{skipped_decode} decode points beyond it left out"
    )
    meta = ProfileMeta(gpu_spec.name, spec.name, spec.dtype, tp, "roofline", notes)
    return profile_from_records(meta, records)


class _FixedTerms(NamedTuple):
    """The terms a forward pass adds to its roofline time (see :func:`roofline_profile`)."""

    overhead_s: float
    all_reduce_latency_s: float
    elementwise_bytes: float
    expert_parallel: bool


def _roofline_s(flops: float, bytes_: float, rates: tuple[float, float]) -> float:
    return max(flops / rates[0], bytes_ / rates[1])


def _step_s(
    flops: float,
    bytes_: float,
    tokens: float,
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    rates: tuple[float, float],
    fixed: _FixedTerms,
) -> float:
    """One forward pass over ``tokens`` tokens: roofline of the GEMM/attention FLOPs and bytes,
    then (not overlapped) the elementwise bytes at the same bandwidth, the fixed overhead and
    the TP communication."""
    latency = _roofline_s(flops, bytes_, rates) + fixed.overhead_s
    if fixed.elementwise_bytes:
        per_token = fixed.elementwise_bytes * model.num_layers * model.hidden_size
        latency += per_token * tokens / rates[1]
    latency += _communication_s(model, gpu, tp, tokens, fixed.expert_parallel)
    if tp > 1 and fixed.all_reduce_latency_s:
        latency += 2 * model.num_layers * fixed.all_reduce_latency_s
    return latency


def _gemm_shapes(model: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """(n, k) of the QKV, O, gate+up and down projections on one TP shard (MoE: of one expert;
    MLA: the query up-projection stands for QKV)."""
    hidden, head_dim = model.hidden_size, model.head_dim
    heads = model.num_heads // tp
    if model.is_mla:
        qkv = (heads * head_dim, model.q_lora_rank or hidden)
    else:
        qkv = (head_dim * (heads + 2 * kv_heads_per_gpu(model, tp)), hidden)
    width = model.moe_intermediate_size if model.is_moe else model.intermediate_size
    up = (2 if model.gated_mlp else 1) * width // tp
    return [qkv, (hidden, model.v_head_dim * heads), (up, hidden), (hidden, width // tp)]


def _gemm_records(model: ModelSpec, tp: int, rates: tuple[float, float]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    act = model.activation_bytes
    for n, k in _gemm_shapes(model, tp):
        for m in GEMM_M_TOKENS:
            flops = 2.0 * m * n * k
            bytes_ = float(m * k + m * n) * act + float(k * n) * model.dtype_bytes
            latency = _roofline_s(flops, bytes_, rates)
            records.append({"kind": "gemm", "m": m, "n": n, "k": k, "latency_s": latency})
    return records


def _ring_all_reduce_s(message_bytes: float, gpu: GpuSpec, tp: int) -> float:
    """One ring all-reduce of ``message_bytes`` over ``tp`` GPUs: ``2(tp−1)/tp · bytes / link``."""
    return 2.0 * (tp - 1) / tp * message_bytes / gpu.link_bw_bytes_per_s


def _all_to_all_s(model: ModelSpec, gpu: GpuSpec, tp: int, tokens: float) -> float:
    """One MoE dispatch or combine under expert parallelism over the ``tp`` GPUs, first order:
    each GPU sends its ``tokens / tp`` tokens' ``experts_per_token`` copies of the hidden state,
    of which ``(tp − 1)/tp`` go to experts on other GPUs, at the link bandwidth (uniform routing,
    all GPUs sending at once over a full-bisection NVLink switch)."""
    copies = tokens / tp * model.experts_per_token * (tp - 1) / tp
    return copies * model.hidden_size * model.activation_bytes / gpu.link_bw_bytes_per_s


def _communication_s(
    model: ModelSpec, gpu: GpuSpec, tp: int, tokens: float, expert_parallel: bool
) -> float:
    """TP communication of one forward pass over ``tokens`` tokens (Megatron TP): two ring
    all-reduces per layer of ``tokens · hidden · activation_bytes`` bytes (after attention and
    after the MLP). With ``expert_parallel``, an MoE layer's MLP all-reduce is replaced by a
    dispatch and a combine all-to-all (:func:`_all_to_all_s`)."""
    if tp == 1:
        return 0.0
    one = _ring_all_reduce_s(tokens * model.hidden_size * model.activation_bytes, gpu, tp)
    if not (expert_parallel and model.is_moe):
        return 2.0 * model.num_layers * one
    dense_layers = model.num_layers - model.moe_layers
    moe = model.moe_layers * (one + 2.0 * _all_to_all_s(model, gpu, tp, tokens))
    return 2.0 * dense_layers * one + moe


def _prefill_records(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    rates: tuple[float, float],
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
            latency = _step_s(cost.flops, cost.bytes, batch * length, model, gpu, tp, rates, fixed)
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
    rates: tuple[float, float],
    fixed: _FixedTerms,
    capacity: int,
) -> tuple[list[dict[str, Any]], int]:
    records: list[dict[str, Any]] = []
    skipped = 0
    for batch in DECODE_BATCH_SIZES:
        for context in DECODE_CONTEXT_TOKENS:
            total = batch * context
            if total > capacity:
                skipped += 1
                continue
            cost = decode_step_cost(model, batch, total, tp)
            latency = _step_s(cost.flops, cost.bytes, batch, model, gpu, tp, rates, fixed)
            records.append(
                {
                    "kind": "decode",
                    "batch_size": batch,
                    "total_context_tokens": total,
                    "latency_s": latency,
                }
            )
    return records, skipped
