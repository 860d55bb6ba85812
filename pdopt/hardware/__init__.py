"""GPU specifications and the catalogue of public data-sheet values."""

from pdopt.hardware._catalog import GPUS, get_gpu
from pdopt.hardware._gpu import GPU_GENERATIONS, GpuSpec

__all__ = ["GPUS", "GPU_GENERATIONS", "GpuSpec", "get_gpu"]
