"""Traces with any column names: a column map over CSV or JSON lines reads exactly what the
canonical CSV reads; the simulators' layouts (Vidur, Splitwise-sim) are detected by header; bad
maps and bad rows are errors naming the file, row, field and rule."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import DataWarning, InputError, MissingColumnsError, ParameterError
from pdopt.workload import (
    Workload,
    detect_trace_format,
    read_csv_trace,
    read_jsonl_trace,
    read_splitwise_sim_trace,
    read_trace,
    read_vidur_trace,
    write_csv_trace,
)

ARRIVAL = [0.0, 0.25, 1.5, 1.5, 3.0]
INPUTS = [10, 2048, 7, 300, 1]
OUTPUTS = [5, 1, 64, 9, 2]
RENAMED = {
    "arrival_s": "timestamp",
    "input_tokens": "num_prefill_tokens",
    "output_tokens": "num_decode_tokens",
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _columns(workload: Workload) -> tuple[list[float], list[int], list[int]]:
    """The three columns as lists: readers of different files differ only in the name."""
    return (
        workload.arrival_s.tolist(),
        workload.input_tokens.tolist(),
        workload.output_tokens.tolist(),
    )


def _renamed_csv(tmp_path: Path, arrival: list[float], name: str = "renamed.csv") -> Path:
    # Other columns and another order than the canonical file: both must not matter.
    rows = [
        f"{i},{o},chat,{a!r},{n}"
        for i, (a, n, o) in enumerate(zip(arrival, INPUTS, OUTPUTS, strict=True))
    ]
    header = "request_id,num_decode_tokens,kind,timestamp,num_prefill_tokens"
    return _write(tmp_path, name, "\n".join([header, *rows]) + "\n")


def _renamed_jsonl(tmp_path: Path, arrival: list[float], name: str = "renamed.jsonl") -> Path:
    records = [
        json.dumps({"timestamp": a, "num_prefill_tokens": n, "num_decode_tokens": o, "x": [1]})
        for a, n, o in zip(arrival, INPUTS, OUTPUTS, strict=True)
    ]
    return _write(tmp_path, name, "\n".join(records) + "\n")


def test_renamed_csv_and_jsonl_read_as_the_canonical_csv(tmp_path: Path) -> None:
    canonical = tmp_path / "canonical.csv"
    write_csv_trace(Workload(ARRIVAL, INPUTS, OUTPUTS), canonical)
    expected = _columns(read_trace(canonical))
    assert expected == (ARRIVAL, INPUTS, OUTPUTS)
    csv_path, jsonl_path = _renamed_csv(tmp_path, ARRIVAL), _renamed_jsonl(tmp_path, ARRIVAL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sorted files: no repair, no warning
        for workload in (
            read_csv_trace(csv_path, RENAMED),
            read_trace(csv_path, columns=RENAMED),  # auto + a map: CSV by the file's type
            read_trace(csv_path, "csv", columns=RENAMED, time_unit="s", arrival_kind="time"),
            read_jsonl_trace(jsonl_path, RENAMED),
            read_trace(jsonl_path, columns=RENAMED),  # auto + a map: JSON lines
            read_trace(jsonl_path, "jsonl", columns=RENAMED),
        ):
            assert _columns(workload) == expected
    assert detect_trace_format(jsonl_path, column_map=True) == "jsonl"
    assert detect_trace_format(csv_path, column_map=True) == "csv"


def test_canonical_names_need_no_map_in_either_file_type(tmp_path: Path) -> None:
    records = [
        json.dumps({"arrival_s": a, "input_tokens": n, "output_tokens": o})
        for a, n, o in zip(ARRIVAL, INPUTS, OUTPUTS, strict=True)
    ]
    path = _write(tmp_path, "plain.jsonl", "\n".join(records))
    assert detect_trace_format(path) == "jsonl"
    assert _columns(read_trace(path)) == (ARRIVAL, INPUTS, OUTPUTS)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.floats(0.0, 1e7, allow_nan=False, allow_infinity=False),
            st.integers(1, 2**40),
            st.integers(1, 2**40),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_any_workload_reads_back_equal_under_renamed_columns(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[float, int, int]]
) -> None:
    rows = sorted(rows, key=lambda row: row[0])
    arrival, inputs, outputs = (list(col) for col in zip(*rows, strict=True))
    folder = tmp_path_factory.mktemp("renamed")
    canonical = folder / "trace.csv"
    write_csv_trace(Workload(arrival, inputs, outputs), canonical)
    text = canonical.read_text().replace("arrival_s,input_tokens,output_tokens", "t,p,d", 1)
    renamed_csv = _write(folder, "r.csv", text)
    renamed_jsonl = _write(
        folder,
        "r.jsonl",
        "".join(json.dumps({"d": o, "t": a, "p": n}) + "\n" for a, n, o in rows),
    )
    mapping = {"arrival_s": "t", "input_tokens": "p", "output_tokens": "d"}
    expected = _columns(read_trace(canonical))
    assert _columns(read_trace(renamed_csv, columns=mapping)) == expected
    assert _columns(read_trace(renamed_jsonl, columns=mapping)) == expected


def test_arrival_units_and_kinds(tmp_path: Path) -> None:
    ms = _renamed_csv(tmp_path, [1000 * a for a in ARRIVAL], "ms.csv")
    assert read_csv_trace(ms, RENAMED, time_unit="ms").arrival_s == pytest.approx(ARRIVAL)
    us = _renamed_jsonl(tmp_path, [1e6 * a for a in ARRIVAL], "us.jsonl")
    assert read_jsonl_trace(us, RENAMED, time_unit="us").arrival_s == pytest.approx(ARRIVAL)
    gaps = np.diff(ARRIVAL, prepend=0.0).tolist()  # 0, 0.25, 1.25, 0, 1.5
    as_gaps = _renamed_csv(tmp_path, gaps, "gaps.csv")
    workload = read_trace(as_gaps, columns=RENAMED, arrival_kind="gap")
    assert _columns(workload) == (ARRIVAL, INPUTS, OUTPUTS)  # binary fractions: sums exact
    # Inter-arrival gaps from t = 0: the first request arrives after its own gap.
    shifted = _renamed_jsonl(tmp_path, [2.0, *gaps[1:]], "late.jsonl")
    late = read_trace(shifted, columns=RENAMED, arrival_kind="gap", time_unit="s")
    assert late.arrival_s.tolist() == [a + 2.0 for a in ARRIVAL]
    dated = _write(
        tmp_path,
        "dated.jsonl",
        '{"when": "2024-05-01T10:00:01.5", "p": 5, "d": 5}\n'
        '{"when": "2024-05-01T10:00:00", "p": 6, "d": 6}\n',
    )
    mapping = {"arrival_s": "when", "input_tokens": "p", "output_tokens": "d"}
    with pytest.warns(DataWarning, match="1 of 2 rows arrive before"):
        w = read_trace(dated, columns=mapping, time_unit="datetime")
    assert w.arrival_s.tolist() == [0.0, 1.5] and w.input_tokens.tolist() == [6, 5]


VIDUR = (
    "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,2322,91\n0.1217,4158,16\n0.5,1177,339\n"
)
SPLITWISE = (
    "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size\n"
    "0,2,0,0.0,1,4808,10\n1,2,0,0.052,1,3180,8\n2,2,0,2.0,1,110,27\n"
)


def test_simulator_layouts_are_detected_by_header(tmp_path: Path) -> None:
    vidur = _write(tmp_path, "vidur.csv", VIDUR)
    assert detect_trace_format(vidur) == "vidur"
    w = read_trace(vidur)
    assert _columns(w) == ([0.0, 0.1217, 0.5], [2322, 4158, 1177], [91, 16, 339])
    assert read_vidur_trace(vidur) == w
    # The same requests under the generic map read the same.
    mapping = {**RENAMED, "arrival_s": "arrived_at"}
    assert _columns(read_trace(vidur, "csv", columns=mapping)) == _columns(w)
    split = _write(tmp_path, "split.csv", SPLITWISE)
    assert detect_trace_format(split) == "splitwise_sim"
    s = read_trace(split)
    assert _columns(s) == ([0.0, 0.052, 2.0], [4808, 3180, 110], [10, 8, 27])
    assert read_splitwise_sim_trace(split) == s


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            VIDUR.replace("\n0.5,1177,339", "\n0.5,0,339"),
            "v.csv row 3 (line 4): num_prefill_tokens=0 must be >= 1",
        ),
        (
            VIDUR.replace("\n0.5,1177,339", "\n0.5,1177.5,339"),
            "v.csv row 3 (line 4): num_prefill_tokens=1177.5 must be a whole number",
        ),
        (
            VIDUR.replace("\n0.5,1177,339", "\n-0.5,1177,339"),
            "v.csv row 3 (line 4): arrived_at=-0.5 must be >= 0",
        ),
        (
            SPLITWISE.replace("2,2,0,2.0,1,", "2,2,0,2.0,4,"),
            "v.csv row 3 (line 4): batch_size=4 must be 1 (pdopt simulates one sequence per "
            "request; write one row per sequence)",
        ),
        (
            SPLITWISE.replace("1,2,0,0.052,1,3180,8", "1,2,0,0.052,1,3180,"),
            "v.csv row 2 (line 3): token_size is empty",
        ),
    ],
)
def test_simulator_rows_are_checked_not_clipped(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        read_trace(_write(tmp_path, "v.csv", text))
    assert str(info.value) == message


def test_a_header_fitting_two_formats_is_ambiguous(tmp_path: Path) -> None:
    header = "arrival_s,input_tokens,output_tokens,arrived_at,num_prefill_tokens,num_decode_tokens"
    both = _write(tmp_path, "both.csv", f"{header}\n0,1,1,0,1,1\n")
    with pytest.raises(InputError) as info:
        read_trace(both)
    assert str(info.value) == (
        "both.csv: the columns fit several trace formats ['vidur', 'csv']; give the format"
    )
    assert len(read_trace(both, "vidur")) == 1


def test_unknown_json_fields_name_the_first_records(tmp_path: Path) -> None:
    path = _write(tmp_path, "x.jsonl", '{"t": 0, "p": 1, "d": 1}\n')
    unknown = r"^x\.jsonl: unknown trace format; the first record has \['d', 'p', 't'\], the known"
    with pytest.raises(InputError, match=unknown):
        read_trace(path)
    with pytest.raises(InputError, match=r"^y\.jsonl row 1 \(line 1\): not valid JSON"):
        read_trace(_write(tmp_path, "y.jsonl", '{"t": 0,\n'))


def test_a_map_naming_a_missing_column_lists_the_files_columns(tmp_path: Path) -> None:
    csv_path = _renamed_csv(tmp_path, ARRIVAL)
    bad = {**RENAMED, "input_tokens": "prompt_tokens"}
    with pytest.raises(MissingColumnsError) as info:
        read_trace(csv_path, columns=bad)
    assert str(info.value) == (
        "renamed.csv: missing column(s) ['prompt_tokens'] (from the column map: input_tokens = "
        "'prompt_tokens'); the header has ['request_id', 'num_decode_tokens', 'kind', "
        "'timestamp', 'num_prefill_tokens']"
    )
    assert info.value.missing == ["prompt_tokens"]
    jsonl_path = _renamed_jsonl(tmp_path, ARRIVAL)
    with pytest.raises(MissingColumnsError) as info:
        read_trace(jsonl_path, columns={"arrival_s": "timestamp"})
    assert str(info.value) == (
        "renamed.jsonl: missing column(s) ['input_tokens', 'output_tokens']; the records have "
        "['timestamp', 'num_prefill_tokens', 'num_decode_tokens', 'x']"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"columns": {"arrival": "timestamp"}},
            "The 'columns' parameter of read_csv_trace must be a mapping from names in "
            "['arrival_s', 'input_tokens', 'output_tokens', 'block_hashes', 'prefix_group', "
            "'prefix_tokens', 'block_tokens'] to the file's column names. "
            "Got {'arrival': 'timestamp'}.",
        ),
        (
            {"columns": {"input_tokens": " "}},
            "The 'columns' parameter of read_csv_trace must be a mapping from names in "
            "['arrival_s', 'input_tokens', 'output_tokens', 'block_hashes', 'prefix_group', "
            "'prefix_tokens', 'block_tokens'] to the file's column names. "
            "Got {'input_tokens': ' '}.",
        ),
        (
            {"time_unit": "hours"},
            "The 'time_unit' parameter of read_csv_trace must be one of "
            "['datetime', 'ms', 'ns', 's', 'us']. Got 'hours'.",
        ),
        (
            {"arrival_kind": "delta"},
            "The 'arrival_kind' parameter of read_csv_trace must be one of ['gap', 'time']. "
            "Got 'delta'.",
        ),
        (
            {"time_unit": "datetime", "arrival_kind": "gap"},
            "The 'arrival_kind' parameter of read_csv_trace must be 'time' with "
            "time_unit='datetime' (a date-time is not a gap). Got 'gap'.",
        ),
    ],
)
def test_bad_maps_and_options_are_parameter_errors(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ParameterError) as info:
        read_csv_trace(_renamed_csv(tmp_path, ARRIVAL), **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_options_of_a_fixed_format_are_refused(tmp_path: Path) -> None:
    vidur = _write(tmp_path, "vidur.csv", VIDUR)
    fixed = r"^The 'time_unit' parameter of read_trace must be given only with format 'csv' or"
    with pytest.raises(ParameterError, match=fixed + r" 'jsonl' \('vidur' has fixed columns"):
        read_trace(vidur, "vidur", time_unit="ms")


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            '{"timestamp": 1, "num_prefill_tokens": "12", "num_decode_tokens": 1}',
            'r.jsonl row 2 (line 2): num_prefill_tokens="12" is not a finite number',
        ),
        (
            '{"timestamp": -1, "num_prefill_tokens": 12, "num_decode_tokens": 1}',
            "r.jsonl row 2 (line 2): timestamp=-1 must be >= 0",
        ),
        (
            '{"timestamp": 1, "num_prefill_tokens": 12}',
            "r.jsonl row 2 (line 2): num_decode_tokens is missing or null",
        ),
    ],
)
def test_bad_rows_under_a_map_name_the_files_field(
    tmp_path: Path, record: str, message: str
) -> None:
    first = '{"timestamp": 0, "num_prefill_tokens": 1, "num_decode_tokens": 1}'
    path = _write(tmp_path, "r.jsonl", f"{first}\n{record}\n")
    with pytest.raises(InputError) as info:
        read_trace(path, columns=RENAMED, arrival_kind="gap")
    assert str(info.value) == message


def test_a_date_time_must_be_a_json_string(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "d.jsonl",
        '{"t": "2024-05-01T10:00:00", "p": 1, "d": 1}\n{"t": 5, "p": 1, "d": 1}\n',
    )
    mapping = {"arrival_s": "t", "input_tokens": "p", "output_tokens": "d"}
    with pytest.raises(InputError) as info:
        read_trace(path, columns=mapping, time_unit="datetime")
    assert str(info.value) == (
        "d.jsonl row 2 (line 2): t=5 is not a date-time (YYYY-MM-DD HH:MM:SS.f)"
    )


_HUGE = "99999999999999999999"
_TOO_LARGE = "must be <= 9007199254740991 (2**53 - 1, pdopt's largest token count)"


_HUGE_CASES = [  # file, format, field, its lines with {n} for the count
    ("h.csv", "auto", "input_tokens", "arrival_s,input_tokens,output_tokens", "0,10,10", "1,{n},5"),
    ("h.jsonl", "auto", "output_tokens",
     '{{"arrival_s": 0, "input_tokens": 3, "output_tokens": {n}}}'),
    ("h.csv", "azure", "ContextTokens", "TIMESTAMP,ContextTokens,GeneratedTokens",
     "2023-11-16 18:17:03,5,5", "2023-11-16 18:17:04,{n},5"),
    ("h.csv", "burstgpt", "Response tokens",
     "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
     "0,m,3,3,6,x", "1,m,3,{n},6,x"),
    ("h.jsonl", "mooncake", "input_length",
     '{{"timestamp": 0, "input_length": 3, "output_length": 3}}',
     '{{"timestamp": 5, "input_length": {n}, "output_length": 3}}'),
    ("h.csv", "vidur", "num_prefill_tokens", "arrived_at,num_prefill_tokens,num_decode_tokens",
     "0,3,3", "1,{n},3"),
    ("h.csv", "splitwise_sim", "token_size", "arrival_timestamp,prompt_size,token_size,batch_size",
     "0,3,3,1", "1,3,{n},1"),
]  # fmt: skip


@pytest.mark.parametrize(
    "count", [_HUGE, "9223372036854775807", "9007199254740992", "9007199254740993", "1e+300"]
)
@pytest.mark.parametrize("case", _HUGE_CASES, ids=[f"{c[1]}-{c[2]}" for c in _HUGE_CASES])
def test_a_token_count_too_large_is_named_with_the_files_value(
    tmp_path: Path, case: tuple[str, ...], count: str
) -> None:
    """A count >= 2**63 once wrapped to a negative int64 through float64; now every format
    names the file's own value and the bound, and a count float64 would round is refused."""
    name, fmt, field, *lines = case
    path = _write(tmp_path, name, "".join(line.format(n=count) + "\n" for line in lines))
    with pytest.raises(InputError) as info:
        read_trace(path, fmt)
    message = str(info.value)
    assert message.startswith(f"{name} row ") and f": {field}={count} {_TOO_LARGE}" in message
    assert "-9223372036854775808" not in message


def test_the_largest_token_count_reads_exactly(tmp_path: Path) -> None:
    path = _write(tmp_path, "m.csv", "arrival_s,input_tokens,output_tokens\n0,9007199254740991,1\n")
    assert read_trace(path).input_tokens.tolist() == [2**53 - 1]
