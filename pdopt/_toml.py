"""The one TOML reader (and writer) of pdopt's config files, with one error format.

It sits below every subpackage (it needs only :mod:`pdopt.errors`): scenario files
(:mod:`pdopt.scenario`) and user GPU/model spec files (:mod:`pdopt._specs_file`, which the
catalogues in :mod:`pdopt.hardware` and :mod:`pdopt.model_spec` call) read through it.

Every checked read names the file, the table, the key, what was expected and what was given::

    sim.toml [cluster] n_prefill: expected an int >= 0, got "four"

Top-level keys have no table (``sim.toml seed: ...``); a missing required key is "got nothing";
an unknown key is "expected one of [...]" (a typo never goes unnoticed). The ``simulate``,
``capacity`` and ``tune`` commands read their files through :func:`read_toml` and
:class:`TomlTable`; :func:`dumps_toml` writes what :meth:`pdopt.scenario.Scenario.to_toml`
needs (scalars, lists, nested tables).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pdopt.errors import ConfigError, InputError, ParameterError

_MISSING: Any = object()


def read_toml(path: str | Path) -> TomlTable:
    """The top-level table of the TOML file at ``path`` (``ConfigError`` when unreadable)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such config file") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file ({exc.reason})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return TomlTable(data, str(path))


def literal(value: Any) -> str:
    """``value`` written as a TOML literal (how errors show what was given)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise ConfigError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


class TomlTable:
    """One table of a parsed TOML file, read key by key with checks.

    Parameters
    ----------
    data : mapping
        The table's parsed content.
    file : str
        The file it came from (first word of every error).
    name : str
        Dotted table name (``"workload.closed_loop"``); ``""`` for the top level.
    """

    def __init__(self, data: Mapping[str, Any], file: str, name: str = "") -> None:
        self.data = dict(data)
        self.file = file
        self.name = name

    def error(
        self, key: str, expected: str, given: Any = _MISSING, *, shown: str = ""
    ) -> ConfigError:
        """The one error format: ``FILE [TABLE] KEY: expected EXPECTED, got GIVEN`` (``shown``
        replaces the literal of ``given`` when the value is not the point)."""
        where = f"{self.file} [{self.name}]" if self.name else self.file
        shown = shown or ("nothing" if given is _MISSING else literal(given))
        return ConfigError(f"{where} {key}: expected {expected}, got {shown}")

    @contextmanager
    def naming(
        self, key: str | None = None, params: Mapping[str, str] | None = None
    ) -> Iterator[None]:
        """Library errors raised inside, as errors of this table (the one format above).

        A :class:`ParameterError` about a parameter that is a key of this table (``params`` maps
        a parameter name to the key it comes from, e.g. ``{"name": "archetype"}``) becomes
        ``FILE [TABLE] KEY: expected RULE, got VALUE``, the value as the file writes it. Any other
        :class:`ParameterError`, an :class:`InputError` (a file's bad row), or a
        :class:`ConfigError` that does not name this file yet, keeps its message after
        ``FILE [TABLE] KEY:`` (``key``, the value the call was about; without it, the table).

        Examples
        --------
        >>> part = TomlTable({"archetype": "prod"}, "sim.toml", "workload")
        >>> with part.naming("archetype", {"name": "archetype"}):  # doctest: +SKIP
        ...     archetype_workload(part.string("archetype"), 1.0, n_requests=10)
        ConfigError: sim.toml [workload] archetype: expected one of [...], got "prod"
        """
        try:
            yield
        except ParameterError as exc:
            name = exc.parameter
            own = None if name is None else (params or {}).get(name, name)
            if own is not None and own in self.data and exc.rule is not None:
                raise self.error(own, exc.rule, self.data[own]) from exc
            raise self._prefixed(key, exc) from exc
        except InputError as exc:
            raise self._prefixed(key, exc) from exc
        except ConfigError as exc:
            if str(exc).startswith(f"{self.file} ") or str(exc).startswith(f"{self.file}:"):
                raise
            raise self._prefixed(key, exc) from exc

    def _prefixed(self, key: str | None, exc: Exception) -> ConfigError:
        where = f"{self.file} [{self.name}]" if self.name else self.file
        return ConfigError(f"{where}{'' if key is None else ' ' + key}: {exc}")

    def only(self, allowed: Iterable[str]) -> TomlTable:
        """Raise on the first key not in ``allowed``; return self."""
        names = sorted(allowed)
        for key in sorted(self.data):
            if key not in names:
                raise self.error(key, f"a key among {names}", shown="an unknown key")
        return self

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        """The value as parsed (no check); ``default`` when absent, an error when required."""
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise self.error(key, "a value")
        return default

    def table(self, key: str, allowed: Iterable[str] | None = None) -> TomlTable:
        """Sub-table ``key`` (empty when absent), its keys checked against ``allowed``."""
        value = self.data.get(key, {})
        if not isinstance(value, Mapping):
            raise self.error(key, "a table", value)
        sub = TomlTable(value, self.file, f"{self.name}.{key}" if self.name else key)
        return sub if allowed is None else sub.only(allowed)

    def integer(self, key: str, default: Any = _MISSING, *, min_value: int | None = None) -> int:
        """An integer (not a bool), at least ``min_value``."""
        expected = "an int" + ("" if min_value is None else f" >= {min_value}")
        value = self._get(key, default, expected)
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or (min_value is not None and value < min_value):
            raise self.error(key, expected, value)
        return int(value)

    def number(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        positive: bool = False,
        non_negative: bool = False,
    ) -> float:
        """A number (int or float, not a bool); ``positive``: > 0; ``non_negative``: >= 0 (both
        finite: ``inf`` is refused as ``nan`` is)."""
        expected = "a number > 0" if positive else "a number >= 0" if non_negative else "a number"
        value = self._get(key, default, expected)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, expected, value)
        bounded = positive or non_negative
        if (positive and not value > 0) or (non_negative and not value >= 0):
            raise self.error(key, expected, value)
        if bounded and not math.isfinite(value):
            raise self.error(key, expected, value)
        return float(value)

    def string(self, key: str, default: Any = _MISSING, *, choices: Sequence[str] = ()) -> str:
        """A string, one of ``choices`` when given."""
        expected = f"one of {list(choices)}" if choices else "a string"
        value = self._get(key, default, expected)
        if not isinstance(value, str) or (choices and value not in choices):
            raise self.error(key, expected, value)
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default, "true or false")
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def array(self, key: str, default: Any = _MISSING, *, of: type = str) -> list[Any]:
        """A list whose items are all ``of`` (str, int, or float: any number)."""
        kinds: tuple[type, ...] = (int, float) if of is float else (of,)
        expected = "a list of " + {float: "numbers", int: "ints"}.get(of, "strings")
        value = self._get(key, default, expected)
        if not isinstance(value, list) or not all(
            isinstance(v, kinds) and not isinstance(v, bool) for v in value
        ):
            raise self.error(key, expected, value)
        return [of(v) for v in value]

    def _get(self, key: str, default: Any, expected: str) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise self.error(key, expected)
        return default


def dumps_toml(data: Mapping[str, Any]) -> str:
    """``data`` as TOML text: scalars and lists first, then each sub-table under its header.

    None values are left out (TOML has no null). Lists of tables are written inline.
    """
    lines: list[str] = []
    _write_table(lines, data, "")
    return "\n".join(lines).lstrip("\n") + "\n"


def _write_table(lines: list[str], data: Mapping[str, Any], name: str) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    if name:
        lines.append(f"\n[{name}]")
    for key, value in data.items():
        if value is not None and key not in tables:
            lines.append(f"{_key(key)} = {literal(_plain(value))}")
    for key, value in tables.items():
        _write_table(lines, value, f"{name}.{_key(key)}" if name else _key(key))


def _plain(value: Any) -> Any:
    """Drop None from nested mappings (TOML has no null)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key)
