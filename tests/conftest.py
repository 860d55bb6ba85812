"""Settings shared by every package's tests.

Hypothesis draws the same examples on every run and machine by default (the ``ci`` profile:
derandomized, no example database), so ``make test`` is deterministic: a property test that
found a new counterexample only under some random seed would otherwise fail CI at random (issue
19). To hunt for new counterexamples, run with ``HYPOTHESIS_PROFILE=explore`` (random seeds, the
local example database) and pin what it finds with ``@example``.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
