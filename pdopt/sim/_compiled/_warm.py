"""The compiled engine compiled ahead of its first run, and a line on stderr when a run must
compile it (issue 38: a new user's first compiled run must not stall silently).

numba compiles the engine on its first call (~3 min on one CPU) and keeps the machine code in
its cache (``cache=True``: next to the sources, or under ``NUMBA_CACHE_DIR``), from which later
processes load it in a few seconds. ``python -m pdopt.sim._compiled`` (:func:`main`; run by the
Makefile's install step, so by ``make demo``) fills that cache by running tiny simulations. A
run that would compile in-process (:func:`compile_notice`, around
:func:`pdopt.sim._compiled.run`) says so on stderr first: library code writes nothing on stdout,
and ``tqdm.write`` keeps the line clear of a progress bar drawn meanwhile (``pdopt simulate``'s).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from tqdm import tqdm

from pdopt.errors import PdoptError
from pdopt.sim._policy import Policy, PolicyTraits

COMPILING = (
    "pdopt: compiling the simulation engine once (several minutes; later runs load it from "
    "numba's cache; `python -m pdopt.sim._compiled` does it ahead)..."
)

# Set while :func:`warm` runs: its caller says what happens, once.
_quiet = False


def cache_is_cold() -> bool:
    """True when the next compiled run compiles the engine: this process has not loaded it and
    numba's cache holds no entry of its event loop for these sources.

    NOTE: reads numba's cache index through its private ``_cache._cache_file`` (numba 0.68); if
    that changes, this answers False (no notice) rather than failing a run.
    """
    from pdopt.sim._compiled._loop import run_events

    if run_events.signatures:
        return False
    try:
        return not run_events._cache._cache_file._load_index()
    except Exception:  # numba internals: see the note
        return False


def cache_path() -> str:
    """Where numba keeps the engine's compiled code (the event loop's cache directory)."""
    from pdopt.sim._compiled._loop import run_events

    try:
        return str(run_events._cache.cache_path)
    except AttributeError:
        return "numba's cache"


def _say(line: str) -> None:
    tqdm.write(line, file=sys.stderr)
    sys.stderr.flush()


@contextmanager
def compile_notice() -> Iterator[None]:
    """Around a compiled run: when it will compile the engine, a line on stderr before it and
    the seconds it took after it; nothing otherwise."""
    if _quiet or not cache_is_cold():
        yield
        return
    _say(COMPILING)
    t0 = time.perf_counter()
    yield
    _say(f"pdopt: compiled the simulation engine in {time.perf_counter() - t0:.0f} s")


def _warm_runs() -> list[tuple[str, Any]]:
    """(twin, cluster) pairs whose compiled runs reach every kernel: a disaggregated cluster and
    a colocated one under each schedule (the policies these twins belong to are named after
    them; :data:`_TWINS` gives their traits)."""
    from pdopt.cluster import ClusterSpec
    from pdopt.costmodel import CostModel, DecodeModel, PrefillModel

    cost = CostModel(PrefillModel(0.0, 2e9, 1e14), DecodeModel(0.01, 1e-4, 1e-7))
    disaggregated = ClusterSpec.build(cost, 1, 1, kv_capacity_blocks=512)
    colocated = ClusterSpec.build(cost, 0, 0, 2, kv_capacity_blocks=512)
    return [("least_loaded", disaggregated), ("vllm", colocated), ("sarathi", colocated)]


# The traits of the built-in policies' compiled twins (pdopt.policies sits above the simulator,
# so the warm runs name the twins directly; the compiled engine reads nothing else of a policy).
_TWINS = {
    "least_loaded": PolicyTraits(compiled_routing=("least_loaded", "least_loaded")),
    "vllm": PolicyTraits(
        colocated_schedule="prefill_first", compiled_routing=("least_outstanding", "origin")
    ),
    "sarathi": PolicyTraits(
        colocated_schedule="hybrid", compiled_routing=("least_outstanding", "origin")
    ),
}


class _Twin(Policy):
    """A policy that only names a compiled twin; the compiled engine never calls its hooks."""

    def __init__(self, name: str) -> None:
        self.name = name

    def traits(self) -> PolicyTraits:
        return _TWINS[self.name]


def warm() -> list[str]:
    """Compile (or load from numba's cache) every kernel the compiled engine runs today, by
    running tiny simulations with a time series; the policies it ran compiled.

    A policy the engine refuses (a ``ConfigError``, or another pdopt error on these tiny
    clusters) is skipped, except the first: the engine may not run the others yet.
    """
    global _quiet
    from pdopt.cluster import Slo
    from pdopt.sim import simulate
    from pdopt.workload import PrefixBlocks, Workload
    from pdopt.workload._prefix import number_keys

    # the prefix keys' compiled loops (a run with prefix caching keys its blocks; the reuse
    # analysis numbers them)
    number_keys(PrefixBlocks.from_lists([[1, 2], [1]], block_tokens=16).chained_keys())
    wl = Workload(
        np.array([0.0, 0.01, 0.02, 0.5]), np.array([512, 64, 300, 40]), np.array([8, 30, 1, 5])
    )
    ran: list[str] = []
    _quiet = True
    try:
        for name, cluster in _warm_runs():
            try:
                simulate(
                    wl, cluster, _Twin(name), slo=Slo(1.0, 0.1),
                    record_timeseries=True, engine="compiled",
                )  # fmt: skip
            except PdoptError:
                if not ran:
                    raise
                continue
            ran.append(name)
    finally:
        _quiet = False
    return ran


def main() -> int:
    """``python -m pdopt.sim._compiled``: :func:`warm`, with one line on stderr."""
    cold = cache_is_cold()
    if cold:
        print(COMPILING, file=sys.stderr, end=" ", flush=True)
    t0 = time.perf_counter()
    warm()
    took = time.perf_counter() - t0
    if cold:
        print(f"done in {took:.0f} s", file=sys.stderr)
    else:
        print(
            f"pdopt: the simulation engine is compiled (loaded from {cache_path()} in "
            f"{took:.1f} s)",
            file=sys.stderr,
        )
    return 0
