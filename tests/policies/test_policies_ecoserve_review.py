"""EcoServe: the second reader's findings (issue 36 review), each against a hand computation or
the state the policy must hold after one control tick.

Mitosis and the InterSchedule cursor are driven through :meth:`EcoServe.on_tick` with a
:class:`_View` stub that carries only the telemetry those steps read; C3 runs end to end on the
``FLAT`` cost model (prefill 0.2 ms per prompt token, decode iterations 20 ms).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pdopt.policies.ecoserve  # noqa: F401  (registers "ecoserve")
from pdopt.cluster import ClusterSpec, Role, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.policies._ecoserve_macros import MacroInstances
from pdopt.policies.ecoserve import EcoServe
from pdopt.sim import MoveWorker, RunContext, simulate
from pdopt.workload import Workload

FLAT = CostModel(PrefillModel(0.0, 2e9, 1e13), DecodeModel(0.02, 0.0, 0.0))


class _View:
    """The telemetry mitosis reads: every worker mixed, ``busy`` ones running one decode;
    ``runs``: worker -> {request id: context tokens} of its running decodes."""

    def __init__(
        self, n: int, now_s: float, busy: set[int], runs: dict[int, dict[int, int]] | None = None
    ) -> None:
        self.now_s, self.n_workers = now_s, n
        self.running = np.array([int(w in busy) for w in range(n)], dtype=np.int64)
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


def _started(n: int, **flags: Any) -> EcoServe:
    policy = make_policy("ecoserve", **flags)
    assert isinstance(policy, EcoServe)
    policy.start(RunContext(ClusterSpec.build(FLAT, 0, 0, n), Slo(0.5, 0.1), 0.05))
    policy.on_tick(_View(n, 0.0, set()))  # the first tick sets the instances up
    return policy


def test_a_removal_that_moves_the_cursor_starts_an_activation() -> None:
    """Finding 4. One macro instance [m0, m1, m2], cursor on m2; m0 still carries an old
    activation (0.4 s of prompts since t_switch = 0). At 3 s m2 has idled 3 s >= scale_idle_s
    = 2 s and goes to standby; the cursor falls back to m0, whose activation starts then:
    nothing routed since, t_switch = 3 s (else the next request would see 0.4 s of stale
    prompts in C1 and move on)."""
    policy = _started(3, macro_size=3, n_lower=1, n_upper=3)
    macro = policy._instances.macros[0]
    macro.cursor = 2
    policy._activation[0] = {99: 0.4}
    policy.on_tick(_View(3, 3.0, busy={0, 1}))
    assert macro.members == [0, 1] and policy._instances.standby == [2]
    assert policy._activation[0] == {} and policy._t_switch[0] == 3.0


def test_a_split_starts_the_new_macro_instance_s_activation() -> None:
    """Finding 4. Macro instance [m0, m1, m2] (n_upper = 3) missed: standby m3 joins at 1 s,
    four > n_upper, so the last n_lower = 1 member, m3, splits off as a new macro instance
    whose cursor starts on m3: its activation starts at 1 s."""
    policy = _started(4, macro_size=3, initial_instances=3, n_lower=1, n_upper=3)
    policy._instances.macros[0].misses = 1
    policy.on_tick(_View(4, 1.0, busy={0, 1, 2, 3}))
    assert [m.members for m in policy._instances.macros] == [[0, 1, 2], [3]]
    assert policy._t_switch[3] == 1.0


def test_requests_gone_while_no_standby_was_left_are_not_late_finishes() -> None:
    """Finding 5. At 0.05 s m0 runs 12 decodes (first token at 0 s with context 100, now 110).
    The standby then empties (m1 joins); they finish by 1 s within their TPOT SLO (11 tokens
    in 0.5 s, 0.1 s SLO). When m1 is back in standby (5 s), none of them may count as a
    finish at 5 s (11 tokens in 5 s: late on all 12, a false scale-up)."""
    policy = _started(2, macro_size=1, initial_instances=1, n_lower=1, n_upper=2)
    runs = {0: {rid: 110 for rid in range(12)}}
    policy._first_token.update({rid: (0.0, 100) for rid in range(12)})
    policy.on_tick(_View(2, 0.05, busy={0}, runs=runs))
    policy._instances.standby.clear()  # m1 added to a macro instance
    policy.on_tick(_View(2, 1.0, busy={0}))
    policy._instances.standby.append(1)  # ... and removed again
    actions = policy.on_tick(_View(2, 5.0, busy={0}))
    assert policy._instances.standby == [1]
    assert not [a for a in actions if isinstance(a, MoveWorker)]


def _grown(refill: str) -> list[tuple[int, ...]]:
    """Fig. 7 (N_l = 3, N_u = 6): one macro instance of 6 and 5 in standby; the first miss
    adds a seventh, which splits it (4 + 3); then the new macro instance misses three times.
    Sizes after each tick."""
    mi = MacroInstances(
        11, n_lower=3, n_upper=6, scale_idle_s=2.0, migration_s=0.1, tpot_slo_s=0.1,
        tick_s=0.05, refill=refill,
    )  # fmt: skip
    mi.populate(6, 1)
    sizes = []
    for tick in range(4):
        mi.macros[-1].misses = 1
        mi.scale(_View(11, 1.0 + tick, busy=set(range(11))))
        for macro in mi.macros:
            macro.misses = 0
        sizes.append(tuple(len(m.members) for m in mi.macros))
    return sizes


def test_mitosis_refills_the_original_macro_instance_first() -> None:
    """Finding 3, Fig. 7 steps 3-4 (paper lines ~331-333): after a split new instances go to
    the original macro instance until it is back at N_u, then to the new one. pdopt's earlier
    rule (``refill="missing"``) gives each one to the macro instance that missed."""
    assert _grown("paper") == [(4, 3), (5, 3), (6, 3), (6, 4)]
    assert _grown("missing") == [(4, 3), (4, 4), (4, 5), (4, 6)]


def _c3(
    arrival: list[float], prompt: list[int], output: list[int], blocks: int, **flags: Any
) -> list[str]:
    cluster = ClusterSpec.build(FLAT, 0, 0, 2, kv_capacity_blocks=blocks)
    policy = make_policy("ecoserve", macro_size=2, mitosis=False, **flags)
    res = simulate(
        Workload(arrival, prompt, output), cluster, policy, slo=Slo(0.5, 10.0), engine="python"
    )
    return list(res.requests["prefill_worker"])


def test_c3_does_not_count_the_running_prefill_batch_twice() -> None:
    """Finding 6. 150 blocks of 16 tokens; 1000-token prompts take 63 blocks. R2 (0.1 s)
    finds R1 prefilling on m0 (0-0.2 s), its 63 blocks already used: 150 − 63 = 87 free
    hold R2's 63 (C1: 0.4 s <= 0.5 s), so R2 stays on m0. Subtracting R1's blocks again
    (24 left) sent it to m1."""
    assert _c3([0.0, 0.1], [1000, 1000], [4, 4], 150, phases="batch") == ["m0", "m0"]


def test_c3_counts_prompts_waiting_for_decode_admission() -> None:
    """Finding 6. 50 blocks; 300-token prompts (60 ms, 19 blocks) at 0, 0.1 and 0.2 s under
    ``phases="activation"``: m0 holds R1 and R2 prefilled (from 0.05 s in a prefill phase,
    no decode admitted), so they hold no blocks but will take 38 of the 50 when they decode:
    R3 does not fit (12 left < 19) and goes to m1."""
    out = _c3([0.0, 0.1, 0.2], [300] * 3, [4] * 3, 50, phases="activation")
    assert out == ["m0", "m0", "m1"]


@pytest.mark.parametrize("phases", ["activation", "batch", "ticks"])
def test_every_phase_rule_ends_each_request_once(phases: str) -> None:
    rng = np.random.default_rng(1)
    n = 60
    wl = Workload(np.sort(rng.uniform(0, 3, n)), rng.integers(100, 1500, n), rng.integers(2, 80, n))
    cluster = ClusterSpec.build(FLAT, 0, 0, 4, kv_capacity_blocks=400)
    policy = make_policy("ecoserve", macro_size=2, initial_instances=2, phases=phases)
    res = simulate(wl, cluster, policy, slo=Slo(0.5, 0.05, timing="decode_start"), engine="python")
    assert (res.requests["status"] == "finished").all()
