"""Prefix caching on the compiled engine against the Python engine: identical results.

Each worker's cache (pdopt.sim._compiled._prefix) is one pool of entries behind an
open-addressing index, with an LRU ring per worker; the engine looks up, evicts, pins and
releases where the Python engine does (pdopt.sim._prefix_cache). Requests, events, time series
and workers frames (the cache's hit tokens, lookups and evictions among them) match bit for bit
on random workloads whose prompts share group prefixes, on disaggregated clusters under every
policy with a twin, the cache-aware routings included, and on all-mixed clusters under the
colocated policies; with small KV (evictions, preemptions) and prefix blocks that span several
KV blocks. A pool too small for a run hands the run to the Python engine, with the same result;
an LRU ring compacted and grown many times over keeps the LRU order (against an OrderedDict).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from numba import njit

from pdopt.cluster import ClusterSpec
from pdopt.policies import make_policy
from pdopt.sim import _simulate as simulate_module
from pdopt.sim import simulate
from pdopt.sim._compiled import _io
from pdopt.sim._compiled._jit import by_reference, keep, view_of
from pdopt.sim._compiled._prefix import (
    _KEPT,
    E_KEY,
    E_REFS,
    _add,
    _drop_entry,
    _evict,
    _find,
    _grow_lru,
    _lru_append,
    _lru_remove,
    cache_prompt,
    cached_tokens,
    hit_tokens,
    prefix_blocks,
    prefix_hit,
    prefix_take,
    release_prefix,
)
from pdopt.sim._compiled._state import (
    ENTRY_COLUMNS,
    G_HIDX_N,
    INDEX_COLUMNS,
    INDEX_SLOTS_PER_ENTRY,
    W_LRU_HEAD,
    W_LRU_N,
    W_LRU_TAIL,
)
from pdopt.sim._engine import Engine
from pdopt.sim._prefix_cache import PrefixCache
from pdopt.workload import PrefixBlocks, Workload
from tests.sim.test_sim_compiled import (
    COST,
    SLO,
    assert_identical,
    check_both_engines,
    client_timeouts,
    disaggregated_clusters,
    hypothesis_event,
    note_aborts,
)
from tests.sim.test_sim_compiled_colocated import mixed_clusters

HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
DISAGGREGATED = [
    ("round_robin", {}),
    ("least_loaded", {}),
    ("cache_aware", {"prefill_routing": "kv_aware"}),
    ("cache_aware", {"prefill_routing": "prefix_affinity"}),
    ("static_split", {}),
    ("min_load_tokens", {}),
    ("splitwise", {}),
    ("mooncake", {}),
    ("phasor", {}),
    ("arrow", {"colocated": False}),
    ("arrow", {}),
]
# their runs with client timeouts stay on the Python engine (pdopt.sim._simulate._no_timeouts)
TIMEOUTS_ON_PYTHON = ("arrow", "ecoserve")
MIXED = [
    ("vllm", {}),
    ("vllm", {"prefill_routing": "prefix_affinity"}),
    ("sarathi", {"prefill_routing": "kv_aware"}),
    ("sarathi", {"prefill_routing": "prefix_affinity", "chunk_tokens": 32}),
    ("sarathi", {}),
    ("min_load_tokens", {}),
]


@st.composite
def prefix_workloads(draw):
    """1–40 requests in 1–4 groups: each prompt starts with some of its group's shared blocks
    (0–6 of 8, 16 or 24 tokens), then 0–3 blocks of its own and a partial block's tokens;
    Poisson arrivals 1–50 ms apart, outputs of 1–39 tokens."""
    n = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    block = draw(st.sampled_from([8, 16, 24]))
    groups = draw(st.integers(1, 4))
    longest = draw(st.integers(0, 6))
    lists = []
    for i in range(n):
        g = int(rng.integers(groups))
        shared = int(rng.integers(0, longest + 1))
        own = int(rng.integers(0, 4))
        lists.append(
            [g * 100 + j for j in range(shared)] + [10_000 + 10 * i + j for j in range(own)]
        )
    inputs = np.array([len(b) * block + int(rng.integers(0, block)) for b in lists])
    inputs = np.maximum(inputs, 1)
    return Workload(
        np.cumsum(rng.exponential(draw(st.floats(0.001, 0.05)), n)),
        inputs,
        rng.integers(1, 40, n),
        prefix_blocks=PrefixBlocks.from_lists(lists, block),
    )


def run(driver, cluster, name, flags, record, tick_s, engine, timeout=None):
    return simulate(
        driver,
        cluster,
        make_policy(name, **flags),
        slo=SLO,
        record_timeseries=record,
        tick_s=tick_s,
        engine=engine,
        client_timeout_s=timeout,
    )


def check(driver, cluster, name, flags, record, tick_s, no_fallback, timeout=None):
    """Both engines identical (or refusing alike); the Python engine's result (None: refused).
    With ``timeout``, clients give up (their requests' cached blocks released wherever they
    are)."""
    python = check_both_engines(
        lambda engine: run(driver, cluster, name, flags, record, tick_s, engine, timeout),
        no_fallback,
    )
    if python is not None:
        hits = int(python.workers["prefix_hit_tokens"].sum())
        hypothesis_event("prefix hits" if hits else "no prefix hit")
        evicted = int(python.workers["prefix_evictions"].sum())
        hypothesis_event("evictions" if evicted else "no eviction")
        hypothesis_event("preemptions" if python.requests["preemptions"].sum() else "none")
    return python


@st.composite
def clusters_and_policies(draw):
    """A disaggregated cluster under a policy of :data:`DISAGGREGATED`, or an all-mixed one
    under a policy of :data:`MIXED`, its prefix caching on."""
    if draw(st.booleans()):
        cluster, policy = draw(disaggregated_clusters()), draw(st.sampled_from(DISAGGREGATED))
    else:
        cluster, policy = draw(mixed_clusters()), draw(st.sampled_from(MIXED))
    return dataclasses.replace(cluster, prefix_caching=True), policy


@settings(max_examples=140, deadline=None, suppress_health_check=HEALTH)
@given(
    prefix_workloads(),
    clusters_and_policies(),
    st.booleans(),
    st.sampled_from([0.001, 0.02]),
    client_timeouts(),
)
def test_compiled_prefix_cache_matches_the_python_engine(
    no_fallback, workload, cluster_policy, record, tick_s, timeout
):
    cluster, policy = cluster_policy
    if policy[0] in TIMEOUTS_ON_PYTHON:
        timeout = None
    python = check(workload, cluster, *policy, record, tick_s, no_fallback, timeout)
    if python is not None:
        note_aborts(python)


def _shared_burst(n: int, seed: int) -> Workload:
    """``n`` requests of 24–40 blocks of 16 tokens over 5 group prefixes (16 shared blocks),
    arriving faster than two workers serve them: queues, evictions and preemptions."""
    rng = np.random.default_rng(seed)
    lists = []
    for i in range(n):
        g = int(rng.integers(5))
        own = int(rng.integers(8, 25))
        lists.append([g * 1000 + j for j in range(16)] + [100_000 + 50 * i + j for j in range(own)])
    inputs = np.array([16 * len(b) + 5 for b in lists])
    return Workload(
        np.sort(rng.uniform(0, n / 60.0, n)),
        inputs,
        rng.integers(2, 120, n),
        prefix_blocks=PrefixBlocks.from_lists(lists, 16),
    )


@pytest.mark.parametrize(
    ("kind", "name", "flags"),
    [
        ("pd", "cache_aware", {"prefill_routing": "kv_aware"}),
        ("pd", "cache_aware", {"prefill_routing": "prefix_affinity"}),
        ("pd", "phasor", {}),
        ("mixed", "sarathi", {"prefill_routing": "kv_aware"}),
        ("mixed", "vllm", {"prefill_routing": "prefix_affinity"}),
    ],
)
def test_compiled_prefix_cache_matches_under_overload(kind, name, flags, no_fallback):
    if kind == "pd":
        cluster = ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=400, prefix_caching=True)
    else:
        cluster = ClusterSpec.build(
            COST, 0, 0, 2, kv_capacity_blocks=400, chunk_tokens=256, prefix_caching=True
        )
    python = check(_shared_burst(400, 7), cluster, name, flags, True, 0.02, no_fallback)
    assert python is not None
    assert python.workers["prefix_hit_tokens"].sum() > 0  # the cache served prompts
    assert python.workers["prefix_evictions"].sum() > 0  # and ran out of room
    assert python.requests["preemptions"].sum() > 0


def test_an_index_that_starts_with_room_for_one_entry_grows_and_matches(no_fallback, monkeypatch):
    # the index doubles through a whole run (4 slots at first, thousands of entries later)
    monkeypatch.setattr(_io, "FIRST_INDEX_ENTRIES", 1)
    cluster = ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=400, prefix_caching=True)
    policy = ("cache_aware", {"prefill_routing": "kv_aware"})
    python = check(_shared_burst(400, 7), cluster, *policy, True, 0.02, no_fallback)
    assert python is not None and python.workers["prefix_evictions"].sum() > 0


def test_a_pool_too_small_hands_the_run_to_the_python_engine(monkeypatch):
    cluster = ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=400, prefix_caching=True)
    workload = _shared_burst(120, 3)
    policy = ("cache_aware", {"prefill_routing": "kv_aware"})
    python = run(workload, cluster, *policy, False, 0.05, "python")
    handed = []
    real = simulate_module._simulate_python
    monkeypatch.setattr(
        simulate_module,
        "_simulate_python",
        lambda *a, **k: handed.append(True) or real(*a, **k),
    )
    monkeypatch.setattr(_io, "cache_entries", lambda cluster, keys, per_block: 4)
    compiled = run(workload, cluster, *policy, False, 0.05, "compiled")
    assert handed == [True]
    assert_identical(python, compiled)


@pytest.mark.parametrize(("records", "prefix_tokens"), [(512, 16), (1, 16), (1, 8), (0, 8)])
def test_a_small_lru_ring_compacts_and_grows_through_a_run_and_matches(
    records, prefix_tokens, no_fallback, monkeypatch
):
    # 512 records for at most 400 unreferenced blocks: struck-out records fill the ring, which
    # is compacted and (over half full after that) doubled; a ring of one record doubles as
    # blocks are released; with 8-token prefix blocks in 16-token KV blocks a worker holds up to
    # two unreferenced prefix blocks per KV block, more than the ring sized from its KV's blocks
    # holds (0: the run's own ring, the case that fell back to the Python engine before rings grew)
    if records:
        monkeypatch.setattr(_io, "lru_ring", lambda cluster, per_block: records)
    cluster = ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=400, prefix_caching=True)
    workload = _shared_burst(400, 7)
    if prefix_tokens != 16:
        pb = workload.prefix_blocks
        halves = np.repeat(pb.hashes, 2) * 2 + np.tile([0, 1], len(pb.hashes))
        workload = dataclasses.replace(
            workload, prefix_blocks=PrefixBlocks(2 * pb.offsets, halves, prefix_tokens)
        )
    policy = ("cache_aware", {"prefill_routing": "kv_aware"})
    python = check(workload, cluster, *policy, True, 0.02, no_fallback)
    assert python is not None and python.workers["prefix_evictions"].sum() > 0


@njit
def _lru_keys(s, w, out):
    """The keys of ``w``'s LRU ring's live records, least recent first, into ``out`` (as many as
    it holds); how many there are."""
    lru = s.lru
    n = 0
    for pos in range(s.wi[w, W_LRU_HEAD], s.wi[w, W_LRU_TAIL]):
        e = lru[w, pos & (lru.shape[1] - 1)]
        if e >= 0:
            if n < out.shape[0]:
                out[n] = s.ent[e, E_KEY]
            n += 1
    return n


@njit
def _lru_run(state, n_keys, ops):
    """Cache keys ``0..n_keys-1`` on worker 0, then apply ``ops`` rows (0: append key, 1: remove
    key, 2: evict down to ``x``) to its LRU ring, growing the rings when an append asks for it
    (as the engine's kernels do); after each, the keys listed from least recent (-1 padded);
    then how many times the rings grew (-1: the count disagreed with the records)."""
    ref = by_reference(state)
    s = view_of(ref)
    entry = np.empty(n_keys, np.int64)
    for k in range(n_keys):
        entry[k] = _add(s, k, 0)
    listed = np.full((ops.shape[0], n_keys), -1, np.int64)
    grown = 0
    for i in range(ops.shape[0]):
        kind, x = ops[i, 0], ops[i, 1]
        if kind == 0:
            while not _lru_append(s.ent, s.wi, s.lru, 0, entry[x]):
                _grow_lru(s)
                grown += 1
        elif kind == 1:
            _lru_remove(s.ent, s.wi, s.lru, 0, entry[x])
        else:
            _evict(s.hidx, s.ent, s.wi, s.g, s.lru, 0, x)
        if _lru_keys(s, 0, listed[i]) != s.wi[0, W_LRU_N]:
            grown = -1
            break
    keep(ref)
    return listed, grown


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8, 16]),
    st.lists(st.tuples(st.sampled_from([0, 0, 1, 1, 2]), st.integers(0, 23)), max_size=150),
)
# a full ring with a struck-out record compacts (key 1 moves from position 1 to 0), then a
# moved record is struck out through its new position
@example(4, [(0, 0), (0, 0), (1, 0), (0, 1), (0, 1), (0, 1), (1, 1)])
def test_the_lru_ring_keeps_the_order_an_ordered_dict_keeps(ring, draws):
    # appends, removals (a reference taken or a lookup's hit set aside) and evictions of up to
    # two blocks, on a ring of 1 to 16 records: struck-out records, compactions, wrap-around,
    # and rings that grow when compacting leaves them over half full
    from collections import OrderedDict

    n_keys = 24
    model: OrderedDict[int, None] = OrderedDict()
    dropped: set[int] = set()
    ops, expected = [], []
    for kind, x in draws:  # the x-th key the reference's cache could make the call for
        if kind == 0:
            can = [k for k in range(n_keys) if k not in model and k not in dropped]
        elif kind == 1:
            can = list(model)
        if kind != 2 and not can:
            continue
        ops.append((kind, can[x % len(can)] if kind != 2 else max(0, len(model) - x % 3)))
        if kind == 0:
            model[ops[-1][1]] = None
        elif kind == 1:
            del model[ops[-1][1]]
        else:
            while len(model) > ops[-1][1]:
                dropped.add(model.popitem(last=False)[0])
        expected.append(list(model) + [-1] * (n_keys - len(model)))
    s = _state(64, entries=n_keys)._replace(lru=np.zeros((2, ring), np.int32))
    listed, grown = _lru_run(s, n_keys, np.array(ops, np.int64).reshape(-1, 2))
    assert grown >= 0  # the live count is the records'
    np.testing.assert_array_equal(listed, np.array(expected).reshape(-1, n_keys))
    most = max((sum(k >= 0 for k in row) for row in expected), default=0)
    assert ring << grown >= most  # it grew as far as the live records needed


def test_cache_off_or_no_blocks_runs_compiled_as_without_a_cache(no_fallback):
    workload = _shared_burst(60, 1)
    plain = dataclasses.replace(workload, prefix_blocks=None)
    cluster = ClusterSpec.build(COST, 2, 2, kv_capacity_blocks=400)
    no_fallback["compiled"] = True
    base = run(plain, cluster, "least_loaded", {}, False, 0.05, "compiled")
    for driver, caching in ((workload, False), (plain, True)):
        spec = dataclasses.replace(cluster, prefix_caching=caching)
        res = run(driver, spec, "least_loaded", {}, False, 0.05, "compiled")
        assert_identical(base, res)
        assert "prefix_hit_tokens" not in res.workers


KEYS = np.arange(-20, 21)  # the keys the index test draws, on workers 0 and 1


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.lists(
        st.tuples(st.booleans(), st.sampled_from(KEYS.tolist()), st.integers(0, 1)), max_size=200
    ),
)
def test_the_cache_index_finds_exactly_the_keys_added_and_not_dropped(log2_slots, ops):
    # a tiny index that doubles as entries arrive: long probe runs that wrap around, deletions
    # that shift entries back, rehashing; one key on both workers is two entries
    s = _state(1 << log2_slots, entries=2 * len(KEYS))  # room for every pair
    rows = np.array([(int(add), key, worker) for add, key, worker in ops], np.int64)
    found, entries, n_live, slots = _index_run(s, rows.reshape(-1, 3), KEYS)
    np.testing.assert_array_equal(found, entries)  # each pair finds the entry its add made
    cached: set[tuple[int, int]] = set()  # the model: the (key, worker) pairs cached
    most = 0  # the most pairs cached at once
    for i, (add, key, worker) in enumerate(ops):
        (cached.add if add else cached.discard)((key, worker))
        most = max(most, len(cached))
        expected = np.array([[(k, w) in cached for w in (0, 1)] for k in KEYS.tolist()])
        np.testing.assert_array_equal(found[i] >= 0, expected)
    assert n_live == len(cached) and INDEX_SLOTS_PER_ENTRY * n_live <= slots
    grew = INDEX_SLOTS_PER_ENTRY * most > 1 << log2_slots
    assert (slots > 1 << log2_slots) == grew  # it grew when it had to


@njit
def _index_run(state, ops, keys):
    """Apply ``ops`` rows (add?, key, worker) to ``state``'s index (an add of a cached pair and a
    drop of an uncached one do nothing), recording after each the entry each (key, worker) of
    ``keys`` finds and the one its add returned (-1: none); then the entries counted and the
    slots."""
    ref = by_reference(state)
    s = view_of(ref)  # as the engine's functions get it
    entry = np.full((keys.shape[0], 2), -1, np.int64)
    found = np.empty((ops.shape[0], keys.shape[0], 2), np.int64)
    added = np.empty((ops.shape[0], keys.shape[0], 2), np.int64)
    for i in range(ops.shape[0]):
        add, key, w = ops[i, 0], ops[i, 1], ops[i, 2]
        k = key - keys[0]
        if add and entry[k, w] < 0:
            entry[k, w] = _add(s, key, w)
        elif not add and entry[k, w] >= 0:
            _drop_entry(s.hidx, s.ent, s.wi, s.g, w, entry[k, w])
            entry[k, w] = -1
        for j in range(keys.shape[0]):
            for v in range(2):
                found[i, j, v] = _find(s.hidx, keys[j], v)
        added[i] = entry
    out = found, added, s.g[G_HIDX_N], s.hidx.shape[0]
    keep(ref)
    return out


def _state(slots, entries):
    """A run's State (two workers) with an empty prefix cache of ``slots`` index slots and
    ``entries``."""
    workload = Workload([0.0], [32], [2], prefix_blocks=PrefixBlocks.from_lists([[1, 2]], 16))
    cluster = ClusterSpec.build(COST, 1, 1, prefix_caching=True)
    table, _, _ = simulate_module._load_driver(workload, 0)
    s = _io.pack(table, cluster, (1, 1, 0, ()), 0.05, False, None)
    return s._replace(
        hidx=np.full((slots, INDEX_COLUMNS), -1, np.int64),
        ent=_io.aligned_zeros(entries, ENTRY_COLUMNS),
    )


def test_every_runs_state_has_the_warm_steps_numba_type():
    # a workload's prefix offsets are read-only; a State holding them as they are would be a
    # new numba type, and the run would compile the engine again instead of loading it
    from numba import typeof

    frozen = Workload(
        [0.0, 0.1], [32, 40], [2, 3], prefix_blocks=PrefixBlocks.from_lists([[1, 2], [1]], 16)
    )
    plain = Workload([0.0, 0.1], [32, 40], [2, 3])
    states = []
    for workload, caching in ((frozen, True), (frozen, False), (plain, False)):
        cluster = ClusterSpec.build(COST, 1, 1, prefix_caching=caching)
        table, _, _ = simulate_module._load_driver(workload, 0)
        states.append(_io.pack(table, cluster, (1, 1, 0, ()), 0.05, False, None))
    assert len({typeof(s) for s in states}) == 1


@njit
def _calls_run(state, ops, keys, most):
    """Apply ``ops`` rows (kind, worker, request, free blocks) as the engine calls the cache (0:
    a prefill's lookup with references, prefix_hit; 1: a batch's later prompt, prefix_blocks
    then prefix_take; 2: cache_prompt; 3: release_prefix; 4: cached_tokens; 5: a batch's prompt
    that does not fit after its lookup, prefix_blocks alone), recording after
    each its value, each worker's LRU keys (least recent first, at most ``most``) and their
    count, each (key, worker)'s references (-2: not cached) and how many entries are left set
    aside."""
    ref = by_reference(state)
    s = view_of(ref)
    n_w = s.wi.shape[0]
    values = np.zeros(ops.shape[0], np.int64)
    listed = np.zeros((ops.shape[0], n_w, most), np.int64)
    counts = np.zeros((ops.shape[0], n_w), np.int64)
    refs = np.full((ops.shape[0], n_w, keys.shape[0]), -2, np.int64)
    aside = np.zeros(ops.shape[0], np.int64)
    for i in range(ops.shape[0]):
        kind, w, rid, free = ops[i, 0], ops[i, 1], ops[i, 2], ops[i, 3]
        if kind == 0:
            values[i] = prefix_hit(s, w, rid, free)
        elif kind == 1:
            n = prefix_blocks(s, w, rid, free)
            values[i] = hit_tokens(s, rid, n)
            prefix_take(s, w, rid, n, values[i])
        elif kind == 2:
            cache_prompt(s, w, rid)
        elif kind == 3:
            release_prefix(s, rid)
        elif kind == 4:
            values[i] = cached_tokens(s, w, rid)
        else:
            values[i] = hit_tokens(s, rid, prefix_blocks(s, w, rid, free))
        ent = s.ent
        for v in range(n_w):
            counts[i, v] = _lru_keys(s, v, listed[i, v])
            for k in range(keys.shape[0]):
                e = _find(s.hidx, keys[k], v)
                if e >= 0:
                    refs[i, v, k] = ent[e, E_REFS]
                    aside[i] += ent[e, E_REFS] == _KEPT
    keep(ref)
    return values, listed, counts, refs, aside


class _EngineCache:
    """The Python engine's calls of the cache (Engine.prefix_hit, cached_tokens, cache_prompt,
    release_prefix), run on a packed table without the rest of the engine."""

    prefix_hit = Engine.prefix_hit
    cached_tokens = Engine.cached_tokens
    cache_prompt = Engine.cache_prompt
    release_prefix = Engine.release_prefix
    _hit_tokens = Engine._hit_tokens

    def __init__(self, table, n_workers, per_block):
        self.table = table
        self.kv = [PrefixCache(per_block) for _ in range(n_workers)]
        self.caches = self.kv  # the counters live on the same objects
        self.pinned: dict[int, tuple[int, int]] = {}


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 50),
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 1), st.integers(0, 3), st.integers(0, 12)),
        max_size=120,
    ),
    st.sampled_from([1, 2, 64]),
)
# a prompt cached, released, then looked up again with references: its hits are set aside
# through the lookup and handed to the references (prefix_hit), or put back and then taken
@example(3, [(0, 0, 1, 40), (2, 0, 1, 0), (3, 0, 1, 0), (0, 0, 1, 5)], 64)
@example(3, [(0, 0, 1, 40), (2, 0, 1, 0), (3, 0, 1, 0), (1, 0, 1, 5), (3, 0, 1, 0)], 1)
@example(3, [(0, 0, 1, 40), (2, 0, 1, 0), (3, 0, 1, 0), (5, 0, 1, 5), (4, 0, 1, 0)], 2)
def test_each_call_leaves_the_cache_as_the_python_engines_does(seed, draws, records):
    # the references, the lookups' evictions, the hits set aside and handed to the references
    # (prefix_hit) or put back (prefix_blocks), releases and re-prefills on the same or another
    # worker, on rings that start small and grow: after every call the same LRU order, the same
    # references, and no hit left set aside
    workload = _shared_burst(8, seed)
    cluster = ClusterSpec.build(COST, 1, 1, prefix_caching=True)
    table, _, _ = simulate_module._load_driver(workload, 0)
    s = _io.pack(table, cluster, (1, 1, 0, ()), 0.05, False, None)
    s = s._replace(lru=np.zeros((2, records), np.int32))
    model = _EngineCache(table, 2, int(s.pblocks))
    ops, expected = [], []
    for kind, w, rid, free in draws:
        value = 0
        if kind == 0:
            value = model.prefix_hit(w, rid, free, True)
        elif kind == 1:
            value = model.prefix_hit(w, rid, free, False)
            assert model.prefix_hit(w, rid, free, True) == value
        elif kind == 2:  # a prefill ends where its references were taken
            if rid not in model.pinned:
                continue
            w = model.pinned[rid][0]
            model.cache_prompt(w, rid)
        elif kind == 3:
            model.release_prefix(rid)
        elif kind == 4:
            value = model.cached_tokens(w, rid)
        else:
            value = model.prefix_hit(w, rid, free, False)
        ops.append((kind, w, rid, free))
        expected.append((value, [list(c.lru) for c in model.kv], [dict(c.refs) for c in model.kv]))
    keys = np.unique(s.pkeys)
    most = len(keys)
    values, listed, counts, refs, aside = _calls_run(
        s, np.array(ops, np.int64).reshape(-1, 4), keys, most
    )
    assert not aside.any()
    for i, (value, lru, held) in enumerate(expected):
        assert values[i] == value
        for v in range(2):
            assert listed[i, v, : counts[i, v]].tolist() == lru[v]
            assert refs[i, v].tolist() == [held[v].get(k, -2) for k in keys.tolist()]
    event = "evicted" if sum(c.evictions for c in model.kv) else "nothing evicted"
    hypothesis_event(event)
