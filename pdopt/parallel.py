"""Independent simulations, run serially or on a Dask cluster, results in input order (issue 38,
item 3).

One owner for "run ``fn`` on each of these items": the experiments' grids, ``pdopt capacity``'s
replicate seeds, ``pdopt plan``'s verification draws and ``--compare-modes``, and ``pdopt tune``'s
sensitivity sweep all go through :func:`map_runs`. Where the work runs is a ``dask`` argument:

* ``None``: serially, in this process (the reference);
* ``"local"``: a :class:`distributed.LocalCluster` on this machine (``n_workers`` processes, one
  thread each; default one per CPU);
* ``"tcp://HOST:PORT"`` (any Dask scheduler address, ``tls://`` too): a client of that cluster.
  Every worker must import pdopt (and any module ``fn`` lives in).

The result is the same whichever: each item carries everything its run depends on (its seed
included), the results are put back in the items' order, and nothing depends on the order in
which the runs finish. A run's exception is re-raised here, as serially.

A caller that maps several times (a verification loop, one map per iteration) opens the cluster
once with :func:`open_runs` and passes the open :class:`Runs` as ``dask``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from pdopt.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")

LOCAL = "local"
"""The ``dask`` value (and ``--dask`` with no address) that starts a LocalCluster here."""

OPTION = "--dask"
"""The command-line option every error message names (the one spelling of the flag)."""

CONNECT_TIMEOUT_S = 10.0
"""How long a client waits for a scheduler address before the address is reported as wrong."""

_SCHEMES = ("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")


@dataclass(frozen=True, slots=True)
class Runs:
    """An open place to run simulations: ``client`` is a :class:`distributed.Client`, or None
    (serially, in this process). ``where`` says which, in words (for progress lines)."""

    client: Any
    where: str

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        progress: Callable[[], None] | None = None,
    ) -> list[R]:
        """``[fn(x) for x in items]``, on the cluster when there is one; ``progress()`` after
        each run ends (in completion order; the results are in input order). Each process
        that runs items loads the compiled engine first (:func:`with_compiled_engine`)."""
        items = list(items)
        if len(items) == 0:
            return []
        if self.client is None:
            out = []
            for item in items:
                out.append(with_compiled_engine(fn, item))
                if progress is not None:
                    progress()
            return out
        return _on_client(self.client, functools.partial(with_compiled_engine, fn), items, progress)


DaskTarget = Union[None, str, Runs]  # noqa: UP007 - a runtime alias (Python 3.11 typing)
"""What a ``dask`` argument takes: None (serial), ``"local"``, a scheduler address, or an
already open :class:`Runs`."""

SERIAL = Runs(None, "serially in this process")


def check_dask(value: str | None, option: str = OPTION) -> str | None:
    """``value`` when it names where to run (None, ``"local"`` or a scheduler address such as
    ``tcp://host:8786``), else a :class:`~pdopt.errors.ConfigError` naming ``option``."""
    if value is None or value == LOCAL:
        return value
    text = str(value).strip()
    if not text.startswith(_SCHEMES) or len(text.split("://", 1)[1]) == 0:
        raise ConfigError(
            f"{option} {value!r}: give a Dask scheduler address such as tcp://HOST:8786, or "
            f"{option} alone (or {option} {LOCAL}) for a LocalCluster on this machine"
        )
    return text


@contextlib.contextmanager
def open_runs(
    dask: DaskTarget = None, *, n_workers: int | None = None, option: str = OPTION
) -> Iterator[Runs]:
    """Where to run, open for the ``with`` block: serially (``dask=None``), on a new
    LocalCluster of ``n_workers`` processes (``"local"``), or on the cluster at an address; an
    open :class:`Runs` is passed through (its owner closes it).

    Raises
    ------
    ConfigError
        ``option`` names the flag: a malformed address, an address no scheduler answers at
        within :data:`CONNECT_TIMEOUT_S`, a cluster without workers, or no dask installed.
    """
    if isinstance(dask, Runs):
        yield dask
        return
    address = check_dask(dask, option)
    if address is None:
        yield SERIAL
        return
    distributed = _distributed(option)
    with contextlib.ExitStack() as stack:
        if address == LOCAL:
            workers = n_workers or os.cpu_count() or 1
            # silence_logs: a worker's heartbeat racing the scheduler's shutdown logs a
            # traceback at ERROR; a run's own error comes back as its exception (_on_client)
            cluster = distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                silence_logs=logging.CRITICAL,
            )  # fmt: skip
            stack.enter_context(cluster)
            client = stack.enter_context(distributed.Client(cluster))
            where = f"on a Dask LocalCluster of {workers} workers"
        else:
            client = stack.enter_context(_connect(distributed, address, option))
            where = f"on the Dask cluster at {address}"
        if not client.nthreads():
            raise ConfigError(f"{option} {address}: the Dask cluster has no workers")
        yield Runs(client, where)


def map_runs(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    dask: DaskTarget = None,
    n_workers: int | None = None,
    progress: Callable[[], None] | None = None,
    option: str = OPTION,
) -> list[R]:
    """``[fn(x) for x in items]``, serially or on Dask (module docstring), in input order.

    ``fn`` must be a module-level function (or another object Dask can pickle) whose result
    depends only on its item; ``progress()`` is called after each run ends.
    """
    with open_runs(dask, n_workers=n_workers, option=option) as runs:
        return runs.map(fn, items, progress)


def with_compiled_engine(fn: Callable[[T], R], item: T) -> R:
    """``fn(item)`` with the compiled engine loaded in this process
    (:func:`pdopt.sim.load_compiled_engine`: from numba's cache, about a second the first time,
    nothing when the cache does not hold it). The runs mapped here are mostly below the size
    at which ``engine="auto"`` loads it for one run (an experiment grid's 300-3,000 requests,
    a plan's verification draws), so without it they ran on the Python engine, 30-100x
    slower, with the identical result."""
    from pdopt.sim import load_compiled_engine

    load_compiled_engine()
    return fn(item)


def _distributed(option: str) -> Any:
    try:
        import distributed
    except ImportError as exc:  # pragma: no cover - dask is an optional dependency
        raise ConfigError(
            f"{option} needs Dask's distributed scheduler: pip install 'pdopt[dask]' "
            "(or leave out the option to run serially)"
        ) from exc
    return distributed


def _connect(distributed: Any, address: str, option: str) -> Any:
    """A client of the scheduler at ``address``, or a ConfigError naming ``option``."""
    try:
        return distributed.Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(
            f"{option} {address}: no Dask scheduler answered there within "
            f"{CONNECT_TIMEOUT_S:g} s ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
            f"start one (dask scheduler; dask worker {address}) or give {option} alone for a "
            "LocalCluster on this machine"
        ) from exc


def _on_client(
    client: Any, fn: Callable[[T], R], items: list[T], progress: Callable[[], None] | None
) -> list[R]:
    """Submit every item (``pure=False``: equal items are still separate runs), count them as
    they finish, and gather in input order; the first failed run's exception is raised."""
    from distributed import as_completed

    futures = [client.submit(fn, item, pure=False) for item in items]
    try:
        for future in as_completed(futures):  # type: ignore[no-untyped-call]
            if future.status == "error":
                future.result()  # re-raises the run's own exception
            if progress is not None:
                progress()
        return list(client.gather(futures))
    finally:
        client.cancel(futures)
