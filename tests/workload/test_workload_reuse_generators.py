"""Shared-prefix and multi-turn session generators: lengths, block identities, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import ParameterError
from pdopt.workload import (
    LognormalLengths,
    RateSchedule,
    Workload,
    piecewise_rate_arrivals,
    poisson_arrivals,
    session_workload,
    shared_prefix_workload,
)


def _shared(n: int = 200, seed: int = 3, **kw: object) -> Workload:
    options: dict[str, object] = {
        "num_system_prompts": 3,
        "system_prompt_tokens": 100,
        "users_per_system_prompt": 4,
        "question_tokens": 40,
        "output_tokens": 10,
        "block_tokens": 16,
        "seed": seed,
        **kw,
    }
    return shared_prefix_workload(poisson_arrivals(5.0, n_requests=n, seed=seed), **options)  # type: ignore[arg-type]


def _system_prompt_of(w: Workload) -> list[int]:
    """Requests grouped by their first block (the system prompt's)."""
    assert w.prefix_blocks is not None
    firsts = [int(w.prefix_blocks.of(i)[0]) for i in range(len(w))]
    ids = {h: k for k, h in enumerate(dict.fromkeys(firsts))}
    return [ids[h] for h in firsts]


def test_single_turn_shares_exactly_the_system_prompt_blocks() -> None:
    w = _shared()
    b = w.prefix_blocks
    assert b is not None and b.block_tokens == 16
    assert w.input_tokens.tolist() == [140] * len(w)
    assert b.counts().tolist() == [140 // 16] * len(w)
    groups = _system_prompt_of(w)
    assert sorted(set(groups)) == [0, 1, 2]
    keys = b.chained_keys().reshape(len(w), -1)
    for i in range(len(w)):
        for k in range(i):
            same = keys[i] == keys[k]
            # 100 // 16 = 6 system blocks shared within a system prompt, nothing else, ever
            assert same.tolist() == [groups[i] == groups[k]] * 6 + [False] * 2


def test_multi_turn_history_grows_and_is_reused() -> None:
    w = _shared(n=60, multi_turn=True)
    b = w.prefix_blocks
    assert b is not None
    keys = b.chained_keys()
    seen: set[int] = set()
    grew = 0
    for i in range(len(w)):
        row = keys[b.offsets[i] : b.offsets[i + 1]]
        hits = int(np.count_nonzero(np.isin(row, list(seen))))
        grew += int(w.input_tokens[i] > 140)
        if w.input_tokens[i] > 140:  # a later turn: its previous prompt's full blocks are reused
            previous = (int(w.input_tokens[i]) - 50 - 40) // 16
            assert hits >= previous
        seen.update(row.tolist())
    assert grew > 30  # 12 users, 60 requests: most are later turns
    # prompts are the system prompt + 50 tokens per earlier turn + the question
    assert set(((w.input_tokens - 140) % 50).tolist()) == {0}


def test_multi_turn_history_restarts_at_the_cap() -> None:
    w = _shared(n=100, multi_turn=True, max_input_tokens=400)
    assert int(w.input_tokens.max()) <= 400
    assert int(np.count_nonzero(w.input_tokens == 140)) > 12


def test_same_seed_same_workload_and_schedule_arrivals() -> None:
    assert _shared(seed=5) == _shared(seed=5)
    assert _shared(seed=5) != _shared(seed=6)
    schedule = RateSchedule((0.0, 10.0), (2.0, 8.0), 20.0)
    w = shared_prefix_workload(
        piecewise_rate_arrivals(schedule, seed=1),
        num_system_prompts=2,
        system_prompt_tokens=64,
        users_per_system_prompt=2,
        question_tokens=LognormalLengths.from_mean_median(80.0, 60.0),
        output_tokens=LognormalLengths.from_mean_median(30.0, 20.0),
        seed=1,
    )
    assert len(w) > 50 and len(set(w.input_tokens.tolist())) > 10


def test_sessions_turns_think_time_and_history() -> None:
    w = session_workload(
        poisson_arrivals(1.0, n_requests=30, seed=2),
        turns=4,
        think_time_s=10.0,
        question_tokens=24,
        output_tokens=8,
        system_prompt_tokens=32,
        seed=2,
    )
    assert len(w) == 120
    # turn k's prompt: 32 system + 32 per earlier turn + 24
    assert sorted(set(w.input_tokens.tolist())) == [56, 88, 120, 152]
    b = w.prefix_blocks
    assert b is not None
    keys = b.chained_keys()
    seen: set[int] = set()
    for i in range(len(w)):
        row = keys[b.offsets[i] : b.offsets[i + 1]]
        hits = int(np.count_nonzero(np.isin(row, list(seen))))
        expected = 2 if w.input_tokens[i] == 56 else (int(w.input_tokens[i]) - 32) // 16
        if i > 0:
            assert hits >= min(expected, len(row))
        seen.update(row.tolist())
    gaps = np.diff(np.sort(w.arrival_s))
    assert np.all(gaps >= 0)


def test_sessions_think_time_mean() -> None:
    w = session_workload(
        np.zeros(1), turns=2001, think_time_s=3.0, question_tokens=1, output_tokens=1, seed=4
    )
    assert np.mean(np.diff(w.arrival_s)) == pytest.approx(3.0, rel=0.08)
    zero = session_workload([0.0, 1.0], turns=3, think_time_s=0.0, question_tokens=4,
                            output_tokens=1)  # fmt: skip
    assert zero.arrival_s.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 64),
    st.integers(0, 100),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_blocks_never_exceed_the_prompt(
    n: int, block_tokens: int, system: int, multi: bool, seed: int
) -> None:
    w = shared_prefix_workload(
        np.arange(n, dtype=float),
        num_system_prompts=2,
        system_prompt_tokens=system,
        users_per_system_prompt=2,
        question_tokens=LognormalLengths(3.0, 1.0),
        output_tokens=5,
        multi_turn=multi,
        block_tokens=block_tokens,
        seed=seed,
    )
    assert w.prefix_blocks is not None
    assert w.prefix_blocks.counts().tolist() == (w.input_tokens // block_tokens).tolist()


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"num_system_prompts": 0}, "num_system_prompts"),
        ({"question_tokens": 0}, "question_tokens"),
        ({"question_tokens": True}, "question_tokens"),
        ({"block_tokens": 0}, "block_tokens"),
        ({"max_input_tokens": 0}, "max_input_tokens"),
    ],
)
def test_bad_parameters(kw: dict[str, object], name: str) -> None:
    with pytest.raises(ParameterError, match=name):
        _shared(**kw)
