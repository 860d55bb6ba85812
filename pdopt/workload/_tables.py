"""The raw fields of a trace file (CSV or JSON lines) and their vectorised, row-naming checks.

Split from :mod:`pdopt.workload._readers` so each reader there is only its format's column
names and rules. Every check raises :class:`InputError` naming the file, the row (1-based data
row, header excluded), the file line, the field and the rule, e.g.
``code.csv row 42 (line 43): ContextTokens=-3 must be >= 1``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pdopt.errors import DataWarning, InputError, MissingColumnsError
from pdopt.workload._files import read_lines, text_stream
from pdopt.workload._prefix import PrefixBlocks
from pdopt.workload._workload import (
    MAX_TOKENS,
    TOO_MANY_TOKENS,
    FloatArray,
    IntArray,
    Workload,
)

TIME_UNITS = ("s", "ms", "us", "ns", "datetime")
"""Units of an arrival column: numbers in seconds, milli-, micro- or nanoseconds, or
date-times (ISO 8601)."""
ARRIVAL_KINDS = ("time", "gap")
"""What an arrival column holds: each request's arrival ``time`` since a common origin, or the
``gap`` since the previous request (inter-arrival time; the first request's gap is from 0)."""
_SECONDS_PER_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True, slots=True)
class Table:
    """Raw text (or JSON) fields of one file, with each row's file line for messages.

    ``is_json``: each field holds the JSON text of a value (``"12"`` for the number 12,
    ``'"12"'`` for the string), so a JSON string is never read as a number.
    """

    source: str
    fields: pd.DataFrame
    lines: np.ndarray
    empty_rule: str = "is empty"
    is_json: bool = False

    def fail(self, bad: np.ndarray, field: str, rule: str) -> None:
        """Raise naming the first row where ``bad`` is true, and how many more there are."""
        rows = np.flatnonzero(bad)
        if len(rows):
            i = int(rows[0])
            value = self.fields[field].iloc[i]
            shown = (
                f"={_clipped(value.strip())}" if isinstance(value, str) and value.strip() else ""
            )
            more = f" ({len(rows) - 1} more rows break this rule)" if len(rows) > 1 else ""
            raise InputError(
                f"{self.source} row {i + 1} (line {int(self.lines[i])}): "
                f"{field}{shown} {rule}{more}"
            )

    def numbers(self, field: str) -> FloatArray:
        """The column as finite floats; an empty or non-numeric field is an error."""
        raw = self._present(field)
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        self.fail(~np.isfinite(values), field, "is not a finite number")
        return values

    def tokens(self, field: str, keep: np.ndarray | None = None, hint: str = "") -> IntArray:
        """The column as whole numbers >= 1; with ``keep``, >= 1 on those rows and >= 0 else."""
        values = self.numbers(field)
        self.fail(values != np.round(values), field, "must be a whole number")
        if keep is not None:
            self.fail(values < 0, field, f"must be >= 0{hint}")
        small = values < 1 if keep is None else (values < 1) & keep
        self.fail(small, field, f"must be >= 1{hint}")
        # NOTE: checked before the cast, which would wrap a count >= 2**63 to a negative one.
        self.fail(values > MAX_TOKENS, field, TOO_MANY_TOKENS)
        return values.astype(np.int64)

    def seconds(self, field: str, time_unit: str) -> FloatArray:
        """Times in seconds: numbers in ``time_unit`` (>= 0), or date-times converted to
        seconds since the earliest one (``time_unit='datetime'``)."""
        if time_unit != "datetime":
            values = self.numbers(field) * _SECONDS_PER_UNIT[time_unit]
            self.fail(values < 0, field, "must be >= 0")
            return values
        raw = self._present(field)
        if self.is_json:  # a date-time is a JSON string; anything else cannot be one
            raw = raw.map(lambda text: json.loads(text) if text.startswith('"') else "")
        try:
            stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce")
        except (ValueError, TypeError) as exc:  # e.g. time zones mixed with naive times
            raise InputError(
                f"{self.source}: {field}: cannot read the date-times ({exc})"
            ) from None
        self.fail(stamps.isna().to_numpy(), field, "is not a date-time (YYYY-MM-DD HH:MM:SS.f)")
        elapsed = (stamps - stamps.min()).dt.total_seconds()
        return np.asarray(elapsed, dtype=np.float64)

    def arrivals(self, field: str, time_unit: str, arrival_kind: str) -> FloatArray:
        """Arrival times in seconds from an arrival ``time`` or inter-arrival ``gap`` column
        (:data:`ARRIVAL_KINDS`): gaps (>= 0) become their running sum, the first from t = 0."""
        values = self.seconds(field, time_unit)
        return values if arrival_kind == "time" else np.cumsum(values)

    def int_lists(self, field: str) -> tuple[list[IntArray], np.ndarray]:
        """Each row's list of int64 identities (block hashes) and each row's raw item count.

        JSON lines: a JSON list of integers (``[]`` for none; missing or null is an error). CSV:
        a JSON list (``"[1, 2]"``), or integers separated by spaces or ``;`` (``1 2``, ``1;2``);
        an empty field lists none. Items outside int64, fractions, strings and booleans are
        errors naming the row.
        """
        raw = self.fields[field]
        if self.is_json:
            self.fail(raw.isna().to_numpy(), field, self.empty_rule)
        rule = (
            "must be a list of integers (a JSON list"
            + ("" if self.is_json else ", or integers separated by spaces or ';'")
            + ")"
        )
        lists: list[IntArray] = []
        for i, text in enumerate(raw.tolist()):
            items = _int_items(str(text), self.is_json)
            if items is None:
                self.fail(np.arange(len(raw)) == i, field, rule)
            elif not all(-(2**63) <= v < 2**63 for v in items):
                self.fail(np.arange(len(raw)) == i, field, "has an integer outside int64")
            lists.append(np.asarray(items, dtype=np.int64))
        return lists, np.fromiter((len(v) for v in lists), dtype=np.int64, count=len(lists))

    def texts(self, field: str) -> list[str]:
        """The column as non-empty raw texts (JSON text for JSON lines), e.g. group ids."""
        raw = self._present(field)
        return [str(v).strip() for v in raw.tolist()]

    def _present(self, field: str) -> pd.Series:
        """The raw column; an empty field (or a missing/null JSON value) is an error."""
        raw = self.fields[field]
        empty = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
        self.fail(empty, field, self.empty_rule)
        return raw


def _clipped(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters (a row's list of block hashes can be long)."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _int_items(text: str, is_json: bool) -> list[int] | None:
    """The integers ``text`` lists, or None if it is not such a list (see Table.int_lists)."""
    text = text.strip()
    if text.startswith("[") or is_json:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        ok = isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        )
        return value if ok else None
    parts = text.replace(";", " ").split()
    if not all(p.lstrip("+-").isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def missing_columns_error(
    source: str,
    required: Sequence[str],
    present: Sequence[str],
    mapping: Mapping[str, str],
    has: str = "the header has",
) -> MissingColumnsError:
    """The file lacks some of ``required``: name them, the column-map entries that asked for
    them, and what the file has."""
    missing = [c for c in required if c not in present]
    asked = [f"{key} = {column!r}" for key, column in mapping.items() if column in missing]
    by_map = f" (from the column map: {', '.join(asked)})" if asked else ""
    message = f"{source}: missing column(s) {missing}{by_map}; {has} {list(present)}"
    return MissingColumnsError(message, missing, list(present))


def read_csv_table(
    path: str | Path,
    required: Sequence[str],
    mapping: Mapping[str, str] | None = None,
    optional: Sequence[str] = (),
) -> Table:
    """The CSV file's fields as text; every ``required`` column must be in the header
    (``mapping``, a column map, only words the error; every column is kept, so ``optional``
    is taken for the same signature as :func:`read_jsonl_table`)."""
    source = Path(path).name
    try:
        fields = pd.read_csv(
            text_stream(path), dtype=str, keep_default_na=False, skip_blank_lines=False
        )
    except pd.errors.EmptyDataError:
        raise InputError(f"{source}: the file is empty (no header line)") from None
    except pd.errors.ParserError as exc:
        raise InputError(f"{source}: not a valid CSV file: {exc}") from None
    fields.columns = [str(c).strip() for c in fields.columns]
    if any(c not in fields.columns for c in required):
        raise missing_columns_error(source, required, list(fields.columns), mapping or {})
    # Trailing blank lines carry no request; drop them (and only them) so line numbers stay exact.
    n_rows = len(fields)
    while n_rows and all(not str(v).strip() for v in fields.iloc[n_rows - 1]):
        n_rows -= 1
    if n_rows == 0:
        raise InputError(f"{source}: the file has a header but no data rows")
    lines = np.arange(n_rows) + 2  # line 1 is the header
    return Table(source, fields.iloc[:n_rows].reset_index(drop=True), lines)


def read_jsonl_table(
    path: str | Path,
    required: Sequence[str],
    mapping: Mapping[str, str] | None = None,
    optional: Sequence[str] = (),
) -> Table:
    """The JSON-lines file's ``required`` fields as JSON text, one row per record (blank lines
    are skipped; ``row`` counts records, ``line`` is the file line). A field that no record has
    is a misnamed column (an error listing the fields the records have); a field missing from
    some records reads as empty there. ``optional`` fields are kept when some record has them."""
    source = Path(path).name
    records: list[dict[str, object]] = []
    lines: list[int] = []
    for line_no, text in enumerate(read_lines(path), start=1):
        if not text.strip():
            continue  # a blank line is no record; row numbers count records only
        where = f"{source} row {len(records) + 1} (line {line_no})"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"{where}: must be a JSON object, got {type(record).__name__}")
        records.append(record)
        lines.append(line_no)
    if not records:
        raise InputError(f"{source}: the file is empty (no JSON records)")
    present = list(dict.fromkeys(key for record in records for key in record))
    if any(field not in present for field in required):
        raise missing_columns_error(source, required, present, mapping or {}, "the records have")
    # Raw values as text, so the messages read as the file does; a JSON bool is not a number.
    columns = {
        field: [None if (v := r.get(field)) is None else json.dumps(v) for r in records]
        for field in [*required, *(f for f in optional if f in present and f not in required)]
    }
    return Table(
        source,
        pd.DataFrame(columns, dtype=object),
        np.asarray(lines),
        "is missing or null",
        is_json=True,
    )


def sorted_workload(
    arrival_s: FloatArray,
    inputs: IntArray,
    outputs: IntArray,
    source: str,
    prefix_blocks: PrefixBlocks | None = None,
) -> Workload:
    """The workload in arrival order; rows out of order are sorted (stable) with a warning."""
    out_of_order = int(np.count_nonzero(np.diff(arrival_s) < 0))
    if out_of_order:
        warnings.warn(
            f"{source}: {out_of_order} of {len(arrival_s)} rows arrive before the row above them; "
            "sorted all rows by arrival time (stable, none dropped)",
            DataWarning,
            stacklevel=3,
        )
    return Workload.from_unsorted(
        arrival_s, inputs, outputs, name=source, prefix_blocks=prefix_blocks
    )
