"""Latency models fitted from profiles: prefill, TTFT, decode; their fit reports."""

from pdopt.costmodel._models import CostModel, DecodeModel, PrefillModel, TtftModel

__all__ = ["CostModel", "DecodeModel", "PrefillModel", "TtftModel"]
