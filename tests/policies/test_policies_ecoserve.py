"""EcoServe-style policy: each mechanism on a small scenario of mixed (colocated) workers.

Temporal disaggregation and rolling activation are read from the event log (``phase`` events
from :class:`pdopt.sim.SetPhase`); CheckConstraints from where requests go and the TPOT they get;
mitosis scaling from ``pool_move`` events.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import pdopt.policies.ecoserve  # noqa: F401  (registers "ecoserve")
from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ParameterError
from pdopt.policies import make_policy
from pdopt.sim import SimResult, simulate
from pdopt.testing import check_policy
from pdopt.workload import Workload

pytest.importorskip("pdopt.sim._mixed", reason="needs mixed (colocated) workers in pdopt.sim")

COST = CostModel(PrefillModel(0.0, 2e9, 1e13, 1.0, 1e-3), DecodeModel(5e-3, 1e-4, 1e-7))
# constant 20 ms decode iterations, prefill 0.2 ms per token: easy numbers for the TPOT scenario
FLAT = CostModel(PrefillModel(0.0, 2e9, 1e13), DecodeModel(0.02, 0.0, 0.0))


EARLIER = {"check": "request", "phases": "ticks", "saved_tpot_margin": True}
"""pdopt's earlier rules (per-request CheckConstraints, tick-bounded phases, saved TPOT less the
coming iteration): the tests written for them run with these flags."""


def _prefill_phases(res: SimResult) -> dict[str, list[tuple[float, float]]]:
    """Per worker, the [start, end) intervals it spent in a prefill phase."""
    ev = res.events[res.events["kind"] == "phase"]
    out: dict[str, list[tuple[float, float]]] = {}
    open_at: dict[str, float] = {}
    for t, worker, detail in zip(ev["t_s"], ev["worker"], ev["detail"], strict=True):
        if detail.endswith("->prefill"):
            open_at[worker] = t
        elif detail.startswith("prefill->") and worker in open_at:
            out.setdefault(worker, []).append((open_at.pop(worker), t))
    for worker, t in open_at.items():
        out.setdefault(worker, []).append((t, res.makespan_s))
    return out


def _overlap(phases: dict[str, list[tuple[float, float]]]) -> float:
    """Total time two different workers were in a prefill phase together."""
    spans = [(a, b, w) for w, iv in phases.items() for a, b in iv]
    total = 0.0
    for i, (a, b, w) in enumerate(spans):
        for c, d, v in spans[i + 1 :]:
            if v != w:
                total += max(0.0, min(b, d) - max(a, c))
    return total


def _staggered(rolling: bool, prefill_slots: int = 0, span_s: float = 4.0) -> SimResult:
    rng = np.random.default_rng(0)
    n = 40
    wl = Workload(
        np.sort(rng.uniform(0, span_s, n)), rng.integers(200, 800, n), rng.integers(50, 200, n)
    )
    cluster = ClusterSpec.build(COST, 0, 0, 3, kv_capacity_blocks=3000)
    policy = make_policy(
        "ecoserve",
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        macro_size=3,
        rolling=rolling,
        prefill_slots=prefill_slots,
        **EARLIER,
    )
    return simulate(wl, cluster, policy, slo=Slo(1.0, 0.05), engine="python")


def test_ecoserve_ablations_pass_contract() -> None:
    check_policy(lambda: make_policy("ecoserve", rolling=False, constraints=False, mitosis=False))


def test_bad_mitosis_bounds_raise() -> None:
    with pytest.raises(ParameterError, match="n_upper"):
        make_policy("ecoserve", n_lower=3, n_upper=4)


def test_instances_alternate_prefill_and_decode_phases() -> None:
    res = _staggered(rolling=True)
    ev = res.events[res.events["kind"] == "phase"]
    # every instance starts decoding, then enters prefill phases and leaves them again
    assert (ev["detail"] == "decode->prefill").sum() >= 3
    assert (ev["detail"] == "prefill->decode").sum() >= 3
    assert res.metrics()["slo_attainment"] == 1.0


def test_rolling_activation_staggers_prefill_phases() -> None:
    """Measured (40 requests over 8 s): prefill phases of different instances overlap 0.75 s in
    all with rolling activation, 0 s with one prefill slot per macro instance, 1.2 s when
    requests spread (``rolling=False``: the least predicted TTFT among the instances meeting
    CheckConstraints). Over 4 s the two are alike (1.95 s against 2.0 s): an instance that just
    prefilled has decodes with no saved TPOT, so the next request moves on either way."""
    sticky = _prefill_phases(_staggered(rolling=True, span_s=8.0))
    capped = _prefill_phases(_staggered(rolling=True, prefill_slots=1, span_s=8.0))
    spread = _prefill_phases(_staggered(rolling=False, span_s=8.0))
    assert len(capped) >= 2 and len(sticky) >= 2  # several instances took prefill turns ...
    assert _overlap(capped) == 0.0  # ... never two at once with one slot
    assert _overlap(sticky) < 0.8 * _overlap(spread)
    assert len(spread) == 3


def _tpot_scenario(constraints: bool) -> pd.DataFrame:
    """A: 100-token prompt, 30 tokens, decoding on m0 from t≈0.02 at 20 ms per token. B: a
    1500-token prompt (0.3 s of prefill) at t=0.3. A's saved TPOT then is about
    14·25 ms − 0.28 s = 0.07 s < 0.3 s, so CheckConstraints refuses m0 and B goes to m1; sticky
    routing without the check puts B on m0, whose prefill phase stalls A for 0.3 s: A's TPOT
    becomes (29·0.02 + 0.3) / 29 ≈ 30 ms > 25 ms."""
    wl = Workload([0.0, 0.3], [100, 1500], [30, 2])
    cluster = ClusterSpec.build(FLAT, 0, 0, 2, kv_capacity_blocks=1000)
    policy = make_policy(
        "ecoserve",
        ttft_slo_s=5.0,
        tpot_slo_s=0.025,
        macro_size=2,
        constraints=constraints,
        **EARLIER,
    )
    return simulate(wl, cluster, policy, slo=Slo(5.0, 0.025), engine="python").requests


def test_check_constraints_refuses_a_prefill_that_would_break_tpot() -> None:
    kept = _tpot_scenario(constraints=True)
    assert list(kept["prefill_worker"]) == ["m0", "m1"]
    assert kept["tpot_s"][0] == pytest.approx(0.02, rel=1e-9)
    sticky = _tpot_scenario(constraints=False)
    assert list(sticky["prefill_worker"]) == ["m0", "m0"]
    assert sticky["tpot_s"][0] > 0.025


def test_c2_mean_saved_tpot_admits_what_the_minimum_refuses() -> None:
    """Alg. 2 line 16 (mean) against ``saved_tpot="min"``. A (400 tokens from t=0) has saved
    ~1 s of TPOT by t=4; C (30 tokens from t=3.95) has saved ~0.03 s when B's 1500-token prompt
    (0.3 s of prefill) arrives at t=4 on the same instance. Their mean saved TPOT (~0.5 s)
    covers B's phase, so the paper's C2 lets B prefill at once (t=4.01) and C's TPOT becomes
    32 ms; the minimum does not, so that phase waits until C finishes (t=4.53, next tick 4.55)
    and every decode keeps TPOT <= 25 ms. Without any check B prefills at once as well."""
    wl = Workload([0.0, 3.9, 4.0], [100, 100, 1500], [400, 30, 2])
    cluster = ClusterSpec.build(FLAT, 0, 0, 2, kv_capacity_blocks=1000)

    def run(**flags: object) -> pd.DataFrame:
        policy = make_policy(
            "ecoserve", ttft_slo_s=5.0, tpot_slo_s=0.025, macro_size=2, **EARLIER, **flags
        )
        return simulate(wl, cluster, policy, slo=Slo(5.0, 0.025), engine="python").requests

    least = run(saved_tpot="min")
    assert (least["tpot_s"] <= 0.025).all()
    assert least["prefill_start_s"][2] >= least["finish_s"][1]
    mean = run()  # the paper's default
    assert list(mean["prefill_worker"]) == ["m0", "m0", "m0"]
    assert mean["prefill_start_s"][2] < 4.1
    assert mean["tpot_s"][1] == pytest.approx(0.032069, rel=1e-3)
    unchecked = run(constraints=False)
    assert unchecked["prefill_start_s"][2] < 4.1
    assert unchecked["tpot_s"][1] > 0.025


def test_bad_saved_tpot_raises() -> None:
    with pytest.raises(ParameterError, match="saved_tpot"):
        make_policy("ecoserve", saved_tpot="median")


def test_inter_schedule_is_sticky_then_next() -> None:
    """Loose SLOs: every request stays on the first instance; tight TTFT: the instance changes
    only when the current one cannot take the next request (runs, not alternation)."""
    wl = Workload(np.arange(12) * 0.05, np.full(12, 1000), np.full(12, 4))
    cluster = ClusterSpec.build(COST, 0, 0, 3, kv_capacity_blocks=3000)
    loose = make_policy("ecoserve", ttft_slo_s=100.0, tpot_slo_s=100.0, macro_size=3)
    res = simulate(wl, cluster, loose, slo=Slo(100.0, 100.0), engine="python")
    assert set(res.requests["prefill_worker"]) == {"m0"}
    tight = make_policy("ecoserve", ttft_slo_s=0.5, tpot_slo_s=1.0, macro_size=3)
    order = list(
        simulate(wl, cluster, tight, slo=Slo(0.5, 1.0), engine="python").requests["prefill_worker"]
    )
    # 1000 tokens = 0.201 s of prefill: m0 takes two (0.05 s to its phase + 0.40 s <= 0.5 s),
    # a third would wait 0.6 s, so it goes to the next instance, which then keeps the fourth
    assert order[:4] == ["m0", "m0", "m1", "m1"]
    spread = make_policy("ecoserve", ttft_slo_s=0.5, tpot_slo_s=1.0, macro_size=3, rolling=False)
    res = simulate(wl, cluster, spread, slo=Slo(0.5, 1.0), engine="python")
    assert list(res.requests["prefill_worker"][:3]) == ["m0", "m1", "m2"]


def test_alg1_moves_to_the_next_instance_unconditionally() -> None:
    """Alg. 1 lines 6-8 against ``scan=True``. TTFT SLO 0.7 s, prefill 0.2 ms per token: A
    (3000 tokens, 0.6 s) fills m0; B (1000) fails C1 on m0 and goes to m1 (free again at
    0.21 s); C (3000) fails on m1 and goes to m2. D (2000 tokens, 0.4 s) at 0.3 s fails on m2
    (0.3 s left there) and on m0 (0.3 s left) but fits m1: the paper's InterSchedule sends it
    to m0 = (m2 + 1) mod 3 anyway (TTFT 0.70 s), pdopt's scan finds m1 (TTFT 0.40 s)."""
    wl = Workload([0.0, 0.01, 0.02, 0.30], [3000, 1000, 3000, 2000], [2, 2, 2, 2])
    cluster = ClusterSpec.build(COST, 0, 0, 3, kv_capacity_blocks=3000)

    def run(scan: bool) -> pd.DataFrame:
        policy = make_policy(
            "ecoserve", ttft_slo_s=0.7, tpot_slo_s=1.0, macro_size=3, scan=scan, **EARLIER
        )
        return simulate(wl, cluster, policy, slo=Slo(0.7, 1.0), engine="python").requests

    paper, scan = run(scan=False), run(scan=True)
    assert list(paper["prefill_worker"]) == ["m0", "m1", "m2", "m0"]
    assert list(scan["prefill_worker"]) == ["m0", "m1", "m2", "m1"]
    assert paper["ttft_s"][3] > 0.7 > scan["ttft_s"][3]


def test_mitosis_adds_splits_removes_and_merges() -> None:
    """6 workers, 2 active in one macro instance (n_lower 2, n_upper 4): a burst makes it take
    standby instances and split off n_lower = 2 past 4 (macro1); in the quiet tail instances go
    back to standby and the macro instances merge. Measured: adds at 0.10-0.25 s, the split at
    0.20 s; removals from 5.40 s (m2 comes back once at 5.45 s: macro1's requests finished in the
    last 2 s still missed TPOT), the merge of m3 into macro0 at 7.55 s."""
    n = 60
    arrivals = np.concatenate([np.arange(n) * 0.02, [30.0]])
    wl = Workload(arrivals, np.full(n + 1, 1500), np.full(n + 1, 8))
    cluster = ClusterSpec.build(COST, 0, 0, 6, kv_capacity_blocks=3000)
    policy = make_policy(
        "ecoserve",
        ttft_slo_s=0.5,
        tpot_slo_s=0.1,
        n_lower=2,
        n_upper=4,
        macro_size=2,
        initial_instances=2,
        scale_idle_s=2.0,
    )
    res = simulate(wl, cluster, policy, slo=Slo(0.5, 0.1), engine="python")
    moves = res.events[res.events["kind"] == "pool_move"]
    details = list(moves["detail"])
    assert any(d.startswith("prefill->mixed pool=macro0") for d in details)  # add
    assert any(d.endswith("pool=macro1") for d in details)  # split into a new macro instance
    assert any(d.startswith("mixed->prefill pool=standby") for d in details)  # remove
    late = moves[moves["t_s"] > 1.0]
    merged = late[late["detail"].str.startswith("mixed->mixed")]
    assert len(merged) >= 1  # merge: a leftover instance changes macro instance
    last = moves.groupby("worker")["detail"].last()
    assert (last.str.endswith("pool=standby")).sum() == 5  # one instance stays
    assert set(res.requests["status"]) == {"finished"}
    # Fig. 7: the first split moves n_lower = 2 instances into macro1 at one tick
    to_macro1 = moves[moves["detail"].str.endswith("pool=macro1")]
    assert (to_macro1["t_s"] == to_macro1["t_s"].iloc[0]).sum() == 2
    # migration through the proxy: an instance moved at t takes no new request before t + 0.1 s
    req = res.requests
    later = moves[moves["t_s"] > moves["t_s"].min()]  # the first tick only sets instances up
    for t, worker in zip(later["t_s"], later["worker"], strict=True):
        mine = req[req["prefill_worker"] == worker]["arrival_s"]
        assert not ((mine >= t) & (mine < t + 0.1 - 1e-9)).any()


def test_free_migration_routes_to_an_added_instance_at_once() -> None:
    """``migration_s=0``: the instance added at a tick can take the next arrival; with the
    default 0.1 s it cannot (measured: first request on the first added instance; the scenario
    was measured under ``hold="deadline"``, the default before the second review: under the
    default no request reaches the added instance at all with 0.1 s)."""
    n = 30
    wl = Workload(np.arange(n) * 0.02, np.full(n, 1500), np.full(n, 8))
    cluster = ClusterSpec.build(COST, 0, 0, 4, kv_capacity_blocks=3000)

    def first_use(migration_s: float) -> float:
        policy = make_policy(
            "ecoserve", ttft_slo_s=0.5, tpot_slo_s=0.1, n_lower=1, n_upper=4, macro_size=2,
            initial_instances=2, migration_s=migration_s, hold="deadline",
        )  # fmt: skip
        res = simulate(wl, cluster, policy, slo=Slo(0.5, 0.1), engine="python")
        moves = res.events[res.events["kind"] == "pool_move"]
        added = moves[moves["detail"].str.startswith("prefill->mixed") & (moves["t_s"] > 0.0)]
        t_add, worker = float(added["t_s"].iloc[0]), added["worker"].iloc[0]
        req = res.requests
        return float(req[req["prefill_worker"] == worker]["arrival_s"].min()) - t_add

    assert first_use(0.0) < 0.1
    assert first_use(0.1) >= 0.1 - 1e-9


def test_mitosis_grows_on_observed_tpot_misses() -> None:
    """Without CheckConstraints (no predicted misses) and with a loose TTFT SLO, the only
    trigger left is observed: more than 10% of the (at least 10) requests the macro instance
    finished in the last ``scale_idle_s`` missed the TPOT SLO. Decode iterations take 20 ms, so
    under a 15 ms TPOT SLO every request misses and the standby instance is added; under 200 ms
    (the prefill phases stall each decode by at most a 50 ms tick now and then) none does and it
    stays in standby."""
    wl = Workload(np.arange(20) * 0.05, np.full(20, 100), np.full(20, 5))
    cluster = ClusterSpec.build(FLAT, 0, 0, 2, kv_capacity_blocks=1000)

    def adds(tpot_slo_s: float) -> int:
        policy = make_policy(
            "ecoserve", ttft_slo_s=100.0, tpot_slo_s=tpot_slo_s, n_lower=1, n_upper=2,
            macro_size=1, initial_instances=1, constraints=False,
        )  # fmt: skip
        res = simulate(wl, cluster, policy, slo=Slo(100.0, tpot_slo_s), engine="python")
        moves = res.events[res.events["kind"] == "pool_move"]
        return int(moves["detail"].str.startswith("prefill->mixed").sum())

    assert adds(0.015) == 1
    assert adds(0.2) == 0
