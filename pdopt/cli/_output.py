"""Shared output helpers of the CLI: JSON or human text, and pdopt's warnings, one place."""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import numpy as np
import pandas as pd

from pdopt.errors import PdoptWarning

WARNING_PREFIX = "pdopt: warning: "
"""How every command starts a line showing one of pdopt's warnings (errors: ``pdopt: error:``)."""


def add_json_flag(parser: Any) -> None:
    """Add the ``--json`` flag every command has."""
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def to_jsonable(value: Any) -> Any:
    """Convert numpy, pandas and float specials to plain JSON values (NaN/inf become null)."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, pd.DataFrame):
        return to_jsonable(value.to_dict(orient="records"))
    if isinstance(value, pd.Series):
        return to_jsonable(value.to_dict())
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def print_json(payload: Any) -> None:
    print(json.dumps(to_jsonable(payload), indent=2, sort_keys=False))


def print_warning(message: str) -> None:
    """One warning as one line on stderr, as every command shows them."""
    print(f"{WARNING_PREFIX}{message}", file=sys.stderr)


@contextmanager
def pdopt_warnings_on_stderr() -> Iterator[None]:
    """While a command runs, each of pdopt's warnings (:class:`pdopt.errors.PdoptWarning`) is
    shown by :func:`print_warning`, without Python's file, line and source; other warnings show
    as Python shows them. Warning filters and the previous display are restored after.

    ``pdopt.cli.main`` runs every handler inside it; a command that also reports its warnings in
    ``--json`` records them itself and calls :func:`print_warning` (stdout stays JSON only).
    """
    with warnings.catch_warnings():
        previous = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if issubclass(category, PdoptWarning):
                print_warning(str(message))
            else:
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield
