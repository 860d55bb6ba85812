"""The KV component (issue 35 item 1, :mod:`pdopt.sim._kv`): after every instant of a run, every
worker's blocks are used by its decode batch, held for a migration, reserved by a prompt in
prefill, or free (cached unreferenced blocks live in free space), exactly once; no count is
negative and none exceeds the capacity; the counts the component keeps equal what the sides and
the migrations hold."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdopt.cluster import KV_ALLOCATIONS, ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.policies import make_policy
from pdopt.sim import simulate
from pdopt.sim._closed_form import kv_blocks
from pdopt.sim._engine import Engine
from pdopt.sim._enums import MigrationPhase, Status
from pdopt.sim._kernel import Handler, Kernel
from pdopt.sim._kv import KvBlocks
from pdopt.testing.strategies import worker_limits
from pdopt.workload import PrefixBlocks, Workload

COST = CostModel(PrefillModel(50.0, 1e9, 1e13, 1.0, 5e-4), DecodeModel(5e-3, 1e-4, 1e-7))
PD_POLICIES = ["round_robin", "least_loaded", "phasor", "memory_centric", "cache_aware"]
MIXED_POLICIES = ["round_robin", "sarathi", "vllm", "least_loaded"]


def check_blocks(engine: Engine) -> None:
    """Every worker's KV partition at the current time (see the module docstring)."""
    now = engine.kernel.now
    t = engine.table
    held_for: dict[int, int] = {}
    for mig in engine.migrations.in_progress():
        held_for[mig.dst] = held_for.get(mig.dst, 0) + mig.held
        if mig.phase == MigrationPhase.STOPCOPY:
            held_for[mig.src] = held_for.get(mig.src, 0) + mig.src_held
    refs: dict[int, int] = {}
    for rid, (w, n) in engine.pinned.items():
        assert t.status[rid] == Status.PENDING, rid  # a request that ended holds nothing
        refs[w] = refs.get(w, 0) + n
    bt, win = engine.bt, engine.cluster.kv_window
    for w, (kv, d, p) in enumerate(zip(engine.kv, engine.decode, engine.prefill, strict=True)):
        assert d.kv is kv and p.kv is kv  # one owner per worker, shared by both sides
        used = d.used_blocks(now)
        prompts = sum(kv_blocks(t.prefill_tokens[r], bt, *win) for r in p.batch)
        assert kv.prompts == prompts, (w, kv, prompts)
        assert kv.held == held_for.get(w, 0), (w, kv, held_for)
        assert used >= 0 and kv.held >= 0 and kv.prompts >= 0, (w, kv, used)
        assert used <= kv.decode_limit or d.b == 0, (w, kv, used)
        free = kv.capacity - used - kv.held - kv.prompts
        assert free >= 0, (w, kv, used)  # never over capacity
        cached = min(kv.cached_blocks(), free)  # what lookups would still find in free space
        assert used + kv.held + kv.prompts + cached + (free - cached) == kv.capacity
        if kv.cache is not None:
            kv.cache.check()
            assert sum(kv.cache.refs.values()) == refs.get(w, 0)  # references are requests'


@contextlib.contextmanager
def checked_events() -> Iterator[list[int]]:
    """Run :func:`check_blocks` after the events of every instant of the runs inside (when the
    next event is later); yields how many checks ran."""
    count = [0]
    run, engine_run = Kernel.run, Engine.run

    def engine_run_checked(engine: Engine) -> None:
        def kernel_run(kernel: Kernel, handlers: tuple[Handler, ...]) -> None:
            def wrap(handler: Handler) -> Handler:
                def checked(now: float, seq: int, arg: int) -> None:
                    handler(now, seq, arg)
                    # NOTE: once every event of this instant ran: a decode boundary due now is
                    # counted in the closed form before its event (same time) processes it.
                    if not len(kernel) or kernel.next_time() > now:
                        check_blocks(engine)
                        count[0] += 1

                return checked

            run(kernel, [wrap(h) for h in handlers])

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Kernel, "run", kernel_run)
            engine_run(engine)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "run", engine_run_checked)
        yield count


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    """1–30 requests; with prefix blocks (3 groups sharing leading blocks) half the time."""
    n = draw(st.integers(1, 30))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    inputs = rng.integers(1, 400, n)
    blocks = None
    if draw(st.booleans()):
        group = rng.integers(0, 3, n)
        lists = [
            [int(g) * 100 + j for j in range(int(i) // 32)][:4]
            + [10_000 + 20 * k + j for j in range(max(int(i) // 32 - 4, 0))]
            for k, (g, i) in enumerate(zip(group, inputs, strict=True))
        ]
        blocks = PrefixBlocks.from_lists(lists, 32)
    arrival = np.cumsum(rng.exponential(draw(st.floats(0.001, 0.05)), n))
    return Workload(arrival, inputs, rng.integers(1, 80, n), prefix_blocks=blocks)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Workload, ClusterSpec, str]:
    common = dict(
        **draw(worker_limits(min_kv_blocks=4)),
        kv_bytes_per_token=1e4,
        link=LinkSpec("l", 1e9, 1e-4),
        kv_allocation=draw(st.sampled_from(KV_ALLOCATIONS)),
        prefix_caching=draw(st.booleans()),
    )
    kind = draw(st.sampled_from(["pd", "pd_standby", "hybrid", "prefill_first"]))
    if kind.startswith("pd"):
        n_mixed = 2 if kind == "pd_standby" else 0
        cluster = ClusterSpec.build(
            COST, draw(st.integers(1, 2)), draw(st.integers(1, 3)), n_mixed, **common
        )
        return draw(workloads()), cluster, draw(st.sampled_from(PD_POLICIES))
    cluster = ClusterSpec.build(
        COST, 0, 0, draw(st.integers(1, 3)), colocated_schedule=kind, chunk_tokens=64, **common
    )
    return draw(workloads()), cluster, draw(st.sampled_from(MIXED_POLICIES))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_block_is_used_held_reserved_or_free_once_at_every_event(
    case: tuple[Workload, ClusterSpec, str],
) -> None:
    wl, cluster, name = case
    with checked_events() as events:
        res = simulate(wl, cluster, make_policy(name), slo=Slo(1.0, 0.1), tick_s=0.01,
                       engine="python")  # fmt: skip
    assert events[0] > 0
    assert len(res.requests) == len(wl)


def test_counts_never_go_negative_or_over_capacity() -> None:
    kv = KvBlocks(10)
    kv.reserve_prompts(4)
    kv.commit_used(3)
    kv.reserve(2)
    assert (kv.free_blocks(), kv.decode_limit, kv.in_use(5)) == (1, 8, 11)
    kv.share_prompts(True)
    assert kv.decode_limit == 4 and kv.decode_capacity() == 6 and kv.prompt_room() == 3
    kv.release_prompts(4)
    assert kv.decode_limit == 8
    with pytest.raises(AssertionError):
        kv.release(3)  # more than it holds
    with pytest.raises(AssertionError):
        kv.commit_used(11)
