"""Settings shared by every package's tests.

Hypothesis draws the same examples on every run and machine by default (the ``ci`` profile:
derandomized, no example database), so ``make test`` is deterministic: a property test that
found a new counterexample only under some random seed would otherwise fail CI at random (issue
19). To hunt for new counterexamples, run with ``HYPOTHESIS_PROFILE=explore`` (random seeds, the
local example database) and pin what it finds with ``@example``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the marks (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep a file's tests on one pytest-xdist worker when they share a fixture wider than a test
    that the tests define (a module-scoped CLI run, the README blocks' outcomes, a session's
    PostgreSQL server): split across workers, each worker would build it again. Every other test
    is handed to whichever worker is free (``make test``: ``-n JOBS --dist loadgroup``)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = any(
            fixturedef.scope != "function" and fixturedef.baseid  # "": pytest's own or a plugin's
            for fixturedefs in info.name2fixturedefs.values()
            for fixturedef in fixturedefs
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
