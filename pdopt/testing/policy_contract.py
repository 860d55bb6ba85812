"""The conformance suite every registered policy passes (STYLE.md "Contract suites").

:func:`check_policy` runs a policy on small scenarios (open loop with a burst, KV pressure that
forces preemptions and admission waits, closed loop) and checks:

* every request ends exactly once, finished or rejected with a reason;
* its decisions were valid (the engine raises :class:`pdopt.sim.PolicyDecisionError` otherwise);
* per-request timestamps are ordered and KV stays within [0, capacity] at every tick;
* determinism: the same inputs and seed give identical DataFrames, also when the same policy
  object runs twice (per-run state is reset in ``start``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.sim import ClosedLoop, PolicyProtocol, SimResult, simulate
from pdopt.workload import Workload

_COST = CostModel(PrefillModel(100.0, 2e9, 1e13, 1.0, 1e-3), DecodeModel(5e-3, 1e-4, 1e-7))
_SLO = Slo(1.0, 0.05)


def contract_scenarios() -> dict[str, tuple[Any, ClusterSpec]]:
    """Named (driver, cluster) pairs of the suite; small enough to run in well under a second."""
    rng = np.random.default_rng(1234)
    n = 120
    arrivals = np.sort(np.concatenate([rng.uniform(0, 3, n - 40), rng.uniform(1, 1.2, 40)]))
    wl = Workload(arrivals, rng.integers(1, 600, n), rng.integers(1, 200, n), name="contract")
    roomy = ClusterSpec.build(
        _COST,
        2,
        2,
        2,
        kv_capacity_blocks=400,
        max_batch_size=4,
        max_running=16,
        mixed_pool_role="decode",
    )
    tight = ClusterSpec.build(_COST, 2, 2, kv_capacity_blocks=60, max_batch_size=4, max_running=16)
    closed = ClosedLoop(6, 0.05, (rng.integers(1, 400, 30), rng.integers(1, 60, 30)), 80)
    return {"open_burst": (wl, roomy), "kv_pressure": (wl, tight), "closed_loop": (closed, roomy)}


def _check_result(label: str, res: SimResult, cluster: ClusterSpec) -> None:
    req = res.requests
    ids = req["request_id"].to_numpy()
    if not np.array_equal(ids, np.arange(len(req))):
        raise AssertionError(f"{label}: request ids are not 0..n-1 exactly once")
    status = req["status"]
    if not status.isin(["finished", "rejected"]).all():
        raise AssertionError(f"{label}: some requests did not end: {status.value_counts()}")
    rejected = req[status == "rejected"]
    if (rejected["reason"] == "").any():
        raise AssertionError(f"{label}: a rejected request has no reason")
    done = req[status == "finished"]
    order = [
        "arrival_s",
        "prefill_start_s",
        "prefill_end_s",
        "transfer_start_s",
        "transfer_end_s",
        "decode_start_s",
        "finish_s",
    ]
    stamps = done[order].to_numpy()
    for row in stamps:
        seen = row[~np.isnan(row)]
        if np.any(np.diff(seen) < 0):
            raise AssertionError(
                f"{label}: timestamps out of order: {dict(zip(order, row, strict=True))}"
            )
    ts = res.timeseries
    cap = {w.name: w.kv_capacity_blocks for w in cluster.workers}
    if len(ts) and (
        (ts["kv_used_blocks"] < 0).any() or (ts["kv_used_blocks"] > ts["worker"].map(cap)).any()
    ):
        raise AssertionError(f"{label}: KV blocks outside [0, capacity]")


def check_policy(make: Callable[[], PolicyProtocol], *, seed: int = 0) -> None:
    """Run the suite on policies built by ``make()`` (e.g. ``lambda: make_policy("phasor")``).

    Raises AssertionError (or the engine's PolicyDecisionError) naming the scenario at fault.
    """
    for label, (driver, cluster) in contract_scenarios().items():
        policy = make()
        first = simulate(driver, cluster, policy, slo=_SLO, tick_s=0.05, seed=seed)
        _check_result(f"{policy.name}/{label}", first, cluster)
        again = simulate(driver, cluster, policy, slo=_SLO, tick_s=0.05, seed=seed)
        fresh = simulate(driver, cluster, make(), slo=_SLO, tick_s=0.05, seed=seed)
        for other, how in ((again, "the same policy object"), (fresh, "a new policy object")):
            for name in ("requests", "timeseries", "events"):
                try:
                    pd.testing.assert_frame_equal(getattr(first, name), getattr(other, name))
                except AssertionError as exc:
                    raise AssertionError(
                        f"{label}: not deterministic: {name} differ when run again with {how}"
                    ) from exc
