"""GPU specifications (public data sheets)."""

from __future__ import annotations

from dataclasses import dataclass

from pdopt._validation import (
    check_int_at_least,
    check_non_negative,
    check_positive,
    param_error,
)
from pdopt.errors import ParameterError

GPU_GENERATIONS: tuple[str, ...] = (
    "volta",
    "ampere",
    "ada",
    "hopper",
    "blackwell",
    "cdna3",
    "unknown",
)
"""Architecture generations a :class:`GpuSpec` may name (NVIDIA Volta … Blackwell, AMD CDNA3);
the roofline prior takes its efficiency preset from the generation
(:data:`pdopt.profile.ROOFLINE_PRESETS`)."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU type.

    Parameters
    ----------
    name : str
        Catalogue name, e.g. ``"A100-80GB"``.
    peak_flops : float
        Dense FP16/BF16 tensor-core peak, FLOP/s (no sparsity).
    memory_bytes : float
        HBM capacity, bytes.
    hbm_bw_bytes_per_s : float
        HBM bandwidth, bytes/s.
    link_bw_bytes_per_s : float
        Intra-node GPU-GPU bandwidth (NVLink or PCIe), bytes/s, one direction.
    idle_power_w, max_power_w : float
        Power drawn idle and at full load (TDP), watts.
    cost_per_hour : float
        A relative price used by planners (on-demand USD/h order of magnitude).
    fp8_peak_flops : float
        Dense FP8 tensor-core peak, FLOP/s (no sparsity); 0 when the GPU has no FP8 tensor cores
        (Volta, Ampere), where FP8 weights run weight-only at :attr:`peak_flops`.
    generation : str
        Architecture generation, one of :data:`GPU_GENERATIONS` (lower case); ``"unknown"`` (the
        default, for user spec files that do not say) picks a generic roofline preset.
    gpus_per_node : int
        GPUs one node joins by :attr:`link_bw_bytes_per_s` (an HGX/DGX board, a PCIe server):
        tensor parallelism spans at most this many (:meth:`check_tp`), since pdopt prices a TP
        group's all-reduces on that link only; 8 (the default) for every catalogued board.
    """

    name: str
    peak_flops: float
    memory_bytes: float
    hbm_bw_bytes_per_s: float
    link_bw_bytes_per_s: float
    idle_power_w: float
    max_power_w: float
    cost_per_hour: float = 1.0
    fp8_peak_flops: float = 0.0
    generation: str = "unknown"
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        for field_name in (
            "peak_flops",
            "memory_bytes",
            "hbm_bw_bytes_per_s",
            "link_bw_bytes_per_s",
            "max_power_w",
            "cost_per_hour",
        ):
            check_positive(getattr(self, field_name), field_name, "GpuSpec")
        check_non_negative(self.fp8_peak_flops, "fp8_peak_flops", "GpuSpec")
        if self.generation not in GPU_GENERATIONS:
            raise ParameterError(
                f"GpuSpec generation: expected one of {list(GPU_GENERATIONS)}, "
                f"got {self.generation!r}"
            )
        check_int_at_least(self.gpus_per_node, 1, "gpus_per_node", "GpuSpec")

    def check_tp(self, tp: int, owner: str) -> int:
        """``tp`` when one node holds it (at most :attr:`gpus_per_node`), else a
        :class:`~pdopt.errors.ParameterError` of ``owner``: a larger group would all-reduce over
        the network between nodes, which pdopt does not price (nor pipeline parallelism)."""
        if tp > self.gpus_per_node:
            rule = (
                f"at most {self.name}'s gpus_per_node={self.gpus_per_node} (tensor parallelism "
                "within one node: pdopt prices its all-reduces on the node's GPU link and "
                "models neither multi-node TP nor pipeline parallelism)"
            )
            raise param_error("tp", owner, rule, tp)
        return tp

    def peak_flops_for(self, weight_dtype: str) -> float:
        """Dense tensor peak the GEMMs of a model stored as ``weight_dtype`` run at, FLOP/s:
        :attr:`fp8_peak_flops` for FP8 weights (W8A8) where the GPU has FP8 tensor cores, else
        :attr:`peak_flops` (16-bit activations; INT8/INT4/MXFP4 weights are dequantised)."""
        if weight_dtype == "fp8" and self.fp8_peak_flops > 0:
            return self.fp8_peak_flops
        return self.peak_flops
