"""EcoServe: the third second-reading's findings (issue 36): a cursor move keeps the activation
of an instance still in prefill (B1, ecoserve.txt line 299), a forced phase end lets the held
prompts decode and keeps its bookkeeping at their decode start (B2), C2 against the prefill
still to run as a named flag (B3), and the L6 race guard; each on a tiny scenario checked by
hand.

End-to-end runs use the ``FLAT`` cost model (prefill 0.2 ms per prompt token, so a 1000-token
prompt takes 0.2 s; decode iterations 20 ms) and the default 0.05 s control tick; the routing
steps are driven with a stub view that carries only what they read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pdopt.policies.ecoserve  # noqa: F401  (registers "ecoserve")
from pdopt.cluster import ClusterSpec, Slo
from pdopt.policies import _ecoserve_activation as activation
from pdopt.policies import make_policy
from pdopt.policies._ecoserve_macros import DECODE, PREFILL
from pdopt.policies.ecoserve import EcoServe
from pdopt.sim import ClusterView, RequestInfo, latency_by_timing, simulate
from pdopt.workload import Workload
from tests.policies.test_policies_ecoserve_review3 import FLAT, _started, _view

DECODE_START = Slo(0.5, 0.1, timing="decode_start")


def _req(rid: int, blocks: int = 10) -> RequestInfo:
    return RequestInfo(rid, 0.0, 100, 50, 100, blocks, blocks + 5, 0)


def _ttft(res: Any) -> list[float]:
    ttft = latency_by_timing(res.requests, res.workers)["decode_start"][0]
    return [round(float(t), 6) for t in ttft]


# -- B1: a cursor move keeps the activation of an instance still in prefill ---------------------
@pytest.mark.parametrize(
    ("state", "kept"),
    [
        ("prefill phase", True),
        ("prompt queued", True),
        ("prompt in service", True),
        ("idle", False),
    ],
)
def test_a_cursor_move_keeps_the_activation_of_an_instance_in_prefill(
    state: str, kept: bool
) -> None:
    """B1 (line 299: t_switch is "when it last switched and is currently in prefill").
    Macro instance [m0, m1, m2], cursor on m0, where CheckConstraints fails; m1 had its
    activation switched at 0.2 s with one 0.3 s prompt. Alg. 1 moves the cursor to m1 at 1 s:
    while m1 is in its prefill phase, or has a prompt queued or in service, its t_switch and
    activation stay (C1 then counts that prompt); only an idle m1 starts a new one."""
    policy = _started(3, macro_size=3)
    checked: list[dict[int, float]] = []

    def check(w: int, request: RequestInfo, view: Any, fresh: bool = False) -> bool:
        checked.append(dict(policy._activation[w]))
        return w != 0

    policy._check = check  # type: ignore[method-assign]
    policy._t_switch[1], policy._activation[1] = 0.2, {7: 0.3}
    fields: dict[str, Any] = {}
    if state == "prefill phase":
        policy._instances.phase[1] = PREFILL
    elif state == "prompt queued":
        fields["prefill_queue_len"] = np.array([0, 1, 0])
    elif state == "prompt in service":
        fields["queued_prefill_flop"] = np.array([0.0, 1e12, 0.0])
    macro = policy._instances.macros[0]
    assert policy._alg1(macro, _req(1), _view(3, 1.0, **fields), {0, 1, 2}) == 1
    assert macro.cursor == 1 and macro.misses == 0
    if kept:
        assert (policy._t_switch[1], checked[-1]) == (0.2, {7: 0.3})
    else:
        assert (policy._t_switch[1], checked[-1]) == (1.0, {})


def test_scan_checks_an_instance_in_prefill_with_its_activation() -> None:
    """B1, ``scan=True``: the member the scan would move to is checked as a fresh activation
    only when it is not in prefill; m1, in its prefill phase, is checked with its activation
    (fresh=False) and keeps it when it takes the request."""
    policy = _started(3, macro_size=3, scan=True)
    fresh_flags: dict[int, bool] = {}

    def check(w: int, request: RequestInfo, view: Any, fresh: bool = False) -> bool:
        fresh_flags[w] = fresh
        return w != 0

    policy._check = check  # type: ignore[method-assign]
    policy._t_switch[1], policy._activation[1] = 0.2, {7: 0.3}
    policy._instances.phase[1] = PREFILL
    macro = policy._instances.macros[0]
    assert policy._inter_schedule(macro, _req(1), _view(3, 1.0), {0, 1, 2}) == 1
    assert fresh_flags == {0: False, 1: False}
    assert (macro.cursor, policy._t_switch[1], policy._activation[1]) == (1, 0.2, {7: 0.3})


def test_the_cursor_wrapping_onto_an_instance_in_prefill_does_not_reset_it() -> None:
    """B1, the review's probe: three instances, 1000-token prompts (0.2 s), TTFT SLO 0.5 s
    counted until decoding begins (§4.4). R0-R5 (0-0.05 s) go two per instance (a third
    would make C1 0.6 s > 0.5 s); R6 (0.06 s) wraps the cursor to m0, which is prefilling R0
    and holds it: m0 keeps its activation {R0, R1} (C1 0.6 s fails: a miss, and R6 goes there
    anyway, Alg. 1 line 8), prefill 0.4-0.6 s. R7 (0.30 s): m0's activation is full, m1 (in
    prefill) keeps {R2, R3}: a miss, R7 to m1; R8 likewise to m2. Before, the reset let m0
    take R7 too (R7 0.6-0.8 s on m0), and R0/R1 began decoding only at 0.8 s (TTFT 0.8/0.79).
    Now each instance's oldest prompt nears its deadline (R0: 0.5 s) at the 0.45 s tick
    (0.5 s for m1 and m2), where a forced end lets the held prompts decode after the
    prefill batch in service: m0 at 0.6 s, m1 0.62, m2 0.64 (TTFT 0.6/0.59 on each)."""
    arrival = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.30, 0.31]
    n = len(arrival)
    work = Workload(arrival, [1000] * n, [3] * n)
    cluster = ClusterSpec.build(FLAT, 0, 0, 3, kv_capacity_blocks=3000)
    res = simulate(
        work,
        cluster,
        make_policy("ecoserve", macro_size=3, mitosis=False),
        slo=DECODE_START,
        engine="python",
    )
    assert list(res.requests["prefill_worker"]) == [
        "m0",
        "m0",
        "m1",
        "m1",
        "m2",
        "m2",
        "m0",
        "m1",
        "m2",
    ]
    assert _ttft(res) == pytest.approx([0.6, 0.59, 0.6, 0.59, 0.6, 0.59, 0.54, 0.32, 0.33])


# -- B2: a forced phase end lets the held prompts decode ------------------------------------------
def test_a_forced_end_with_prompts_queued_switches_to_decode() -> None:
    """B2. One instance, 1000-token prompts (0.2 s), TTFT SLO 0.5 s. R0 (0 s) prefills
    0-0.2 s, R1 (0.01 s) 0.2-0.4 s, R2 (0.3 s) 0.4-0.6 s; R3 (0.41 s) queues behind R2. At the
    0.45 s tick another tick would take R0 past its deadline (0.5 s): a forced end while R2 is
    in service and R3 queued. The instance switches to ``"decode"`` (§4.2.2.1), so R0 and R1
    are admitted when R2's batch ends (0.6 s; the engine does not interrupt it) instead of
    after R3's prefill too (0.8 s under prefill-first ``"both"``, before). The release
    stamps their first token at 0.6 s = 0.45 + (0.35 s outstanding − 0.2 s of R3 queued), not
    0.45 s; both TTFTs (0.6, 0.59 s) are misses for mitosis (before: none); R2 and R3 are
    carried into the new activation (t_switch 0.45 s), R2/R3 still held (before: C1 forgot
    them)."""
    seen: list[tuple[Any, ...]] = []
    release = activation.release

    def spy(p: EcoServe, w: int, view: ClusterView) -> None:
        release(p, w, view)
        first = {r: round(t, 6) for r, (t, _) in p._first_token.items()}
        state = (dict(p._activation[w]), sorted(p._held[w]), p._instances.phase[w])
        seen.append((view.now_s, first, p._instances.macros[0].misses, p._t_switch[w], *state))

    activation.release = spy  # type: ignore[assignment]
    try:
        work = Workload([0.0, 0.01, 0.3, 0.41], [1000] * 4, [3] * 4)
        cluster = ClusterSpec.build(FLAT, 0, 0, 1, kv_capacity_blocks=3000)
        policy = make_policy("ecoserve", macro_size=1, mitosis=False)
        res = simulate(work, cluster, policy, slo=DECODE_START, engine="python")
    finally:
        activation.release = release  # type: ignore[assignment]
    now, first, misses, t_switch, batch, held, phase = seen[0]
    assert now == pytest.approx(0.45)
    assert first == {0: pytest.approx(0.6), 1: pytest.approx(0.6)}
    assert (misses, t_switch, phase) == (2, now, DECODE)
    assert (batch, held) == ({2: pytest.approx(0.2), 3: pytest.approx(0.2)}, [2, 3])
    assert res.requests["decode_start_s"].tolist()[:3] == pytest.approx([0.6] * 3)
    assert res.requests["prefill_start_s"].tolist()[3] > 0.6  # R3 waits for the decode stretch
    assert _ttft(res)[:2] == pytest.approx([0.6, 0.59])


# -- B3: C2 against the prefill still to run (named flag) -----------------------------------------
@pytest.mark.parametrize(("flag", "r2_on"), [(False, "m1"), (True, "m0")])
def test_c2_remaining_compares_with_the_prefill_still_to_run(flag: bool, r2_on: str) -> None:
    """B3 (ecoserve.txt line 307). TPOT SLO 25 ms, decode iterations 20 ms: R0 (100 tokens,
    prefilled 0-0.02 s) has decoded 49 tokens by 1.0 s, saved 50·0.025 − 0.98 = 0.27 s, so
    R1 (1000 tokens, 0.2 s) joins m0 (t_total 0.2 s) and prefills 1.0-1.2 s, R0 paused. At
    1.1 s R0's saved is 1.25 − 1.08 = 0.17 s; R2 (250 tokens, 0.05 s): the paper's C2 holds
    it against t_total = 0.25 s (R1 counted whole, its elapsed 0.1 s already in R0's lower
    saved TPOT) and refuses: R2 goes to m1. ``c2_remaining=True`` holds it against the
    prefill still to run, 0.1 + 0.05 = 0.15 s <= 0.17 s: R2 joins m0 (prefill 1.2-1.25 s)."""
    work = Workload([0.0, 1.0, 1.1], [100, 1000, 250], [100, 3, 3])
    cluster = ClusterSpec.build(FLAT, 0, 0, 2, kv_capacity_blocks=3000)
    policy = make_policy("ecoserve", macro_size=2, mitosis=False, c2_remaining=flag)
    res = simulate(work, cluster, policy, slo=Slo(5.0, 0.025), engine="python")
    assert list(res.requests["prefill_worker"]) == ["m0", "m0", r2_on]
    assert res.requests["prefill_start_s"].tolist()[2] == pytest.approx(1.2 if flag else 1.1)


# -- L6 race: a tick landing as a short prefill batch ends -----------------------------------------
@pytest.mark.parametrize(("in_service", "kept"), [(1, True), (0, False)])
def test_a_tick_at_a_batch_end_keeps_the_prompts_in_service(in_service: int, kept: bool) -> None:
    """L6 race. R1 was routed to m0; at the tick its batch's outstanding work reads 0 (the
    tick is popped at ``batch_end_s`` before the batch's end) while ``view.running`` still
    counts it (1 running, no decode): its routing records stay for route_decode. With
    nothing running (R1 finished at prefill, one output token) they go, as before."""
    policy = _started(2, macro_size=2, phases="batch")
    policy._dispatch = lambda request, view: 0  # type: ignore[method-assign]
    policy.route_prefill(_req(1), _view(2, 0.1))
    policy._started = True
    running = {"request_id": np.zeros(0, dtype=np.int64)}
    tick = _view(
        2,
        0.2,
        running=np.array([in_service, 0]),
        running_contexts=lambda w: running,
        decode_queue_len=np.zeros(2, dtype=np.int64),
    )
    policy.on_tick(tick)
    assert (1 in policy._src, 1 in policy._queued[0]) == (kept, kept)
