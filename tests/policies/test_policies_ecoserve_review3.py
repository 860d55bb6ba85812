"""EcoServe: what the two second readings left (issue 36): C1's pending set (finding 2), Alg. 1's
edge cases (finding 7), C3's queue order after a front requeue (L4), the cursor on scale-down
(L5) and per-request records pruned (L6); each on a tiny scenario checked by hand.

End-to-end runs use the ``FLAT`` cost model (prefill 0.2 ms per prompt token, decode iterations
20 ms); the routing steps are driven with a stub view that carries only what they read.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import pdopt.policies.ecoserve  # noqa: F401  (registers "ecoserve")
from pdopt.cluster import ClusterSpec, Role, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.policies._ecoserve_macros import MacroInstances
from pdopt.policies.ecoserve import SWEEP_S, EcoServe
from pdopt.sim import ClusterView, RequestInfo, RunContext, latency_by_timing, simulate
from pdopt.workload import Workload

FLAT = CostModel(PrefillModel(0.0, 2e9, 1e13), DecodeModel(0.02, 0.0, 0.0))


def _view(n: int, now_s: float, **fields: Any) -> Any:
    """A routing-time view: every worker mixed and idle unless ``fields`` say otherwise."""
    base: dict[str, Any] = {
        "now_s": now_s,
        "n_workers": n,
        "prefill_workers": np.arange(n, dtype=np.int64),
        "queued_prefill_flop": np.zeros(n),
        "prefill_queue_len": np.zeros(n, dtype=np.int64),
        "kv_free_blocks": np.full(n, 1000, dtype=np.int64),
        "roles": (Role.MIXED,) * n,
        "waiting_requests": lambda w: np.zeros(0, dtype=np.int64),
        "prefill_waiting": lambda w: np.zeros(0, dtype=np.int64),
    }
    return SimpleNamespace(**{**base, **fields})


def _started(n: int, **flags: Any) -> EcoServe:
    policy = make_policy("ecoserve", mitosis=False, **flags)
    assert isinstance(policy, EcoServe)
    policy.start(RunContext(ClusterSpec.build(FLAT, 0, 0, n), Slo(0.5, 0.1), 0.05))
    return policy


def _req(rid: int, blocks: int = 10, preemptions: int = 0) -> RequestInfo:
    return RequestInfo(rid, 0.0, 100, 50, 100, blocks, blocks + 5, preemptions)


# -- finding 2: C1 counts the activation's prompts already prefilled -----------------------------
class _PendingOnly(EcoServe):
    """The other reading of the paper's line 299: C1/C2 count only the activation's prompts
    still to prefill (not pdopt's, kept here to show what it would do)."""

    def _check_activation(
        self, w: int, request: RequestInfo, view: ClusterView, *, fresh: bool
    ) -> bool:
        full = self._activation[w]
        self._activation[w] = {r: s for r, s in full.items() if r in self._src}
        try:
            return super()._check_activation(w, request, view, fresh=fresh)
        finally:
            self._activation[w] = full


def test_c1_counts_prompts_already_prefilled() -> None:
    """Finding 2 (ecoserve.txt line 299, Alg. 2 line 4). TTFT SLO 0.5 s counted as §4.4 does
    (until decoding begins). R1 (1000 tokens, 0.2 s) at 0 s prefills 0-0.2 s on m0, which
    enters its prefill phase at the 0.05 s tick and holds R1; R2 (900, 0.18 s) at 0.1 s joins
    (C1 0.38 s) and prefills 0.2-0.38 s. R3 (1000, 0.2 s) at 0.3 s: the activation's t_total
    is R1 + R2 + R3 = 0.58 s > 0.5 s although R1 is prefilled: R3 goes to m1. m0's phase ends
    at the 0.4 s tick; R1 begins decoding then, TTFT 0.4 s. Counting only the prompts still to
    prefill (R2 + R3 = 0.38 s) keeps R3 on m0 (0.38-0.58 s) and R1 waits for it: TTFT 0.58 s,
    a miss the written rule avoids."""
    work = Workload([0.0, 0.1, 0.3], [1000, 900, 1000], [3, 3, 3])
    cluster = ClusterSpec.build(FLAT, 0, 0, 2, kv_capacity_blocks=3000)
    slo = Slo(0.5, 0.1, timing="decode_start")
    res = simulate(
        work,
        cluster,
        make_policy("ecoserve", macro_size=2, mitosis=False),
        slo=slo,
        engine="python",
    )
    assert list(res.requests["prefill_worker"]) == ["m0", "m0", "m1"]
    ttft = latency_by_timing(res.requests, res.workers)["decode_start"][0]
    assert ttft == pytest.approx([0.4, 0.3, 0.2])
    assert res.metrics()["slo_attainment"] == 1.0
    other = simulate(
        work, cluster, _PendingOnly(macro_size=2, mitosis=False), slo=slo, engine="python"
    )
    assert list(other.requests["prefill_worker"]) == ["m0"] * 3
    assert latency_by_timing(other.requests, other.workers)["decode_start"][0][0] > 0.5


# -- finding 7: Alg. 1's edge cases ---------------------------------------------------------------
def _alg1_policy(ok: bool) -> EcoServe:
    policy = _started(3, macro_size=3)
    policy._check = lambda w, request, view, fresh=False: ok  # type: ignore[method-assign]
    return policy


def test_alg1_next_is_the_member_after_a_migrating_prev() -> None:
    """Finding 7. Macro instance [m0, m1, m2], cursor on m1, which is migrating (not in the
    instance list). Alg. 1's next is the member after m1: m2 (before: m0, the list's first),
    whose activation starts now."""
    policy = _alg1_policy(True)
    macro = policy._instances.macros[0]
    macro.cursor = 1
    w = policy._alg1(macro, _req(1), _view(3, 2.0), {0, 2})
    assert (w, macro.cursor, policy._t_switch[2]) == (2, 2, 2.0)


def test_alg1_with_one_instance_left_goes_on_with_its_activation() -> None:
    """Finding 7. Only m0 takes requests (m1, m2 migrate) and CheckConstraints fails there:
    (prev + 1) mod n is m0 again, so the request goes to m0 as a miss, and m0's activation
    (t_switch 0.5 s, 0.3 s of prompts) goes on: the cursor did not move (before: a new
    activation started, C1 forgot its prompts)."""
    policy = _alg1_policy(False)
    macro = policy._instances.macros[0]
    policy._t_switch[0], policy._activation[0] = 0.5, {7: 0.3}
    w = policy._alg1(macro, _req(1), _view(3, 2.0), {0})
    assert w == 0 and macro.misses == 1
    assert (policy._t_switch[0], policy._activation[0]) == (0.5, {7: 0.3})


def test_alg1_routes_to_next_when_every_instance_fails() -> None:
    """Finding 7. Every instance fails CheckConstraints: Alg. 1 still routes to next (m1, as
    written: line 8 is unconditional) and counts a miss for mitosis."""
    policy = _alg1_policy(False)
    macro = policy._instances.macros[0]
    assert policy._alg1(macro, _req(1), _view(3, 2.0), {0, 1, 2}) == 1
    assert macro.cursor == 1 and macro.misses == 1


def test_overall_scheduler_skips_a_macro_instance_with_no_member_taking_requests() -> None:
    """Finding 7. Macro instances [m0, m2] and [m1, m3] (round robin), both idle: a tie on
    mean outstanding prefill, so the oldest (the first) gets the request, on m0. With m0 and
    m2 migrating, the first has an empty instance list and is skipped: Alg. 1 runs in the
    second, m1, no miss (before: a miss and a fallback outside Alg. 1)."""
    policy = _started(4, macro_size=2)
    policy._check = lambda w, request, view, fresh=False: True  # type: ignore[method-assign]
    assert [m.members for m in policy._instances.macros] == [[0, 2], [1, 3]]
    assert policy._dispatch(_req(1), _view(4, 2.0)) == 0
    policy._instances._ready_at[0] = policy._instances._ready_at[2] = 9.0
    assert policy._dispatch(_req(2), _view(4, 2.0)) == 1
    assert [m.misses for m in policy._instances.macros] == [0, 0]


def test_with_every_member_migrating_a_request_stays_in_the_macro_instances() -> None:
    """Finding 7. Every member migrates: a miss, and the request goes to the member with the
    least predicted TTFT (ties to the lowest index), m0 here, not to a standby instance (m2,
    which takes requests but is in no macro instance)."""
    policy = _started(3, macro_size=2, initial_instances=2)
    assert policy._instances.standby == [2]
    policy._instances._ready_at[0] = policy._instances._ready_at[1] = 9.0
    assert policy._dispatch(_req(1), _view(3, 2.0)) == 0
    assert policy._instances.macros[0].misses == 1


# -- L4: C3 reads the queue in the engine's order after a front requeue -------------------------
def test_c3_reads_a_front_requeued_request_at_the_head_of_the_queue() -> None:
    """L4. m0's queue: A (10 blocks) in service, B (20) and C (30) waiting. R, preempted by
    recompute (50 blocks), rejoins at the front (``preempted_requeue="front"``): the queue is
    R, B, C. The next batch takes R and B; C waits. C3 for a 60-block prompt with 100 free:
    100 − 30 >= 60, it fits. C3 reads the engine's queue (``view.prefill_waiting``), so the
    order the policy recorded its prompts in cannot shift the count; with R still waiting
    100 − 80 < 60."""
    policy = _started(2, macro_size=2)
    policy._dispatch = lambda request, view: 0  # type: ignore[method-assign]
    for k, (rid, blocks) in enumerate(((1, 10), (2, 20), (3, 30))):
        policy.route_prefill(_req(rid, blocks), _view(2, 0.1, prefill_queue_len=np.array([k, 0])))
    queue = np.array([2, 0])  # A in service, B and C waiting
    policy.route_prefill(_req(9, 50, preemptions=1), _view(2, 0.2, prefill_queue_len=queue))
    assert list(policy._queued[0]) == [1, 9, 2, 3]
    free = np.array([100, 0])
    after = _view(
        2, 0.3, kv_free_blocks=free, prefill_waiting=lambda w: np.array([3] if w == 0 else [])
    )
    assert policy._kv_fits(0, _req(10, 60), after)
    still = _view(
        2, 0.3, kv_free_blocks=free, prefill_waiting=lambda w: np.array([9, 3] if w == 0 else [])
    )
    assert not policy._kv_fits(0, _req(10, 60), still)
    back = _started(2, macro_size=2)
    back._requeue_front = False  # a cluster with preempted_requeue="back"
    back._dispatch = policy._dispatch  # type: ignore[method-assign]
    back.route_prefill(_req(9, 50, preemptions=1), _view(2, 0.2))
    assert list(back._queued[0]) == [9]


def test_c3_stops_counting_a_prompt_withdrawn_by_a_client_timeout() -> None:
    """Third review, low item: B (20 blocks) and C (30) wait behind A in service; B's client
    gives up and the engine withdraws it from the middle of the queue. C3 for a 60-block prompt
    with 100 free counts only C (100 − 30 >= 60); counting B's blocks, as the policy's own record
    of its routed prompts would until the instance went idle, refused it (100 − 50 < 60)."""
    policy = _started(2, macro_size=2)
    policy._dispatch = lambda request, view: 0  # type: ignore[method-assign]
    for k, (rid, blocks) in enumerate(((1, 10), (2, 20), (3, 30))):
        policy.route_prefill(_req(rid, blocks), _view(2, 0.1, prefill_queue_len=np.array([k, 0])))
    assert list(policy._queued[0]) == [1, 2, 3]  # the policy has not seen the withdrawal
    free = np.array([100, 0])
    withdrawn = _view(
        2, 0.3, kv_free_blocks=free, prefill_waiting=lambda w: np.array([3] if w == 0 else [])
    )
    assert policy._kv_fits(0, _req(10, 60), withdrawn)


# -- L5: the cursor names an instance -------------------------------------------------------------
def _idle_view(n: int, now_s: float, idle: set[int]) -> Any:
    busy = np.array([int(w not in idle) for w in range(n)], dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    return SimpleNamespace(
        now_s=now_s, n_workers=n, running=busy, prefill_queue_len=zeros, decode_queue_len=zeros
    )


def _macro_of(members: list[int], cursor: int) -> MacroInstances:
    mi = MacroInstances(
        len(members), n_lower=1, n_upper=6, scale_idle_s=2.0, migration_s=0.1, tpot_slo_s=0.1,
        tick_s=0.05,
    )  # fmt: skip
    mi._new_macro().members.extend(members)
    mi.macros[0].cursor = cursor
    mi._index()
    return mi


def test_a_scale_down_keeps_the_cursor_on_its_instance() -> None:
    """L5. Macro instance [m0 .. m4], cursor on m3. m1 idled 3 s and goes to standby: the
    cursor stays on m3 (index 2 now; before: index 0, m0, whose activation then restarted).
    If the removed instance is under the cursor (m3), the cursor moves to the member that
    followed it, m4."""
    mi = _macro_of([0, 1, 2, 3, 4], cursor=3)
    mi._scale_down(_idle_view(5, 3.0, {1}))
    macro = mi.macros[0]
    assert macro.members == [0, 2, 3, 4] and macro.members[macro.cursor] == 3
    mi = _macro_of([0, 1, 2, 3, 4], cursor=3)
    mi._scale_down(_idle_view(5, 3.0, {3}))
    macro = mi.macros[0]
    assert macro.members == [0, 1, 2, 4] and macro.members[macro.cursor] == 4


def test_a_split_keeps_the_cursor_on_its_instance() -> None:
    """L5. Macro instance [m0 .. m6] (n_upper 6, n_lower 3) with the cursor on m5 splits off
    [m4, m5, m6]: the new macro instance's cursor is on m5 (it keeps its activation), the
    original's on its first member m0 (the next after the moved tail)."""
    mi = _macro_of([0, 1, 2, 3, 4, 5, 6], cursor=5)
    mi.n_lower = 3
    mi._split(mi.macros[0], SimpleNamespace(now_s=1.0))  # type: ignore[arg-type]
    (a, b) = mi.macros
    assert (a.members, a.members[a.cursor]) == ([0, 1, 2, 3], 0)
    assert (b.members, b.members[b.cursor]) == ([4, 5, 6], 5)


# -- L6: per-request records do not grow with the run --------------------------------------------
def test_per_request_records_are_pruned() -> None:
    """L6. 400 requests over 20 s (one in four with a single output token: it never reaches
    route_decode) on two instances. At the end the policy keeps records only of requests
    finished within the last two sweeps (before: all 300 first tokens and KV blocks, and the
    routing records of the 100 one-token requests)."""
    n = 400
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0.0, 20.0, n)).tolist()
    output = [1 if k % 4 == 0 else 20 for k in range(n)]
    policy = make_policy("ecoserve", macro_size=2, mitosis=False)
    assert isinstance(policy, EcoServe)
    cluster = ClusterSpec.build(FLAT, 0, 0, 2)
    res = simulate(
        Workload(arrival, [200] * n, output), cluster, policy, slo=Slo(1.0, 0.1), engine="python"
    )
    assert (res.requests["status"] == "finished").all()
    recent = int((res.requests["finish_s"] >= policy._last_tick_s - 2 * SWEEP_S - 0.1).sum())
    assert len(policy._first_token) <= recent < n // 4
    assert len(policy._decode_blocks) <= recent
    assert len(policy._src) == len(policy._blocks) == 0
