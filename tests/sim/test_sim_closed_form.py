"""The decode closed forms (pdopt.sim._closed_form) against brute force, and their one source."""

from __future__ import annotations

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


def test_the_compiled_engine_compiles_the_same_code_objects():
    """One source: each compiled leaf is built from the plain function's code object, and the
    closed-form module itself imports no numba (the Python engine runs without it)."""
    from pdopt.sim._compiled import _jit

    for name in ("boundary_time", "boundaries_before", "growth", "used_blocks"):
        assert getattr(_jit, name).py_func.__code__ is getattr(cf, name).__code__
    code = "import sys, pdopt.sim._closed_form, pdopt.sim._decode; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
