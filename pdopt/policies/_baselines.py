"""Baseline policies that exercise the engine: round-robin, least-loaded, cache-aware (prefix
caching), Arrow's min-load (decode by running tokens), static P:D split."""

from __future__ import annotations

import numpy as np

from pdopt._validation import check_one_of
from pdopt.cluster import ClusterSpec, Role
from pdopt.errors import ConfigError
from pdopt.freeness._flow import MIXED_POOL
from pdopt.policies._cache_routing import CACHE_ROUTINGS, cache_aware_worker
from pdopt.policies._registry import register_policy
from pdopt.sim import ClusterView, Policy, PolicyTraits, RequestInfo, RunContext


def _feasible_decode(request: RequestInfo, view: ClusterView) -> np.ndarray:
    """Decode workers whose capacity holds the request's peak KV footprint."""
    idx = view.decode_workers
    if request.peak_kv_blocks <= view.min_kv_capacity_blocks:
        return idx
    ok = idx[view.kv_capacity_blocks[idx] >= request.peak_kv_blocks]
    if not len(ok):
        raise ConfigError(
            f"no decode worker can hold request {request.request_id} "
            f"({request.peak_kv_blocks} KV blocks at its peak)"
        )
    return ok


def check_a_decoder_remains(policy: str, cluster: ClusterSpec) -> None:
    """A ConfigError when ``policy``'s pool moves would leave no worker to decode: it moves its
    Mixed pool's members (pool ``"mixed"``) into the prefill or decode role, so a cluster whose
    only decoding workers are such members (no decode worker, no mixed worker in another pool)
    ended with every worker prefilling and a ValueError from inside the routing."""
    decodes = [
        w
        for w in cluster.workers
        if w.role is Role.DECODE or (w.role is Role.MIXED and w.pool != MIXED_POOL)
    ]
    if not decodes:
        raise ConfigError(
            f"policy {policy!r} moves its Mixed pool's workers (pool 'mixed') into the prefill "
            "or decode role, and the cluster has no other worker to decode (role 'decode', or "
            "role 'mixed' in another pool): add a decode worker, or use a colocated policy "
            "(vllm, sarathi, ecoserve, arrow) for colocated workers"
        )


def routes_as(policy: Policy, cls: type[Policy], rules: tuple[str, ...] = ()) -> bool:
    """True when ``policy`` runs ``cls``'s hooks and the methods named in ``rules`` (the ones its
    hooks decide with; a subclass may rename it, not reroute it): the condition for sharing
    ``cls``'s twin in the compiled engine."""
    kind = type(policy)
    hooks = ("start", "route_prefill", "route_decode", "on_tick", *rules)
    return isinstance(policy, cls) and all(getattr(kind, h) is getattr(cls, h) for h in hooks)


@register_policy("round_robin")
class RoundRobin(Policy):
    """Prefill and decode workers in turn (each role its own counter)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._p = 0
        self._d = 0

    def start(self, ctx: RunContext) -> None:
        self._p = 0
        self._d = 0

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        self._p += 1
        return int(idx[(self._p - 1) % len(idx)])

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = _feasible_decode(request, view)
        self._d += 1
        return int(idx[(self._d - 1) % len(idx)])

    def traits(self) -> PolicyTraits:
        twin = ("round_robin", "round_robin") if routes_as(self, RoundRobin) else None
        return PolicyTraits(compiled_routing=twin)


@register_policy("least_loaded")
class LeastLoaded(Policy):
    """Prefill: least queued prefill work (FLOP); decode: fewest running plus waiting requests.

    Ties go to the lowest worker index.
    """

    name = "least_loaded"

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        return int(idx[np.argmin(view.queued_prefill_flop[idx])])

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = _feasible_decode(request, view)
        load = view.running[idx] + view.decode_queue_len[idx]
        return int(idx[np.argmin(load)])

    def traits(self) -> PolicyTraits:
        twin = ("least_loaded", "least_loaded") if routes_as(self, LeastLoaded) else None
        return PolicyTraits(compiled_routing=twin)


@register_policy("cache_aware")
class CacheAware(Policy):
    """Prefill by a cache-aware rule (:mod:`pdopt.policies._cache_routing`: ``"kv_aware"``,
    the worker where the prompt's uncached prefill finishes first, as Mooncake's conductor and
    Dynamo's KV router weigh cached blocks against load; or ``"prefix_affinity"``, the worker
    holding most of the prompt); decode as :class:`LeastLoaded` (fewest running plus waiting).
    Without prefix caching every worker caches nothing and ``"kv_aware"`` is least queued work.
    """

    name = "cache_aware"

    def __init__(self, prefill_routing: str = "kv_aware") -> None:
        check_one_of(prefill_routing, CACHE_ROUTINGS, "prefill_routing", self.name)
        self.prefill_routing = prefill_routing
        self._cluster: ClusterSpec | None = None

    def start(self, ctx: RunContext) -> None:
        self._cluster = ctx.cluster

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        assert self._cluster is not None, "start(ctx) runs before routing"
        idx = view.prefill_workers
        return cache_aware_worker(self.prefill_routing, request, view, idx, self._cluster)

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = _feasible_decode(request, view)
        load = view.running[idx] + view.decode_queue_len[idx]
        return int(idx[np.argmin(load)])

    def traits(self) -> PolicyTraits:
        twin = (self.prefill_routing, "least_loaded") if routes_as(self, CacheAware) else None
        return PolicyTraits(compiled_routing=twin)


@register_policy("min_load_tokens")
class MinLoadTokens(Policy):
    """Arrow's minimum-load baseline (Arrow §5.3, arrow.txt ~line 230): prefill to the worker
    with the least predicted prefill queueing delay (outstanding prefill FLOP / P_peak; Arrow's
    baseline may use its quadratic TTFT predictor instead, a stated assumption), decode to the
    worker with the fewest *running tokens*: the KV tokens it holds (``kv_used_blocks`` ×
    block tokens, "the total number of tokens of requests currently being processed on the
    instance as its decode load"). That counts its running decodes (and, on a mixed worker, the
    prompts of its running prefill batch, whose blocks are reserved); decodes waiting for
    admission hold no blocks and are not counted. :class:`LeastLoaded` balances decode by
    request count instead; use this one where Arrow's baseline is meant. Ties: lowest index.
    Its compiled twin (``"min_load_tokens"`` both ways) runs disaggregated and all-mixed clusters.
    """

    name = "min_load_tokens"

    def __init__(self) -> None:
        self._p_peak: np.ndarray | None = None

    def start(self, ctx: RunContext) -> None:
        self._p_peak = np.array(
            [w.cost.prefill.p_peak_flops for w in ctx.cluster.workers], dtype=np.float64
        )

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        if self._p_peak is None:
            raise RuntimeError("min_load_tokens: route called before start(ctx)")
        idx = view.prefill_workers
        return int(idx[np.argmin(view.queued_prefill_flop[idx] / self._p_peak[idx])])

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = _feasible_decode(request, view)
        tokens = view.kv_used_blocks[idx].astype(np.float64) * view.block_tokens
        return int(idx[np.argmin(tokens)])

    def traits(self) -> PolicyTraits:
        twin = ("min_load_tokens", "min_load_tokens") if routes_as(self, MinLoadTokens) else None
        return PolicyTraits(compiled_routing=twin)


@register_policy("static_split")
class StaticSplit(Policy):
    """DistServe-style static disaggregation: the cluster's P:D split never changes.

    Prefill routing by ``prefill_routing``: ``"least_outstanding"`` (fewest queued plus running
    prefill requests) or ``"round_robin"``; decode goes to the worker with the most free KV
    blocks (ties: lowest index).
    """

    name = "static_split"

    def __init__(self, prefill_routing: str = "least_outstanding") -> None:
        check_one_of(
            prefill_routing, ("least_outstanding", "round_robin"), "prefill_routing", "static_split"
        )
        self.prefill_routing = prefill_routing
        self._p = 0

    def start(self, ctx: RunContext) -> None:
        self._p = 0

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        if self.prefill_routing == "round_robin":
            self._p += 1
            return int(idx[(self._p - 1) % len(idx)])
        load = view.prefill_queue_len[idx] + view.running[idx]
        return int(idx[np.argmin(load)])

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = _feasible_decode(request, view)
        return int(idx[np.argmax(view.kv_free_blocks[idx])])

    def traits(self) -> PolicyTraits:
        twin = (self.prefill_routing, "most_free_kv") if routes_as(self, StaticSplit) else None
        return PolicyTraits(compiled_routing=twin)
