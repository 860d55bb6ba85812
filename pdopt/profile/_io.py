"""Reading, validating and writing profile files (format: :mod:`pdopt.profile._format`).

Every row is checked; a bad one raises :class:`~pdopt.errors.InputError` naming the file, the
1-based data row (header and metadata excluded), the file line, the field, its value and the
rule, e.g. ``h100.csv row 3 (line 10): latency_s=-0.5 must be > 0``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pdopt.errors import InputError
from pdopt.model_spec._model import DTYPE_BYTES
from pdopt.profile._format import (
    LEGACY_COLUMNS,
    PROFILE_COLUMNS,
    REQUIRED_FIELDS,
    ROW_KINDS,
    Profile,
    ProfileMeta,
)

FORMAT_VERSION = "1"
_VERSION_KEY = "pdopt-profile"
_META_KEYS: tuple[str, ...] = ("gpu", "model", "dtype", "tp", "source", "notes")
_NUMERIC_COLUMNS: tuple[str, ...] = PROFILE_COLUMNS[1:]
_INTEGER_COLUMNS = frozenset(
    ("batch_size", "input_tokens", "total_context_tokens", "m", "n", "k", "prefix_tokens")
)
_ZERO_ALLOWED = frozenset(("prefix_tokens",))  # a first chunk has no prefix


def read_profile(path: str | Path) -> Profile:
    """Read and validate a profile CSV file.

    Parameters
    ----------
    path : str or Path
        A file in the profile format (``# key: value`` metadata lines, then a CSV table with
        the columns :data:`PROFILE_COLUMNS`, or :data:`LEGACY_COLUMNS` when it has no
        ``hybrid`` rows).

    Returns
    -------
    Profile
        ``rows`` has the columns :data:`PROFILE_COLUMNS` in that order: ``kind`` as strings,
        the others float64 with NaN where the field is empty (``prefix_tokens`` all NaN for a
        file without that column); the index is 0-based, so data
        row ``i + 1`` of the file is ``rows.iloc[i]``.

    Raises
    ------
    InputError
        Missing or bad metadata, a bad header, an unknown kind, a required field missing, a field
        set that the kind does not use, a non-number, NaN or infinity, a latency <= 0, a size that
        is not an integer >= 1 (``prefix_tokens``: >= 0), a ``decode`` or ``hybrid`` row whose
        context is smaller than its batch, or no data rows at all.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(f"{path}: cannot read profile file ({exc.strerror})") from exc
    meta, rows = _parse(text, path.name)
    return Profile(meta, rows, str(path))


def write_profile(profile: Profile, path: str | Path) -> Path:
    """Write ``profile`` to ``path`` in the profile format, after validating every row.

    Integer fields are written without a decimal point and latencies with Python's shortest
    round-trip repr, so :func:`read_profile` gives back equal values. Multi-line ``notes`` are
    written as repeated ``# notes:`` lines. Returns the path written.

    Raises
    ------
    InputError
        When a row breaks a rule of the format (the file is then not written).
    """
    path = Path(path)
    text = format_profile(profile)
    _parse(text, path.name)  # refuse to write what read_profile would reject
    path.write_text(text, encoding="utf-8")
    return path


def format_profile(profile: Profile) -> str:
    """The text :func:`write_profile` writes (no validation).

    The ``prefix_tokens`` column is written only when a row has it (a ``hybrid`` row), so a
    profile without hybrid rows is written as before that column existed; ``profile.rows`` may
    leave that column out.
    """
    lines = [f"# {_VERSION_KEY}: {FORMAT_VERSION}"]
    meta = profile.meta
    for key in _META_KEYS[:-1]:
        lines.append(f"# {key}: {_single_line(str(getattr(meta, key)), key)}")
    lines.extend(f"# notes: {note}" for note in meta.notes.splitlines())
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    missing = [c for c in LEGACY_COLUMNS if c not in profile.rows.columns]
    extra = [c for c in profile.rows.columns if c not in PROFILE_COLUMNS]
    if missing or extra:
        raise InputError(
            f"profile rows: columns must be {list(PROFILE_COLUMNS)}; missing {missing}, "
            f"unexpected {extra}"
        )
    columns = _written_columns(profile.rows)
    writer.writerow(columns)
    for record in profile.rows[list(columns)].itertuples(index=False):
        writer.writerow([_format_cell(c, v) for c, v in zip(columns, record, strict=True)])
    return "\n".join(lines) + "\n" + buffer.getvalue()


def profile_from_records(meta: ProfileMeta, records: Iterable[Mapping[str, Any]]) -> Profile:
    """A validated in-memory :class:`Profile` from dicts keyed by column (absent = empty).

    Raises
    ------
    InputError
        As :func:`read_profile`, naming the record as ``<memory> row N``.
    """
    frame = pd.DataFrame.from_records(list(records), columns=list(PROFILE_COLUMNS))
    profile = Profile(meta, _typed(frame))
    _, rows = _parse(format_profile(profile), "<memory>")
    return Profile(meta, rows)


def _written_columns(rows: pd.DataFrame) -> tuple[str, ...]:
    """:data:`PROFILE_COLUMNS` when a row sets ``prefix_tokens`` or is ``hybrid``, else the legacy
    header (so files without hybrid rows stay byte-identical to before)."""
    prefix = rows.get("prefix_tokens")
    has_prefix = prefix is not None and bool(pd.notna(prefix).any())
    has_hybrid = bool((rows["kind"] == "hybrid").any())
    return PROFILE_COLUMNS if has_prefix or has_hybrid else LEGACY_COLUMNS


def _single_line(value: str, key: str) -> str:
    if "\n" in value or "\r" in value:
        raise InputError(f"profile metadata: {key}={value!r} must be a single line")
    return value


def _format_cell(column: str, value: Any) -> str:
    if column == "kind":
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
    if value is None or (isinstance(value, float | np.floating) and math.isnan(value)):
        return ""
    number = float(value)
    if column in _INTEGER_COLUMNS and number.is_integer():
        return str(int(number))
    return repr(number)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"kind": frame["kind"].astype(object)})
    for column in _NUMERIC_COLUMNS:
        values = frame[column] if column in frame else pd.Series(np.nan, index=frame.index)
        out[column] = pd.to_numeric(values, errors="coerce").astype(np.float64)
    return out.reset_index(drop=True)


def _parse(text: str, name: str) -> tuple[ProfileMeta, pd.DataFrame]:
    lines = text.splitlines()
    meta, first = _parse_meta(lines, name)
    if first >= len(lines) or not lines[first].strip():
        raise InputError(f"{name}: no header line after the metadata (expected {_header()})")
    header = [h.strip() for h in next(csv.reader([lines[first]]))]
    if header not in (list(PROFILE_COLUMNS), list(LEGACY_COLUMNS)):
        raise InputError(
            f"{name} line {first + 1}: header is {','.join(header)}; expected {_header()} "
            "(and a last column prefix_tokens when there are hybrid rows)"
        )
    width = len(header)
    values: list[list[float]] = []
    kinds: list[str] = []
    row = 0
    for index in range(first + 1, len(lines)):
        if not lines[index].strip():
            continue
        row += 1
        fields = next(csv.reader([lines[index]]))
        where = f"{name} row {row} (line {index + 1})"
        kind, numbers = _parse_row(fields, width, where)
        kinds.append(kind)
        values.append(numbers + [math.nan] * (len(PROFILE_COLUMNS) - width))
    if not kinds:
        raise InputError(f"{name}: no data rows after the header")
    frame = pd.DataFrame(np.array(values, dtype=np.float64), columns=list(_NUMERIC_COLUMNS))
    frame.insert(0, "kind", pd.Series(kinds, dtype=object))
    return meta, frame


def _header() -> str:
    return ",".join(LEGACY_COLUMNS)


def _parse_meta(lines: Sequence[str], name: str) -> tuple[ProfileMeta, int]:
    found: dict[str, str] = {}
    notes: list[str] = []
    index = 0
    while index < len(lines) and lines[index].lstrip().startswith("#"):
        key, sep, value = lines[index].lstrip()[1:].partition(":")
        key, value = key.strip(), value.strip()
        where = f"{name} line {index + 1}"
        if not sep:
            raise InputError(f"{where}: metadata line must read '# key: value'")
        if key == "notes":
            notes.append(value)
        elif key not in (_VERSION_KEY, *_META_KEYS):
            raise InputError(f"{where}: unknown metadata key {key!r} (known: {_META_KEYS})")
        elif key in found:
            raise InputError(f"{where}: metadata key {key!r} given twice")
        else:
            found[key] = value
        index += 1
    return _build_meta(found, notes, name), index


def _build_meta(found: dict[str, str], notes: list[str], name: str) -> ProfileMeta:
    if found.get(_VERSION_KEY) != FORMAT_VERSION:
        raise InputError(
            f"{name}: metadata '{_VERSION_KEY}' must be {FORMAT_VERSION} "
            f"(got {found.get(_VERSION_KEY)!r}); is this a pdopt profile?"
        )
    for key in ("gpu", "model"):
        if not found.get(key):
            raise InputError(f"{name}: metadata {key!r} is missing (add a '# {key}: ...' line)")
    tp_text = found.get("tp", "1")
    if not tp_text.isdigit() or int(tp_text) < 1:
        raise InputError(f"{name}: metadata tp={tp_text} must be an integer >= 1")
    dtype = found.get("dtype", "float16")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"{name}: metadata dtype={dtype} must be one of {sorted(DTYPE_BYTES)}")
    return ProfileMeta(
        gpu=found["gpu"],
        model=found["model"],
        dtype=dtype,
        tp=int(tp_text),
        source=found.get("source", "unknown"),
        notes="\n".join(notes),
    )


def _parse_row(fields: list[str], width: int, where: str) -> tuple[str, list[float]]:
    """Kind and numbers of one row of a ``width``-column table (the first ``width - 1``
    numeric columns)."""
    if len(fields) != width:
        raise InputError(f"{where}: has {len(fields)} fields; the header has {width}")
    kind = fields[0].strip()
    if kind not in ROW_KINDS:
        raise InputError(f"{where}: kind={kind} must be one of {', '.join(ROW_KINDS)}")
    required = REQUIRED_FIELDS[kind]
    if width < len(PROFILE_COLUMNS) and kind == "hybrid":
        raise InputError(
            f"{where}: hybrid rows need the prefix_tokens column; add it to the header "
            f"({','.join(PROFILE_COLUMNS)})"
        )
    numbers: list[float] = []
    for column, raw in zip(_NUMERIC_COLUMNS, fields[1:], strict=False):
        text = raw.strip()
        if not text:
            if column in required:
                raise InputError(f"{where}: {column}=(empty) is required for {kind} rows")
            numbers.append(math.nan)
            continue
        if column not in required:
            raise InputError(f"{where}: {column}={text} must be empty for {kind} rows")
        numbers.append(_parse_number(column, text, where))
    if kind in ("decode", "hybrid"):
        batch, context = numbers[0], numbers[2]
        if context < batch:
            raise InputError(
                f"{where}: total_context_tokens={fields[3].strip()} must be >= "
                f"batch_size={fields[1].strip()} (each running request holds a token)"
            )
    return kind, numbers


def _parse_number(column: str, text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{where}: {column}={text} must be a number") from None
    if not math.isfinite(value):
        raise InputError(f"{where}: {column}={text} must be a finite number")
    if column in _INTEGER_COLUMNS:
        least = 0 if column in _ZERO_ALLOWED else 1
        if not value.is_integer() or value < least:
            raise InputError(f"{where}: {column}={text} must be an integer >= {least}")
    elif value <= 0:
        raise InputError(f"{where}: {column}={text} must be > 0")
    return value
