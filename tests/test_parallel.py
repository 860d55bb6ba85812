"""pdopt.parallel (issue 38, item 3): the one owner of "run these independent simulations,
serially or on Dask, results in input order"."""

from __future__ import annotations

import pytest

from pdopt.errors import ConfigError
from pdopt.parallel import SERIAL, check_dask, map_runs, open_runs


def _square_after_a_wait(x: int) -> int:
    """Later items finish first, so completion order differs from input order."""
    import time

    time.sleep(0.05 * (5 - x))
    return x * x


def _engine_loaded(_: int) -> bool:
    from pdopt.sim._simulate import _compiled_loaded

    return _compiled_loaded()


def _cache_is_warm() -> bool:
    from pdopt.sim._compiled._warm import cache_is_cold

    return not cache_is_cold()


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("item three")
    return x


def test_serial_map_keeps_order_and_counts_progress() -> None:
    ticks: list[int] = []
    out = map_runs(_square_after_a_wait, [0, 1, 2, 3, 4], progress=lambda: ticks.append(1))
    assert out == [0, 1, 4, 9, 16]
    assert len(ticks) == 5


def test_an_open_runs_passes_through_and_none_is_serial() -> None:
    with open_runs(None) as runs:
        assert runs is SERIAL
        with open_runs(runs) as same:
            assert same is runs
    assert map_runs(_square_after_a_wait, [], dask=SERIAL) == []


@pytest.mark.parametrize("bad", ["localhost:8786", "tcp://", "cluster", ""])
def test_a_malformed_address_names_the_option(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--dask .*tcp://HOST:8786"):
        check_dask(bad)
    with pytest.raises(ConfigError, match="--capacity-dask"):
        map_runs(_square_after_a_wait, [1], dask=bad, option="--capacity-dask")


def test_an_address_nobody_answers_at_is_a_config_error() -> None:
    pytest.importorskip("distributed")
    with pytest.raises(ConfigError, match=r"--dask tcp://127\.0\.0\.1:9: no Dask scheduler"):
        map_runs(_square_after_a_wait, [1], dask="tcp://127.0.0.1:9")


@pytest.mark.slow
def test_a_local_cluster_gives_the_serial_results_in_input_order() -> None:
    pytest.importorskip("distributed")
    import sys

    import cloudpickle

    # this test module is not importable in the workers: ship its functions by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    items = [0, 1, 2, 3, 4]
    ticks: list[int] = []
    with open_runs("local", n_workers=2) as runs:
        assert runs.client is not None and "LocalCluster of 2 workers" in runs.where
        on_dask = runs.map(_square_after_a_wait, items, lambda: ticks.append(1))
        loaded = runs.map(_engine_loaded, items)
        with pytest.raises(ValueError, match="item three"):
            runs.map(_fails_on_three, items)
    assert on_dask == map_runs(_square_after_a_wait, items) == [0, 1, 4, 9, 16]
    assert len(ticks) == len(items)
    # each worker loaded the compiled engine before its first item (from numba's cache)
    assert loaded == [_cache_is_warm()] * len(items)


def test_a_serial_map_loads_the_compiled_engine_first() -> None:
    """A fresh process has not loaded it (``engine="auto"`` would run small runs on the Python
    engine); mapping runs loads it from numba's cache, or does nothing when the cache is cold."""
    import subprocess
    import sys

    code = (
        "from pdopt.parallel import map_runs\n"
        "from pdopt.sim._simulate import _compiled_loaded\n"
        "print(_compiled_loaded(), map_runs(lambda _: _compiled_loaded(), [0, 1]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    warm = _cache_is_warm()
    assert done.stdout.split("\n")[0] == f"False [{warm}, {warm}]"
