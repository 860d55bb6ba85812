"""Parameter checks with one error format.

Every parameter error in pdopt reads alike::

    The 'ttft_slo_s' parameter of simulate must be > 0. Got -1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pdopt.errors import ParameterError


def param_error(name: str, owner: str, rule: str, value: Any) -> ParameterError:
    """Build the standard parameter error: name, owner, rule and the value given."""
    return ParameterError(
        f"The {name!r} parameter of {owner} must be {rule}. Got {value!r}.",
        parameter=name,
        rule=rule,
        value=value,
    )


def check_positive(value: float, name: str, owner: str) -> float:
    """Return ``value`` as float if it is finite and > 0, else raise :class:`ParameterError`."""
    if not _is_finite_number(value) or value <= 0:
        raise param_error(name, owner, "a finite number > 0", value)
    return float(value)


def check_positive_or_none(value: float | None, name: str, owner: str) -> float | None:
    """``value`` as a float > 0, or None (for flags whose None means "the run's value")."""
    return None if value is None else check_positive(value, name, owner)


def check_non_negative(value: float, name: str, owner: str) -> float:
    """Return ``value`` as float if it is finite and >= 0, else raise :class:`ParameterError`."""
    if not _is_finite_number(value) or value < 0:
        raise param_error(name, owner, "a finite number >= 0", value)
    return float(value)


def check_fraction(value: float, name: str, owner: str, *, open_low: bool = True) -> float:
    """Return ``value`` if it lies in (0, 1] (or [0, 1] with ``open_low=False``)."""
    low_ok = value > 0 if open_low else value >= 0
    if not _is_finite_number(value) or not low_ok or value > 1:
        rule = "in (0, 1]" if open_low else "in [0, 1]"
        raise param_error(name, owner, rule, value)
    return float(value)


def check_int_at_least(value: int, minimum: int, name: str, owner: str) -> int:
    """Return ``value`` if it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise param_error(name, owner, f"an integer >= {minimum}", value)
    if value < minimum:
        raise param_error(name, owner, f"an integer >= {minimum}", value)
    return int(value)


def check_one_of(value: str, allowed: Iterable[str], name: str, owner: str) -> str:
    """Return ``value`` if it is one of ``allowed``."""
    options = sorted(allowed)
    if value not in options:
        raise param_error(name, owner, f"one of {options}", value)
    return value


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
