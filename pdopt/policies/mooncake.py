"""Mooncake-style policy: fully disaggregated prefill and decode nodes, KV moved through a KV
pool over the network (Qin et al., "Mooncake", FAST'25, §5 KVCache-centric scheduling).

The network is a property of the cluster, not of the policy: build the cluster with a pool link,
e.g. ``ClusterSpec.build(..., link=LinkSpec.kv_pool(LinkSpec.ethernet(10)))`` (each byte crosses
the 10 GbE hop twice, so 625 MB/s) or ``link=LINK_PRESETS["kvpool"]`` (over 100 GbE). What the
policy adds is Mooncake's Conductor: it *accounts for the transfer* when choosing where to
prefill and decode.

* Prefill: the prefill worker whose KV would reach a decode worker earliest, i.e. the smallest
  ``now + wait_w + TTFT(l) + transfer`` where ``wait_w`` is the worker's outstanding prefill work
  over its P_peak, TTFT(l) the quadratic predictor, and the transfer time on the FIFO link
  ``w → d`` (``latency + l · kv_bytes_per_token / bandwidth``, after the transfers the policy has
  already put on that link) is minimised over decode workers ``d``.
* Decode: among decode workers whose KV fits the request and whose predicted iteration time with
  the request added ``τ(B + 1, C + l)`` stays within the TPOT (TBT) SLO, the one where the KV
  arrives first (ties: least loaded); when none meets the TBT SLO, the earliest arrival overall.

The policy mirrors the engine's link bookkeeping (a transfer starts when the previous one on the
same ordered pair has put its last byte on the wire) and prices what the engine sends: the
prefill's KV, every token but the one that prefill emitted (decode computes its KV), so
``request.prefill_tokens - 1`` at decode routing (a recomputed request's too: its prefill covers
the tokens generated before its preemption). The engine re-routes a migrated request with
``prefill_tokens`` reset to everything generated; Mooncake issues no migrations, so the rule
holds on every path it sees. (It once priced ``request.prefill_tokens``
there, one token's wire time more per transfer, so a queued link's predicted arrivals drifted
late: 0.20 s measured on a queued 1 GbE pair link.) Ablation: ``transfer_aware=False`` ignores
the links (prefill by least predicted TTFT, decode by least load), which is what a
network-oblivious disaggregated scheduler does.

What is not modelled: prefix caching (Mooncake's cache-aware routing and the pool as a cache),
layer-wise streaming of KV during prefill, and early rejection.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pdopt._validation import check_positive_or_none
from pdopt.policies._baselines import _feasible_decode, routes_as
from pdopt.policies._registry import register_policy
from pdopt.policies._slo_predict import WorkerModels, decode_load
from pdopt.sim import ClusterView, Policy, PolicyTraits, RequestInfo, RunContext

if TYPE_CHECKING:
    from pdopt.model_spec import SlidingWindow


@register_policy("mooncake")
class Mooncake(Policy):
    """Transfer-aware disaggregated routing over a KV-pool network (see the module docstring).

    Parameters
    ----------
    tpot_slo_s : float or None
        TPOT (time between tokens) SLO the decode choice protects, seconds. None: the run's
        (``RunContext.slo.tpot_s``); a value overrides it.
    transfer_aware : bool
        Account for KV transfer times when routing (Mooncake's Conductor); False ablates it.
    """

    name = "mooncake"

    def __init__(self, tpot_slo_s: float | None = None, transfer_aware: bool = True) -> None:
        self.tpot_slo_s = check_positive_or_none(tpot_slo_s, "tpot_slo_s", "mooncake")
        self._tpot_slo_s = math.nan  # the run's, set by start
        self.transfer_aware = bool(transfer_aware)
        self._models: WorkerModels | None = None
        self._bw = np.ones((1, 1))
        self._lat = np.zeros((1, 1))
        self._wire_free = np.zeros((1, 1))
        self._kv_bytes = 0.0
        self._window: SlidingWindow | None = None
        self._src: dict[int, int] = {}

    def start(self, ctx: RunContext) -> None:
        cluster = ctx.cluster
        self._tpot_slo_s = ctx.slo.tpot_s if self.tpot_slo_s is None else self.tpot_slo_s
        workers = cluster.workers
        n = len(workers)
        self._models = WorkerModels.of(cluster)
        self._bw = np.empty((n, n))
        self._lat = np.empty((n, n))
        for i, a in enumerate(workers):
            for j, b in enumerate(workers):
                link = cluster.link_between(a.name, b.name)
                self._bw[i, j] = link.bw_bytes_per_s
                self._lat[i, j] = link.latency_s
        self._wire_free = np.zeros((n, n))
        self._kv_bytes = cluster.kv_bytes_per_token
        self._window = cluster.sliding_window
        self._src = {}

    def traits(self) -> PolicyTraits:
        # the compiled twin (pdopt.sim._compiled._mooncake), its constants by compiled_params
        if not self._own_rules():
            return PolicyTraits()
        aware = self.transfer_aware
        twin = ("mooncake", "mooncake") if aware else ("mooncake_ttft", "mooncake_load")
        return PolicyTraits(compiled_routing=twin)

    def _own_rules(self) -> bool:
        """True when this policy runs Mooncake's hooks and rules (the twin's condition)."""
        return routes_as(self, Mooncake, ("_kv_bytes_of", "_arrival_s", "_put_on_wire"))

    def compiled_params(self) -> tuple[float, ...]:
        """The twin's constants once started: the TPOT SLO, then each worker's TTFT predictor's
        ``a, b, c`` (empty before ``start``)."""
        if self._models is None:
            return ()
        ttft = [(m.a_s_per_token2, m.b_s_per_token, m.c_s) for m in self._models.ttft]
        return (self._tpot_slo_s, *(float(x) for abc in ttft for x in abc))

    @property
    def _m(self) -> WorkerModels:
        if self._models is None:
            raise RuntimeError("mooncake: route called before start(cluster, seed)")
        return self._models

    def _kv_bytes_of(self, tokens: int) -> float:
        """Bytes a transfer of ``tokens`` prompt tokens moves (as the engine: the sliding
        layers send only their window)."""
        held = tokens if self._window is None else self._window.held_tokens(tokens)
        return float(held * self._kv_bytes)

    def _arrival_s(self, src: int, dst: np.ndarray, ready_s: float, tokens: int) -> np.ndarray:
        """When KV made ready at ``ready_s`` on ``src`` would reach each of ``dst``."""
        wire = self._kv_bytes_of(tokens) / self._bw[src, dst]
        start = np.maximum(ready_s, self._wire_free[src, dst])
        end = start + self._lat[src, dst] + wire
        return np.where(dst == src, ready_s, end)

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        ready = view.now_s + self._m.predicted_ttft_s(view, idx, request.prefill_tokens)
        score = ready
        if self.transfer_aware and request.output_tokens > 1:
            dst = view.decode_workers
            score = np.array(
                [
                    self._arrival_s(int(w), dst, float(r), request.prefill_tokens).min()
                    for w, r in zip(idx, ready, strict=True)
                ]
            )
        w = int(idx[int(np.argmin(score))])
        self._src[request.request_id] = w
        return w

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        src = self._src.pop(request.request_id)
        idx = _feasible_decode(request, view)
        batch, tokens = decode_load(view)
        ok = np.array(
            [
                view.kv_free_blocks[d] >= request.kv_blocks
                and self._m.decode_iteration_s(
                    int(d), batch[d] + 1, tokens[d] + request.prefill_tokens
                )
                <= self._tpot_slo_s
                for d in idx
            ],
            dtype=bool,
        )
        cand = idx[ok] if ok.any() else idx
        load = batch[cand]
        sent = request.prefill_tokens - 1  # the prefill's KV: the token it emitted is decode's
        if self.transfer_aware:
            arrive = self._arrival_s(src, cand, view.now_s, sent)
            d = int(cand[np.lexsort((load, arrive))[0]])
        else:
            d = int(cand[int(np.argmin(load))])
        self._put_on_wire(src, d, view.now_s, sent)
        return d

    def _put_on_wire(self, src: int, dst: int, now_s: float, tokens: int) -> None:
        """Mirror the engine's FIFO link: the wire is busy until the last byte is sent."""
        if src == dst:
            return
        start = max(now_s, float(self._wire_free[src, dst]))
        self._wire_free[src, dst] = start + self._kv_bytes_of(tokens) / self._bw[src, dst]
