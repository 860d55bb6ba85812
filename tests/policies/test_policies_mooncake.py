"""Mooncake-style policy: KV through a pool over the network; the link becomes the bottleneck for
an MHA model on 10 GbE, much less for a GQA model.

Setup (A100-80GB roofline cost models, 2 prefill + 2 decode workers, 2048-token prompts, 64
output tokens, Poisson arrivals, SLO TTFT 2 s / TPOT 0.1 s, 90% attainment):

* KV bytes/token from the catalogue: Llama-2-7B (MHA, 32 KV heads) 524,288 B; Llama-3-8B (GQA,
  8 KV heads) 131,072 B. One 2048-token prompt: 1.07 GB vs 0.27 GB.
* Through a KV pool on 10 GbE each byte crosses the hop twice: 625 MB/s per ordered pair, so one
  transfer takes 1.718 s (MHA) vs 0.430 s (GQA), against a 0.137 s / 0.147 s prefill.
* Link bound (4 FIFO prefill→decode pairs): 4 / 1.718 = 2.33 req/s for MHA, 9.3 req/s for GQA;
  the prefill bound is ~14.6 / 13.6 req/s.
* Measured max rate at 90% attainment (rel_tol 5%, when written): MHA 15.08 req/s on NVLink →
  2.16 on the 10 GbE pool (−86%); GQA 13.79 → 10.77 (−22%). With 100 GbE both are back at their
  NVLink rate. Ablation ``transfer_aware=False`` on MHA/10 GbE: 0.65 req/s (the oblivious choice
  queues transfers on a busy pair).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pdopt.capacity import max_rate_under_slo
from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel, fit_cost_model
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model, kv_bytes_per_token
from pdopt.policies import make_policy
from pdopt.policies.mooncake import Mooncake
from pdopt.profile import roofline_profile
from pdopt.scenario import Scenario
from pdopt.sim import ClusterView, RequestInfo, simulate
from pdopt.testing import check_policy
from pdopt.workload import Workload

SLO = Slo(2.0, 0.1)
POOL_10GBE = LinkSpec.kv_pool(LinkSpec.ethernet(10))


def _cluster(model: str, link: LinkSpec) -> ClusterSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost, _ = fit_cost_model(roofline_profile("A100-80GB", model))
    return ClusterSpec.from_hardware(get_gpu("A100-80GB"), get_model(model), cost, 2, 2, link=link)


def _workload(n: int = 200) -> Workload:
    rng = np.random.default_rng(0)
    return Workload(np.cumsum(rng.exponential(1.0, n)), np.full(n, 2048), np.full(n, 64))


def _max_rate(model: str, link: LinkSpec, **flags: object) -> float:
    scenario = Scenario(_workload(), _cluster(model, link), "mooncake", SLO, policy_flags=flags)
    cap = max_rate_under_slo(scenario, rel_tol=0.05)
    assert cap.status == "ok"
    return cap.max_rate_per_s


def test_mooncake_passes_contract_with_ablation() -> None:
    check_policy(lambda: make_policy("mooncake", transfer_aware=False))


def test_transfer_time_on_10gbe_pool_is_the_closed_form() -> None:
    kv = kv_bytes_per_token(get_model("Llama-2-7B"))
    assert kv == 524288 and kv_bytes_per_token(get_model("Llama-3-8B")) == 131072
    res = simulate(
        _workload(5), _cluster("Llama-2-7B", POOL_10GBE), make_policy("mooncake"), slo=SLO
    )
    r = res.requests
    xfer = (r["transfer_end_s"] - r["transfer_start_s"]).to_numpy()
    expected = POOL_10GBE.transfer_time_s(2048 * kv)
    assert expected == pytest.approx(1.71801, rel=1e-4)
    np.testing.assert_allclose(xfer, expected, rtol=1e-9)


@pytest.mark.slow
def test_10gbe_pool_bottlenecks_mha_much_more_than_gqa() -> None:
    mha_fast = _max_rate("Llama-2-7B", LinkSpec.nvlink())
    mha_slow = _max_rate("Llama-2-7B", POOL_10GBE)
    gqa_fast = _max_rate("Llama-3-8B", LinkSpec.nvlink())
    gqa_slow = _max_rate("Llama-3-8B", POOL_10GBE)
    link_bound_mha = 4 / POOL_10GBE.transfer_time_s(2048 * 524288)
    # MHA is held at the link bound (2.33 req/s), far below its compute-bound rate
    assert mha_slow <= link_bound_mha * 1.02
    assert mha_slow >= 0.8 * link_bound_mha
    assert mha_slow / mha_fast < 0.2
    # GQA moves 4x fewer bytes: it keeps most of its rate
    assert gqa_slow / gqa_fast > 0.7
    assert gqa_slow > 4 * mha_slow


def test_transfer_aware_routing_beats_the_oblivious_ablation_on_10gbe() -> None:
    aware = _max_rate("Llama-2-7B", POOL_10GBE)
    oblivious = _max_rate("Llama-2-7B", POOL_10GBE, transfer_aware=False)
    assert aware > 2 * oblivious


def test_decode_goes_where_the_kv_arrives_first() -> None:
    """p0→d0 is NVLink, p0→d1 10 GbE: the aware policy sends every request to d0 (its TBT SLO
    holds), the oblivious one balances load and pays the slow link."""
    cost = CostModel(PrefillModel(0.0, 2e9, 1e14), DecodeModel(0.01, 1e-4, 1e-7))
    base = ClusterSpec.build(cost, 1, 2, kv_bytes_per_token=524288.0, link=POOL_10GBE)
    cluster = ClusterSpec(
        base.workers, base.kv_bytes_per_token, POOL_10GBE, (("p0", "d0", LinkSpec.nvlink()),)
    )
    wl = Workload(np.arange(6) * 0.001, np.full(6, 512), np.full(6, 8))
    aware = simulate(wl, cluster, make_policy("mooncake"), slo=SLO).requests
    oblivious = simulate(wl, cluster, make_policy("mooncake", transfer_aware=False), slo=SLO)
    assert set(aware["decode_worker"]) == {"d0"}
    assert set(oblivious.requests["decode_worker"]) == {"d0", "d1"}
    assert aware["tpot_s"].max() < oblivious.requests["tpot_s"].max()


class _RecordsWire(Mooncake):
    """Mooncake, recording at each decode routing its predicted arrival at the worker it chose
    and its mirror of that link's wire afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.arrival_s: dict[int, float] = {}
        self.wire_free_s: dict[int, float] = {}
        self._last: tuple[np.ndarray, np.ndarray] | None = None

    def _arrival_s(self, src: int, dst: np.ndarray, ready_s: float, tokens: int) -> np.ndarray:
        arrive = super()._arrival_s(src, dst, ready_s, tokens)
        self._last = (np.asarray(dst), arrive)
        return arrive

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        src = self._src[request.request_id]
        d = super().route_decode(request, view)
        assert self._last is not None
        dst, arrive = self._last
        self.arrival_s[request.request_id] = float(arrive[list(dst).index(d)])
        self.wire_free_s[request.request_id] = float(self._wire_free[src, d])
        return d


def test_the_link_mirror_prices_what_the_engine_sends() -> None:
    """One prefill worker, two decode workers, 1 GbE pool links that queue every transfer: the
    policy's predicted arrival at the decode worker it picks is the engine's transfer end, and
    its mirror of the wire the engine's (each transfer's last byte leaves at transfer_end_s less
    the link latency), to rounding, however long the queues grow (the old pricing, one token
    more per transfer, is 0.10 s late by the twelfth)."""
    cost = CostModel(PrefillModel(0.0, 2e9, 1e14), DecodeModel(0.01, 1e-4, 1e-7))
    link = LinkSpec.kv_pool(LinkSpec.ethernet(1))
    cluster = ClusterSpec.build(cost, 1, 2, kv_bytes_per_token=524288.0, link=link)
    wl = Workload(np.arange(12) * 0.01, np.full(12, 1000), np.full(12, 4))
    policy = _RecordsWire()
    r = simulate(wl, cluster, policy, slo=SLO).requests
    assert set(r["decode_worker"]) == {"d0", "d1"}
    ids = range(len(wl))
    one_transfer_s = link.transfer_time_s(1000 * 524288)
    assert r["transfer_end_s"].max() - r["transfer_start_s"].min() > 5 * one_transfer_s
    np.testing.assert_allclose([policy.arrival_s[i] for i in ids], r["transfer_end_s"], rtol=1e-12)
    last_byte = (r["transfer_end_s"] - link.latency_s).to_numpy()
    np.testing.assert_allclose([policy.wire_free_s[i] for i in ids], last_byte, rtol=1e-12)
