"""Cache-aware prefill routing (issue 35, item 4): the rules of the KV-aware routers.

Two rules pick a prefill (or mixed) worker for a request among ``idx``, reading each worker's
cached prompt tokens (:meth:`pdopt.sim.ClusterView.prefix_cached_tokens`):

* ``"prefix_affinity"`` — the worker holding the most of the prompt (ties, and a prompt cached
  nowhere: the least queued prefill work). Affinity alone can pile a popular prefix onto one
  worker: the hit rate is highest, the queue too.
* ``"kv_aware"`` — the worker where the prompt's prefill would *finish* first: its queued prefill
  work plus this prompt's uncached work, over its prefill peak (Mooncake's conductor estimates the
  TTFT of each prefill instance this way, and Dynamo's KV router scores blocks to compute plus
  load): cached blocks are worth exactly the compute they save, so load still spreads.

Work is the prefill model's FLOP-equivalent (:meth:`pdopt.costmodel.PrefillModel.work_flop`),
so ``work(l) − work(h)`` is what a hit of ``h`` tokens leaves to compute.
"""

from __future__ import annotations

import numpy as np

from pdopt.cluster import ClusterSpec
from pdopt.sim import ClusterView, RequestInfo

CACHE_ROUTINGS = ("prefix_affinity", "kv_aware")
"""The cache-aware prefill routing rules (module docstring)."""


def cache_aware_worker(
    rule: str, request: RequestInfo, view: ClusterView, idx: np.ndarray, cluster: ClusterSpec
) -> int:
    """The worker of ``idx`` that ``rule`` picks for ``request`` (module docstring)."""
    cached = view.prefix_cached_tokens(request.request_id)[idx]
    queued = view.queued_prefill_flop[idx]
    if rule == "prefix_affinity":
        # most cached first, then least queued work, then the lowest index
        order = np.lexsort((idx, queued, -cached))
        return int(idx[order[0]])
    tokens = request.prefill_tokens
    finish = np.empty(len(idx))
    for k, w in enumerate(idx.tolist()):
        model = cluster.workers[w].cost.prefill
        left = float(model.work_flop(tokens) - model.work_flop(int(cached[k])))
        finish[k] = (queued[k] + left) / model.p_peak_flops
    return int(idx[np.argmin(finish)])
