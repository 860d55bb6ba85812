"""The planner counts sliding-window KV: gpt-oss's decode workers hold more long requests.

Hand computation: 8192-token prompts with 256 outputs run at a mean context ``c̄ = 8192 + 128 =
8320`` tokens; gpt-oss-120b's 18 full layers hold all of it and its 18 sliding layers 128, so a
request takes ``(18·8320 + 18·128) / 36 = 4224`` tokens of a KV capacity counted in tokens held
in every layer.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from pdopt.cluster import Role
from pdopt.model_spec import get_model
from pdopt.plan import Demand, worker_capacity, worker_options

N = 64
LONG = Demand(
    rate_per_s=1.0,
    input_tokens=np.full(N, 8192.0),
    output_tokens=np.full(N, 256.0),
    ttft_slo_s=60.0,
    tpot_slo_s=5.0,  # loose: KV binds, not TPOT
)


def _kv_batch(capacity_tokens: float, per_request: float, quantile: float) -> float:
    """``B + z sqrt(B) = capacity / per_request`` solved for ``B`` (pdopt.plan._workers)."""
    z = float(stats.norm.ppf(quantile))
    k = capacity_tokens / per_request
    return ((-z + math.sqrt(z * z + 4.0 * k)) / 2.0) ** 2


@pytest.fixture(scope="module")
def option():  # type: ignore[no-untyped-def]
    (found,) = worker_options(["H200"], "gpt-oss-120b", tps=(1,))
    return found


def test_demand_counts_the_window(option) -> None:  # type: ignore[no-untyped-def]
    assert option.model == get_model("gpt-oss-120b")
    assert LONG.decode_context_tokens == 8320.0
    assert LONG.decode_kv_tokens(option.model) == 4224.0
    assert LONG.peak_kv_tokens(option.model) == (18 * 8447 + 18 * 128) / 36
    assert LONG.decode_kv_tokens(None) == LONG.decode_context_tokens
    assert LONG.decode_kv_tokens(get_model("Llama-3.1-8B")) == LONG.decode_context_tokens


def test_gpt_oss_decode_capacity_counts_the_window(option) -> None:  # type: ignore[no-untyped-def]
    windowed = worker_capacity(option, LONG)
    full = worker_capacity(replace(option, model=None), LONG)
    assert windowed.decode_limited_by == full.decode_limited_by == "kv"
    cap = option.kv_capacity_tokens
    assert windowed.decode_batch == pytest.approx(_kv_batch(cap, 4224.0, 0.99), rel=1e-12)
    assert full.decode_batch == pytest.approx(_kv_batch(cap, 8320.0, 0.99), rel=1e-12)
    # about twice the requests per decode worker (8320 / 4224 = 1.97 before the z term)
    assert 1.9 < windowed.decode_batch / full.decode_batch < 2.1
    # the rate grows less: each iteration of the larger batch takes longer (Little's law)
    dec = option.cost.decode
    for got in (windowed, full):
        tau = float(dec.mean_context_time_s(got.decode_batch, 8320.0))
        assert got.decode_rate_per_worker == pytest.approx(got.decode_batch / (255 * tau))
    assert windowed.decode_rate_per_worker > full.decode_rate_per_worker


def test_plan_cluster_carries_the_window_to_the_simulator(option) -> None:  # type: ignore[no-untyped-def]
    from pdopt.plan import solve_pd_sizing
    from pdopt.plan._verify import cluster_for_plan

    cap = worker_capacity(option, LONG)
    plan = solve_pd_sizing(LONG, [option])
    cluster = cluster_for_plan(plan, [cap], float(option.model.kv_bytes_per_token))
    assert cluster.sliding_window == option.model.sliding_window
    assert cluster.count(Role.DECODE) >= 1
