"""Trace readers: every error names file, row, line, field and rule; repairs warn; real traces."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import DataWarning, InputError, ParameterError
from pdopt.workload import (
    Workload,
    detect_trace_format,
    read_azure_trace,
    read_burstgpt_trace,
    read_csv_trace,
    read_mooncake_trace,
    read_trace,
    write_csv_trace,
)

AZURE_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces"
AZURE_DIR = AZURE_DIR / "azure_llm_2023"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def _azure(tmp_path: Path, *rows: str, name: str = "code.csv") -> Path:
    return _write(tmp_path, name, "\r\n".join([AZURE_HEADER, *rows]))


def _raises(path: Path, message: str, reader: Callable[[Path], Workload] = read_trace) -> None:
    with pytest.raises(InputError) as info:
        reader(path)
    assert str(info.value) == message


def test_azure_reads_seconds_since_first_request(tmp_path: Path) -> None:
    path = _azure(
        tmp_path,
        "2023-11-16 18:17:03.9799600,4808,10",
        "2023-11-16 18:17:04.0319600,3180,8",
        "2023-11-16 18:17:05.9799600,110,27",
    )
    w = read_azure_trace(path)
    assert w.name == "code.csv"
    assert w.arrival_s == pytest.approx([0.0, 0.052, 2.0], abs=1e-6)
    assert w.input_tokens.tolist() == [4808, 3180, 110]
    assert w.output_tokens.tolist() == [10, 8, 27]
    assert detect_trace_format(path) == "azure" and read_trace(path) == w


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2023-11-16 18:17:05.0,-3,5", "code.csv row 2 (line 3): ContextTokens=-3 must be >= 1"),
        ("2023-11-16 18:17:05.0,0,5", "code.csv row 2 (line 3): ContextTokens=0 must be >= 1"),
        ("2023-11-16 18:17:05.0,,5", "code.csv row 2 (line 3): ContextTokens is empty"),
        ("2023-11-16 18:17:05.0,  ,5", "code.csv row 2 (line 3): ContextTokens is empty"),
        (
            "2023-11-16 18:17:05.0,NaN,5",
            "code.csv row 2 (line 3): ContextTokens=NaN is not a finite number",
        ),
        (
            "2023-11-16 18:17:05.0,12k,5",
            "code.csv row 2 (line 3): ContextTokens=12k is not a finite number",
        ),
        (
            "2023-11-16 18:17:05.0,2.5,5",
            "code.csv row 2 (line 3): ContextTokens=2.5 must be a whole number",
        ),
        (
            "2023-11-16 18:17:05.0,7,0",
            "code.csv row 2 (line 3): GeneratedTokens=0 must be >= 1 (a request that generated "
            "no token cannot be simulated; remove the row)",
        ),
        (
            "yesterday,7,5",
            "code.csv row 2 (line 3): TIMESTAMP=yesterday is not a date-time "
            "(YYYY-MM-DD HH:MM:SS.f)",
        ),
        (",7,5", "code.csv row 2 (line 3): TIMESTAMP is empty"),
    ],
)
def test_azure_row_errors(tmp_path: Path, row: str, message: str) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:04.0,100,5", row, "2023-11-16 18:17:06.0,100,5")
    _raises(path, message, read_azure_trace)


def test_error_counts_further_bad_rows(tmp_path: Path) -> None:
    path = _azure(
        tmp_path,
        "2023-11-16 18:17:04.0,100,5",
        "2023-11-16 18:17:05.0,100,-1",
        "2023-11-16 18:17:06.0,100,0",
    )
    _raises(
        path,
        "code.csv row 2 (line 3): GeneratedTokens=-1 must be >= 1 (a request that generated no "
        "token cannot be simulated; remove the row) (1 more rows break this rule)",
    )


def test_file_level_errors(tmp_path: Path) -> None:
    _raises(
        _write(tmp_path, "a.csv", ""), "a.csv: the file is empty (no header line)", read_azure_trace
    )
    _raises(
        _write(tmp_path, "b.csv", AZURE_HEADER + "\r\n"),
        "b.csv: the file has a header but no data rows",
        read_azure_trace,
    )
    _raises(
        _write(tmp_path, "c.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:04,5\n"),
        "c.csv: missing column(s) ['GeneratedTokens']; the header has "
        "['TIMESTAMP', 'ContextTokens']",
        read_azure_trace,
    )
    with pytest.raises(InputError, match=r"^d\.csv: not a valid CSV file: .*line 3"):
        read_azure_trace(_write(tmp_path, "d.csv", f"{AZURE_HEADER}\n2023-11-16,1,1\n1,2,3,4\n"))


def test_blank_lines(tmp_path: Path) -> None:
    # Trailing blank lines are ignored; a blank line between rows is an empty row.
    ok = _azure(tmp_path, "2023-11-16 18:17:04,1,1", "2023-11-16 18:17:05,2,2", "", "")
    assert len(read_azure_trace(ok)) == 2
    bad = _azure(tmp_path, "2023-11-16 18:17:04,1,1", "", "2023-11-16 18:17:05,2,2", name="gap.csv")
    _raises(bad, "gap.csv row 2 (line 3): TIMESTAMP is empty", read_azure_trace)


def test_unsorted_rows_are_sorted_with_a_warning_and_ties_kept(tmp_path: Path) -> None:
    path = _azure(
        tmp_path,
        "2023-11-16 18:17:05,1,1",
        "2023-11-16 18:17:04,2,2",
        "2023-11-16 18:17:06,3,3",
        "2023-11-16 18:17:06,4,4",
        "2023-11-16 18:17:04,5,5",
    )
    with pytest.warns(DataWarning) as record:
        w = read_azure_trace(path)
    assert str(record[0].message) == (
        "code.csv: 2 of 5 rows arrive before the row above them; sorted all rows by arrival "
        "time (stable, none dropped)"
    )
    assert w.arrival_s.tolist() == [0.0, 0.0, 1.0, 2.0, 2.0]
    assert w.input_tokens.tolist() == [2, 5, 1, 3, 4]


def test_sorted_rows_raise_no_warning(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:04,1,1", "2023-11-16 18:17:04,2,2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_azure_trace(path).arrival_s.tolist() == [0.0, 0.0]


def test_burstgpt_leaves_out_failed_requests(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "burst.csv",
        "\n".join(
            [
                BURST_HEADER,
                "5,ChatGPT,472,18,490,Conversation log",
                "45,ChatGPT,1087,0,1087,Conversation log",
                "118,GPT-4,417,276,693,API log",
                "118,ChatGPT,0,0,0,Conversation log",
                "130,ChatGPT,60,12,72,API log",
            ]
        ),
    )
    assert detect_trace_format(path) == "burstgpt"
    with pytest.warns(DataWarning, match=r"^burst\.csv: left out 2 of 5 rows that are failed"):
        w = read_trace(path)
    assert w.arrival_s.tolist() == [5.0, 118.0, 130.0]
    assert w.input_tokens.tolist() == [472, 417, 60]
    assert w.output_tokens.tolist() == [18, 276, 12]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "9,ChatGPT,5,-1,4,API log",
            "b.csv row 2 (line 3): Response tokens=-1 must be >= 0 (0 marks a failed request)",
        ),
        ("9,ChatGPT,0,3,3,API log", "b.csv row 2 (line 3): Request tokens=0 must be >= 1"),
        ("9,ChatGPT,-2,0,0,API log", "b.csv row 2 (line 3): Request tokens=-2 must be >= 0"),
        ("-1,ChatGPT,5,3,8,API log", "b.csv row 2 (line 3): Timestamp=-1 must be >= 0"),
        (
            "soon,ChatGPT,5,3,8,API log",
            "b.csv row 2 (line 3): Timestamp=soon is not a finite number",
        ),
    ],
)
def test_burstgpt_row_errors(tmp_path: Path, row: str, message: str) -> None:
    path = _write(tmp_path, "b.csv", f"{BURST_HEADER}\n5,ChatGPT,1,1,2,API log\n{row}\n")
    _raises(path, message, read_burstgpt_trace)


def test_burstgpt_all_failed_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "b.csv", f"{BURST_HEADER}\n5,ChatGPT,10,0,10,API log\n")
    _raises(
        path,
        "b.csv: all 1 rows are failed requests (0 response tokens); there is nothing to simulate",
        read_burstgpt_trace,
    )


def test_mooncake_converts_milliseconds(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "mooncake.jsonl",
        '{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [0, 1, 2]}\n'
        "\n"
        '{"timestamp": 1500, "input_length": 6472, "output_length": 26, "hash_ids": [0, 46]}\n'
        '{"timestamp": 1500, "input_length": 100, "output_length": 1, "hash_ids": []}\n',
    )
    assert detect_trace_format(path) == "mooncake"
    w = read_trace(path)
    assert w.arrival_s.tolist() == [0.0, 1.5, 1.5]
    assert w.input_tokens.tolist() == [6955, 6472, 100]
    assert w.output_tokens.tolist() == [52, 26, 1]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            '{"timestamp": 2, "input_length": 0, "output_length": 1}',
            "m.jsonl row 2 (line 3): input_length=0 must be >= 1",
        ),
        (
            '{"timestamp": 2, "output_length": 1}',
            "m.jsonl row 2 (line 3): input_length is missing or null",
        ),
        (
            '{"timestamp": null, "input_length": 3, "output_length": 1}',
            "m.jsonl row 2 (line 3): timestamp is missing or null",
        ),
        (
            '{"timestamp": 2, "input_length": "12", "output_length": 1}',
            'm.jsonl row 2 (line 3): input_length="12" is not a finite number',
        ),
        (
            '{"timestamp": 2, "input_length": true, "output_length": 1}',
            "m.jsonl row 2 (line 3): input_length=true is not a finite number",
        ),
        (
            '{"timestamp": -5, "input_length": 3, "output_length": 1}',
            "m.jsonl row 2 (line 3): timestamp=-5 must be >= 0",
        ),
        (
            '{"timestamp": 2, "input_length": 3',
            "m.jsonl row 2 (line 3): not valid JSON (Expecting ',' delimiter)",
        ),
        ("[1, 2, 3]", "m.jsonl row 2 (line 3): must be a JSON object, got list"),
    ],
)
def test_mooncake_row_errors(tmp_path: Path, record: str, message: str) -> None:
    first = '{"timestamp": 0, "input_length": 1, "output_length": 1}'
    path = _write(tmp_path, "m.jsonl", f"{first}\n\n{record}\n")
    _raises(path, message, read_mooncake_trace)


def test_mooncake_empty_file(tmp_path: Path) -> None:
    _raises(
        _write(tmp_path, "m.jsonl", "\n\n"),
        "m.jsonl: the file is empty (no JSON records)",
        read_mooncake_trace,
    )


def test_generic_csv_with_column_map_and_units(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", "t_ms,prompt,completion,extra\n250,10,3,x\n1000,20,4,y\n")
    w = read_csv_trace(
        path,
        columns={"arrival_s": "t_ms", "input_tokens": "prompt", "output_tokens": "completion"},
        time_unit="ms",
    )
    assert w.arrival_s.tolist() == [0.25, 1.0]
    assert w.input_tokens.tolist() == [10, 20] and w.output_tokens.tolist() == [3, 4]
    stamps = _write(
        tmp_path,
        "d.csv",
        "arrival_s,input_tokens,output_tokens\n"
        "2024-05-01T10:00:01.5,5,5\n2024-05-01T10:00:00,6,6\n",
    )
    with pytest.warns(DataWarning, match="1 of 2 rows"):
        dated = read_csv_trace(stamps, time_unit="datetime")
    assert dated.arrival_s.tolist() == [0.0, 1.5] and dated.input_tokens.tolist() == [6, 5]
    with pytest.raises(ParameterError, match="'time_unit' parameter of read_csv_trace"):
        read_csv_trace(path, time_unit="hours")
    with pytest.raises(ParameterError, match="'columns' parameter of read_csv_trace"):
        read_csv_trace(path, columns={"arrival": "t_ms"})
    _raises(
        path,
        "t.csv: missing column(s) ['arrival_s', 'input_tokens', 'output_tokens']; the "
        "header has ['t_ms', 'prompt', 'completion', 'extra']",
        read_csv_trace,
    )


def test_read_trace_format_choice(tmp_path: Path) -> None:
    path = _write(tmp_path, "x.csv", "when,a,b\n1,2,3\n")
    with pytest.raises(
        InputError,
        match=r"^x\.csv: unknown trace format; the header has "
        r"\['a', 'b', 'when'\]",
    ):
        read_trace(path)
    with pytest.raises(ParameterError, match="'format' parameter of read_trace"):
        read_trace(path, format="parquet")
    _raises(
        path,
        "x.csv: missing column(s) ['TIMESTAMP', 'ContextTokens', 'GeneratedTokens']; "
        "the header has ['when', 'a', 'b']",
        lambda p: read_trace(p, format="azure"),
    )


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.floats(0.0, 1e7, allow_nan=False, allow_infinity=False),
            st.integers(1, 2**40),
            st.integers(1, 2**40),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_generic_csv_round_trips_any_valid_workload(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[float, int, int]]
) -> None:
    arrival, inputs, outputs = (list(col) for col in zip(*rows, strict=True))
    workload = Workload.from_unsorted(arrival, inputs, outputs, name="trace.csv")
    path = tmp_path_factory.mktemp("roundtrip") / "trace.csv"
    write_csv_trace(workload, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # written sorted: no repair warning
        assert read_trace(path) == workload
        assert read_csv_trace(path) == workload


@pytest.mark.parametrize(
    ("name", "rows", "rate", "cv"),
    [
        ("AzureLLMInferenceTrace_code.csv", 8_819, 2.566, 13.15),
        ("AzureLLMInferenceTrace_conv.csv", 19_366, 5.530, 1.09),
    ],
)
def test_real_azure_traces_match_their_readme(name: str, rows: int, rate: float, cv: float) -> None:
    path = AZURE_DIR / name
    if not path.exists():
        pytest.skip(f"shared data not present: {path}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # both files are sorted and clean
        w = read_trace(path)
    stats = w.stats()
    assert len(w) == rows and w.arrival_s[0] == 0.0
    assert stats["rate_per_s"] == pytest.approx(rate, abs=0.001)
    assert stats["interarrival_cv"] == pytest.approx(cv, abs=0.005)
    assert w.input_tokens.min() >= 2 and w.output_tokens.min() >= 6


_MOONCAKE_REUSE = (
    '{"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, '
    "5, 6, 7, 8, 9, 10, 11, 12, 13]}\n"
    '{"timestamp": 3052, "input_length": 2287, "output_length": 316, "hash_ids": [0, 42, 43, 44, '
    "45]}\n"
    '{"timestamp": 1000, "input_length": 1024, "output_length": 3, "hash_ids": [0, 42]}\n'
)


def test_mooncake_reads_hash_ids_as_full_blocks(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text(_MOONCAKE_REUSE)
    with pytest.warns(DataWarning, match="sorted"):
        w = read_mooncake_trace(path)
    blocks = w.prefix_blocks
    assert blocks is not None and blocks.block_tokens == 512
    # sorted by time (1000 ms before 3052 ms); a partial last block's id is left out
    assert w.input_tokens.tolist() == [6755, 1024, 2287]
    assert [blocks.of(i).tolist() for i in range(3)] == [list(range(13)), [0, 42], [0, 42, 43, 44]]
    with pytest.warns(DataWarning):
        assert read_trace(path) == w


@pytest.mark.filterwarnings("ignore::pdopt.errors.DataWarning")
def test_mooncake_block_size_setting(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text(_MOONCAKE_REUSE)
    with pytest.raises(InputError, match=r"mc.jsonl row 1 \(line 1\): hash_ids.*more blocks"):
        read_trace(path, block_tokens=1024)
    w = read_trace(path, "mooncake", block_tokens=256)
    assert w.prefix_blocks is not None and w.prefix_blocks.counts().tolist() == [14, 2, 5]


def test_mooncake_without_hash_ids_has_no_blocks(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5}\n')
    assert read_mooncake_trace(path).prefix_blocks is None


@pytest.mark.parametrize(
    ("hash_ids", "message"),
    [
        ('"hash_ids": null', "hash_ids is missing or null"),
        ('"hash_ids": [1, 2.5]', "hash_ids=.* must be a list of integers"),
        ('"hash_ids": [true]', "hash_ids=.* must be a list of integers"),
        ('"hash_ids": "1 2"', "hash_ids=.* must be a list of integers"),
        ('"hash_ids": [18446744073709551615]', "hash_ids=.* has an integer outside int64"),
    ],
)
def test_mooncake_bad_hash_ids(tmp_path: Path, hash_ids: str, message: str) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
        f'{{"timestamp": 1, "input_length": 600, "output_length": 5, {hash_ids}}}\n'
    )
    with pytest.raises(InputError, match=rf"mc.jsonl row 2 \(line 2\): {message}"):
        read_mooncake_trace(path)


def test_block_tokens_refused_for_formats_without_blocks(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n")
    with pytest.raises(ParameterError, match="block_tokens"):
        read_trace(path, block_tokens=16)
