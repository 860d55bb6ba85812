"""The Workload table: validation messages, stats, window, scale_rate."""

from __future__ import annotations

import numpy as np
import pytest

from pdopt.errors import InputError, ParameterError
from pdopt.workload import Workload


def _small() -> Workload:
    return Workload([0.0, 1.0, 1.0, 3.0, 6.0], [10, 20, 30, 40, 50], [1, 2, 3, 4, 5], name="w")


def test_columns_are_typed_read_only_copies() -> None:
    arrival = np.array([0.0, 1.0])
    inputs = np.array([5, 6])
    w = Workload(arrival, inputs, [1.0, 2.0])
    assert w.arrival_s.dtype == np.float64 and w.output_tokens.dtype == np.int64
    assert w.output_tokens.tolist() == [1, 2]
    with pytest.raises(ValueError):
        w.input_tokens[0] = 9
    # The caller's arrays stay writable: Workload copies before freezing.
    arrival[0] = 0.5
    inputs[0] = 7
    assert w.arrival_s[0] == 0.0 and w.input_tokens[0] == 5


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (([0.0, 1.0], [1, 0], [1, 1]), "w: input_tokens[1]=0 must be >= 1"),
        (([0.0, 1.0], [1, 1], [1, -2]), "w: output_tokens[1]=-2 must be >= 1"),
        (([0.0, 1.0], [1.5, 1], [1, 1]), "w: input_tokens[0]=1.5 must be a whole number"),
        (([0.0, 1.0], [1, np.nan], [1, 1]), "w: input_tokens[1]=nan must be a finite number"),
        (([-1.0, 1.0], [1, 1], [1, 1]), "w: arrival_s[0]=-1.0 must be >= 0"),
        (([0.0, np.inf], [1, 1], [1, 1]), "w: arrival_s[1]=inf must be a finite number"),
        (([0.0, 2.0, 1.0], [1, 1, 1], [1, 1, 1]), "w: arrival_s[2]=1.0 is before arrival_s[1]=2.0"),
        (
            ([0.0, 1.0], [1, 1], [1]),
            "w: columns have different lengths: arrival_s=2, input_tokens=2, output_tokens=1",
        ),
        ((["a"], [1], [1]), "w: arrival_s must be numeric seconds"),
        (([0.0], [True], [1]), "w: input_tokens must be numeric, got dtype bool"),
    ],
)
def test_validation_messages(columns: tuple[list[object], ...], message: str) -> None:
    with pytest.raises(InputError) as info:
        Workload(*columns, name="w")  # type: ignore[arg-type]
    assert str(info.value).startswith(message)


def test_message_counts_further_bad_rows() -> None:
    with pytest.raises(InputError, match=r"input_tokens\[0\]=0 must be >= 1 \(2 more rows"):
        Workload([0.0, 1.0, 2.0], [0, -1, 0], [1, 1, 1])


def test_from_unsorted_sorts_stably() -> None:
    w = Workload.from_unsorted([2.0, 1.0, 2.0, 0.0], [1, 2, 3, 4], [5, 6, 7, 8])
    assert w.arrival_s.tolist() == [0.0, 1.0, 2.0, 2.0]
    assert w.input_tokens.tolist() == [4, 2, 1, 3]  # ties keep file order
    assert w.output_tokens.tolist() == [8, 6, 5, 7]


def test_stats_closed_form() -> None:
    w = _small()
    stats = w.stats()
    gaps = np.array([1.0, 0.0, 2.0, 3.0])
    assert stats["requests"] == 5
    assert stats["duration_s"] == 6.0
    assert stats["rate_per_s"] == pytest.approx(4 / 6)
    # Sample standard deviation (ddof=1), as the data README defines it.
    assert stats["interarrival_cv"] == pytest.approx(gaps.std(ddof=1) / gaps.mean())
    assert stats["input_tokens_mean"] == 30
    assert stats["input_tokens_p50"] == 30
    assert stats["input_tokens_p90"] == pytest.approx(46.0)
    assert stats["output_tokens_max"] == 5
    assert stats.name == "w"


def test_stats_of_tiny_workloads_are_nan_not_errors() -> None:
    empty = Workload([], [], [])
    assert len(empty) == 0 and empty.duration_s == 0.0
    assert np.isnan(empty.stats()["rate_per_s"])
    assert np.isnan(empty.stats()["input_tokens_mean"])
    one = Workload([3.0], [1], [1])
    assert np.isnan(one.stats()["interarrival_cv"]) and one.stats()["input_tokens_max"] == 1


def test_window_is_half_open_and_keeps_times() -> None:
    w = _small()
    part = w.window(1.0, 6.0)
    assert part.arrival_s.tolist() == [1.0, 1.0, 3.0]
    assert part.input_tokens.tolist() == [20, 30, 40]
    assert len(w.window(7.0, 9.0)) == 0
    assert len(w.window(5.0, 1.0)) == 0


def test_scale_rate_compresses_time() -> None:
    w = _small()
    fast = w.scale_rate(2.0)
    assert fast.arrival_s.tolist() == [0.0, 0.5, 0.5, 1.5, 3.0]
    assert fast.rate_per_s == pytest.approx(2 * w.rate_per_s)
    assert fast.stats()["interarrival_cv"] == pytest.approx(w.stats()["interarrival_cv"])
    assert np.array_equal(fast.input_tokens, w.input_tokens)
    with pytest.raises(ParameterError, match=r"The 'factor' parameter of Workload\.scale_rate"):
        w.scale_rate(0.0)


def test_equality_shift_and_frame() -> None:
    w = _small()
    assert w == Workload(w.arrival_s, w.input_tokens, w.output_tokens, name="w")
    assert w != Workload(w.arrival_s, w.input_tokens, w.output_tokens, name="other")
    assert w != w.scale_rate(2.0)
    shifted = Workload([2.0, 3.0], [1, 2], [1, 1]).shifted_to_zero()
    assert shifted.arrival_s.tolist() == [0.0, 1.0]
    frame = w.to_frame()
    assert list(frame.columns) == ["arrival_s", "input_tokens", "output_tokens"]
    assert frame["input_tokens"].tolist() == [10, 20, 30, 40, 50]
    with pytest.raises(TypeError, match="slicing only"):
        w[0]  # type: ignore[index]


@pytest.mark.parametrize(
    "tokens", [[1.0, 1e20], np.array([1, 2**64 - 1], dtype=np.uint64), [1, 2**53]]
)
def test_a_token_count_too_large_is_refused_not_wrapped(tokens: object) -> None:
    with pytest.raises(InputError, match=r"w: input_tokens\[1\]=\S+ must be <= 9007199254740991"):
        Workload([0.0, 1.0], tokens, [1, 1], name="w")  # type: ignore[arg-type]
