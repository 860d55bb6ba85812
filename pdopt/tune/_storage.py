"""Study storage chosen Optuna style: ``None`` (in memory), a URL, or a storage object.

=================================  ==============================================================
``None``, ``"memory"``             in-process memory: fastest, lost at exit, one process only
``"sqlite:///study.db"``           a SQLite file: several processes on one machine; resumable
``"journal:///study.log"``         Optuna's append-only journal file (or any path ending in
or ``"study.log"``/``".journal"``  ``.log``/``.journal``): several processes on one machine (file
                                   locks), robust to a process killed mid-write; resumable. As
                                   for SQLite, three slashes and a relative path, four for an
                                   absolute one (``journal:////data/study.log``)
``"postgresql://user:pw@host/db"`` Optuna's RDB storage on PostgreSQL (``pip install
                                   psycopg2-binary``): many processes and machines, e.g. the
                                   workers of a Dask cluster
=================================  ==============================================================

RDB storages (SQLite, PostgreSQL, MySQL) get a heartbeat (every 10 s, grace 60 s): a trial whose
process died is marked FAIL when the next worker starts, so a resumed study is clean.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a commit is one append to the write-ahead
log, not an fsync of the database (Optuna commits ~20 times per trial, each ~10 ms with fsync),
and readers do not block the writer. A committed trial survives a killed process; only a power
loss can drop the last commits.
"""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdopt.errors import ConfigError

if TYPE_CHECKING:
    import optuna

_RDB_PREFIXES = ("sqlite://", "postgresql", "postgres://", "mysql")
_JOURNAL_SUFFIXES = (".log", ".journal", ".jsonl")
HEARTBEAT_S = 10
GRACE_S = 60
FIDELITY_ATTR = "pdopt_fidelity"
"""The study's user attribute naming the fidelity its trials ran at (one per study)."""


def is_shared(storage: object) -> bool:
    """True when other processes can open the same study from ``storage`` (a URL)."""
    return isinstance(storage, str) and storage not in ("memory", ":memory:")


def open_storage(storage: object) -> optuna.storages.BaseStorage:
    """The Optuna storage for ``storage`` (table in the module docstring)."""
    import optuna

    if storage is None or storage in ("memory", ":memory:"):
        return optuna.storages.InMemoryStorage()
    if isinstance(storage, optuna.storages.BaseStorage):
        return storage
    if not isinstance(storage, str):
        raise ConfigError(f"storage must be None, a URL or an Optuna storage; got {storage!r}")
    if storage.startswith(_RDB_PREFIXES):
        import sqlalchemy.exc

        # NOTE: WAL through the connection class (module docstring): every connection the
        # engine opens, its first included, gets the pragmas; no Optuna internals are touched.
        sqlite = {"connect_args": {"timeout": 60, "factory": _WriteAheadConnection}}
        kwargs = sqlite if storage.startswith("sqlite") else {}
        try:
            with warnings.catch_warnings():  # the heartbeat is "experimental" since Optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                rdb = optuna.storages.RDBStorage(
                    storage,
                    engine_kwargs=kwargs,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                )
        except ImportError as exc:
            raise ConfigError(
                f"storage {storage!r} needs a database driver: {exc} "
                '(PostgreSQL: pip install "pdopt[postgres]", i.e. psycopg 3, '
                "or name another driver: postgresql+psycopg2://...)"
            ) from exc
        except sqlalchemy.exc.SQLAlchemyError as exc:  # a bad URL, a missing folder, no server
            raise _unreachable(storage, exc) from exc
        return rdb
    path = journal_path(storage)
    if storage.startswith("journal://") or path.endswith(_JOURNAL_SUFFIXES):
        from optuna.storages.journal import JournalFileBackend

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(path))
    raise ConfigError(
        f"storage {storage!r} is not understood: use sqlite:///FILE.db, journal:///FILE.log, "
        "postgresql://USER:PASSWORD@HOST/DB or None for memory"
    )


def journal_path(storage: str) -> str:
    """The file of a journal storage URL, read as SQLAlchemy reads ``sqlite:`` URLs: three
    slashes then a relative path (``journal:///study.log`` is ``study.log`` in the current
    folder), four for an absolute one (``journal:////data/study.log``); a bare path is itself.

    Examples
    --------
    >>> journal_path("journal:///study.log"), journal_path("journal:////tmp/s.log")
    ('study.log', '/tmp/s.log')
    """
    if storage.startswith("journal:///"):
        return storage.removeprefix("journal:///")
    return storage.removeprefix("journal://")


def _unreachable(storage: str, exc: Exception) -> ConfigError:
    """The one-line error of an RDB storage that cannot be opened (the driver's first line)."""
    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
    hint = ""
    if storage.startswith("sqlite:///"):
        folder = Path(storage.removeprefix("sqlite:///")).parent
        if not folder.is_dir():
            hint = f" (the folder {str(folder)!r} does not exist: create it or choose another)"
    return ConfigError(f"storage {storage!r} cannot be opened: {reason}{hint}")


class _WriteAheadConnection(sqlite3.Connection):
    """A SQLite connection in WAL mode with ``synchronous=NORMAL`` (module docstring); given to
    ``sqlite3.connect`` as its ``factory`` through SQLAlchemy's ``connect_args``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA journal_mode=WAL")
        self.execute("PRAGMA synchronous=NORMAL")


def study_fidelity(storage: object, study_name: str) -> str | None:
    """The fidelity the study ``study_name`` in ``storage`` ran its trials at (None: no such
    study, or an in-memory storage); opening the storage reports a bad URL or folder."""
    backend = open_storage(storage)
    if not is_shared(storage):
        return None
    try:
        study_id = backend.get_study_id_from_name(study_name)
    except KeyError:
        return None
    ran = backend.get_study_user_attrs(study_id).get(FIDELITY_ATTR)
    if ran is None or not any(
        t.state.is_finished() for t in backend.get_all_trials(study_id, deepcopy=False)
    ):
        return None
    return str(ran)
