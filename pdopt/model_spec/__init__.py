"""Model configurations and derived sizes (parameters, KV bytes per token, FLOPs)."""

from pdopt.model_spec._model import DTYPE_BYTES, ModelSpec

__all__ = ["DTYPE_BYTES", "ModelSpec"]
