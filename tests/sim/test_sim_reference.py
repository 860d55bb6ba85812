"""The fast engine against a slow per-iteration reference simulator (same semantics, no closed
forms): per-request timestamps must agree to 1e-9 s on random small scenarios."""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np
import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.sim import Policy, simulate
from pdopt.workload import Workload


class Modulo(Policy):
    """Routes by request id, so the reference can route identically whatever the call order."""

    name = "modulo"

    def route_prefill(self, request, view):  # type: ignore[no-untyped-def]
        idx = view.prefill_workers
        return int(idx[request.request_id % len(idx)])

    def route_decode(self, request, view):  # type: ignore[no-untyped-def]
        idx = view.decode_workers
        return int(idx[(request.request_id // 2) % len(idx)])


def reference(
    wl: Workload,
    cost: CostModel,
    n_p: int,
    n_d: int,
    cap: int,
    bt: int,
    max_tokens: int,
    max_size: int,
    max_running: int,
    kvb: float,
    link: LinkSpec,
    requeue: str = "front",
) -> dict[str, np.ndarray]:
    """One event per decode iteration; straightforward lists and dicts. A preempted request
    rejoins its prefill queue at the head (``requeue="front"``, vLLM) or the tail."""
    n = len(wl)
    inp = wl.input_tokens.tolist()
    out = wl.output_tokens.tolist()
    gen = [0] * n
    cols = {
        k: [math.nan] * n
        for k in (
            "prefill_start_s",
            "prefill_end_s",
            "transfer_start_s",
            "transfer_end_s",
            "decode_start_s",
            "finish_s",
        )
    }
    pre = [0] * n
    status = ["pending"] * n
    heap: list = []
    seq = [0]

    def push(t, kind, arg):
        heapq.heappush(heap, (t, seq[0], kind, arg))
        seq[0] += 1

    pq = [deque() for _ in range(n_p)]
    pbatch: list[list[int]] = [[] for _ in range(n_p)]
    link_free = {}
    dq = [deque() for _ in range(n_d)]
    running: list[list[int]] = [[] for _ in range(n_d)]
    ctx: dict[int, int] = {}
    dbusy = [False] * n_d
    pm = cost.prefill
    work = lambda n: pm.alpha_flop_per_token2 * n * n + pm.beta_flop_per_token * pm.p_m * n  # noqa: E731

    def blocks(c):
        return (c + bt - 1) // bt

    def start_batch(w, t):
        q = pq[w]
        b = [q.popleft()]
        used = inp[b[0]] + gen[b[0]]
        nblk = blocks(used)
        while (
            q
            and len(b) < max_size
            and used + inp[q[0]] + gen[q[0]] <= max_tokens
            and nblk + blocks(inp[q[0]] + gen[q[0]]) <= cap
        ):
            used += inp[q[0]] + gen[q[0]]
            nblk += blocks(inp[q[0]] + gen[q[0]])
            b.append(q.popleft())
        for r in b:
            if math.isnan(cols["prefill_start_s"][r]):
                cols["prefill_start_s"][r] = t
        pbatch[w] = b
        push(
            t + pm.intercept_s + sum(work(inp[r] + gen[r]) for r in b) / pm.p_peak_flops, "pdone", w
        )

    def route_p(r, t, front=False):
        w = r % n_p
        if front:
            pq[w].appendleft(r)
        else:
            pq[w].append(r)
        if not pbatch[w]:
            start_batch(w, t)

    def admit_and_run(d, t):
        used = sum(blocks(ctx[r]) for r in running[d])
        while dq[d] and len(running[d]) < max_running:
            r = dq[d][0]
            c = inp[r] + gen[r]
            if used + blocks(c) > cap:
                break
            dq[d].popleft()
            ctx[r] = c
            running[d].append(r)
            used += blocks(c)
            if math.isnan(cols["decode_start_s"][r]):
                cols["decode_start_s"][r] = t
        assert used <= cap
        if running[d]:
            dc = cost.decode
            tau = (
                dc.d0_s
                + dc.d1_s_per_request * len(running[d])
                + dc.d2_s_per_token * sum(ctx[r] for r in running[d])
            )
            dbusy[d] = True
            push(t + tau, "iter", d)
        else:
            dbusy[d] = False

    for i in range(n):
        push(float(wl.arrival_s[i]), "arr", i)
    while heap:
        t, _, kind, arg = heapq.heappop(heap)
        if kind == "arr":
            need = inp[arg] + out[arg] - 1 if out[arg] > 1 else inp[arg]
            if need > cap * bt:
                status[arg] = "rejected"
                continue
            route_p(arg, t)
        elif kind == "pdone":
            w = arg
            b, pbatch[w] = pbatch[w], []
            for r in b:
                gen[r] += 1
                if math.isnan(cols["prefill_end_s"][r]):
                    cols["prefill_end_s"][r] = t
                if gen[r] >= out[r]:
                    cols["finish_s"][r] = t
                    status[r] = "finished"
                    continue
                d = (r // 2) % n_d
                free = link_free.get((w, d), 0.0)
                s = max(t, free)
                wire = (inp[r] + gen[r] - 1) * kvb / link.bw_bytes_per_s
                link_free[(w, d)] = s + wire
                e = s + link.latency_s + wire
                if math.isnan(cols["transfer_start_s"][r]):
                    cols["transfer_start_s"][r] = s
                    cols["transfer_end_s"][r] = e
                push(e, "tdone", r)
            if pq[w]:
                start_batch(w, t)
        elif kind == "tdone":
            d = (arg // 2) % n_d
            dq[d].append(arg)
            if not dbusy[d]:
                admit_and_run(d, t)
        elif kind == "iter":
            d = arg
            keep = []
            for r in running[d]:
                gen[r] += 1
                if gen[r] >= out[r]:
                    cols["finish_s"][r] = t
                    status[r] = "finished"
                    del ctx[r]
                else:
                    ctx[r] += 1
                    keep.append(r)
            running[d] = keep
            while running[d] and sum(blocks(ctx[r]) for r in running[d]) > cap:
                r = running[d].pop()
                del ctx[r]
                pre[r] += 1
                route_p(r, t, front=requeue == "front")
            admit_and_run(d, t)
    result = {k: np.array(v) for k, v in cols.items()}
    result["preemptions"] = np.array(pre)
    result["status"] = np.array(status)
    return result


def _scenario(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    bt = int(rng.choice([1, 4, 16]))
    cap = int(rng.integers(8, 40)) * (16 // bt if bt < 16 else 1)
    arrivals = np.cumsum(rng.exponential(rng.uniform(0.005, 0.05), n))
    inputs = rng.integers(1, 200, n)
    outputs = rng.integers(1, 120, n)
    wl = Workload(arrivals, inputs, outputs)
    cost = CostModel(
        PrefillModel(rng.uniform(0, 1e3), rng.uniform(1e9, 1e10), 1e13, 1.0, rng.uniform(0, 2e-3)),
        DecodeModel(rng.uniform(1e-3, 1e-2), rng.uniform(0, 1e-4), rng.uniform(0, 1e-5)),
    )
    link = LinkSpec("l", rng.uniform(1e8, 1e10), rng.uniform(0, 1e-3))
    params = dict(
        n_p=int(rng.integers(1, 3)),
        n_d=int(rng.integers(1, 3)),
        cap=cap,
        bt=bt,
        max_tokens=int(rng.integers(100, 600)),
        max_size=int(rng.integers(1, 5)),
        max_running=int(rng.integers(1, 8)),
        kvb=float(rng.uniform(1e4, 1e6)),
        link=link,
    )
    return wl, cost, params


@pytest.mark.parametrize("requeue", ["front", "back"])
@pytest.mark.parametrize("seed", range(40))
def test_fast_engine_matches_per_iteration_reference(seed: int, requeue: str) -> None:
    wl, cost, p = _scenario(seed)
    cluster = ClusterSpec.build(
        cost,
        p["n_p"],
        p["n_d"],
        kv_capacity_blocks=p["cap"],
        block_tokens=p["bt"],
        max_batch_tokens=p["max_tokens"],
        max_batch_size=p["max_size"],
        max_running=p["max_running"],
        kv_bytes_per_token=p["kvb"],
        link=p["link"],
        preempted_requeue=requeue,
    )
    fast = simulate(wl, cluster, Modulo(), slo=Slo(1.0, 0.1), record_timeseries=False).requests
    ref = reference(
        wl,
        cost,
        p["n_p"],
        p["n_d"],
        p["cap"],
        p["bt"],
        p["max_tokens"],
        p["max_size"],
        p["max_running"],
        p["kvb"],
        p["link"],
        requeue,
    )
    assert list(fast["status"]) == list(ref["status"])
    np.testing.assert_array_equal(fast["preemptions"].to_numpy(), ref["preemptions"])
    for col in (
        "prefill_start_s",
        "prefill_end_s",
        "transfer_start_s",
        "transfer_end_s",
        "decode_start_s",
        "finish_s",
    ):
        np.testing.assert_allclose(
            fast[col].to_numpy(), ref[col], rtol=0, atol=1e-9, equal_nan=True, err_msg=col
        )


def test_reference_scenarios_exercise_preemption_and_queueing() -> None:
    """The random scenarios above are not trivial: some preempt, some wait for KV."""
    preempted = waited = 0
    for seed in range(40):
        wl, cost, p = _scenario(seed)
        ref = reference(
            wl,
            cost,
            p["n_p"],
            p["n_d"],
            p["cap"],
            p["bt"],
            p["max_tokens"],
            p["max_size"],
            p["max_running"],
            p["kvb"],
            p["link"],
        )
        preempted += int(ref["preemptions"].sum() > 0)
        waited += int(np.nansum(ref["decode_start_s"] - ref["transfer_end_s"] > 1e-6) > 0)
    assert preempted >= 5
    assert waited >= 10
