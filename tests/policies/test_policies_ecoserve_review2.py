"""EcoServe: the second review's findings (issue 36), each on a tiny scenario checked by hand.

Mitosis is driven through :class:`MacroInstances` with a telemetry stub; the phases end to end
on the ``FLAT`` cost model (prefill 0.2 ms per prompt token, decode iterations 20 ms).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

import pdopt.policies.ecoserve  # noqa: F401  (registers "ecoserve")
from pdopt.cluster import ClusterSpec, Role, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.policies._ecoserve_macros import MacroInstances
from pdopt.policies.ecoserve import EcoServe
from pdopt.sim import RequestInfo, RunContext, simulate
from pdopt.workload import Workload

FLAT = CostModel(PrefillModel(0.0, 2e9, 1e13), DecodeModel(0.02, 0.0, 0.0))


class _View:
    """The telemetry mitosis reads: every worker mixed and busy (never idle, so none is
    removed); ``runs``: worker -> {request id: context tokens} of its running decodes."""

    def __init__(self, n: int, now_s: float, runs: dict[int, dict[int, int]] | None = None):
        self.now_s, self.n_workers = now_s, n
        self.running = np.ones(n, dtype=np.int64)
        self.prefill_queue_len = np.zeros(n, dtype=np.int64)
        self.decode_queue_len = np.zeros(n, dtype=np.int64)
        self.queued_prefill_flop = np.zeros(n, dtype=np.float64)
        self.roles = (Role.MIXED,) * n
        self.pools = ("",) * n
        self._runs = runs or {}
        self.migrating_requests = np.zeros(0, dtype=np.int64)

    def waiting_requests(self, w: int) -> Any:
        return np.zeros(0, dtype=np.int64)

    def running_requests(self, w: int) -> dict[str, Any]:
        run = self._runs.get(w, {})
        return {
            "request_id": np.array(list(run), dtype=np.int64),
            "context_tokens": np.array(list(run.values()), dtype=np.int64),
        }

    running_contexts = running_requests  # the view's cheap columns are all this fake has


def _late_finishes(mi: MacroInstances, w: int, n: int, t_s: float) -> None:
    """``n`` requests on worker ``w`` finish at ``t_s``, each late: first token at 0 s with
    context 100, last seen at 0.1 s with context 101 (2 tokens in ``t_s`` >= 0.5 s: over
    2 x 0.1 s TPOT SLO + a 0.05 s tick)."""
    first = {rid: (0.0, 100) for rid in range(n)}
    n_w = len(mi.macro_of)
    mi.observe_finished(_View(n_w, 0.1, {w: {rid: 101 for rid in range(n)}}), first)  # type: ignore[arg-type]
    mi.observe_finished(_View(n_w, t_s), first)  # type: ignore[arg-type]


def _instances(n: int, sizes: tuple[int, ...], refill: str = "paper") -> MacroInstances:
    mi = MacroInstances(
        n, n_lower=3, n_upper=6, scale_idle_s=2.0, migration_s=0.1, tpot_slo_s=0.1,
        tick_s=0.05, refill=refill,
    )  # fmt: skip
    start = 0
    for size in sizes:
        mi._new_macro().members.extend(range(start, start + size))
        start += size
    mi._index()
    mi.standby = list(range(start, n))
    return mi


def _added_per_tick(refill: str) -> list[int]:
    """M0 = [0..5] (full: n_upper = 6) finished 20 late requests by 0.5 s, M1 = [6, 7, 8],
    standby 9..13. Ticks every 0.05 s from 1.0 s, no new finish: instances added per tick."""
    mi = _instances(14, (6, 3), refill)
    _late_finishes(mi, 0, 20, 0.5)
    added = []
    for k in range(5):
        before = len(mi.standby)
        mi.scale(_View(14, 1.0 + 0.05 * k))  # type: ignore[arg-type]
        for macro in mi.macros:
            macro.misses = 0
        added.append(before - len(mi.standby))
    return added


def test_h1_the_tpot_trigger_holds_off_after_a_paper_refill() -> None:
    """H1. M0 fails the TPOT trigger (20 of 20 late >= 10, > 10%); under ``refill="paper"``
    the instance joins M1 (M0 is at n_upper), and M0's window must restart then: one
    instance at 1.0 s, none on the next four ticks (before: one per tick, the same 20
    finishes firing again). ``refill="missing"`` already did so."""
    assert _added_per_tick("paper") == [1, 0, 0, 0, 0]
    assert _added_per_tick("missing") == [1, 0, 0, 0, 0]


def test_m6_finishes_stay_with_their_macro_instance_when_indices_shift() -> None:
    """M6. M_a = [0, 1, 2] (list index 0) finished 20 late requests by 0.5 s, M_b = [3, 4, 5]
    (index 1) none; standby 6. M_a then leaves the list (as a scale-down that empties it, or
    a merge, does), so M_b becomes index 0. At 1.0 s M_b has finished nothing: it must not
    grow (before: finishes were kept by index, and M_b inherited M_a's 20)."""
    mi = _instances(7, (3, 3))
    _late_finishes(mi, 0, 20, 0.5)
    mi.macros.remove(mi.macros[0])
    mi._index()
    mi.scale(_View(7, 1.0))  # type: ignore[arg-type]
    assert [m.members for m in mi.macros] == [[3, 4, 5]] and mi.standby == [6]


def test_m6_a_split_and_a_merge_restart_the_tpot_window() -> None:
    """M6. M0 = [0..5] (n_upper = 6) misses at 1.0 s: standby 6 joins, M0 splits into
    [0, 1, 2, 3] and a new [4, 5, 6]; both changed at 1.0 s (the new one had 0.0). Then
    [0] and [1] (together 2 < n_upper) merge at 2.0 s, the first into the second, which
    changed then."""
    mi = _instances(9, (6,))
    mi.macros[0].misses = 1
    mi.scale(_View(9, 1.0))  # type: ignore[arg-type]
    assert [m.members for m in mi.macros] == [[0, 1, 2, 3], [4, 5, 6]]
    assert [m.changed_s for m in mi.macros] == [1.0, 1.0]
    mi = _instances(2, (1, 1))
    mi._merge(_View(2, 2.0))  # type: ignore[arg-type]
    assert [(m.members, m.changed_s) for m in mi.macros] == [([1, 0], 2.0)]


def _phase_events(**flags: Any) -> list[tuple[float, str]]:
    cluster = ClusterSpec.build(FLAT, 0, 0, 1)
    policy = make_policy("ecoserve", mitosis=False, **flags)
    res = simulate(Workload([0.0], [300], [4]), cluster, policy, slo=Slo(0.5, 0.1), engine="python")
    ev = res.events[res.events["kind"] == "phase"]
    return [(round(float(t), 6), str(d)) for t, d in zip(ev["t_s"], ev["detail"], strict=True)]


def test_m2_a_prefill_phase_ends_once_nothing_is_left_to_prefill() -> None:
    """M2. One instance, no decode; a 300-token prompt at 0 s prefills 0-0.06 s (the
    prefill-first schedule starts it at once). The tick at 0.05 s sees it in prefill: a
    prefill phase. At 0.10 s nothing is left to prefill: the phase ends (before: the
    instance idled until 0.45 s, a tick before the prompt's 0.5 s TTFT deadline, which
    ``hold="deadline"`` keeps as pdopt's reading)."""
    assert _phase_events() == [(0.05, "both->prefill"), (0.1, "prefill->both")]
    assert _phase_events(hold="deadline") == [(0.05, "both->prefill"), (0.45, "prefill->both")]


def test_m1_a_preempted_request_prefilled_again_is_not_held_nor_a_new_ttft_miss() -> None:
    """M1. R7 arrived at 0 s, had its first token at 0.1 s, decoded 20 tokens and was
    preempted (recompute). Its re-prefill is routed to m0 at 2.0 s and ends at 2.05 s: it is
    not held (its 0.5 s TTFT deadline from arrival passed at 0.5 s: the phase would end at the
    next tick and count a miss), and its decoding again is no TTFT miss for mitosis; its first
    token stays at 0.1 s."""
    policy = make_policy("ecoserve", macro_size=2, mitosis=False)
    assert isinstance(policy, EcoServe)
    policy.start(RunContext(ClusterSpec.build(FLAT, 0, 0, 2), Slo(0.5, 0.1), 0.05))
    policy.on_tick(_View(2, 0.0))  # type: ignore[arg-type]
    policy._dispatch = lambda request, view: 0  # type: ignore[method-assign]
    policy._first_token[7] = (0.1, 100)
    r7 = RequestInfo(7, 0.0, 100, 50, 120, 8, 10, preemptions=1)
    policy.route_prefill(r7, _View(2, 2.0))  # type: ignore[arg-type]
    assert 7 not in policy._held[0]
    view = SimpleNamespace(
        now_s=2.05, decode_workers=np.array([0, 1]), min_kv_capacity_blocks=1000,
        kv_capacity_blocks=np.array([1000, 1000]), roles=(Role.MIXED,) * 2,
        kv_free_blocks=np.array([500, 500]),
    )  # fmt: skip
    assert policy.route_decode(r7, view) == 0  # type: ignore[arg-type]
    assert policy._instances.macros[0].misses == 0
    assert policy._first_token[7] == (0.1, 100)
