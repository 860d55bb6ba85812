"""Predictions shared by the SLO-aware policies (Mooncake, Arrow, EcoServe): per-worker prefill
waiting time and TTFT, decode iteration time and load, computed from each worker's cost model and
the read-only :class:`pdopt.sim.ClusterView`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdopt.cluster import ClusterSpec
from pdopt.costmodel import CostModel, DecodeModel, TtftModel
from pdopt.sim import ClusterView

FloatArray = npt.NDArray[np.float64]


def ttft_predictor(cost: CostModel) -> TtftModel:
    """The quadratic TTFT predictor of a worker (Arrow §4): the fitted one when the cost model
    carries it (:func:`pdopt.costmodel.fit_ttft`), else the batch-of-one prefill time
    ``t0 + (alpha·l² + beta·P_m·l) / P_peak``, which is exactly quadratic in ``l``."""
    if cost.ttft is not None:
        return cost.ttft
    p = cost.prefill
    return TtftModel(
        p.alpha_flop_per_token2 / p.p_peak_flops,
        p.beta_flop_per_token * p.p_m / p.p_peak_flops,
        p.intercept_s,
    )


@dataclass(frozen=True, slots=True)
class WorkerModels:
    """Per-worker constants a policy reads once in ``start`` (index = worker index)."""

    p_peak_flops: FloatArray
    ttft: tuple[TtftModel, ...]
    decode: tuple[DecodeModel, ...]
    kv_capacity_tokens: FloatArray

    @classmethod
    def of(cls, cluster: ClusterSpec) -> WorkerModels:
        return cls(
            np.array([w.cost.prefill.p_peak_flops for w in cluster.workers], dtype=np.float64),
            tuple(ttft_predictor(w.cost) for w in cluster.workers),
            tuple(w.cost.decode for w in cluster.workers),
            np.array(
                [w.kv_capacity_blocks * w.block_tokens for w in cluster.workers], dtype=np.float64
            ),
        )

    def prefill_wait_s(self, view: ClusterView) -> FloatArray:
        """Predicted queueing delay of a new prefill on each worker: outstanding prefill work
        (queued plus the running batch's remainder, FLOP) over the worker's P_peak, seconds."""
        wait: FloatArray = view.queued_prefill_flop / self.p_peak_flops
        return wait

    def predicted_ttft_s(
        self, view: ClusterView, idx: npt.NDArray[np.int64], tokens: int
    ) -> FloatArray:
        """Predicted TTFT on workers ``idx``: queueing delay + TTFT(l) (Arrow Alg. 1)."""
        own = np.array([float(self.ttft[w].predict(tokens)) for w in idx], dtype=np.float64)
        out: FloatArray = self.prefill_wait_s(view)[idx] + own
        return out

    def decode_iteration_s(self, w: int, batch: float, context_tokens: float) -> float:
        """τ(B, C) of worker ``w``, seconds (DESIGN.md "Cost model")."""
        return float(self.decode[w].iteration_time_s(batch, context_tokens))

    def max_running_tokens(self, w: int, batch: float, tpot_slo_s: float) -> float:
        """Max Running Tokens of worker ``w`` at ``batch`` running requests (Arrow §4.3): the
        largest context total C with τ(B, C) <= TPOT SLO, capped by the KV capacity in tokens."""
        budget = self.decode[w].context_budget_tokens(batch, tpot_slo_s)
        return float(min(self.kv_capacity_tokens[w], budget))


def decode_load(view: ClusterView) -> tuple[FloatArray, FloatArray]:
    """``(batch, running_tokens)`` per worker: running plus waiting decode requests, and the KV
    tokens they hold (used blocks × block tokens, so rounded up to whole blocks)."""
    batch = (view.running + view.decode_queue_len).astype(np.float64)
    tokens = view.kv_used_blocks.astype(np.float64) * view.block_tokens
    return batch, tokens
