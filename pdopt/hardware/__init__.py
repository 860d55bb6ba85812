"""GPU specifications."""

from pdopt.hardware._gpu import GpuSpec

__all__ = ["GpuSpec"]
