"""Colocated baselines (issue 5): vLLM-style NoDG and Sarathi-style chunked prefill.

Both run every request's prefill and decode on one ``mixed`` worker (no KV transfer), so the two
phases interfere on the GPU; they differ only in how a worker interleaves them, which the engine
does (:mod:`pdopt.sim._mixed`) from the policy's declared ``PolicyTraits.colocated_schedule``:

* :class:`VLLM` — ``"prefill_first"``: whole prefill batches whenever prefills wait, running
  decodes stall meanwhile (low TTFT, TPOT spikes under prefill load).
* :class:`Sarathi` — ``"hybrid"``: every iteration carries all running decodes plus prefill chunks
  within Sarathi-Serve's iteration token budget ``chunk_tokens`` (decode tokens included;
  stall-free decodes, TTFT stretched over several chunks), one fused forward pass.

Routing is the same for both: a new prefill goes to the worker with the fewest outstanding
requests (prefill queue + running + waiting for decode), or round-robin, or by a cache-aware rule
under prefix caching (``prefix_affinity``, ``kv_aware``:
:mod:`pdopt.policies._cache_routing`); the decode stays where
the prompt was prefilled. On a cluster without mixed workers they fall back to the P/D workers
they are given (prefill workers for prefills, the decode worker with the most free KV), so a
misconfigured layout still runs; the layout meant is ``ClusterSpec.build(cost, 0, 0, n)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pdopt._validation import check_int_at_least, check_one_of
from pdopt.cluster import CHUNK_BUDGETS, ClusterSpec, Role
from pdopt.policies._baselines import _feasible_decode, routes_as
from pdopt.policies._cache_routing import CACHE_ROUTINGS, cache_aware_worker
from pdopt.policies._registry import register_policy
from pdopt.sim import ClusterView, Policy, PolicyTraits, RequestInfo, RunContext

ROUTINGS = ("least_outstanding", "round_robin", *CACHE_ROUTINGS)


class _Colocated(Policy):
    """Shared routing of the colocated baselines; subclasses set the engine schedule."""

    TRAITS = PolicyTraits(colocated_schedule="prefill_first")

    def _twin(self) -> tuple[str, str] | None:
        """The compiled engine's twin of this routing (:mod:`pdopt.sim._compiled._routing`):
        the prefill rule, and ``"origin"``: the decode stays where it was prefilled when that
        worker holds its peak KV, else the most free KV. None when a subclass overrides a
        hook."""
        if not routes_as(self, _Colocated):
            return None
        return (self.prefill_routing, "origin")

    def __init__(self, prefill_routing: str = "least_outstanding") -> None:
        check_one_of(prefill_routing, ROUTINGS, "prefill_routing", self.name)
        self.prefill_routing = prefill_routing
        self._next = 0
        self._origin: dict[int, int] = {}
        self._cluster: ClusterSpec | None = None

    def start(self, ctx: RunContext) -> None:
        self._next = 0
        self._origin = {}
        self._cluster = ctx.cluster

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        roles = view.roles
        mixed = [w for w in idx.tolist() if roles[w] is Role.MIXED]
        if mixed:
            idx = np.asarray(mixed)
        if self.prefill_routing == "round_robin":
            self._next += 1
            w = int(idx[(self._next - 1) % len(idx)])
        elif self.prefill_routing in CACHE_ROUTINGS:
            assert self._cluster is not None, "start(ctx) runs before routing"
            w = cache_aware_worker(self.prefill_routing, request, view, idx, self._cluster)
        else:
            load = view.prefill_queue_len[idx] + view.running[idx] + view.decode_queue_len[idx]
            w = int(idx[np.argmin(load)])
        self._origin[request.request_id] = w
        return w

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        w = self._origin.pop(request.request_id, -1)
        ok = _feasible_decode(request, view)
        if w in ok:
            return w
        return int(ok[np.argmax(view.kv_free_blocks[ok])])


@register_policy("vllm")
class VLLM(_Colocated):
    """vLLM-style NoDG: colocated continuous batching, prefill priority, separate batches."""

    name = "vllm"
    TRAITS = PolicyTraits(colocated_schedule="prefill_first")

    def traits(self) -> PolicyTraits:
        return dataclasses.replace(self.TRAITS, compiled_routing=self._twin())


@register_policy("sarathi")
class Sarathi(_Colocated):
    """Sarathi-style: hybrid batches of all running decodes plus prefill chunks (decode priority).

    Parameters
    ----------
    chunk_tokens : int or None
        Sarathi-Serve's chunk size: the token budget of one iteration (vLLM V1's
        ``max_num_batched_tokens``). None (the default): each worker's own
        (:attr:`pdopt.sim.WorkerSpec.chunk_tokens`, 512 unless the scenario sets
        ``max_num_batched_tokens``).
    prefill_routing : {"least_outstanding", "round_robin", "prefix_affinity", "kv_aware"}
        How a new prefill picks its worker (the cache-aware rules:
        :mod:`pdopt.policies._cache_routing`).
    chunk_budget : {"iteration", "prefill"}
        What ``chunk_tokens`` bounds (:attr:`pdopt.sim.WorkerSpec.chunk_budget`):
        ``"iteration"`` (Sarathi-Serve): decode and prefill tokens together, so ``B`` running
        decodes leave ``chunk_tokens − B`` for chunks (none when ``B >= chunk_tokens``);
        ``"prefill"`` (pdopt before issue 18): the chunks alone, on top of all decodes.
    """

    name = "sarathi"

    def __init__(
        self,
        chunk_tokens: int | None = None,
        prefill_routing: str = "least_outstanding",
        chunk_budget: str = "iteration",
    ) -> None:
        if chunk_tokens is not None:
            check_int_at_least(chunk_tokens, 1, "chunk_tokens", "sarathi")
        check_one_of(chunk_budget, CHUNK_BUDGETS, "chunk_budget", "sarathi")
        super().__init__(prefill_routing)
        self.chunk_tokens = chunk_tokens
        self.chunk_budget = chunk_budget

    def traits(self) -> PolicyTraits:
        return PolicyTraits(
            colocated_schedule="hybrid",
            chunk_tokens=self.chunk_tokens,
            chunk_budget=self.chunk_budget,
            compiled_routing=self._twin(),
        )
