"""EcoServe on the compiled engine against the Python engine: identical results.

The compiled twin (:mod:`pdopt.sim._compiled._ecoserve`) runs EcoServe's overall scheduler
(least mean outstanding prefill time over macro instances), Alg. 1 InterSchedule with its
activations (or pdopt's scan, or no rolling activation), Alg. 2 CheckConstraints (C1 the
activation's predicted prefill time, C2 the saved TPOT of the existed decodes by ``math.fsum``
or its minimum, C3 the free KV less what waits) or pdopt's earlier per-request check, the
decode routing (stay where prefilled, else the most free KV in the macro instance), the prefill
phases with held prompts (``hold="prefilled"`` or ``"deadline"``) or pdopt's earlier
tick-bounded phases (with or without ``prefill_slots``), mitosis (standby
instances joining, splits, removals, merges), the forgetting of prompts that never decode and
the sweeps of the first-token records, on clusters that start all mixed or as prefill and
decode workers, with every setting of the policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from experiments._common import ECOSERVE_PDOPT_FLAGS
from pdopt.cluster import ClusterSpec, Role, Slo, WorkerSpec
from pdopt.costmodel import CostModel, PrefillModel
from pdopt.errors import PdoptError
from pdopt.model_spec import SlidingWindow
from pdopt.policies import _ecoserve_activation, _ecoserve_earlier, make_policy
from pdopt.policies import ecoserve as ecoserve_module
from pdopt.policies._ecoserve_macros import BEHIND_FRAC
from pdopt.policies.ecoserve import SWEEP_S, EcoServe
from pdopt.sim import ClosedLoop, simulate
from pdopt.sim._compiled import _io as compiled_io
from pdopt.sim._compiled._ecoserve import fsum_add, fsum_value, mean_below, uid_before
from pdopt.sim._compiled._loop import run_events
from pdopt.sim._compiled._state import (
    A_NEXT,
    A_RID,
    E_BLOCKS,
    E_DBLOCKS,
    E_FT_CTX,
    E_FT_T,
    E_GONE,
    E_HELD_W,
    E_PENDING,
    E_SRC,
    EW_ACT_HEAD,
    EW_IDLE_SINCE,
    EW_MACRO,
    EW_PHASE,
    EW_READY_AT,
    G_E_FIN_HEAD,
    G_E_FIN_N,
    G_E_MACROS,
    G_E_STANDBY,
    G_E_SWEEP,
    K_E_LAST_MISS,
    K_E_LAST_TICK,
    M_CURSOR,
    M_MISSES,
    M_SIZE,
    M_UID,
    PHASE_NAMES,
    R_ADMIT_SEQ,
    R_KV_OFFSET,
    R_RUN_NEXT,
    W_RUN_HEAD,
    W_SNAP_M,
    W_SNAP_OUT,
    W_SNAP_SEQ,
)
from pdopt.sim._simulate import _compiled_codes
from pdopt.testing.strategies import kv_allocations, worker_limits
from pdopt.workload import Workload, poisson_arrivals, shared_prefix_workload
from tests.sim.test_sim_compiled import (
    COST,
    MOE_COST,
    assert_identical,
    check_both_engines,
    disaggregated_clusters,
    hypothesis_event,
)
from tests.sim.test_sim_compiled_splitwise import HEALTH

SLOW_PREFILL = CostModel(PrefillModel(5e3, 3e9, 6e12, intercept_s=0.004), COST.decode)
TWIN = {"mitosis": False}
"""Settings the twin runs (the rest at their defaults: phases="activation", hold="prefilled")."""
PDOPT = dict(ECOSERVE_PDOPT_FLAGS)
"""The experiments' ``ecoserve_pdopt`` system: pdopt's earlier EcoServe (scan, the minimum saved
TPOT less the coming iteration, ``check="request"``, ``phases="ticks"``, refill="missing")."""


@st.composite
def eco_flags(draw):
    """Both phase rules, mitosis on (mostly) or off, macro-instance sizes from one instance each
    to one for all, SLOs from tight (C1 and C2 fail, misses and the cursor moving on every
    request, macro instances growing) to loose (activations grow), spare instances in standby
    or none, small mitosis bounds and short idle times (splits, removals and merges within a
    few seconds), migrations free or 0.1 s, both refill rules, the ablations ``constraints=False``
    and ``rolling=False``, pdopt's ``scan`` InterSchedule, the named departures of C2 (the
    minimum, the margin, the prefill still to run) and pdopt's earlier rules: the per-request
    ``check="request"`` and ``prefill_slots`` (read by the tick-bounded ``phases="ticks"``), and
    pdopt's reading ``hold="deadline"``."""
    lower = draw(st.integers(1, 2))
    return {
        # "ticks" also runs on roomier clusters (test_compiled_ecoserve_matches_with_tick_phases)
        "phases": draw(st.sampled_from(["activation", "activation", "batch", "ticks"])),
        "check": draw(st.sampled_from(["activation", "activation", "request"])),
        "prefill_slots": draw(st.sampled_from([0, 0, 1, 2])),
        "hold": draw(st.sampled_from(["prefilled", "prefilled", "deadline"])),
        "mitosis": draw(st.booleans()) or draw(st.booleans()),
        "macro_size": draw(st.sampled_from([1, 2, 3, 6])),
        "ttft_slo_s": draw(st.sampled_from([None, 0.005, 0.03, 0.3])),
        "tpot_slo_s": draw(st.sampled_from([None, 0.005, 0.02, 0.2])),
        "initial_instances": draw(st.sampled_from([0, 0, 1, 2, 3, 8])),
        "n_lower": lower,
        "n_upper": 2 * lower + draw(st.integers(0, 1)),
        "scale_idle_s": draw(st.sampled_from([0.02, 0.1, 0.5, 2.0])),
        "migration_s": draw(st.sampled_from([0.0, 0.1])),
        "refill": draw(st.sampled_from(["paper", "paper", "missing"])),
        "constraints": draw(st.booleans()) or draw(st.booleans()),
        "saved_tpot": draw(st.sampled_from(["mean", "mean", "min"])),
        "saved_tpot_margin": draw(st.booleans()) and draw(st.booleans()),
        "c2_remaining": draw(st.booleans()) and draw(st.booleans()),
        "rolling": draw(st.booleans()) or draw(st.booleans()),
        "scan": draw(st.booleans()) and draw(st.booleans()),
    }


@st.composite
def eco_clusters(draw):
    """2–6 mixed workers (a dense or an MoE decode cost; some with a slower prefill, so each
    worker's predictor and P_peak count) with the shared limits (KV of 24–60
    blocks of 16 tokens and a small ``max_running``: preemptions and requests waiting for
    admission), sometimes one with half the KV (long requests decode on another member), a
    sliding-window model's KV, preempted requests re-queued at the front or the back; the
    workers' KV allocated on demand or reserved at admission
    (:func:`pdopt.testing.strategies.kv_allocations`)."""
    limits = draw(worker_limits(min_kv_blocks=24))
    cost = draw(st.sampled_from([COST, MOE_COST]))
    n = draw(st.integers(2, 6))
    costs = [draw(st.sampled_from([cost, cost, SLOW_PREFILL])) for _ in range(n)]
    workers = [WorkerSpec(f"m{i}", Role.MIXED, costs[i], **limits) for i in range(n)]
    if draw(st.booleans()):
        small = max(1, limits["kv_capacity_blocks"] // 2)
        workers[-1] = WorkerSpec(
            "m_small", Role.MIXED, cost, **{**limits, "kv_capacity_blocks": small}
        )
    window = SlidingWindow(128, 18, 36) if draw(st.booleans()) else None
    return ClusterSpec(
        draw(kv_allocations(workers)),
        kv_bytes_per_token=2e5,
        preempted_requeue=draw(st.sampled_from(["front", "back"])),
        sliding_window=window,
    )


@st.composite
def eco_workloads(draw):
    """1–120 Poisson arrivals (mean gap 1–60 ms: runs past two sweeps), prompts of 1–399
    tokens, outputs of 1–99 tokens."""
    n = draw(st.integers(1, 120))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    gap_s = draw(st.floats(0.001, 0.06))
    return Workload(
        np.cumsum(rng.exponential(gap_s, n)), rng.integers(1, 400, n), rng.integers(1, 100, n)
    )


def run(driver, cluster, flags, record, tick_s, engine):
    return simulate(
        driver,
        cluster,
        make_policy("ecoserve", **flags),
        slo=Slo(0.2, 0.05),
        record_timeseries=record,
        tick_s=tick_s,
        engine=engine,
    )


@contextlib.contextmanager
def earlier_rules_seen():
    """Spies on the Python policy's earlier rules (pdopt.policies._ecoserve_earlier) and
    ``hold="deadline"``'s, yielding the outcomes they returned: ``check_request`` (True/False),
    ``joins_batch``, ``may_prefill``, ``switch_s`` whether it waited past the next tick (every
    prefill slot taken), ``held_late``, and whether ``phase_over`` kept a phase with nothing left
    to prefill (the instance idles for its activation's next prompts)."""
    seen: dict[str, set] = {"check_request": set(), "joins_batch": set(), "may_prefill": set()}
    seen["switch_s past the next tick"] = set()
    seen["held_late"] = set()
    seen["phase idles"] = set()
    real_phase_over = _ecoserve_activation.phase_over

    def phase_over(p, w, view, *, busy, on_cursor):
        out = real_phase_over(p, w, view, busy=busy, on_cursor=on_cursor)
        if not busy:
            seen["phase idles"].add(not out)
        return out

    def spy(name, real):
        def wrapped(*args, **kwargs):
            out = real(*args, **kwargs)
            seen[name].add(bool(out))
            return out

        return wrapped

    real_switch = _ecoserve_earlier.switch_s

    def switch_s(p, w, view):
        out = real_switch(p, w, view)
        seen["switch_s past the next tick"].add(out > _ecoserve_earlier.to_next_tick(p, view.now_s))
        return out

    with (
        mock.patch.object(
            ecoserve_module, "check_request", spy("check_request", ecoserve_module.check_request)
        ),
        mock.patch.object(
            _ecoserve_earlier, "joins_batch", spy("joins_batch", _ecoserve_earlier.joins_batch)
        ),
        mock.patch.object(
            _ecoserve_earlier, "may_prefill", spy("may_prefill", _ecoserve_earlier.may_prefill)
        ),
        mock.patch.object(_ecoserve_earlier, "switch_s", switch_s),
        mock.patch.object(
            ecoserve_module, "held_late", spy("held_late", ecoserve_module.held_late)
        ),
        mock.patch.object(_ecoserve_activation, "phase_over", phase_over),
    ):
        yield seen


def check(driver, cluster, flags, record, tick_s, no_fallback):
    """Both engines identical (or refusing alike); the Python engine's result (None: refused)."""
    with earlier_rules_seen() as seen:
        python = check_both_engines(
            lambda engine: run(driver, cluster, flags, record, tick_s, engine), no_fallback
        )
    for name, outcomes in seen.items():
        for outcome in sorted(outcomes):
            hypothesis_event(f"{name}: {outcome}")
    if python is None:  # which phase rule the engines both refused under (e.g. stuck phases)
        hypothesis_event(f"refused under phases={flags.get('phases', 'activation')!r}")
    if python is not None:
        end = python.requests["finish_s"].max()
        hypothesis_event(f"sweeps: {'none' if not end >= 1.0 else '1' if end < 2.0 else '2+'}")
        moved = python.requests["prefill_worker"] != python.requests["decode_worker"]
        hypothesis_event(f"decoded elsewhere: {bool(moved.any())}")
        moves = python.events.loc[python.events["kind"] == "pool_move"]
        later = moves.loc[moves["t_s"] > moves["t_s"].min(), "detail"]
        for what, start in (("joins", "prefill->mixed"), ("to standby", "mixed->prefill")):
            hypothesis_event(f"mitosis {what}: {int(later.str.startswith(start).sum() > 0)}")
        hypothesis_event(f"mitosis relabels: {int(later.str.startswith('mixed->mixed').any())}")
        phases = python.events.loc[python.events["kind"] == "phase", "detail"]
        changes = (
            "both->prefill", "prefill->both", "prefill->decode", "decode->both", "both->decode",
            "decode->prefill",
        )  # fmt: skip
        for change in changes:
            if (phases == change).any():
                hypothesis_event(f"phase {change}")
    return python


@settings(max_examples=120, deadline=None, suppress_health_check=HEALTH)
@given(eco_workloads(), eco_clusters(), eco_flags(), st.sampled_from([None, 0.005, 0.05]))
def test_compiled_ecoserve_matches_python_engine(no_fallback, workload, cluster, flags, tick_s):
    """Without a time series (the policy's ticks still run), and with one every ``tick_s``."""
    check(workload, cluster, flags, tick_s is not None, tick_s or 0.01, no_fallback)


@st.composite
def roomy_clusters(draw):
    """:func:`eco_clusters` with 16–64 running slots and 2–4 times the KV per worker: pdopt's
    earlier ``phases="ticks"`` with slots to spare (on :func:`eco_clusters`' few slots its
    phases end for want of one, since session 47; before, its runs mostly ended stuck in a
    phase, see :func:`test_tick_phases_end_when_every_running_slot_is_taken`)."""
    cluster = draw(eco_clusters())
    running, scale = draw(st.integers(16, 64)), draw(st.integers(2, 4))
    workers = tuple(
        dataclasses.replace(w, max_running=running, kv_capacity_blocks=w.kv_capacity_blocks * scale)
        for w in cluster.workers
    )
    return dataclasses.replace(cluster, workers=workers)


@settings(max_examples=80, deadline=None, suppress_health_check=HEALTH)
@given(eco_workloads(), roomy_clusters(), eco_flags(), st.sampled_from([None, 0.005, 0.05]))
def test_compiled_ecoserve_matches_with_tick_phases(no_fallback, workload, cluster, flags, tick_s):
    """pdopt's earlier ``phases="ticks"`` (with the rest of the settings drawn: ``check``,
    ``prefill_slots``, the C2 departures, mitosis) on clusters with room to run."""
    flags = {**flags, "phases": "ticks"}
    check(workload, cluster, flags, tick_s is not None, tick_s or 0.01, no_fallback)


def _one_slot_workers():
    """Two mixed workers with one running slot each (one prompt a batch, 50 tokens a batch;
    the second with half the KV) and four prompts that arrive close together (the last
    rejected: its KV exceeds both): hypothesis's shrunk example of a decode holding an
    instance's only slot while prompts wait there."""
    limits = {"block_tokens": 1, "max_batch_tokens": 50, "max_batch_size": 1, "max_running": 1}
    workers = (
        WorkerSpec("m0", Role.MIXED, COST, kv_capacity_blocks=400, **limits),
        WorkerSpec("m_small", Role.MIXED, COST, kv_capacity_blocks=200, **limits),
    )
    workload = Workload(
        np.array([0.02124787, 0.05311028, 0.05372924, 0.05380016]),
        np.array([70, 325, 260, 365]),
        np.array([50, 61, 97, 73]),
    )
    return workload, ClusterSpec(workers, kv_bytes_per_token=2e5, preempted_requeue="front")


@pytest.mark.parametrize("flags", [{"constraints": False}, {"macro_size": 1, "scale_idle_s": 0.02}])
def test_tick_phases_end_when_every_running_slot_is_taken(no_fallback, flags):
    """pdopt's earlier ``phases="ticks"`` keeps a prefill phase only with a running slot free
    for a prompt: a phase kept (C2 off, or a prompt past its TTFT SLO) while a prefilled
    request waited for the only slot never admitted it, and no prompt could start (the run
    stopped after 100,000 ticks). Now
    every request the cluster can hold finishes, the same on both engines; with the guard
    taken out of the Python policy the run still stops."""
    workload, cluster = _one_slot_workers()
    flags = {"phases": "ticks", **flags}
    python = check(workload, cluster, flags, False, 0.01, no_fallback)
    assert python is not None
    assert python.requests["status"].tolist() == ["finished"] * 3 + ["rejected"]
    phases = python.events.loc[python.events["kind"] == "phase", "detail"]
    assert (phases == "prefill->decode").any()
    with (
        mock.patch.object(EcoServe, "_slots_full", lambda self, w, view: False),
        pytest.raises(PdoptError, match="100000 control ticks"),
    ):
        run(workload, cluster, flags, False, 0.01, "python")


def _records(state):
    """The twin's records at the run's end, in the Python policy's shapes."""
    e, erf, ewi = state.eri, state.erf, state.ewi
    rids = range(len(e))
    activation = []
    for w in range(len(ewi)):
        entries, ent = {}, ewi[w, EW_ACT_HEAD]
        while ent >= 0:
            entries[int(state.eact[ent, A_RID])] = float(state.eactf[ent])
            ent = state.eact[ent, A_NEXT]
        activation.append(entries)
    n_macros = state.g[G_E_MACROS]
    return {
        "src": {r: int(e[r, E_SRC]) for r in rids if e[r, E_SRC] >= 0},
        "blocks": {r: int(e[r, E_BLOCKS]) for r in rids if e[r, E_BLOCKS] >= 0},
        "decode_blocks": {r: int(e[r, E_DBLOCKS]) for r in rids if e[r, E_DBLOCKS] >= 0},
        "first_token": {
            r: (float(erf[r, E_FT_T]), int(e[r, E_FT_CTX])) for r in rids if e[r, E_DBLOCKS] >= 0
        },
        "gone": {r for r in rids if e[r, E_GONE] == state.g[G_E_SWEEP] - 1},
        "held": [sorted(r for r in rids if e[r, E_HELD_W] == w) for w in range(len(ewi))],
        "queued": [sorted(r for r in rids if e[r, E_SRC] == w) for w in range(len(ewi))],
        "pending": [
            {r: int(e[r, E_PENDING]) for r in rids if e[r, E_SRC] == w and e[r, E_PENDING] >= 0}
            for w in range(len(ewi))
        ],
        "activation": activation,
        "phase": [PHASE_NAMES[p] for p in ewi[:, EW_PHASE]],
        "macros": [
            (
                int(state.emac[m, M_UID]),
                state.emem[m, : state.emac[m, M_SIZE]].tolist(),
                int(state.emac[m, M_CURSOR]),
                float(state.emacf[m, 0]),
            )
            for m in range(n_macros)
        ],
        "misses": [int(m) for m in state.emac[:n_macros, M_MISSES]],
        "macro_of": ewi[:, EW_MACRO].tolist(),
        "standby": state.estb[: state.g[G_E_STANDBY]].tolist(),
        "ready_at": state.ewf[:, EW_READY_AT].tolist(),
        "idle_since": state.ewf[:, EW_IDLE_SINCE].tolist(),
        "seen": [_seen(state, w) for w in range(len(ewi))],
        "finished": _ring(state),
        "last_miss_s": float(state.tick_f[K_E_LAST_MISS]),
        "last_tick_s": float(state.tick_f[K_E_LAST_TICK]),
    }


def _seen(state, w):
    """``_seen[w]``: the requests of ``w``'s snapshot still running there (admitted before it),
    with their context then, and those listed as stopped since."""
    ri, wi = state.ri, state.wi
    seen = {}
    rid = wi[w, W_RUN_HEAD]
    while rid >= 0:
        if ri[rid, R_ADMIT_SEQ] < wi[w, W_SNAP_SEQ]:
            seen[int(rid)] = int(ri[rid, R_KV_OFFSET] + wi[w, W_SNAP_M])
        rid = ri[rid, R_RUN_NEXT]
    for x in range(wi[w, W_SNAP_OUT]):
        seen[int(state.snap_out[w, x, 0])] = int(state.snap_out[w, x, 1])
    return seen


def _ring(state):
    """The finished requests' ring as (time, uid) -> (requests, late ones)."""
    fin, head, size = state.efin, state.g[G_E_FIN_HEAD], len(state.efin)
    rows = [fin[(head + i) % size] for i in range(state.g[G_E_FIN_N])]
    return {(float(t), int(uid)): (int(n), int(late)) for t, uid, n, late in rows}


def _policy_records(policy):
    """The same records of the Python policy after its run."""
    macros = policy._instances.macros
    return {
        "src": policy._src,
        "blocks": policy._blocks,
        "decode_blocks": policy._decode_blocks,
        "first_token": policy._first_token,
        "gone": policy._gone,
        "held": [sorted(h) for h in policy._held],
        "queued": [sorted(q) for q in policy._queued],
        "pending": [{r: tokens for r, (_, tokens) in p.items()} for p in policy._pending],
        "activation": policy._activation,
        "phase": policy._instances.phase,
        "macros": [(m.uid, m.members, m.cursor, m.changed_s) for m in macros],
        "misses": [m.misses for m in macros],
        "macro_of": policy._instances.macro_of,
        "standby": policy._instances.standby,
        "ready_at": policy._instances._ready_at,
        "idle_since": policy._instances._idle_since,
        "seen": policy._instances._seen,
        "finished": _tally(policy._instances._finished),
        "last_miss_s": policy._instances._last_miss_s,
        "last_tick_s": policy._last_tick_s,
    }


def _tally(finished):
    counts = {}
    for t, uid, late in finished:
        n, n_late = counts.get((t, uid), (0, 0))
        counts[(t, uid)] = (n + 1, n_late + int(late))
    return counts


@settings(max_examples=60, deadline=None, suppress_health_check=HEALTH)
@given(eco_workloads(), eco_clusters(), eco_flags())
def test_the_twins_records_end_as_the_policys(no_fallback, monkeypatch, workload, cluster, flags):
    """Beyond the results: at the run's end the twin holds the policy's records (routing, the
    prompts pending decode with their tokens, the last tick, first tokens, decode blocks, the
    sweeps' unseen set, held prompts, activations with their
    predicted prefill times, phases, the macro instances with their members, cursors, misses and
    last change, standby, migrations, idle times, the running requests last seen and the
    finished requests' TPOT checks), so records that no result shows yet (a sweep dropping them
    one sweep early, a forgotten prompt kept) are compared too."""
    states = []

    def capture(state):
        states.append(state)
        return run_events(state)

    monkeypatch.setattr(compiled_io, "run_events", capture)
    python_policy = make_policy("ecoserve", **flags)
    compiled_policy = make_policy("ecoserve", **flags)
    try:
        python = simulate(workload, cluster, python_policy, slo=Slo(0.2, 0.05), engine="python")
    except PdoptError:
        return
    no_fallback["compiled"] = True
    compiled = simulate(workload, cluster, compiled_policy, slo=Slo(0.2, 0.05), engine="compiled")
    no_fallback["compiled"] = False
    assert_identical(python, compiled)
    (state,) = states
    assert state.eact.shape[0] == len(state.eri) + 64  # not grown: the tuple's arrays are current
    assert _records(state) == _policy_records(python_policy)


@settings(max_examples=30, deadline=None, suppress_health_check=HEALTH)
@given(eco_workloads(), eco_clusters(), eco_flags(), st.integers(1, 6))
def test_compiled_ecoserve_matches_in_a_closed_loop(no_fallback, workload, cluster, flags, clients):
    driver = ClosedLoop(clients, 0.01, workload, 2 * len(workload), start_spread_s=0.1)
    check(driver, cluster, flags, True, 0.01, no_fallback)


def _busy_cluster(n_workers, requeue, kv_blocks=150, max_running=16):
    lim = {"kv_capacity_blocks": kv_blocks, "max_running": max_running, "max_batch_size": 4}
    workers = [WorkerSpec(f"m{i}", Role.MIXED, COST, **lim) for i in range(n_workers)]
    return ClusterSpec(tuple(workers), kv_bytes_per_token=2e5, preempted_requeue=requeue)


def _busy_workload(n, seed, gap_s=0.006):
    rng = np.random.default_rng(seed)
    return Workload(
        np.cumsum(rng.exponential(gap_s, n)), rng.integers(16, 500, n), rng.integers(2, 120, n)
    )


@pytest.mark.parametrize(
    ("requeue", "macro_size", "variant"),
    [
        ("front", 1, {}),
        ("back", 1, {}),
        ("front", 3, {}),
        ("back", 3, {}),
        ("front", 3, {"scan": True}),
        ("back", 3, {"rolling": False}),
    ],
)
def test_compiled_ecoserve_matches_under_load(requeue, macro_size, variant, no_fallback):
    """Six workers loaded for ~9 s (nine sweeps): preemptions (re-routed prompts replacing
    their activation entries), misses, records dropped by the sweeps; also with pdopt's scan
    InterSchedule and the ablation without rolling activation."""
    flags = {**TWIN, "macro_size": macro_size, "ttft_slo_s": 0.1, "tpot_slo_s": 0.03, **variant}
    python = check(
        _busy_workload(1500, 3), _busy_cluster(6, requeue), flags, False, 0.01, no_fallback
    )
    assert python is not None
    assert python.requests["preemptions"].sum() > 0
    assert python.requests["finish_s"].max() > 5 * SWEEP_S
    assert (python.events["kind"] == "pool_move").sum() == 6  # each joins its macro instance


@pytest.mark.parametrize(
    ("requeue", "room", "variant"),
    [
        ("front", (150, 16), {}),
        ("back", (600, 64), {"macro_size": 3, "prefill_slots": 1}),
        (
            "front",
            (600, 64),
            {"macro_size": 3, "prefill_slots": 2, "mitosis": False, "initial_instances": 0},
        ),
    ],
)
def test_compiled_ecoserve_pdopt_matches_under_load(requeue, room, variant, no_fallback):
    """The experiments' ``ecoserve_pdopt`` flags (``check="request"``, ``phases="ticks"``, scan,
    the minimum saved TPOT with the margin, refill="missing") on six workers, four active at
    first (mitosis brings the standby ones in), loaded near capacity for ~45 s (with 16 running
    slots and 150 KV blocks: preemptions), also with one or two prefill slots per macro
    instance: identical on both engines without falling back, and the earlier rules' paths all
    taken (a request refused and accepted, prompts joining a pending batch and not, prefill
    phases allowed and refused, every slot taken)."""
    flags = {
        **PDOPT, "macro_size": 2, "initial_instances": 4, "ttft_slo_s": 0.3, "tpot_slo_s": 0.03,
        "scale_idle_s": 0.5, **variant,
    }  # fmt: skip
    cluster = _busy_cluster(6, requeue, *room)
    with earlier_rules_seen() as seen:
        python = check(_busy_workload(1500, 3, 0.03), cluster, flags, False, 0.01, no_fallback)
    assert python is not None
    assert python.requests["finish_s"].max() > 5 * SWEEP_S
    if room == (150, 16):
        assert python.requests["preemptions"].sum() > 0
    assert seen["check_request"] == {True, False}
    assert seen["joins_batch"] == {True, False}
    assert seen["may_prefill"] == {True, False}
    capped = {True, False} if flags.get("prefill_slots") else {False}
    assert seen["switch_s past the next tick"] == capped
    phases = python.events.loc[python.events["kind"] == "phase", "detail"]
    assert {"decode->prefill", "prefill->decode"} <= set(phases)
    moves = python.events.loc[python.events["kind"] == "pool_move", "detail"]
    if flags.get("mitosis", True):
        assert moves.str.startswith("prefill->mixed").any()  # a standby instance joins


@pytest.mark.parametrize(("requeue", "macro_size"), [("front", 1), ("back", 3)])
def test_compiled_ecoserve_hold_deadline_matches_under_load(requeue, macro_size, no_fallback):
    """pdopt's reading ``hold="deadline"`` on six loaded workers: identical on both engines
    without falling back, with both of its rules taken both ways (C1's ``held_late`` refusing
    and accepting; a phase with nothing left to prefill idling for more prompts and ending)."""
    flags = {**TWIN, "hold": "deadline", "macro_size": macro_size, "ttft_slo_s": 0.3}
    with earlier_rules_seen() as seen:
        python = check(
            _busy_workload(1500, 3, 0.02),
            _busy_cluster(6, requeue),
            flags,
            False,
            0.01,
            no_fallback,
        )
    assert python is not None
    assert seen["held_late"] == {True, False}
    assert seen["phase idles"] == {True, False}


def _fsum(values):
    part = np.zeros(64)
    n = 0
    for x in values:
        n = fsum_add(part, n, float(x))
        assert n >= 0
    return fsum_value(part, n)


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)


@given(st.lists(st.one_of(finite, st.sampled_from([1e16, -1e16, 1.0, 1e-16, 0.1, -0.0]))))
@example([1e16, 1.0, -1e16])
@example([1e-16, 1.0, 1e16])  # half-even rounding across partials
@example([0.1] * 10)
@example([])
def test_fsum_is_math_fsum(values):
    assert _fsum(values) == math.fsum(values)


near = st.floats(-1e-12, 1e-12, allow_nan=False)


@st.composite
def saved_values(draw):
    """A limit and values around it: saved TPOTs (seconds), some a hair from the limit, some
    large and cancelling, so that the mean sits on either side of the limit or on it."""
    limit = draw(st.sampled_from([0.05, 0.1, 1e-3, 0.25, 3.0, 1e-9]))
    base = st.one_of(
        st.floats(-50.0, 50.0, allow_nan=False),
        near.map(lambda d: limit + d),
        st.sampled_from([1e8, -1e8, limit, 2 * limit, 0.0]),
    )
    return limit, draw(st.lists(base, min_size=1, max_size=60))


@settings(max_examples=2000, deadline=None)
@given(saved_values())
@example((0.1, [0.1] * 10))  # the mean on the limit: undecided, the exact value decides
@example((0.05, [1e8, 0.05, -1e8]))  # cancellation
def test_the_plain_sum_decides_the_mean_against_a_limit_only_where_it_can(case):
    """mean_below answers as math.fsum's mean would, or leaves it to it (-1)."""
    limit, values = case
    plain, size = 0.0, 0.0
    for v in values:  # in order, as the walk sums them
        plain += v
        size += abs(v)
    below = mean_below(plain, size, len(values), limit)
    hypothesis_event(f"decided: {below >= 0}")
    if below >= 0:
        assert (below == 1) == (math.fsum(values) / len(values) < limit)


def test_the_plain_sum_decides_the_common_case():
    assert mean_below(0.9, 0.9, 10, 0.05) == 0  # mean 0.09 s saved against a 50 ms tick
    assert mean_below(-0.3, 0.5, 10, 0.05) == 1
    assert mean_below(0.5, 0.5, 10, 0.05) == -1  # on the limit: the exact value decides


def test_fsum_refuses_a_non_finite_sum():
    part = np.zeros(64)
    assert fsum_add(part, 0, math.inf) == -1
    n = fsum_add(part, 0, 1e308)
    assert fsum_add(part, n, 1e308) == -1  # math.fsum raises OverflowError


def _mixed(n):
    return ClusterSpec.build(COST, 0, 0, n, kv_capacity_blocks=200)


@pytest.mark.parametrize("flags", [{}, PDOPT], ids=["paper", "pdopt"])
def test_mitosis_with_no_idle_time_sends_only_idle_instances_to_standby(flags, no_fallback):
    """``scale_idle_s=0``: an instance goes to standby as soon as it is idle, never while it
    has work (it too had idled "0 s" before; the Python policy moved busy instances to standby,
    which the compiled engine did not run); bursts bring standby instances back. The same on
    both engines; the removals happen (with mitosis' ``n_lower`` of 1)."""
    flags = {
        **flags, "n_lower": 1, "n_upper": 2, "macro_size": 1, "initial_instances": 2,
        "scale_idle_s": 0.0, "migration_s": 0.0,
    }  # fmt: skip
    policy = EcoServe(**flags)
    cluster = ClusterSpec.build(COST, 0, 0, 6, kv_capacity_blocks=400)
    assert _compiled_codes("compiled", policy, policy.traits(), cluster, 10) is not None

    def run(engine):
        policy = make_policy("ecoserve", **flags)
        return simulate(_bursts(6), cluster, policy, slo=Slo(0.05, 0.05), engine=engine)

    python = check_both_engines(run, no_fallback)
    assert python.requests["status"].eq("finished").all()
    moves = python.events.loc[python.events["kind"] == "pool_move"]
    to_standby = moves.loc[moves["detail"].str.endswith("pool=standby")]
    assert len(to_standby) > 5
    r = python.requests
    for t_s, worker in zip(to_standby["t_s"], to_standby["worker"], strict=True):
        # nothing of the worker's in flight then: what it prefilled or decoded before is done
        prefilled = (r["prefill_worker"] == worker) & (r["arrival_s"] < t_s)
        assert (r.loc[prefilled, "prefill_end_s"] <= t_s).all(), (t_s, worker)
        decoded = (r["decode_worker"] == worker) & (r["decode_start_s"] <= t_s)
        assert (r.loc[decoded, "finish_s"] <= t_s).all(), (t_s, worker)


@pytest.mark.parametrize(
    "flags",
    [
        PDOPT,
        {**PDOPT, "hold": "deadline", "prefill_slots": 1},
        {**TWIN, "check": "request"},
        {**TWIN, "check": "request", "phases": "batch"},
        {**TWIN, "phases": "ticks", "prefill_slots": 2},
        {**TWIN, "hold": "deadline"},
        {"hold": "deadline", "check": "request"},
    ],
)
def test_pdopts_earlier_rules_run_compiled(flags):
    """``check="request"`` under every phase rule, ``phases="ticks"`` (with or without
    ``prefill_slots``) and ``hold="deadline"`` pass to the twin, their settings in its
    parameters."""
    policy = EcoServe(**flags)
    codes = _compiled_codes("compiled", policy, policy.traits(), _mixed(4), 10)
    assert codes is not None
    _, params = policy.compiled_tick()
    expected = (
        flags.get("phases") == "ticks", flags.get("check") == "request",
        flags.get("prefill_slots", 0), flags.get("hold") == "deadline",
    )  # fmt: skip
    assert params[17:21] == tuple(float(f) for f in expected)


@settings(max_examples=60, deadline=None, suppress_health_check=HEALTH)
@given(eco_workloads(), disaggregated_clusters(), eco_flags(), st.sampled_from([None, 0.01]))
def test_compiled_ecoserve_matches_from_prefill_and_decode_workers(
    no_fallback, workload, cluster, flags, tick_s
):
    """Requests before the first tick go by role (Alg. 1 over the prefill workers, decodes to
    the macro instance's decode workers over the links); the first tick makes the members mixed
    (a batch in flight or decodes running) and the spares prefill workers in standby."""
    python = check(workload, cluster, flags, tick_s is not None, tick_s or 0.01, no_fallback)
    if python is not None:
        moves = python.events.loc[python.events["kind"] == "pool_move", "detail"]
        hypothesis_event(f"decode->mixed: {bool(moves.str.startswith('decode->mixed').any())}")


def test_ecoserve_runs_compiled_with_its_macro_instances():
    """Before start only the settings are known (NaN stands in for the run's SLOs); after it
    the SLOs, each worker's macro instance (round robin over the groups) and TTFT predictor."""
    policy = EcoServe(**TWIN, macro_size=2, tpot_slo_s=0.03)
    codes = _compiled_codes("compiled", policy, policy.traits(), _mixed(5), 10)
    assert codes is not None and codes[:3] == (13, 10, 4)
    workload = Workload(np.array([0.0, 0.01]), np.array([20, 30]), np.array([4, 5]))
    result = simulate(workload, _mixed(5), policy, slo=Slo(0.5, 0.05), engine="compiled")
    name, params = policy.compiled_tick()
    assert name == "ecoserve"
    # the SLOs, phases="activation", mitosis off, refill="paper", n_lower, n_upper,
    # scale_idle_s, migration_s, the policy's constants, constraints on, the paper's C2,
    # rolling, Alg. 1 (no scan), phases other than "ticks", check="activation", no slot cap,
    # hold="prefilled"
    assert params[:21] == (
        0.5, 0.03, 1.0, 0.0, 0.0, 3.0, 6.0, 2.0, 0.1, BEHIND_FRAC, SWEEP_S, 1.0, 0.0, 0.0, 0.0,
        1.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    )  # fmt: skip
    assert params[21:26] == (0.0, 1.0, 2.0, 0.0, 1.0)  # three groups of workers 0-4
    assert len(params) == 26 + 3 * 5
    pools = result.events.loc[result.events["kind"] == "pool_move", "detail"].tolist()
    assert pools == [f"mixed->mixed pool=macro{k}" for k in (0, 0, 1, 1, 2)]


def test_an_ecoserve_subclass_with_its_own_rule_has_no_compiled_twin():
    class Greedy(EcoServe):
        def _check(self, w, request, view, *, fresh=False):
            return True

    assert Greedy(**TWIN).traits().compiled_routing is None
    assert Greedy(**TWIN).compiled_tick() is None
    assert EcoServe(**TWIN).traits().compiled_routing == ("ecoserve", "ecoserve")


def test_macro_pools_compare_as_their_names():
    """Mitosis orders macro instances by (size, pool name): ``macro10`` before ``macro2``."""
    for a in range(0, 1201, 7):
        for b in range(0, 1201, 3):
            assert uid_before(a, b) == (f"macro{a}" < f"macro{b}"), (a, b)


def _bursts(n_bursts):
    """``n_bursts`` bursts of 60 requests in 0.5 s, 1.5 s apart."""
    rng = np.random.default_rng(5)
    arrival = np.concatenate(
        [1.5 * k + np.sort(rng.uniform(0.0, 0.5, 60)) for k in range(n_bursts)]
    )
    n = len(arrival)
    return Workload(arrival, rng.integers(200, 800, n), rng.integers(2, 40, n))


def test_pool_names_order_macro_instances_past_uid_ten(no_fallback):
    """Forty bursts on nine instances, two active at first, with a tight TTFT SLO: each burst
    brings standby instances in and splits (n_upper 2), each pause sends them back and merges,
    so macro instance uids pass 20 and ``macro10`` sorts before ``macro2`` where sizes tie
    (under a numeric order the Python engine's events differ: checked when this test was
    written)."""
    flags = {
        "n_lower": 1, "n_upper": 2, "macro_size": 1, "initial_instances": 2,
        "scale_idle_s": 0.2, "migration_s": 0.0,
    }  # fmt: skip
    cluster = ClusterSpec.build(COST, 0, 0, 9, kv_capacity_blocks=400)

    def run(engine):
        policy = make_policy("ecoserve", **flags)
        return simulate(_bursts(40), cluster, policy, slo=Slo(0.05, 0.05), engine=engine)

    python = check_both_engines(run, no_fallback)
    moves = python.events.loc[python.events["kind"] == "pool_move", "detail"]
    uids = moves.str.extract(r"pool=macro(\d+)")[0].dropna().astype(int)
    assert uids.max() >= 20
    assert moves.str.endswith("pool=standby").sum() > 100


@pytest.mark.parametrize(
    "flags",
    [{}, {"macro_size": 2, "initial_instances": 3, "scale_idle_s": 0.2}],
    ids=["defaults", "mitosis_from_standby"],
)
def test_compiled_ecoserve_matches_with_prefix_caching(flags, no_fallback):
    """Multi-turn conversations on shared system prompts, each instance caching prompt blocks
    (hits skip prefill work, which the policy's predictions do not see), with the defaults and
    with instances joining from standby and leaving again."""
    arrival = poisson_arrivals(40.0, n_requests=800, seed=1)
    workload = shared_prefix_workload(
        arrival, num_system_prompts=4, system_prompt_tokens=512, users_per_system_prompt=50,
        question_tokens=64, output_tokens=64, multi_turn=True, max_input_tokens=2048, seed=0,
    )  # fmt: skip
    cluster = dataclasses.replace(
        ClusterSpec.build(COST, 0, 0, 6, kv_capacity_blocks=600), prefix_caching=True
    )
    python = check(workload, cluster, flags, False, 0.01, no_fallback)
    assert python is not None
    assert python.requests["cached_tokens"].sum() > 0


def test_activation_entries_grow_when_all_are_used(no_fallback, monkeypatch):
    """The activations' entries start at two (a run starts with one per request and 64 more):
    the pool doubles, its entries copied and the new ones freed, as often as the routings
    need, with the same results."""
    real = compiled_io._ecoserve_fields

    def two_entries(*args):
        fields = real(*args)
        fields["eact"] = np.ascontiguousarray(fields["eact"][:2])
        fields["eact"][-1, A_NEXT] = -1
        fields["eactf"] = np.ascontiguousarray(fields["eactf"][:2])
        return fields

    monkeypatch.setattr(compiled_io, "_ecoserve_fields", two_entries)
    flags = {"macro_size": 3, "ttft_slo_s": 0.3, "tpot_slo_s": 0.03}
    python = check(
        _busy_workload(600, 4), _busy_cluster(6, "back"), flags, False, 0.01, no_fallback
    )
    assert python is not None
    assert python.requests["preemptions"].sum() > 0
