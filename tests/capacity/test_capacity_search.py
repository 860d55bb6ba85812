"""The bracketing + bisection search on criteria with known thresholds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdopt.capacity._search import Probe, largest_meeting
from pdopt.errors import ParameterError


def threshold(t: float):  # type: ignore[no-untyped-def]
    return lambda x: Probe(x, x <= t, {"x": x})


@given(t=st.floats(1e-3, 1e4), start=st.floats(0.01, 100), tol=st.floats(1e-4, 0.2))
def test_continuous_search_brackets_the_threshold(t: float, start: float, tol: float) -> None:
    out = largest_meeting(threshold(t), start=start, rel_tol=tol, min_value=1e-9)
    lo, hi = out.bracket
    assert out.status == "ok"
    assert lo == out.best <= t < hi
    assert hi - lo <= tol * lo
    frame = out.frame()
    assert list(frame.columns[:2]) == ["value", "meets"]
    assert frame["meets"].tolist() == [v <= t for v in frame["value"]]


@given(t=st.integers(1, 5000), start=st.integers(1, 300))
def test_integer_search_finds_the_exact_threshold(t: int, start: int) -> None:
    out = largest_meeting(threshold(t), start=start, integer=True)
    assert out.status == "ok"
    assert out.best == t and out.bracket == (t, t + 1)
    assert all(float(v).is_integer() for v in out.frame()["value"])


def test_statuses_when_nothing_or_everything_meets() -> None:
    below = largest_meeting(threshold(-1.0), start=1.0, min_value=1e-3)
    assert below.status == "below_min" and below.best == 0.0
    above = largest_meeting(threshold(1e9), start=1.0, max_value=64.0)
    assert above.status == "above_max" and above.best == 64.0
    budget = largest_meeting(threshold(3.3), start=1.0, rel_tol=1e-12, max_evaluations=6)
    assert budget.status == "max_evaluations" and len(budget.probes) == 6
    assert budget.bracket[0] <= 3.3 < budget.bracket[1]


def test_search_parameter_errors() -> None:
    with pytest.raises(ParameterError, match="The 'rel_tol' parameter of largest_meeting"):
        largest_meeting(threshold(1.0), start=1.0, rel_tol=0.0)
