"""The roofline prior's knobs and their per-GPU-generation presets (issue 20).

Each preset was fitted on ONE measured source per generation and checked on others by
``calibration/roofline_validation.py`` (README "The roofline prior's presets" has the table):
least squares on ``log(roofline / measured)`` over the prefill and decode grid of
:func:`pdopt.profile.roofline_profile`, with ``elementwise_bytes`` held at 20 (counted, not
fitted: two RMSNorms, a residual add and SiLU·gate in 16-bit), the kernel latency and the
all-reduce law (``all_reduce_latency_s``, ``all_reduce_peer_latency_s``,
``all_reduce_bandwidth_efficiency``: :func:`pdopt.profile._roofline.all_reduce_s`) held at their
own fits on separate measurements (the fit sources' memory-bound GEMM rows; the fit system's
measured custom all-reduce table at 2 GPUs and the fit sources' GPU counts, so a TP8 check is
out of sample in the GPU count; on NVSwitch generations whose switch reduces, the in-switch
branch ``all_reduce_switch_*`` on that system's 8-GPU table). Measured sources: NVIDIA
AIConfigurator 0.12.0's per-op databases composed by :func:`pdopt.profile.import_aic` (op sums
without a scheduler, so the fitted ``overhead_s`` is the per-step cost those sums imply, not
vLLM's CPU time). Generations without measurements borrow a neighbour's preset (said on each).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType

from pdopt._validation import check_fraction, check_non_negative, param_error
from pdopt.hardware import GpuSpec


@dataclasses.dataclass(frozen=True, slots=True)
class RooflineKnobs:
    """What turns FLOPs and bytes into seconds in :func:`pdopt.profile.roofline_profile`.

    Parameters
    ----------
    compute_efficiency, bandwidth_efficiency : float in (0, 1]
        Sustained fractions of the data-sheet tensor peak and HBM bandwidth.
    overhead_s : float
        Fixed time per forward pass (kernel launches, gaps), seconds.
    all_reduce_latency_s : float
        Fixed time of one all-reduce call at ``tp > 1`` (its barrier: the ``α`` of
        :func:`pdopt.profile._roofline.all_reduce_s`), seconds (two calls per layer).
    elementwise_bytes : float
        HBM bytes per token × layer × hidden moved by norms, residual adds and the activation,
        not split across TP ranks.
    ridge_exponent : float
        ``p`` of the smooth roofline ``(t_c^p + t_m^p)^(1/p)`` of the compute time ``t_c`` and
        the memory time ``t_m``: near the ridge neither unit is saturated, so an op is slower
        than ``max(t_c, t_m)``; ``math.inf`` is the hard max.
    kernel_latency_s : float
        Fixed time of every kernel besides its bytes and FLOPs (launch, ramp-up and tail
        before the GPU streams at its sustained rate: the ``α`` of Hockney's ``t = α + bytes /
        bw``), seconds. A forward pass counts :data:`KERNELS_PER_LAYER` of them per layer, a
        ``gemm`` row one. It is why a TP shard's small decode GEMMs reach a smaller fraction
        of HBM bandwidth than the whole model's (measured H100 vLLM, ``m = 1``: 0.70–0.88 of
        HBM bandwidth for Llama-3.1-70B's TP4 shards, 0.52–0.80 for its TP8 shards).
    all_reduce_peer_latency_s : float
        Time one all-reduce call adds per peer GPU (the ``β`` of
        :func:`pdopt.profile._roofline.all_reduce_s`: each rank signals and waits for every
        other), seconds.
    all_reduce_bandwidth_efficiency : float in (0, 1]
        Sustained fraction of the link bandwidth an all-reduce moves its bytes at (the ``η`` of
        :func:`pdopt.profile._roofline.all_reduce_s`).
    moe_reduction_overhead : float
        ``K0``, multiply-adds per output element: MoE models only, every routed-expert GEMM
        of reduction depth ``K`` is priced as one of depth ``K + K0`` (extra FLOPs ``2·K0``
        per output element, in the compute time at ``compute_efficiency``). It is the fixed
        cost of each output tile of a fused-MoE (grouped GEMM) kernel (prologue, the epilogue
        writing the output for the separate activation and top-k combine kernels, the
        gathered token rows) that a small ``K`` cannot amortise: measured fused-MoE kernels
        reach 0.36–0.42 of the H100's BF16 peak on Qwen3-30B-A3B's experts (``K`` = 2048 and
        768) and 0.21–0.26 at TP4 (``K`` = 2048 and 192), but 0.57–0.66 on Mixtral-8x7B's
        (``K`` = 4096 and 3584–7168). 0: expert GEMMs cost what dense ones do.
    moe_layer_latency_s : float
        Fixed time of one MoE layer of a forward pass besides its bytes and FLOPs, seconds
        (MoE models only; ``moe_layers`` of them per pass): the fused-MoE path launches more
        kernels than a dense MLP (router top-k, token sorting, the grouped GEMMs, activation,
        top-k combine) and reads ``k`` experts' weights scattered in memory. Measured H100
        vLLM, one token: Qwen3-30B-A3B's fused-MoE kernel takes 48 µs against 28 µs for its
        8 experts' weights at the fitted bandwidth.
    moe_ridge_exponent : float
        ``p`` of the routed experts' own smooth roofline (MoE models only): a pass prices its
        routed-expert GEMMs (their FLOPs with ``moe_reduction_overhead``, the weights of the
        experts it touches) as a roofline of their own, added to the rest's, since the
        fused-MoE kernels run between the attention and dense GEMMs, not overlapped with them.
        Near 1 the experts' weight streaming and compute add up rather than overlap: measured
        H100 vLLM, Qwen3-30B-A3B's fused-MoE layer takes 445–483 µs up to 512 tokens (all 128
        experts' weights, memory-bound), then about ``360 µs + 0.164 µs`` per token from 2048
        tokens on, a sum of the two, not their max. ``math.inf`` (the default): their max.
    fp8_peak_fraction : float in (0, 1]
        Fraction of the FP8 tensor peak that the weight GEMMs of a model stored in FP8 (W8A8)
        compute at, before ``compute_efficiency``, on GPUs with FP8 tensor cores (elsewhere FP8
        weights are dequantised and run at the 16-bit peak anyway); routed experts have their
        own, ``moe_fp8_peak_fraction``. Scaled FP8 GEMMs quantise their activations and rescale
        their partial sums, and reach less than twice the BF16 kernel's speed: measured
        (AIConfigurator ``gemm_perf``, ``fp8_block`` against ``bfloat16`` at the same shapes,
        GEMMs of at least 1 TFLOP) 1.54-1.57x on H100/H200/B200 in vLLM 0.24 (0.77-0.79 of the
        FP8 peak's 2x), 1.73-1.80x in SGLang 0.5.14, but 1.06x on L40S (0.52), whose vLLM
        block-scaled kernel is not the Hopper one. 1 (the default): the whole FP8 peak.
    fp8_bandwidth_fraction : float in (0, 1]
        Fraction of ``bandwidth_efficiency`` at which the weight GEMMs of a model stored in FP8
        (W8A8, on GPUs with FP8 tensor cores) stream their weights: the memory-bound FP8
        kernels (decode) read their one-byte weights more slowly than the BF16 kernels read
        their two-byte ones. Measured (AIConfigurator ``gemm_perf``, ``fp8`` against
        ``bfloat16``, ``m`` ≤ 16, ratio of the slopes of time against bytes) 0.92 on H100,
        0.90 on H200, 0.88 on B200 and 0.96 on L40S in vLLM 0.24, 0.87-0.99 in SGLang 0.5.14;
        the same tables' fixed time per FP8 GEMM is 2.1-3.7 µs above the BF16 one, the
        activation quantisation kernel each W8A8 GEMM launches
        (:data:`FP8_GEMM_EXTRA_KERNELS`). Routed experts keep their own fused-MoE terms.
        1 (the default): FP8 weights stream as fast as 16-bit ones.
    moe_fp8_peak_fraction : float in (0, 1]
        Fraction of the FP8 tensor peak that routed experts stored in FP8 compute at (MoE models
        only, on GPUs with FP8 tensor cores; elsewhere FP8 weights are dequantised and run at
        the 16-bit peak anyway), before ``compute_efficiency``. Block-scaled FP8 fused-MoE
        kernels rescale every 128-deep block of the reduction and reach little of the FP8
        peak: measured (AIConfigurator ``moe_perf``, vLLM 0.24, ``fp8_block`` against
        ``bfloat16`` rows of the same shapes, 16384 tokens) 0.86–1.15× the BF16 kernel's speed
        on H100 and H200 and 0.65–0.95× on B200, where the FP8 peak is 2× the BF16 one. 1 (the
        default): the whole FP8 peak, as dense FP8 GEMMs.
    moe_dequant_reduction_overhead : float
        ``K0_dq``, multiply-adds per output element added to ``moe_reduction_overhead`` for
        routed experts stored in a :data:`DEQUANTISED_EXPERT_DTYPES` dtype (weight-only
        quantised, W4A16: the kernel dequantises each weight tile to 16 bits for every tile of
        tokens it multiplies, work that grows with the tokens like the GEMM's). Measured
        (AIConfigurator's ``w4a16_mxfp4`` ``moe_perf`` rows, 16384 tokens): gpt-oss's experts
        (``K`` = 2880) reach 0.46–0.55 of the H100's BF16 peak but only 0.22–0.24 of the
        B200's. 0: dequantised experts cost what BF16 ones do.
    moe_dequant_weight_latency_s : float
        Seconds per routed-expert weight element read (the experts a pass touches) for experts
        stored in a :data:`DEQUANTISED_EXPERT_DTYPES` dtype, not overlapped with the roofline
        time: unpacking, scaling and converting each element to 16 bits, which the 4.25-bit
        bytes do not pay for. Measured H100 and H200 (same kernel, 3.35 vs 4.8 TB/s): gpt-oss-
        120b's fused-MoE layer at 128 tokens (all 128 experts touched) takes 606 and 584 µs,
        2.7–2.8 TB/s of its MXFP4 bytes on either GPU, so the time is not the bytes'.
    all_reduce_switch_min_gpus : float
        From how many GPUs an all-reduce may reduce in the switch (NVLink SHARP, NCCL's NVLS
        algorithm) instead of over the links: :func:`pdopt.profile._roofline.all_reduce_s`
        then takes the faster of the two. ``math.inf`` (the default): never, as on GPUs whose
        interconnect does not reduce (PCIe, A100's NVSwitch, MI300X's Infinity Fabric).
    all_reduce_switch_latency_s : float
        Fixed time of one in-switch all-reduce (``α_s``), seconds.
    all_reduce_switch_efficiency : float in (0, 1]
        Sustained fraction of the link bandwidth at which an in-switch all-reduce sends and
        receives its buffer once (``η_s``).
    attention_head_latency_s : float
        Fixed time of a decode step's attention per sequence, query head on one GPU and layer,
        besides its KV bytes, seconds: the work of each (sequence, head) output row that no
        KV read pays for (loading the query, the softmax normalisation, combining the split-KV
        partial outputs, writing the output). It is why short-context decode at large batch is
        slower than its bytes: measured decode-attention tables (AIConfigurator, vLLM 0.24)
        extrapolate to 2.5 ms at zero context for 256 sequences of Llama-3.1-8B on H100 and on
        H200 alike (32 layers × 32 heads: about 8 ns each), and the per-sequence intercept
        shrinks with the query heads per GPU (Llama-3.1-70B at TP4 and TP8). Prefill pays it per
        query tile, amortised over the tile's tokens, so only decode steps count it. 0 (the
        default): attention costs its bytes and FLOPs only.
    """

    compute_efficiency: float
    bandwidth_efficiency: float
    overhead_s: float
    all_reduce_latency_s: float
    elementwise_bytes: float
    ridge_exponent: float
    kernel_latency_s: float = 0.0
    # keyword-only (after the MoE knobs in the constructor): a positional 8th argument stays K0
    all_reduce_peer_latency_s: float = dataclasses.field(default=0.0, kw_only=True)
    all_reduce_bandwidth_efficiency: float = dataclasses.field(default=1.0, kw_only=True)
    moe_reduction_overhead: float = 0.0
    moe_layer_latency_s: float = 0.0
    moe_ridge_exponent: float = dataclasses.field(default=math.inf, kw_only=True)
    moe_fp8_peak_fraction: float = dataclasses.field(default=1.0, kw_only=True)
    fp8_peak_fraction: float = dataclasses.field(default=1.0, kw_only=True)
    fp8_bandwidth_fraction: float = dataclasses.field(default=1.0, kw_only=True)
    moe_dequant_reduction_overhead: float = dataclasses.field(default=0.0, kw_only=True)
    moe_dequant_weight_latency_s: float = dataclasses.field(default=0.0, kw_only=True)
    all_reduce_switch_min_gpus: float = dataclasses.field(default=math.inf, kw_only=True)
    all_reduce_switch_latency_s: float = dataclasses.field(default=0.0, kw_only=True)
    all_reduce_switch_efficiency: float = dataclasses.field(default=1.0, kw_only=True)
    attention_head_latency_s: float = dataclasses.field(default=0.0, kw_only=True)

    def __post_init__(self) -> None:
        owner = "RooflineKnobs"
        check_fraction(self.compute_efficiency, "compute_efficiency", owner)
        check_fraction(self.bandwidth_efficiency, "bandwidth_efficiency", owner)
        check_non_negative(self.overhead_s, "overhead_s", owner)
        check_non_negative(self.all_reduce_latency_s, "all_reduce_latency_s", owner)
        check_non_negative(self.elementwise_bytes, "elementwise_bytes", owner)
        check_non_negative(self.kernel_latency_s, "kernel_latency_s", owner)
        check_non_negative(self.all_reduce_peer_latency_s, "all_reduce_peer_latency_s", owner)
        check_fraction(
            self.all_reduce_bandwidth_efficiency, "all_reduce_bandwidth_efficiency", owner
        )
        check_non_negative(self.moe_reduction_overhead, "moe_reduction_overhead", owner)
        check_non_negative(self.moe_layer_latency_s, "moe_layer_latency_s", owner)
        check_fraction(self.moe_fp8_peak_fraction, "moe_fp8_peak_fraction", owner)
        check_fraction(self.fp8_peak_fraction, "fp8_peak_fraction", owner)
        check_fraction(self.fp8_bandwidth_fraction, "fp8_bandwidth_fraction", owner)
        check_non_negative(
            self.moe_dequant_reduction_overhead, "moe_dequant_reduction_overhead", owner
        )
        check_non_negative(self.moe_dequant_weight_latency_s, "moe_dequant_weight_latency_s", owner)
        check_non_negative(self.all_reduce_switch_latency_s, "all_reduce_switch_latency_s", owner)
        check_non_negative(self.attention_head_latency_s, "attention_head_latency_s", owner)
        # p < 1 would make an op slower than compute and memory in sequence; inf is allowed.
        for name in ("ridge_exponent", "moe_ridge_exponent"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value >= 1:
                raise param_error(name, owner, "a number >= 1 (inf: hard max)", value)
        check_fraction(self.all_reduce_switch_efficiency, "all_reduce_switch_efficiency", owner)
        # a count: 2 or more GPUs (one has nothing to reduce); inf: never
        count = self.all_reduce_switch_min_gpus
        whole = isinstance(count, int | float) and (math.isinf(count) or count == int(count))
        if not whole or not count >= 2:
            raise param_error(
                "all_reduce_switch_min_gpus", owner, "a whole number >= 2 (inf: never)", count
            )

    def describe(self, *, moe: bool = True) -> str:
        """``name=value`` pairs of every knob (a profile's notes); ``moe=False`` leaves out the
        ``moe_*`` knobs, which do nothing for a dense model."""
        names = _NAMES if moe else tuple(n for n in _NAMES if not n.startswith("moe_"))
        return " ".join(f"{name}={getattr(self, name):.4g}" for name in names)


_NAMES = tuple(field.name for field in dataclasses.fields(RooflineKnobs))

DEQUANTISED_EXPERT_DTYPES: frozenset[str] = frozenset({"mxfp4"})
"""Routed-expert dtypes (:data:`pdopt.model_spec.DTYPE_BYTES`) whose fused-MoE kernels dequantise
the weights to 16 bits and compute at the BF16 peak (W4A16), priced with the ``moe_dequant_*``
knobs. Only MXFP4 is measured (gpt-oss, AIConfigurator's ``w4a16_mxfp4`` rows); INT4/INT8
experts are not fitted and keep the BF16-expert terms."""

ELEMENTWISE_BYTES = 20.0
"""Bytes per token × layer × hidden of the elementwise ops (16-bit): each RMSNorm reads and
writes the hidden state (2 × 4 B), the residual add reads two and writes one (6 B), SiLU·gate
reads two MLP-wide halves and writes one (about 6 B at an MLP 3.5× hidden over a TP-split
width, counted once): about 20."""

KERNELS_PER_LAYER = 8
"""Kernels of one dense transformer layer's forward pass besides its all-reduces (counted, not
fitted): the QKV, O, gate+up and down GEMMs, attention, two add+RMSNorms and the activation,
as AIConfigurator's and Vidur's per-layer op lists have them."""

FP8_GEMM_EXTRA_KERNELS = 1
"""Kernels each weight GEMM of a model stored in FP8 runs besides its own, on GPUs with FP8
tensor cores (counted, not fitted): W8A8 GEMMs multiply FP8 activations, so each quantises its
16-bit input first (vLLM's and SGLang's dynamic per-token or per-group quantisation). Measured
(AIConfigurator ``gemm_perf``, ``m`` ≤ 16, intercept of time against bytes): an FP8 GEMM's fixed
time is 2.1-3.7 µs above the BF16 one's in vLLM 0.24 and SGLang 0.5.14 on H100, H200, B200 and
L40S, about one kernel latency of each generation's preset."""

MLA_PREFILL_EXTRA_KERNELS = 4
"""Kernels an MLA layer's prefill runs beyond :data:`KERNELS_PER_LAYER` (counted, not fitted;
DeepSeek-V2 §2.1.2 and vLLM's/SGLang's DeepSeek attention): its QKV GEMM is the fused Q/KV
down-projection, followed by the Q-latent and KV-latent RMSNorms and the Q and KV
up-projections before attention over the decompressed keys and values."""

MLA_DECODE_EXTRA_KERNELS = 5
"""Kernels an MLA layer's decode runs beyond :data:`KERNELS_PER_LAYER` (counted, not fitted):
the two latent RMSNorms and the Q up-projection as in prefill, and, the KV up-projection being
absorbed, two batched GEMMs per head (queries into the latent space before attention, the
latent output into value space after it) instead of one KV up-projection."""

# Fitted by calibration/roofline_validation.py --fit (see the module docstring): the kernel
# latency (7th) from the fit sources' memory-bound GEMMs and the all-reduce law (4th and the
# keywords) from the fit system's measured all-reduce table at 2 and the fit sources' GPU
# counts, the rest (attention_head_latency_s too) by least squares with those held, over the
# decode points a serving step can reach (faster_than_hbm: none on Hopper and Blackwell, 14 on
# A100, 30 on L40S left out); Ampere's and Ada's fits put overhead_s at its bound 0 (their
# kernel latencies carry the fixed time), Ampere's attention_head_latency_s too, so Ampere
# keeps that default.
_HOPPER = RooflineKnobs(
    0.753,
    0.874,
    5.36e-4,
    4.26e-6,
    ELEMENTWISE_BYTES,
    3.41,
    3.02e-6,
    all_reduce_peer_latency_s=0.118e-6,
    all_reduce_bandwidth_efficiency=0.638,
    attention_head_latency_s=6.29e-9,
)
_AMPERE = RooflineKnobs(
    0.792,
    0.763,
    0.0,
    5.11e-6,
    ELEMENTWISE_BYTES,
    1.72,
    4.59e-6,
    all_reduce_peer_latency_s=0.115e-6,
    all_reduce_bandwidth_efficiency=0.529,
)
_ADA = RooflineKnobs(
    0.573,
    0.780,
    0.0,
    5.42e-6,
    ELEMENTWISE_BYTES,
    2.96,
    2.03e-6,
    all_reduce_bandwidth_efficiency=0.598,
    attention_head_latency_s=22.5e-9,
)
_BLACKWELL = RooflineKnobs(
    0.669,
    0.892,
    1.90e-4,
    8.23e-6,
    ELEMENTWISE_BYTES,
    2.41,
    3.93e-6,
    all_reduce_bandwidth_efficiency=0.528,
    attention_head_latency_s=1.76e-9,
)

# The MoE knobs, fitted by calibration/roofline_validation.py --fit (fit_moe) on each
# generation's MoE fit row (prefill, and decode where the routing law does not change the experts
# touched: routing_insensitive) with the dense knobs above held (README "The roofline prior's
# presets").
_HOPPER = dataclasses.replace(
    _HOPPER, moe_reduction_overhead=1163.0, moe_layer_latency_s=17.8e-6, moe_ridge_exponent=1.27
)
_AMPERE = dataclasses.replace(
    _AMPERE, moe_reduction_overhead=3400.0, moe_layer_latency_s=23.8e-6, moe_ridge_exponent=1.43
)
_ADA = dataclasses.replace(
    _ADA, moe_reduction_overhead=541.0, moe_layer_latency_s=0.0, moe_ridge_exponent=1.26
)
_BLACKWELL = dataclasses.replace(
    _BLACKWELL, moe_reduction_overhead=832.0, moe_layer_latency_s=1.59e-6, moe_ridge_exponent=1.08
)

# The dequantised-expert (MXFP4) knobs, fitted by calibration/roofline_validation.py --fit
# (fit_dequant) on each generation's gpt-oss fit row with every other knob held (README "The
# roofline prior's presets"). Ampere has no MXFP4 measurements; Ada's (vLLM's Marlin kernel)
# per-op rows sit within 0.86-1.12x of the BF16-expert terms from 16 tokens up, so both keep 0.
_HOPPER = dataclasses.replace(
    _HOPPER, moe_dequant_reduction_overhead=608.0, moe_dequant_weight_latency_s=3.05e-14
)
_BLACKWELL = dataclasses.replace(
    _BLACKWELL, moe_dequant_reduction_overhead=4642.0, moe_dequant_weight_latency_s=5.54e-14
)

# The FP8-expert peak fraction, from the fit system's fused-MoE kernel tables (fp8_block against
# bfloat16 at the same shapes from 8192 tokens: calibration/roofline_validation.py --fit,
# fp8_peak_fraction); Ampere has no FP8 tensor cores.
_HOPPER = dataclasses.replace(_HOPPER, moe_fp8_peak_fraction=0.511)
_ADA = dataclasses.replace(_ADA, moe_fp8_peak_fraction=0.715)
_BLACKWELL = dataclasses.replace(_BLACKWELL, moe_fp8_peak_fraction=0.424)

# The FP8 weight GEMMs' peak fraction, from the fit system's GEMM tables (fp8_block against
# bfloat16 at the same shapes, GEMMs of at least 1 TFLOP: calibration/roofline_validation.py
# --fit, gemm_fp8_peak_fraction); Ampere has no FP8 tensor cores.
_HOPPER = dataclasses.replace(_HOPPER, fp8_peak_fraction=0.778)
_ADA = dataclasses.replace(_ADA, fp8_peak_fraction=0.522)
_BLACKWELL = dataclasses.replace(_BLACKWELL, fp8_peak_fraction=0.770)

# The FP8 weight GEMMs' bandwidth fraction, from the fit system's GEMM tables (fp8 against
# bfloat16, m <= 16: calibration/roofline_validation.py --fit, gemm_fp8_bandwidth_fraction);
# Ampere has no FP8 tensor cores.
_HOPPER = dataclasses.replace(_HOPPER, fp8_bandwidth_fraction=0.916)
_ADA = dataclasses.replace(_ADA, fp8_bandwidth_fraction=0.960)
_BLACKWELL = dataclasses.replace(_BLACKWELL, fp8_bandwidth_fraction=0.882)

# The in-switch all-reduce branch (NVLink SHARP), fitted by calibration/roofline_validation.py
# --fit (switch_law) on the fit system's measured 8-GPU all-reduce table with the link law held;
# only NVSwitch generations that reduce in the switch have one (README "The roofline prior's
# presets").
_HOPPER = dataclasses.replace(
    _HOPPER,
    all_reduce_switch_min_gpus=8,
    all_reduce_switch_latency_s=20.0e-6,
    all_reduce_switch_efficiency=0.536,
)
_BLACKWELL = dataclasses.replace(
    _BLACKWELL,
    all_reduce_switch_min_gpus=8,
    all_reduce_switch_latency_s=14.9e-6,
    all_reduce_switch_efficiency=0.403,
)

ROOFLINE_PRESETS: Mapping[str, RooflineKnobs] = MappingProxyType(
    {
        # MoE knobs: H100 / A100 / L40S / B200 Qwen3-30B-A3B TP1 / Mixtral TP2 / Qwen TP2 / TP1;
        # dequantised-expert knobs: H100 / B200 gpt-oss-20b TP1 (A100, L40S: none, 0)
        "hopper": _HOPPER,  # fitted: H100 SXM, Llama-3.1-8B TP1 + 70B TP4 (AIC vLLM 0.24)
        "ampere": _AMPERE,  # fitted: A100 SXM, Llama-3.1-8B TP1 + 70B TP4 (AIC TRT-LLM 1.0)
        "ada": _ADA,  # fitted: L40S, Llama-3.1-8B TP1 + TP2 (AIC vLLM 0.24)
        "blackwell": _BLACKWELL,  # fitted: B200, Llama-3.1-8B TP1 + 70B TP4 (AIC vLLM 0.24)
        "volta": _AMPERE,  # no measurements: Ampere's preset
        # no measurements: Hopper's preset (a GPU of the same class), but Infinity Fabric
        # is a mesh of links with no switch to reduce in
        "cdna3": dataclasses.replace(_HOPPER, all_reduce_switch_min_gpus=math.inf),
        "unknown": _AMPERE,  # a user's spec without a generation: the oldest measured preset
    }
)
"""The roofline knobs of each :data:`pdopt.hardware.GPU_GENERATIONS` entry (every one has one;
a test checks)."""


def roofline_knobs(gpu: GpuSpec) -> RooflineKnobs:
    """The preset of ``gpu``'s generation (:data:`ROOFLINE_PRESETS`)."""
    return ROOFLINE_PRESETS[gpu.generation]


PRESET_GEMM_EFFICIENCY: Mapping[str, float] = MappingProxyType(
    {
        # calibration/roofline_validation.py --fit (preset_gemm_efficiency): the fit sources'
        # compute-bound BF16 gemm rows (AIConfigurator, the systems named in ROOFLINE_PRESETS)
        "hopper": 0.774,
        "ampere": 0.834,
        "ada": 0.582,
        "blackwell": 0.693,
        # borrowed presets borrow their fit GEMMs too
        "volta": 0.834,
        "cdna3": 0.774,
        "unknown": 0.834,
    }
)
"""The median compute-bound GEMM efficiency (:func:`pdopt.profile.gemm_compute_efficiency`)
of the measurements each generation's preset was fitted on: the reference a user's own GEMMs
are compared with (:func:`pdopt.profile.calibrate_compute_efficiency`)."""
