"""Phasor's meso loop by hand: a false OOM is repaired by migrating a running request.

Two decode workers of 160 blocks (16 tokens each) each run one 800-token request (50 blocks, 75 at
its peak). A 1900-token request (119 blocks) then fits neither worker's free space although the
cluster has 206 free blocks: a false OOM (DESIGN.md "Fragmentation"). With defragmentation the
next tick moves the running request off the head's worker (both running requests fit on one at
their peaks) and the heavy request starts decoding at once; without it, it waits ~1.5 s for the
running request to finish.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import SimResult, simulate
from pdopt.workload import Workload

COST = CostModel(PrefillModel(0.0, 2e9, 1e13), DecodeModel(5e-3, 1e-4, 1e-8))
LINK = LinkSpec("nvlink", 1e11, 1e-5)
KV_BYTES_PER_TOKEN = 1e5


def run(defrag: bool) -> SimResult:
    cluster = ClusterSpec.build(
        COST, 3, 2, kv_capacity_blocks=160, block_tokens=16, link=LINK,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
    )  # fmt: skip
    wl = Workload([0.0, 0.01, 0.3], [800, 800, 1900], [400, 400, 10])
    policy = make_policy("phasor", defrag=defrag, mixed_pool=False)
    return simulate(wl, cluster, policy, slo=Slo(2.0, 0.1))


def kinds(res: SimResult) -> list[str]:
    return list(res.events["kind"])


def test_defragmentation_admits_the_heavy_request_at_once() -> None:
    on, off = run(True), run(False)
    heavy_on, heavy_off = on.requests.iloc[2], off.requests.iloc[2]
    # the same false OOM in both runs: 119 blocks needed, 206 free across the cluster
    assert kinds(off) == ["false_oom"]
    assert kinds(on) == ["false_oom", "migration_start", "migration_end"]
    # without defrag the head waits for the running request on its worker to finish
    assert heavy_off["decode_start_s"] == pytest.approx(off.requests.iloc[0]["finish_s"])
    # with it, it starts right after the migration ends (the first tick after the OOM, + copy)
    end = on.events[on.events["kind"] == "migration_end"].iloc[0]
    assert heavy_on["decode_start_s"] == pytest.approx(end["t_s"], abs=0.01)
    assert heavy_on["decode_start_s"] < heavy_off["decode_start_s"] - 1.0
    assert heavy_on["e2e_s"] < 0.5 * heavy_off["e2e_s"]


def test_migration_overhead_is_accounted() -> None:
    on = run(True)
    moved = on.requests.iloc[0]
    assert moved["migrations"] == 1
    assert moved["decode_worker"] == "d0"  # where it was admitted; the event says where it went
    end = on.events[on.events["kind"] == "migration_end"].iloc[0]
    assert end["worker"] == "d1"
    # pre-copy sends the whole context at least once: bytes >= blocks x 16 tokens x bytes/token
    start = on.events[on.events["kind"] == "migration_start"].iloc[0]
    blocks = int(str(start["detail"]).split("blocks=")[1])
    assert moved["migrated_bytes"] >= blocks * 16 * KV_BYTES_PER_TOKEN
    # a short stop-and-copy downtime, and the moved request still finishes all its tokens
    assert 0 < moved["migration_downtime_s"] < 0.05
    assert moved["status"] == "finished"
    metrics = on.metrics()
    assert metrics["migrations"] == 1
    assert metrics["migrated_bytes"] == pytest.approx(moved["migrated_bytes"])


def test_without_defrag_nothing_moves() -> None:
    off = run(False)
    assert (off.requests["migrations"] == 0).all()
    pd.testing.assert_series_equal(
        off.requests["decode_worker"], pd.Series(["d0", "d1", "d0"], name="decode_worker")
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_defrag_never_targets_a_full_running_batch(seed: int) -> None:
    # max_running = 3 keeps batches full under KV pressure; before the fix every such run ended
    # with PolicyDecisionError "worker k's running batch is full".
    rng = np.random.default_rng(seed)
    n = 200
    heavy = rng.random(n) < 0.2
    wl = Workload(
        np.cumsum(rng.exponential(0.02, n)),
        np.where(heavy, 1800, rng.integers(100, 800, n)),
        rng.integers(50, 400, n),
    )
    cluster = ClusterSpec.build(
        COST, 2, 3, kv_capacity_blocks=160, block_tokens=16, max_running=3, link=LINK,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
    )  # fmt: skip
    res = simulate(wl, cluster, make_policy("phasor", mixed_pool=False), slo=Slo(2.0, 0.1))
    assert len(res.requests) == n
    assert res.requests["status"].isin(["finished", "rejected"]).all()
    assert res.metrics()["migrations"] > 0
