"""Arrow's min-load baseline (``min_load_tokens``) against ``least_loaded``: decode load by
running tokens (Arrow §5.3) rather than by request count."""

from __future__ import annotations

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.workload import Workload

COST = CostModel(PrefillModel(0.0, 2e9, 1e13), DecodeModel(0.02, 0.0, 0.0))


def _decode_workers(policy: str) -> list[str]:
    """One prefill, two decode workers. A (4000-token prompt) goes to d0 (all empty, lowest
    index), B (100 tokens) to d1 (no request, no token). C (100 tokens) meets one request on
    each: ``least_loaded`` ties and takes d0; by running tokens d1 holds ~100 against ~4000,
    so ``min_load_tokens`` takes d1."""
    wl = Workload([0.0, 1.0, 2.0], [4000, 100, 100], [400, 400, 400])
    cluster = ClusterSpec.build(COST, 1, 2, kv_capacity_blocks=3000)
    res = simulate(wl, cluster, make_policy(policy), slo=Slo(10.0, 1.0))
    return list(res.requests["decode_worker"])


def test_min_load_balances_decode_by_running_tokens() -> None:
    assert _decode_workers("least_loaded") == ["d0", "d1", "d0"]
    assert _decode_workers("min_load_tokens") == ["d0", "d1", "d1"]
