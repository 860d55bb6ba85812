"""Every registered policy passes the conformance suite."""

from __future__ import annotations

import pytest

from pdopt.policies import available_policies, make_policy
from pdopt.testing import check_policy


@pytest.mark.parametrize("name", available_policies())
def test_policy_passes_contract(name: str) -> None:
    check_policy(lambda: make_policy(name))
