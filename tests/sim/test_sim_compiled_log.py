"""The compiled engine's event log (pdopt.sim._compiled._heap.put_log): the handlers append
entries to State arrays that double when full, and _io words them. The events frames of every
compiled test compare the log with the Python engine's; here: a migration's bytes keep their
exact float64 bits, and a log that starts with no room grows, with the same result."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.cluster import ClusterSpec
from pdopt.policies import make_policy
from pdopt.sim import _simulate as simulate_module
from pdopt.sim import simulate
from pdopt.sim._compiled import _io
from pdopt.sim._compiled._heap import float_bits
from pdopt.workload import Workload
from tests.sim.test_sim_compiled import COST, SLO, assert_identical


@settings(deadline=None)  # the first example compiles float_bits (it is not in the warm step)
@given(st.one_of(st.just(0.0), st.floats(min_value=2.3e-308, max_value=1e300)))
def test_float_bits_are_the_ieee_bits(x):
    assert float_bits(x) == struct.unpack("<q", struct.pack("<d", x))[0]


def test_a_log_that_starts_with_no_room_grows(monkeypatch):
    # every other prompt fits no worker's KV: 80 rejections, logged on their arrival (more than
    # the log's first growth holds, so it grows twice)
    n = 160
    workload = Workload(
        [0.01 * i for i in range(n)], [100_000 if i % 2 else 64 for i in range(n)], [4] * n
    )
    cluster = ClusterSpec.build(COST, 1, 1, kv_capacity_blocks=64)

    def run(engine):
        return simulate(workload, cluster, make_policy("least_loaded"), slo=SLO, engine=engine)

    python = run("python")
    assert (python.events["kind"] == "rejection").sum() == n // 2
    handed = []
    real = simulate_module._simulate_python
    monkeypatch.setattr(
        simulate_module, "_simulate_python", lambda *a, **k: handed.append(1) or real(*a, **k)
    )
    assert_identical(python, run("compiled"))
    monkeypatch.setattr(_io, "log_buffer", lambda n_workers, running: 0)
    assert_identical(python, run("compiled"))
    assert handed == []  # the compiled engine ran both
