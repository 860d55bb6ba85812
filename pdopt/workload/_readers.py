"""Trace readers: Azure LLM 2023, BurstGPT, Mooncake, the simulators' CSV layouts (Vidur,
Splitwise-sim), and CSV or JSON lines with any column names (a column map); the CSV writer.

Every reader validates every row, vectorised, and raises :class:`InputError` naming the file,
the row (1-based data row, header excluded), the file line, the field and the rule, e.g.
``code.csv row 42 (line 43): ContextTokens=-3 must be >= 1``. Empty or whitespace-only fields,
non-numbers, NaN/inf, fractional or non-positive token counts, unparsable times, missing columns
and files without data rows are errors: nothing is clipped, rounded or dropped to make a row
fit. Rows out of time order are sorted stably with a :class:`DataWarning` saying how many; equal
time stamps are simultaneous arrivals and are kept. Line numbers assume one row per line (no
quoted line breaks). Blank lines at the end of a CSV file are ignored; a blank line between rows
is an error (its fields are empty).
"""

from __future__ import annotations

import csv
import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from pdopt._validation import check_int_at_least, check_one_of, param_error
from pdopt.errors import DataWarning, InputError
from pdopt.workload._block_columns import BLOCK_COLUMNS, read_block_columns
from pdopt.workload._files import read_first_line
from pdopt.workload._prefix import PrefixBlocks
from pdopt.workload._tables import (
    ARRIVAL_KINDS,
    TIME_UNITS,
    Table,
    read_csv_table,
    read_jsonl_table,
    sorted_workload,
)
from pdopt.workload._workload import Workload

TRACE_FORMATS = (
    "auto", "azure", "burstgpt", "mooncake", "vidur", "splitwise_sim", "csv", "jsonl"
)  # fmt: skip
"""Formats :func:`read_trace` reads; ``csv`` and ``jsonl`` take a column map."""
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the Mooncake (FAST'25) traces."""
CSV_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
"""The generic formats' default column names, and the keys of a column map."""
COLUMN_MAP_KEYS = (*CSV_COLUMNS, *BLOCK_COLUMNS)
"""Every key of a column map: the workload's columns, then the optional prefix-block ones."""
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
# The simulators' trace layouts, as column maps (arrivals in seconds since the trace start):
# Vidur's trace-replay generator reads arrived_at, num_prefill_tokens, num_decode_tokens;
# Splitwise-sim's traces are request_id, request_type, application_id, arrival_timestamp,
# batch_size, prompt_size, token_size.
_SIMULATOR_COLUMNS = {
    "vidur": {
        "arrival_s": "arrived_at",
        "input_tokens": "num_prefill_tokens",
        "output_tokens": "num_decode_tokens",
    },
    "splitwise_sim": {
        "arrival_s": "arrival_timestamp",
        "input_tokens": "prompt_size",
        "output_tokens": "token_size",
    },
}
_HEADERS: dict[str, tuple[str, ...]] = {
    "azure": _AZURE_COLUMNS,
    "burstgpt": _BURSTGPT_COLUMNS,
    **{name: tuple(columns.values()) for name, columns in _SIMULATOR_COLUMNS.items()},
    "csv": CSV_COLUMNS,
}
_RECORDS: dict[str, tuple[str, ...]] = {"mooncake": _MOONCAKE_FIELDS, "jsonl": CSV_COLUMNS}
_GENERIC = ("csv", "jsonl")


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
    table = read_csv_table(path, _AZURE_COLUMNS)
    arrival_s = table.seconds("TIMESTAMP", "datetime")
    inputs = table.tokens("ContextTokens")
    outputs = table.tokens(
        "GeneratedTokens",
        hint=" (a request that generated no token cannot be simulated; remove the row)",
    )
    return sorted_workload(arrival_s, inputs, outputs, table.source)


def read_burstgpt_trace(path: str | Path) -> Workload:
    """Read a BurstGPT trace: ``Timestamp, Model, Request tokens, Response tokens, Total tokens,
    Log Type`` (only the first, third and fourth are used).

    ``Timestamp`` is seconds from the trace start and is kept as is. Rows with ``Response tokens``
    = 0 are failed requests: they are validated, then left out, and a :class:`DataWarning` says
    how many. Every other row needs ``Request tokens`` >= 1.
    """
    table = read_csv_table(path, _BURSTGPT_COLUMNS)
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
    return sorted_workload(arrival_s[ok], inputs[ok], outputs[ok], table.source)


def read_mooncake_trace(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Workload:
    """Read a Mooncake trace: JSON lines with ``timestamp`` (milliseconds), ``input_length``,
    ``output_length`` and ``hash_ids``.

    ``hash_ids`` are the prompt's block identities, one per ``block_tokens`` tokens (512 in the
    Mooncake/FAST'25 traces), the last one for the partial block at the prompt's end: they are
    read into :attr:`Workload.prefix_blocks`, keeping the ``input_length // block_tokens`` full
    blocks (an engine reuses full blocks only, so a partial block's id is left out). A record
    listing more than ``ceil(input_length / block_tokens)`` ids is an error (the block size is
    then likely wrong); fewer is allowed. A trace whose records have no ``hash_ids`` at all gets
    ``prefix_blocks=None``; when some records have it, every record needs it (``[]`` for none).

    A missing or null field reads as empty. Blank lines are skipped; ``row`` in messages counts
    records and ``line`` is the file line.
    """
    block_tokens = check_int_at_least(block_tokens, 1, "block_tokens", "read_mooncake_trace")
    table = read_jsonl_table(path, _MOONCAKE_FIELDS, optional=("hash_ids",))
    arrival_s = table.seconds("timestamp", "ms")
    inputs = table.tokens("input_length")
    outputs = table.tokens("output_length")
    blocks = None
    if "hash_ids" in table.fields.columns:
        lists, counts = table.int_lists("hash_ids")
        ceil = -(-inputs // block_tokens)
        table.fail(
            counts > ceil,
            "hash_ids",
            f"lists more blocks than input_length holds in blocks of {block_tokens} tokens "
            "(give the trace's block size: block_tokens / --hash-block-tokens)",
        )
        full = inputs // block_tokens
        blocks = PrefixBlocks.from_lists(
            [ids[: int(k)] for ids, k in zip(lists, full, strict=True)], block_tokens
        )
    return sorted_workload(arrival_s, inputs, outputs, table.source, blocks)


def read_vidur_trace(path: str | Path) -> Workload:
    """Read a Vidur trace-replay CSV: ``arrived_at`` (seconds), ``num_prefill_tokens``,
    ``num_decode_tokens`` (other columns are ignored).

    Vidur clips token counts to >= 1 and truncates fractions; here a count < 1 or a fraction is
    an error naming the row, so the workload is the file's.
    """
    return _mapped_workload(
        read_csv_table(path, list(_SIMULATOR_COLUMNS["vidur"].values())),
        _SIMULATOR_COLUMNS["vidur"],
    )


def read_splitwise_sim_trace(path: str | Path) -> Workload:
    """Read a Splitwise-sim trace CSV: ``arrival_timestamp`` (seconds), ``prompt_size``,
    ``token_size``; ``request_id``, ``request_type`` and ``application_id`` are ignored.

    ``batch_size``, when present, must be 1 on every row: a request of several sequences has no
    meaning in :class:`Workload` (one sequence per request), and splitting or dropping it would
    change the workload; write one row per sequence instead.
    """
    mapping = _SIMULATOR_COLUMNS["splitwise_sim"]
    table = read_csv_table(path, list(mapping.values()))
    if "batch_size" in table.fields.columns:
        batch = table.tokens("batch_size")
        table.fail(
            batch != 1,
            "batch_size",
            "must be 1 (pdopt simulates one sequence per request; write one row per sequence)",
        )
    return _mapped_workload(table, mapping)


def read_csv_trace(
    path: str | Path,
    columns: Mapping[str, str] | None = None,
    time_unit: str = "s",
    arrival_kind: str = "time",
    block_tokens: int | None = None,
) -> Workload:
    """Read a CSV trace with any column names (other columns are ignored).

    Parameters
    ----------
    path : str or Path
        The CSV file, with a header line.
    columns : mapping, optional
        The column map: the file's column for each of ``arrival_s``, ``input_tokens``,
        ``output_tokens`` (:data:`CSV_COLUMNS`, the :class:`Workload` columns they fill);
        names not given default to those names (what :func:`write_csv_trace` writes). A column
        the file lacks is an error listing the header's columns.
    time_unit : {"s", "ms", "us", "ns", "datetime"}
        Unit of the arrival column. Numbers are scaled to seconds and must be >= 0; date-times
        (ISO 8601) become seconds since the earliest request.
    arrival_kind : {"time", "gap"}
        ``"time"``: each row's arrival time (numbers kept as they are, in seconds). ``"gap"``:
        the time since the previous row's arrival (inter-arrival time, >= 0; the first row's is
        from t = 0); arrivals are the running sum, in file order. Not with ``"datetime"``.
    block_tokens : int, optional
        Tokens per block of the prefix-block columns (``block_hashes``, or ``prefix_group``
        with ``prefix_tokens``; column-map keys, see :data:`BLOCK_COLUMNS`), read into
        :attr:`Workload.prefix_blocks`; needed with them unless the file has a
        ``block_tokens`` column, refused without them.

    Examples
    --------
    >>> w = read_csv_trace(
    ...     "trace.csv", {"arrival_s": "ts", "input_tokens": "prompt"}, time_unit="ms"
    ... )  # doctest: +SKIP
    """
    owner = "read_csv_trace"
    return _read_generic(
        path, owner, read_csv_table, columns, time_unit, arrival_kind, block_tokens
    )


def read_jsonl_trace(
    path: str | Path,
    columns: Mapping[str, str] | None = None,
    time_unit: str = "s",
    arrival_kind: str = "time",
    block_tokens: int | None = None,
) -> Workload:
    """Read a JSON-lines trace with any field names (other fields are ignored); the parameters
    are :func:`read_csv_trace`'s, ``columns`` naming JSON fields.

    Numbers must be JSON numbers (``"12"``, a string, is an error, as is ``true``); date-times
    are JSON strings. A field no record has is an error listing the fields the records have; a
    field missing or null in one record is an error naming that row. Blank lines are skipped.
    """
    owner = "read_jsonl_trace"
    return _read_generic(
        path, owner, read_jsonl_table, columns, time_unit, arrival_kind, block_tokens
    )


def write_csv_trace(workload: Workload, path: str | Path) -> None:
    """Write ``arrival_s, input_tokens, output_tokens`` to a CSV that :func:`read_csv_trace` and
    :func:`read_trace` read back exactly (floats are written with round-trip precision).

    A workload with :attr:`Workload.prefix_blocks` also gets ``block_hashes`` (each row's block
    identities separated by spaces) and ``block_tokens`` (the same on every row), which the
    readers pick up by name, so the blocks round-trip too.
    """
    frame = workload.to_frame()
    blocks = workload.prefix_blocks
    if blocks is not None:
        frame["block_hashes"] = [
            " ".join(map(str, blocks.of(i).tolist())) for i in range(len(workload))
        ]
        frame["block_tokens"] = blocks.block_tokens
    frame.to_csv(path, index=False)


def detect_trace_format(path: str | Path, *, column_map: bool = False) -> str:
    """The format of a trace file, from its first line.

    A JSON object is a JSON-lines file: ``"mooncake"`` or ``"jsonl"`` from the first record's
    fields; anything else is a CSV header naming ``"azure"``, ``"burstgpt"``, ``"vidur"``,
    ``"splitwise_sim"`` or ``"csv"``. A header that fits none, or more than one, is an error
    (give the format). With ``column_map``, only the file type: ``"jsonl"`` or ``"csv"``.
    """
    source = Path(path).name
    first = read_first_line(path).strip()
    if not first:
        raise InputError(f"{source}: the first line is empty; cannot tell the trace format")
    is_json = first.startswith("{")
    if column_map:
        return "jsonl" if is_json else "csv"
    if is_json:
        names, known, what = _first_record_fields(source, first), _RECORDS, "the first record has"
    else:
        names = {c.strip() for c in next(csv.reader([first]))}
        known, what = _HEADERS, "the header has"
    matches = [name for name, required in known.items() if names.issuperset(required)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise InputError(
            f"{source}: the columns fit several trace formats {matches}; give the format"
        )
    listed = {name: list(required) for name, required in known.items()}
    raise InputError(
        f"{source}: unknown trace format; {what} {sorted(names)}, the known ones are {listed}; "
        "give the format 'csv' or 'jsonl' with a column map (columns=)"
    )


def read_trace(
    path: str | Path,
    format: str = "auto",
    *,
    columns: Mapping[str, str] | None = None,
    time_unit: str | None = None,
    arrival_kind: str | None = None,
    block_tokens: int | None = None,
) -> Workload:
    """Read a trace in one of :data:`TRACE_FORMATS`.

    Parameters
    ----------
    path : str or Path
        The trace file.
    format : str
        ``"auto"`` (:func:`detect_trace_format`), a named format, or ``"csv"`` / ``"jsonl"``
        with any column names.
    columns, time_unit, arrival_kind : optional
        The column map, arrival unit and arrival kind of :func:`read_csv_trace` (defaults
        ``"s"`` and ``"time"``), for the formats ``"csv"`` and ``"jsonl"`` only; with
        ``"auto"``, giving any of them reads the file as ``"csv"`` or ``"jsonl"`` by its type.
    block_tokens : int, optional
        Tokens per block of the trace's block hashes: ``"mooncake"``'s ``hash_ids`` (default
        512), or the ``block_hashes`` / ``prefix_group`` columns of ``"csv"`` and ``"jsonl"``.
        Refused with the other formats (they carry no blocks).
    """
    owner = "read_trace"
    check_one_of(format, TRACE_FORMATS, "format", owner)
    options = {"columns": columns, "time_unit": time_unit, "arrival_kind": arrival_kind}
    given = {k: v for k, v in options.items() if v is not None}
    kind = format
    if format == "auto":
        kind = detect_trace_format(path, column_map=bool(given))
    if kind in _GENERIC:
        reader = read_csv_trace if kind == "csv" else read_jsonl_trace
        return reader(path, columns, time_unit or "s", arrival_kind or "time", block_tokens)
    if given:
        name, value = next(iter(given.items()))
        rule = f"given only with format 'csv' or 'jsonl' ({kind!r} has fixed columns and units)"
        raise param_error(name, owner, rule, value)
    if kind == "mooncake":
        bt = MOONCAKE_BLOCK_TOKENS if block_tokens is None else block_tokens
        return read_mooncake_trace(path, bt)
    if block_tokens is not None:
        rule = f"given only with format 'mooncake', 'csv' or 'jsonl' ({kind!r} has no blocks)"
        raise param_error("block_tokens", owner, rule, block_tokens)
    readers = {
        "azure": read_azure_trace,
        "burstgpt": read_burstgpt_trace,
        "mooncake": read_mooncake_trace,
        "vidur": read_vidur_trace,
        "splitwise_sim": read_splitwise_sim_trace,
    }
    return readers[kind](path)


def _first_record_fields(source: str, first: str) -> set[str]:
    try:
        record = json.loads(first)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source} row 1 (line 1): not valid JSON ({exc.msg})") from None
    return set(record)  # a JSON text that starts with "{" and parses is an object


def _column_map(columns: Mapping[str, str] | None, owner: str) -> dict[str, str]:
    """The user's column map, checked: keys among :data:`COLUMN_MAP_KEYS`, non-empty names."""
    if columns is None:
        return {}
    ok = isinstance(columns, Mapping) and all(
        key in COLUMN_MAP_KEYS and isinstance(name, str) and name.strip()
        for key, name in columns.items()
    )
    if not ok:
        rule = f"a mapping from names in {list(COLUMN_MAP_KEYS)} to the file's column names"
        raise param_error("columns", owner, rule, columns)
    return {key: name.strip() for key, name in columns.items()}


def _read_generic(
    path: str | Path,
    owner: str,
    read_table: Callable[[str | Path, list[str], Mapping[str, str], list[str]], Table],
    columns: Mapping[str, str] | None,
    time_unit: str,
    arrival_kind: str,
    block_tokens: int | None,
) -> Workload:
    check_one_of(time_unit, TIME_UNITS, "time_unit", owner)
    check_one_of(arrival_kind, ARRIVAL_KINDS, "arrival_kind", owner)
    if time_unit == "datetime" and arrival_kind == "gap":
        rule = "'time' with time_unit='datetime' (a date-time is not a gap)"
        raise param_error("arrival_kind", owner, rule, arrival_kind)
    given = _column_map(columns, owner)
    mapping = {**dict(zip(CSV_COLUMNS, CSV_COLUMNS, strict=True)), **given}
    # Block columns not in the map are read under their own names when the file has them.
    unmapped = [key for key in BLOCK_COLUMNS if key not in given]
    table = read_table(path, list(dict.fromkeys(mapping.values())), given, unmapped)
    present = set(table.fields.columns)
    mapping.update({key: key for key in unmapped if key in present})
    blocks = {key: mapping[key] for key in BLOCK_COLUMNS if key in mapping}
    return _mapped_workload(table, mapping, time_unit, arrival_kind, blocks, block_tokens, owner)


def _mapped_workload(
    table: Table,
    mapping: Mapping[str, str],
    time_unit: str = "s",
    arrival_kind: str = "time",
    block_columns: Mapping[str, str] | None = None,
    block_tokens: int | None = None,
    owner: str = "read_trace",
) -> Workload:
    """The workload of ``table``'s columns named by ``mapping`` (keys :data:`CSV_COLUMNS`) and
    its prefix blocks from ``block_columns`` (keys :data:`BLOCK_COLUMNS`)."""
    arrival_s = table.arrivals(mapping["arrival_s"], time_unit, arrival_kind)
    inputs = table.tokens(mapping["input_tokens"])
    outputs = table.tokens(mapping["output_tokens"])
    blocks = read_block_columns(table, block_columns or {}, inputs, block_tokens, owner)
    return sorted_workload(arrival_s, inputs, outputs, table.source, blocks)
