"""``kv_fits_nowhere``: requests that waited for decode KV fitting on no worker although the
cluster's free blocks together held them (issue 36: a fragmentation figure that can be compared,
unlike the Phasor paper's undefined fragmentation %)."""

from __future__ import annotations

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.workload import Workload

COST = CostModel(PrefillModel(0.0, 2e9, 1e13), DecodeModel(0.02, 0.0, 0.0))


def _metrics(capacity_blocks: int) -> dict[str, float]:
    """1 prefill, 2 decode workers of ``capacity_blocks`` 16-token blocks (``round_robin``). A
    and B (96-token prompts, 100 tokens out) decode on d0 and d1 from about 0.02 s, one token per
    20 ms: at 0.5 s each holds 96 + 25 = 121 tokens = 8 blocks. C (96 tokens, 2 out) arrives
    then and goes to d0; it needs 97 tokens = 7 blocks. With 14 blocks per worker 6 are free on
    each (12 in all): C fits nowhere although the sum holds it. With 15, 7 are free on d0: it
    is admitted at once."""
    wl = Workload([0.0, 0.001, 0.5], [96, 96, 96], [100, 100, 2])
    cluster = ClusterSpec.build(COST, 1, 2, kv_capacity_blocks=capacity_blocks)
    res = simulate(wl, cluster, make_policy("round_robin"), slo=Slo(10.0, 1.0))
    return dict(res.metrics())


def test_a_request_that_fits_only_in_the_clusters_sum_is_counted() -> None:
    tight = _metrics(14)
    assert tight["false_oom"] == 1 and tight["kv_fits_nowhere"] == 1
    assert tight["kv_fits_nowhere_pct"] == 100.0 / 3
    roomy = _metrics(15)
    assert roomy["false_oom"] == 0 and roomy["kv_fits_nowhere"] == 0
