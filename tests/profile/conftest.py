"""Fixtures shared by the profile tests."""

from __future__ import annotations

import os

import pytest

from pdopt.errors import InputError
from pdopt.profile._aic_data import find_database


@pytest.fixture
def aic_dir() -> str:
    """The AIConfigurator data ($PDOPT_AIC_DIR, else the installed package), or a skip."""
    where = os.environ.get("PDOPT_AIC_DIR", "auto")
    try:
        find_database(where)
    except InputError:
        pytest.skip("AIConfigurator data not installed (pip install pdopt[aic] or PDOPT_AIC_DIR)")
    return where
