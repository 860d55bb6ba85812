"""Disaggregated baselines: DistServe-style static split, Splitwise-style JSQ with a reactive
Mixed pool, and the memory-centric router (DESIGN.md "The systems it models").

* ``distserve``: the P:D split never changes; prefill by least outstanding requests (or round
  robin), decode to the worker with the most free KV.
* ``splitwise``: join-shortest-queue by request count on both sides; every Δt, when the pending
  prompt tokens per prefill worker (or the tokens waiting for decode admission per decode worker)
  pass a threshold, one Mixed-pool worker (pool ``"mixed"``) moves to that pool; it goes home
  once both are below half their thresholds. No cool-down, no Φ: the reactive rule Phasor's macro
  loop is compared against.
* ``memory_centric``: prefill and decode both go to the worker with the most free KV memory.
  Prefill queues hold no KV, so a long queue is invisible to it (the "utilization phantom"
  behind Phasor's queue-divergence observation).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from pdopt._validation import check_positive
from pdopt.cluster import ClusterSpec, Role
from pdopt.policies._baselines import (
    StaticSplit,
    _feasible_decode,
    check_a_decoder_remains,
    routes_as,
)
from pdopt.policies._registry import register_policy
from pdopt.sim import Action, ClusterView, MoveWorker, Policy, PolicyTraits, RequestInfo, RunContext

_HISTORY = 8192  # prompts remembered per worker for the pending-token estimate


@register_policy("distserve")
class DistServe(StaticSplit):
    """DistServe-style static disaggregation (see :class:`pdopt.policies.StaticSplit`)."""

    name = "distserve"


@register_policy("memory_centric")
class MemoryCentric(Policy):
    """Prefill and decode to the worker with the most free KV blocks (ties: lowest index)."""

    name = "memory_centric"

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        return int(idx[np.argmax(view.kv_free_blocks[idx])])

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = _feasible_decode(request, view)
        return int(idx[np.argmax(view.kv_free_blocks[idx])])

    def traits(self) -> PolicyTraits:
        twin = ("most_free_kv", "most_free_kv") if routes_as(self, MemoryCentric) else None
        return PolicyTraits(compiled_routing=twin)


@register_policy("splitwise")
class Splitwise(Policy):
    """Splitwise-style: JSQ routing and a reactive Mixed pool (module docstring).

    Parameters
    ----------
    prefill_threshold_tokens : float
        Pending prompt tokens per prefill worker above which a Mixed worker joins prefill.
    decode_threshold_tokens : float
        Context tokens waiting for decode admission per decode worker above which a Mixed worker
        joins decode.
    delta_t_s : float
        How often the Mixed-pool rule runs, seconds.
    """

    name = "splitwise"

    def __init__(
        self,
        *,
        prefill_threshold_tokens: float = 8192.0,
        decode_threshold_tokens: float = 16384.0,
        delta_t_s: float = 0.05,
    ) -> None:
        owner = "splitwise"
        self.prefill_threshold_tokens = check_positive(
            prefill_threshold_tokens, "prefill_threshold_tokens", owner
        )
        self.decode_threshold_tokens = check_positive(
            decode_threshold_tokens, "decode_threshold_tokens", owner
        )
        self.delta_t_s = check_positive(delta_t_s, "delta_t_s", owner)
        self._reset(None)

    def _reset(self, cluster: ClusterSpec | None) -> None:
        workers = cluster.workers if cluster is not None else ()
        self._members = [i for i, w in enumerate(workers) if w.pool == "mixed"]
        self._home = {i: workers[i].role for i in self._members}
        self._routed: list[deque[int]] = [deque(maxlen=_HISTORY) for _ in workers]
        self._tokens: dict[int, int] = {}
        self._next_act_s = self.delta_t_s

    def start(self, ctx: RunContext) -> None:
        check_a_decoder_remains(self.name, ctx.cluster)
        self._reset(ctx.cluster)

    def traits(self) -> PolicyTraits:
        # the compiled twin (pdopt.sim._compiled): JSQ prefill routing that keeps the routing
        # history, least_loaded's decode rule (running + waiting), and compiled_tick's rule
        twin = ("splitwise", "least_loaded") if self._own_rules() else None
        return PolicyTraits(wants_ticks=True, compiled_routing=twin)

    def _own_rules(self) -> bool:
        """True when this policy runs Splitwise's hooks and rules (the twin's condition)."""
        return routes_as(self, Splitwise, ("pending_prefill_tokens", "pending_decode_tokens"))

    def compiled_tick(self) -> tuple[str, tuple[float, ...]] | None:
        """The compiled twin of :meth:`on_tick` and its parameters (pdopt.sim._compiled._pools),
        or None for a subclass with its own hooks."""
        if not self._own_rules():
            return None
        thresholds = (self.prefill_threshold_tokens, self.decode_threshold_tokens)
        return "splitwise", (*thresholds, self.delta_t_s, float(_HISTORY))

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        w = int(idx[np.argmin(view.prefill_queue_len[idx] + view.running[idx])])
        self._routed[w].append(request.prefill_tokens)
        return w

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = _feasible_decode(request, view)
        self._tokens[request.request_id] = request.prefill_tokens
        return int(idx[np.argmin(view.running[idx] + view.decode_queue_len[idx])])

    def pending_prefill_tokens(self, view: ClusterView) -> float:
        """Mean prompt tokens queued or running per prefill worker (the FIFO queue holds the last
        ``queue + batch`` prompts routed to a worker)."""
        idx = view.prefill_workers
        qlen, running = view.prefill_queue_len, view.running
        total = 0
        for w in idx:
            k = min(int(qlen[w] + running[w]), len(self._routed[w]))
            hist = self._routed[w]
            total += sum(hist[len(hist) - 1 - i] for i in range(k))
        return total / len(idx)

    def pending_decode_tokens(self, view: ClusterView) -> float:
        """Mean context tokens waiting for decode admission per decode worker."""
        idx = view.decode_workers
        if not len(idx):
            return 0.0
        qlen = view.decode_queue_len
        total = 0
        for w in idx:
            if qlen[w]:
                total += sum(self._tokens.get(int(r), 0) for r in view.waiting_requests(int(w)))
        return total / len(idx)

    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        now = view.now_s
        if not self._members or now + 1e-9 < self._next_act_s:
            return ()
        self._next_act_s = now + self.delta_t_s
        over_p = self.pending_prefill_tokens(view) / self.prefill_threshold_tokens
        over_d = self.pending_decode_tokens(view) / self.decode_threshold_tokens
        roles = view.roles
        n_role = {Role.PREFILL: len(view.prefill_workers), Role.DECODE: len(view.decode_workers)}
        if max(over_p, over_d) > 1.0:
            target = Role.PREFILL if over_p >= over_d else Role.DECODE
            for w in self._members:
                if roles[w] is not target and n_role.get(roles[w], 2) >= 2:
                    return [MoveWorker(w, str(target), target)]
            return ()
        if max(over_p, over_d) < 0.5:
            for w in self._members:
                if roles[w] is not self._home[w] and n_role.get(roles[w], 2) >= 2:
                    return [MoveWorker(w, "mixed", self._home[w])]
        return ()
