"""GPU specifications and the catalogue of public data-sheet values."""

from pdopt.hardware._catalog import GPUS, get_gpu
from pdopt.hardware._gpu import GpuSpec

__all__ = ["GPUS", "GpuSpec", "get_gpu"]
