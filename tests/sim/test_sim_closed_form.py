"""The decode closed forms (pdopt.sim._closed_form) against brute force, and their one source."""

from __future__ import annotations

import math
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from pdopt.sim import _closed_form as cf

segments = st.tuples(
    st.floats(0.0, 100.0),  # t_seg
    st.floats(1e-3, 0.1),  # a_seg
    st.sampled_from([0.0, 1e-7, 1e-5, 3e-4]),  # half_d2b
)


@given(segments, st.floats(-1.0, 5.0))
def test_boundaries_before_and_first_boundary_after_match_stepping(segment, dt):
    t = segment[0] + dt
    k = 0
    while cf.boundary_time(*segment, k + 1) <= t:
        k += 1
    assert cf.boundaries_before(*segment, t) == k
    first = cf.first_boundary_after(*segment, t)
    assert first >= 1 and cf.boundary_time(*segment, first) >= t
    assert first == 1 or cf.boundary_time(*segment, first - 1) < t


@given(
    st.integers(1, 16).flatmap(
        lambda bt: st.tuples(st.just(bt), st.lists(st.integers(0, 3), min_size=bt, max_size=bt))
    ),
    st.integers(0, 200),
    st.integers(-5, 100),
    st.integers(0, 60),
)
def test_growth_and_first_growth_failure_match_counting_each_boundary(phases, m1, length, free):
    bt, cnt = phases
    b = sum(cnt)
    per_boundary = [cnt[m % bt] for m in range(m1, m1 + max(length, 0))]
    assert cf.growth(cnt, b, bt, m1, m1 + length - 1) == sum(per_boundary)
    if b:
        m, acc = m1, 0
        while acc <= free:
            m += 1
            acc += cnt[m % bt]
        assert cf.first_growth_failure(cnt, b, bt, m1, free) == m


@given(
    segments,
    st.floats(-1.0, 5.0),
    st.integers(1, 16).flatmap(
        lambda bt: st.tuples(st.just(bt), st.lists(st.integers(0, 3), min_size=bt, max_size=bt))
    ),
    st.integers(0, 50),
    st.integers(0, 500),
    st.floats(0.0, 1.0),
)
def test_used_blocks_holds_over_its_span(segment, dt, phases, n_seg, u_seg, where):
    bt, cnt = phases
    b = sum(cnt)
    t = segment[0] + dt
    used, since, until = cf.used_blocks_span(cnt, b, bt, n_seg, u_seg, *segment, t)
    assert since <= t < until
    assert used == cf.used_blocks(cnt, b, bt, n_seg, u_seg, *segment, t)
    # anywhere in the span, and at its ends, the boundary count (so the blocks) is the same
    lo = since if math.isfinite(since) else t - 10.0
    hi = math.nextafter(until, -math.inf) if math.isfinite(until) else t + 10.0
    for x in (lo, hi, lo + (hi - lo) * where):
        assert cf.used_blocks(cnt, b, bt, n_seg, u_seg, *segment, x) == used
    if b and math.isfinite(until):  # and no longer: the next boundary falls at its end
        assert cf.boundaries_before(*segment, until) > cf.boundaries_before(*segment, t)


@given(
    segments,
    st.floats(-1.0, 5.0),
    st.lists(st.integers(0, 400), min_size=0, max_size=6),
    st.sampled_from([(16, 128, 18, 36), (4, 8, 1, 2), (16, 64, 2, 2)]),
    st.integers(0, 50),
    st.integers(0, 500),
    st.floats(0.0, 1.0),
)
def test_window_used_blocks_holds_over_its_span(segment, dt, offsets, win, n_seg, u_seg, where):
    """The compiled engine keeps a sliding window's used blocks over this span, as without."""
    bt, window, sliding, layers = win
    b = len(offsets)
    t = segment[0] + dt
    args = (offsets, b, bt, window, sliding, layers, n_seg, u_seg, *segment)
    used, since, until = cf.window_used_blocks_span(*args, t)
    assert since <= t < until
    assert used == cf.window_used_blocks(*args, t)
    lo = since if math.isfinite(since) else t - 10.0
    hi = math.nextafter(until, -math.inf) if math.isfinite(until) else t + 10.0
    for x in (lo, hi, lo + (hi - lo) * where):
        assert cf.window_used_blocks(*args, x) == used
    if b and math.isfinite(until):
        assert cf.boundaries_before(*segment, until) > cf.boundaries_before(*segment, t)


def test_a_first_boundary_that_rounds_onto_the_segment_start_is_outside_the_span():
    # a_seg below half an ulp of t_seg: boundary 1 falls on t_seg in floating point, where
    # boundaries_before answers 0, while just after t_seg it answers 1
    segment = (1e6, 1e-12, 1e-7)
    assert cf.boundary_time(*segment, 1) == segment[0]
    t = math.nextafter(segment[0], math.inf)
    cnt = [1] + [0] * 15  # one request, growing at phase 0
    used, since, until = cf.used_blocks_span(cnt, 1, 16, 15, 10, *segment, t)
    assert cf.boundaries_before(*segment, t) == 1 and cf.boundaries_before(*segment, since) == 1
    assert segment[0] < since <= t < until and used == 11
    assert cf.used_blocks(cnt, 1, 16, 15, 10, *segment, segment[0]) == 10


def test_the_compiled_engine_compiles_the_same_code_objects():
    """One source: each compiled leaf is built from the plain function's code object, and the
    closed-form module itself imports no numba (the Python engine runs without it)."""
    from pdopt.sim._compiled import _jit

    for name in ("boundary_time", "boundaries_before", "growth", "used_blocks"):
        assert getattr(_jit, name).py_func.__code__ is getattr(cf, name).__code__
    code = "import sys, pdopt.sim._closed_form, pdopt.sim._decode; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
