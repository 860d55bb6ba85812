"""The Sarathi (hybrid) schedule charges the fused iteration (issues 18, 34): the engine's mixed
iterations go through CostModel.hybrid_iteration_time_s, fitted or composed."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, HybridModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.workload import Workload, archetype_workload

SLO = Slo(5.0, 0.5)
PRE, DEC = PrefillModel(3e5, 1.4e10, 1e14, 1.0, 0.004), DecodeModel(0.02, 5e-5, 7e-8)
# the composed pass written as a HybridModel: d0, d1, d2, β·P_m/P_peak, α/P_peak, t0
SAME = HybridModel(0.02, 5e-5, 7e-8, 1.4e10 / 1e14, 3e5 / 1e14, 0.004)


def run(cost: CostModel, workload: Workload) -> pd.DataFrame:
    cluster = ClusterSpec.build(
        cost, 0, 0, 1, colocated_schedule="hybrid", kv_capacity_blocks=20000,
        max_batch_size=16, max_batch_tokens=8192, max_running=64, chunk_tokens=512,
    )  # fmt: skip
    return simulate(workload, cluster, make_policy("round_robin"), slo=SLO).requests


def test_a_hybrid_model_equal_to_the_composition_gives_the_same_run() -> None:
    wl = archetype_workload("long_short", 2.0, n_requests=120, seed=5)
    composed = run(CostModel(PRE, DEC), wl)
    fitted = run(CostModel(PRE, DEC, hybrid=SAME), wl)
    assert (fitted["status"] == "finished").all()
    for column in ("ttft_s", "tpot_s", "finish_s"):
        pd.testing.assert_series_equal(fitted[column], composed[column], rtol=1e-9)


def test_the_engine_charges_the_fitted_mixed_iteration_by_hand() -> None:
    # Request 0 (16-token prompt) is decoding alone when request 1 (300 tokens, one chunk)
    # arrives at 0.1 s; request 1's whole prefill is one mixed iteration with request 0's decode.
    wl = Workload([0.0, 0.1], [16, 300], [200, 4])
    fitted = dataclasses.replace(SAME, h0_s=0.05, h3_s_per_chunk_token=2e-4)
    q = run(CostModel(PRE, DEC, hybrid=fitted), wl)
    # request 0: a chunk-only iteration (the prefill fit's endpoint, t0 + work / P_peak), then
    # decode iterations τ(1, C) from C = 17 (prompt + first token); 5 of them end before 0.1 s
    prefill_0 = PRE.batch_time_s([16])
    assert q.loc[0, "prefill_end_s"] == pytest.approx(prefill_0, abs=1e-15)
    boundary = prefill_0 + sum(float(DEC.iteration_time_s(1, 17 + k)) for k in range(5))
    assert q.loc[1, "prefill_start_s"] == pytest.approx(boundary, abs=1e-12)
    # the mixed iteration: max(h0 + h1·B, h5 + h3·(B + c)) + h2·C + h4·((d + c)² − d²),
    # B = 1, C = 22, d = 0; the chunks' pass 0.004 + 2e-4·301 = 0.0642 binds
    hand = 0.004 + 2e-4 * 301 + 7e-8 * 22 + SAME.h4_s_per_token2 * 300**2
    assert q.loc[1, "prefill_end_s"] - q.loc[1, "prefill_start_s"] == pytest.approx(hand, 1e-12)
    # without the fitted model the same iteration is the composed pass
    composed = run(CostModel(PRE, DEC), wl)
    # decode pass d0 + d1 = 0.02005 vs chunks' pass t0 + 301·β/P = 0.04614: the latter binds
    composed_s = 0.004 + 301 * 1.4e10 / 1e14 + 7e-8 * 22 + 3e5 * 300**2 / 1e14
    iteration = composed.loc[1, "prefill_end_s"] - composed.loc[1, "prefill_start_s"]
    assert iteration == pytest.approx(composed_s, rel=1e-12)
    # so TTFT moves by what the fit changed: (200 − 140) µs × 301 tokens
    shift = q.loc[1, "ttft_s"] - composed.loc[1, "ttft_s"]
    assert shift == pytest.approx(6e-5 * 301, abs=1e-12)
