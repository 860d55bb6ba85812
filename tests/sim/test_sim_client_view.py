"""The client's view of latency (issue 34, item 3): a cost model's server overhead adds
``fixed + per token · l + stream iterations · TPOT`` to each request's TTFT and E2E; TPOT and
every time stamp stay the engine's; none, and nothing changes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import VLLM_V1_OVERHEAD, CostModel, DecodeModel, PrefillModel, ServerOverhead
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.workload import Workload

SLO = Slo(1.0, 0.1)
COST = CostModel(PrefillModel(3e5, 1.4e10, 1e14, 1.0, 0.004), DecodeModel(0.02, 5e-5, 7e-8))


def test_overhead_shifts_ttft_and_e2e_only() -> None:
    rng = np.random.default_rng(1)
    wl = Workload(
        np.sort(rng.uniform(0, 5, 50)), rng.integers(50, 900, 50), rng.integers(1, 40, 50)
    )
    overhead = ServerOverhead(0.004, 1e-6, 1.5)
    for kind in ("pd", "mixed"):
        base = (
            ClusterSpec.build(COST, 1, 1)
            if kind == "pd"
            else ClusterSpec.build(COST, 0, 0, 1, colocated_schedule="hybrid")
        )
        seen = dataclasses.replace(
            base,
            workers=tuple(
                dataclasses.replace(w, cost=dataclasses.replace(w.cost, overhead=overhead))
                for w in base.workers
            ),
        )
        policy = "round_robin" if kind == "pd" else "sarathi"
        a = simulate(wl, base, make_policy(policy), slo=SLO).requests
        b = simulate(wl, seen, make_policy(policy), slo=SLO).requests
        extra = 0.004 + 1e-6 * a["input_tokens"] + 1.5 * a["tpot_s"].fillna(0.0)
        np.testing.assert_allclose(b["ttft_s"], a["ttft_s"] + extra, rtol=1e-12)
        np.testing.assert_allclose(b["e2e_s"], a["e2e_s"] + extra, rtol=1e-12)
        for same in ("tpot_s", "first_token_s", "finish_s", "arrival_s"):
            pd.testing.assert_series_equal(a[same], b[same])


def test_overhead_round_trips_and_is_left_out_when_none() -> None:
    with_overhead = dataclasses.replace(COST, overhead=VLLM_V1_OVERHEAD)
    assert CostModel.from_dict(with_overhead.to_dict()) == with_overhead
    assert "overhead" not in COST.to_dict()
    assert VLLM_V1_OVERHEAD.fixed_s == pytest.approx(0.0042)
