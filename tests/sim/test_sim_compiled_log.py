"""The compiled engine's event-log buffer (pdopt.sim._compiled._heap.put_log): the handlers
write entries into it and the loop moves them to its list after each event, so the handlers take
no list argument. The events frames of every compiled test compare the log
with the Python engine's; here: a migration's bytes keep their exact float64 bits, and a buffer
too small for an event hands the run to the Python engine, with the same result."""

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


def test_a_log_buffer_too_small_hands_the_run_to_the_python_engine(monkeypatch):
    # the third prompt fits no worker's KV: a rejection, logged on its arrival
    workload = Workload([0.0, 0.1, 0.2, 0.3], [64, 64, 100_000, 64], [4, 4, 4, 4])
    cluster = ClusterSpec.build(COST, 1, 1, kv_capacity_blocks=64)

    def run(engine):
        return simulate(workload, cluster, make_policy("least_loaded"), slo=SLO, engine=engine)

    python = run("python")
    assert (python.events["kind"] == "rejection").sum() == 1
    handed = []
    real = simulate_module._simulate_python
    monkeypatch.setattr(
        simulate_module, "_simulate_python", lambda *a, **k: handed.append(1) or real(*a, **k)
    )
    assert_identical(python, run("compiled"))
    assert handed == []  # the buffer holds it
    monkeypatch.setattr(_io, "log_buffer", lambda n_workers, running: 0)
    assert_identical(python, run("compiled"))
    assert handed == [1]  # no room for the entry: rerun on the Python engine
