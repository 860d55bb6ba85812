"""A throwaway PostgreSQL server for the tuner's storage tests, from the ``pgserver`` wheel
(PostgreSQL binaries inside a pip package, installed by ``pip install -e ".[dev]"`` on Linux
x86-64 with Python 3.11/3.12, the platforms it ships wheels for): no system service, no
configuration. ``PDOPT_TEST_POSTGRES_URL`` points the tests at an existing server instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL URL for the session: ``PDOPT_TEST_POSTGRES_URL``, else a fresh server in a
    temporary folder (started in ~1 s, stopped and deleted at the end of the session)."""
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pdopt[postgres])")
    given = os.environ.get("PDOPT_TEST_POSTGRES_URL", "")
    if given:
        yield given
        return
    pgserver = pytest.importorskip(
        "pgserver", reason="no pgserver wheel for this platform (Linux x86-64, Python <= 3.12)"
    )
    # NOTE: a short folder under the system temp dir: the server's Unix socket lives there and
    # socket paths are limited to ~107 bytes (pytest's tmp_path can be longer).
    folder = tempfile.mkdtemp(prefix="pdopt-pg-")
    server = pgserver.get_server(folder, cleanup_mode="stop")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
