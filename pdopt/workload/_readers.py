"""Trace readers (Azure LLM 2023, BurstGPT, Mooncake, generic CSV) and the generic CSV writer.

Every reader validates every row, vectorised, and raises :class:`InputError` naming the file,
the row (1-based data row, header excluded), the file line, the field and the rule, e.g.
``code.csv row 42 (line 43): ContextTokens=-3 must be >= 1``. Empty or whitespace-only fields,
non-numbers, NaN/inf, fractional or non-positive token counts, unparsable times, missing columns
and files without data rows are errors. Rows out of time order are sorted stably with a
:class:`DataWarning` saying how many; equal time stamps are simultaneous arrivals and are kept.
Line numbers assume one row per line (no quoted line breaks). Blank lines at the end of a CSV
file are ignored; a blank line between rows is an error (its fields are empty).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pdopt._validation import check_one_of, param_error
from pdopt.errors import DataWarning, InputError
from pdopt.workload._workload import FloatArray, IntArray, Workload

TRACE_FORMATS = ("auto", "azure", "burstgpt", "mooncake", "csv")
CSV_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
_TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


@dataclass(frozen=True, slots=True)
class _Table:
    """Raw text (or JSON) fields of one file, with each row's file line for messages."""

    source: str
    fields: pd.DataFrame
    lines: np.ndarray
    empty_rule: str = "is empty"

    def fail(self, bad: np.ndarray, field: str, rule: str) -> None:
        """Raise naming the first row where ``bad`` is true, and how many more there are."""
        rows = np.flatnonzero(bad)
        if len(rows):
            i = int(rows[0])
            value = self.fields[field].iloc[i]
            shown = f"={value.strip()}" if isinstance(value, str) and value.strip() else ""
            more = f" ({len(rows) - 1} more rows break this rule)" if len(rows) > 1 else ""
            raise InputError(
                f"{self.source} row {i + 1} (line {int(self.lines[i])}): "
                f"{field}{shown} {rule}{more}"
            )

    def numbers(self, field: str) -> FloatArray:
        """The column as finite floats; an empty or non-numeric field is an error."""
        raw = self.fields[field]
        empty = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
        self.fail(empty, field, self.empty_rule)
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
        return values.astype(np.int64)

    def seconds(self, field: str, time_unit: str) -> FloatArray:
        """Arrival times in seconds: numbers in ``time_unit`` (>= 0), or date-times converted to
        seconds since the earliest one (``time_unit='datetime'``)."""
        if time_unit != "datetime":
            values = self.numbers(field) * _TIME_UNITS_S[time_unit]
            self.fail(values < 0, field, "must be >= 0")
            return values
        raw = self.fields[field]
        empty = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
        self.fail(empty, field, self.empty_rule)
        try:
            stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce")
        except (ValueError, TypeError) as exc:  # e.g. time zones mixed with naive times
            raise InputError(
                f"{self.source}: {field}: cannot read the date-times ({exc})"
            ) from None
        self.fail(stamps.isna().to_numpy(), field, "is not a date-time (YYYY-MM-DD HH:MM:SS.f)")
        elapsed = (stamps - stamps.min()).dt.total_seconds()
        return np.asarray(elapsed, dtype=np.float64)


def _read_csv_table(path: str | Path, required: Sequence[str]) -> _Table:
    source = Path(path).name
    try:
        fields = pd.read_csv(
            path, dtype=str, keep_default_na=False, skip_blank_lines=False, encoding="utf-8-sig"
        )
    except pd.errors.EmptyDataError:
        raise InputError(f"{source}: the file is empty (no header line)") from None
    except pd.errors.ParserError as exc:
        raise InputError(f"{source}: not a valid CSV file: {exc}") from None
    fields.columns = [str(c).strip() for c in fields.columns]
    missing = [c for c in required if c not in fields.columns]
    if missing:
        raise InputError(
            f"{source}: missing column(s) {missing}; the header has {list(fields.columns)}"
        )
    # Trailing blank lines carry no request; drop them (and only them) so line numbers stay exact.
    n_rows = len(fields)
    while n_rows and all(not str(v).strip() for v in fields.iloc[n_rows - 1]):
        n_rows -= 1
    if n_rows == 0:
        raise InputError(f"{source}: the file has a header but no data rows")
    lines = np.arange(n_rows) + 2  # line 1 is the header
    return _Table(source, fields.iloc[:n_rows].reset_index(drop=True), lines)


def _sorted_workload(
    arrival_s: FloatArray, inputs: IntArray, outputs: IntArray, source: str
) -> Workload:
    out_of_order = int(np.count_nonzero(np.diff(arrival_s) < 0))
    if out_of_order:
        warnings.warn(
            f"{source}: {out_of_order} of {len(arrival_s)} rows arrive before the row above them; "
            "sorted all rows by arrival time (stable, none dropped)",
            DataWarning,
            stacklevel=3,
        )
    return Workload.from_unsorted(arrival_s, inputs, outputs, name=source)


def read_azure_trace(path: str | Path) -> Workload:
    """Read an Azure LLM inference trace (2023, Splitwise): ``TIMESTAMP, ContextTokens,
    GeneratedTokens``.

    ``TIMESTAMP`` is a date-time string (``2023-11-16 18:17:03.9799600``); arrivals are seconds
    since the earliest request. A row with ``GeneratedTokens`` = 0 is an error, not repaired: such
    a request cannot be simulated (every request emits at least its first token), and inventing a
    token would change the workload. The public 2023 traces have none (minimum 6 and 7).

    Examples
    --------
    >>> w = read_azure_trace("AzureLLMInferenceTrace_conv.csv")  # doctest: +SKIP
    >>> len(w), round(w.rate_per_s, 2)  # doctest: +SKIP
    (19366, 5.53)
    """
    table = _read_csv_table(path, _AZURE_COLUMNS)
    arrival_s = table.seconds("TIMESTAMP", "datetime")
    inputs = table.tokens("ContextTokens")
    outputs = table.tokens(
        "GeneratedTokens",
        hint=" (a request that generated no token cannot be simulated; remove the row)",
    )
    return _sorted_workload(arrival_s, inputs, outputs, table.source)


def read_burstgpt_trace(path: str | Path) -> Workload:
    """Read a BurstGPT trace: ``Timestamp, Model, Request tokens, Response tokens, Total tokens,
    Log Type`` (only the first, third and fourth are used).

    ``Timestamp`` is seconds from the trace start and is kept as is. Rows with ``Response tokens``
    = 0 are failed requests: they are validated, then left out, and a :class:`DataWarning` says
    how many. Every other row needs ``Request tokens`` >= 1.
    """
    table = _read_csv_table(path, _BURSTGPT_COLUMNS)
    arrival_s = table.seconds("Timestamp", "s")
    outputs = table.tokens(
        "Response tokens",
        keep=np.zeros(len(table.lines), dtype=bool),
        hint=" (0 marks a failed request)",
    )
    ok = outputs >= 1
    inputs = table.tokens("Request tokens", keep=ok)
    failed = int(np.count_nonzero(~ok))
    if failed == len(ok):
        raise InputError(
            f"{table.source}: all {failed} rows are failed requests (0 response "
            "tokens); there is nothing to simulate"
        )
    if failed:
        warnings.warn(
            f"{table.source}: left out {failed} of {len(ok)} rows that are failed requests "
            "(Response tokens = 0)",
            DataWarning,
            stacklevel=2,
        )
    return _sorted_workload(arrival_s[ok], inputs[ok], outputs[ok], table.source)


def _read_jsonl_table(path: str | Path, required: Sequence[str]) -> _Table:
    source = Path(path).name
    records: list[dict[str, object]] = []
    lines: list[int] = []
    with open(path, encoding="utf-8-sig") as handle:
        for line_no, text in enumerate(handle, start=1):
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
    # Raw values as text, so the messages read as the file does; a JSON bool is not a number.
    columns = {
        field: [None if (v := r.get(field)) is None else json.dumps(v) for r in records]
        for field in required
    }
    return _Table(
        source, pd.DataFrame(columns, dtype=object), np.asarray(lines), "is missing or null"
    )


def read_mooncake_trace(path: str | Path) -> Workload:
    """Read a Mooncake trace: JSON lines with ``timestamp`` (milliseconds), ``input_length``,
    ``output_length`` and ``hash_ids``.

    ``hash_ids`` (prefix-cache block hashes) are not needed by :class:`Workload` and are not
    read. A missing or null field reads as empty. Blank lines are skipped; ``row`` in messages
    counts records and ``line`` is the file line.
    """
    table = _read_jsonl_table(path, ("timestamp", "input_length", "output_length"))
    arrival_s = table.seconds("timestamp", "ms")
    inputs = table.tokens("input_length")
    outputs = table.tokens("output_length")
    return _sorted_workload(arrival_s, inputs, outputs, table.source)


def read_csv_trace(
    path: str | Path, columns: Mapping[str, str] | None = None, time_unit: str = "s"
) -> Workload:
    """Read a generic CSV trace (other columns are ignored).

    Parameters
    ----------
    path : str or Path
        The CSV file, with a header line.
    columns : mapping, optional
        File column for each of ``arrival_s``, ``input_tokens``, ``output_tokens``; names not
        given default to those names (what :func:`write_csv_trace` writes).
    time_unit : {"s", "ms", "us", "ns", "datetime"}
        Unit of the arrival column; with ``"datetime"`` arrivals become seconds since the
        earliest request, otherwise they are kept (scaled to seconds) and must be >= 0.
    """
    owner = "read_csv_trace"
    check_one_of(time_unit, (*_TIME_UNITS_S, "datetime"), "time_unit", owner)
    mapping = dict(zip(CSV_COLUMNS, CSV_COLUMNS, strict=True))
    for key, column in (columns or {}).items():
        if key not in mapping:
            raise param_error("columns", owner, f"keyed by names in {list(CSV_COLUMNS)}", columns)
        mapping[key] = column
    table = _read_csv_table(path, list(mapping.values()))
    arrival_s = table.seconds(mapping["arrival_s"], time_unit)
    inputs = table.tokens(mapping["input_tokens"])
    outputs = table.tokens(mapping["output_tokens"])
    return _sorted_workload(arrival_s, inputs, outputs, table.source)


def write_csv_trace(workload: Workload, path: str | Path) -> None:
    """Write ``arrival_s, input_tokens, output_tokens`` to a CSV that :func:`read_csv_trace` and
    :func:`read_trace` read back exactly (floats are written with round-trip precision)."""
    workload.to_frame().to_csv(path, index=False)


def detect_trace_format(path: str | Path) -> str:
    """Guess the format of a trace file from its first line: ``"mooncake"`` for a JSON object,
    else from the CSV header's column names."""
    source = Path(path).name
    with open(path, encoding="utf-8-sig") as handle:
        first = handle.readline().strip()
    if not first:
        raise InputError(f"{source}: the first line is empty; cannot tell the trace format")
    if first.startswith("{"):
        return "mooncake"
    header = {c.strip() for c in first.split(",")}
    known = {"azure": _AZURE_COLUMNS, "burstgpt": _BURSTGPT_COLUMNS, "csv": CSV_COLUMNS}
    for name, required in known.items():
        if header.issuperset(required):
            return name
    raise InputError(
        f"{source}: unknown trace format; the header has {sorted(header)}, the known headers "
        f"are {known}; give format= (or read_csv_trace with a column map)"
    )


def read_trace(path: str | Path, format: str = "auto") -> Workload:
    """Read a trace in one of ``TRACE_FORMATS``; ``"auto"`` uses :func:`detect_trace_format`."""
    check_one_of(format, TRACE_FORMATS, "format", "read_trace")
    kind = detect_trace_format(path) if format == "auto" else format
    readers = {
        "azure": read_azure_trace,
        "burstgpt": read_burstgpt_trace,
        "mooncake": read_mooncake_trace,
        "csv": read_csv_trace,
    }
    return readers[kind](path)
