"""Where a preempted (recomputed) request rejoins the prefill queue (issue 18): at the front, as
vLLM and Sarathi-Serve do, or at the back (``ClusterSpec.preempted_requeue``); both engines."""

from __future__ import annotations

import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ParameterError
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.workload import Workload

# prefill 1 ms per token (no intercept), decode 1 ms per iteration whatever the batch
COST = CostModel(PrefillModel(0.0, 1e9, 1e12, 1.0, 0.0), DecodeModel(1e-3, 0.0, 0.0))
# A and B (5 tokens) prefill one at a time and decode together on d0 (20 one-token blocks) until
# their contexts outgrow it and B, the youngest, is preempted at 13 ms with 3 tokens generated.
# By then X (15 tokens) is prefilling [10.5, 25.5] ms and W (3 tokens) waits behind it.
WORKLOAD = Workload([0.0, 0.0, 0.0105, 0.0106], [5, 5, 15, 3], [12, 12, 2, 2])


def cluster(requeue: str) -> ClusterSpec:
    return ClusterSpec.build(
        COST,
        1,
        1,
        kv_capacity_blocks=20,
        block_tokens=1,
        max_batch_size=1,
        link=LinkSpec("instant", 1e12, 0.0),
        preempted_requeue=requeue,
    )


@pytest.mark.parametrize("engine", ["python", "compiled"])
@pytest.mark.parametrize("requeue", ["front", "back"])
def test_preempted_request_goes_ahead_of_earlier_waiting_requests(
    requeue: str, engine: str
) -> None:
    res = simulate(
        WORKLOAD, cluster(requeue), make_policy("round_robin"), slo=Slo(1, 1), engine=engine
    )
    req = res.requests
    (pre,) = res.events.itertuples()
    assert (pre.kind, pre.request_id, pre.detail) == ("preemption", 1, "generated=3")
    x_end = 0.0105 + 0.015
    assert pre.t_s < x_end and pre.t_s > req.arrival_s[3]  # W was waiting when B came back
    assert req.first_token_s[2] == pytest.approx(x_end)
    if requeue == "front":
        # B's re-prefill over 5 + 3 tokens (8 ms) runs before W, which arrived before it came back
        assert req.prefill_start_s[3] == pytest.approx(x_end + 0.008)
    else:
        assert req.prefill_start_s[3] == pytest.approx(x_end)
        assert req.finish_s[3] < req.finish_s[1]


def test_an_unknown_requeue_is_refused() -> None:
    with pytest.raises(ParameterError, match="preempted_requeue"):
        cluster("middle")
