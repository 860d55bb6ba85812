"""Checked argument types of the CLI: a bad option value is an argparse error naming the option
(``pdopt tune: error: argument --n-trials: expected an int >= 1, got '0'``, exit 2), the same
words as the config reader's ``expected …, got …`` (:mod:`pdopt._toml`), never a
library function's name.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def integer(min_value: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``min_value`` (``"2.7"`` and ``"true"`` are refused)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = min_value - 1
        if value < min_value:
            raise argparse.ArgumentTypeError(f"expected an int >= {min_value}, got {text!r}")
        return value

    return parse


def number(*, positive: bool = False, at_most: float | None = None) -> Callable[[str], float]:
    """An argparse ``type``: a finite number, > 0 when ``positive`` and <= ``at_most``."""
    rule = "a number" + (" > 0" if positive else "") + ("" if at_most is None else f" <= {at_most}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        bad = not math.isfinite(value) or (positive and value <= 0)
        if bad or (at_most is not None and value > at_most):
            raise argparse.ArgumentTypeError(f"expected {rule}, got {text!r}")
        return value

    return parse


POSITIVE_INT = integer(1)
NON_NEGATIVE_INT = integer(0)
POSITIVE = number(positive=True)
FRACTION = number(positive=True, at_most=1.0)
