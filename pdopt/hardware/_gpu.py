"""GPU specifications (public data sheets)."""

from __future__ import annotations

from dataclasses import dataclass

from pdopt._validation import check_positive


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
    """

    name: str
    peak_flops: float
    memory_bytes: float
    hbm_bw_bytes_per_s: float
    link_bw_bytes_per_s: float
    idle_power_w: float
    max_power_w: float
    cost_per_hour: float = 1.0

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
