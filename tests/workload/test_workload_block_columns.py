"""Prefix blocks from generic CSV / JSON-lines columns, the CSV round trip, compressed traces."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.errors import InputError, ParameterError
from pdopt.workload import (
    PrefixBlocks,
    Workload,
    detect_trace_format,
    read_csv_trace,
    read_jsonl_trace,
    read_trace,
    shared_prefix_workload,
    write_csv_trace,
)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        (['"[1, 2]"', "1 2 3", ""], [[1, 2], [1, 2, 3], []]),
        (["1;2", "[]", " 4 ;5 "], [[1, 2], [], [4, 5]]),
        (["-3", "9223372036854775807", "0"], [[-3], [9223372036854775807], [0]]),
    ],
)
def test_csv_block_hashes(tmp_path: Path, cells: list[str], expected: list[list[int]]) -> None:
    rows = "".join(f"{t},64,1,{c}\n" for t, c in enumerate(cells))
    path = _write(tmp_path, "t.csv", "arrival_s,input_tokens,output_tokens,h\n" + rows)
    w = read_csv_trace(path, {"block_hashes": "h"}, block_tokens=16)
    assert w.prefix_blocks == PrefixBlocks.from_lists(expected, 16)


def test_jsonl_block_hashes_and_sorting(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "t.jsonl",
        '{"t": 2, "i": 64, "o": 1, "h": [5, 6]}\n{"t": 1, "i": 20, "o": 1, "h": [5]}\n',
    )
    with pytest.warns(Warning, match="sorted"):
        w = read_jsonl_trace(
            path, {"arrival_s": "t", "input_tokens": "i", "output_tokens": "o",
                   "block_hashes": "h"}, block_tokens=16,
        )  # fmt: skip
    assert w.prefix_blocks == PrefixBlocks.from_lists([[5], [5, 6]], 16)


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("1 x", r"t.csv row 2 \(line 3\): h=1 x must be a list of integers"),
        ('"[1, 2.0]"', r"row 2 \(line 3\): h=\[1, 2.0\] must be a list"),
        ("1 2 3 4 5", r"row 2 \(line 3\): h=1 2 3 4 5 lists more blocks than the prompt's full"),
        ("99999999999999999999", "outside int64"),
    ],
)
def test_csv_block_hash_errors(tmp_path: Path, cell: str, message: str) -> None:
    text = f"arrival_s,input_tokens,output_tokens,h\n0,64,1,1\n1,64,1,{cell}\n"
    path = _write(tmp_path, "t.csv", text)
    with pytest.raises(InputError, match=message):
        read_csv_trace(path, {"block_hashes": "h"}, block_tokens=16)


def test_block_tokens_rules(tmp_path: Path) -> None:
    plain = _write(tmp_path, "p.csv", "arrival_s,input_tokens,output_tokens\n0,64,1\n")
    with pytest.raises(ParameterError, match=r"block_tokens.*only with a block_hashes"):
        read_csv_trace(plain, block_tokens=16)
    path = _write(tmp_path, "t.csv", "arrival_s,input_tokens,output_tokens,h\n0,64,1,1 2\n")
    with pytest.raises(ParameterError, match=r"block_tokens.*given.*e.g. 16 for vLLM"):
        read_csv_trace(path, {"block_hashes": "h"})
    both = {"block_hashes": "h", "prefix_group": "h"}
    with pytest.raises(ParameterError, match="either 'block_hashes' or 'prefix_group'"):
        read_csv_trace(path, both, block_tokens=16)
    with pytest.raises(ParameterError, match="'prefix_group' and 'prefix_tokens' together"):
        read_csv_trace(path, {"prefix_group": "h"}, block_tokens=16)
    with pytest.raises(ParameterError, match="columns"):
        read_csv_trace(path, {"hashes": "h"}, block_tokens=16)


def test_block_tokens_column(tmp_path: Path) -> None:
    head = "arrival_s,input_tokens,output_tokens,block_hashes,block_tokens\n"
    path = _write(tmp_path, "t.csv", head + "0,64,1,1 2,32\n1,64,1,1,32\n")
    w = read_trace(path)  # both block columns read by name
    assert w.prefix_blocks == PrefixBlocks.from_lists([[1, 2], [1]], 32)
    assert read_trace(path, block_tokens=32) == w
    with pytest.raises(ParameterError, match="the trace's block_tokens column"):
        read_trace(path, block_tokens=16)
    bad = _write(tmp_path, "b.csv", head + "0,64,1,1 2,32\n1,64,1,1,16\n")
    with pytest.raises(InputError, match=r"b.csv row 2 \(line 3\): block_tokens=16 must be the"):
        read_trace(bad)


def test_prefix_groups(tmp_path: Path) -> None:
    text = "t,n,o,g,p\n0,100,1,a,64\n1,90,1,a,80\n2,100,1,b,64\n3,40,1,a,0\n"
    path = _write(tmp_path, "g.csv", text)
    cols = {"arrival_s": "t", "input_tokens": "n", "output_tokens": "o", "prefix_group": "g",
            "prefix_tokens": "p"}  # fmt: skip
    w = read_csv_trace(path, cols, block_tokens=16)
    b = w.prefix_blocks
    assert b is not None and b.counts().tolist() == [6, 5, 6, 2]
    k = [b.chained_keys()[b.offsets[i] : b.offsets[i + 1]] for i in range(4)]
    assert (k[0][:4] == k[1][:4]).all() and k[0][4] != k[1][4]  # share min(64, 80) // 16 = 4
    assert not set(k[2].tolist()) & set(k[0].tolist())  # another group
    assert not set(k[3].tolist()) & set(k[0].tolist())  # prefix_tokens 0: its own blocks only
    over = _write(tmp_path, "o.csv", "t,n,o,g,p\n0,100,1,a,101\n")
    with pytest.raises(InputError, match=r"row 1 \(line 2\): p=101 must be <= the row's input"):
        read_csv_trace(over, cols, block_tokens=16)
    empty = _write(tmp_path, "e.csv", "t,n,o,g,p\n0,100,1,,10\n")
    with pytest.raises(InputError, match=r"row 1 \(line 2\): g is empty"):
        read_csv_trace(empty, cols, block_tokens=16)


def _reuse_workload() -> Workload:
    return shared_prefix_workload(
        np.arange(30, dtype=float) / 7,
        num_system_prompts=2,
        system_prompt_tokens=50,
        users_per_system_prompt=3,
        question_tokens=30,
        output_tokens=7,
        multi_turn=True,
        seed=1,
    )


def test_write_csv_round_trips_blocks(tmp_path: Path) -> None:
    w = _reuse_workload()
    path = tmp_path / "r.csv"
    write_csv_trace(w, path)
    back = read_trace(path)
    assert back == Workload(w.arrival_s, w.input_tokens, w.output_tokens, "r.csv", w.prefix_blocks)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4), min_size=1, max_size=6),
    st.integers(1, 8),
)
def test_csv_round_trip_property(lists: list[list[int]], block_tokens: int) -> None:
    import tempfile

    inputs = [block_tokens * len(b) + 1 for b in lists]
    w = Workload(np.arange(len(lists), dtype=float), inputs, [1] * len(lists), "x.csv",
                 PrefixBlocks.from_lists(lists, block_tokens))  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.csv"
        write_csv_trace(w, path)
        assert read_trace(path) == w


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
@pytest.mark.parametrize("name", ["mc.jsonl", "mc.jsonl.gz", "mc.jsonl.zst"])
def test_compressed_traces_read_transparently(tmp_path: Path, kind: str, name: str) -> None:
    text = (
        '{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}\n'
        '{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": [1, 4]}\n'
    )
    plain = _write(tmp_path, "plain.jsonl", text)
    data = gzip.compress(text.encode()) if kind == "gzip" else zstandard.compress(text.encode())
    path = tmp_path / name  # told by the first bytes, not by the name
    path.write_bytes(data)
    assert detect_trace_format(path) == "mooncake"
    got, want = read_trace(path), read_trace(plain)
    assert got.prefix_blocks == want.prefix_blocks
    assert got.input_tokens.tolist() == want.input_tokens.tolist()


def test_compressed_csv_with_errors_names_rows(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"arrival_s,input_tokens,output_tokens\n0,5,5\n1,-3,5\n"))
    with pytest.raises(InputError, match=r"t.csv.gz row 2 \(line 3\): input_tokens=-3"):
        read_trace(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not a text trace .*byte 0x89 at offset 0 is not UTF-8"),
        ("a,b\n".encode("utf-16"), "not a text trace"),
        (b"ts,x\n0,\x00\x01\n", "not a text trace .*NUL bytes"),
        (
            gzip.compress(b"arrival_s,input_tokens\n", mtime=0)[:12],
            "a corrupt or truncated gzip file .*gzip -t",
        ),
        (
            zstandard.compress(b"arrival_s,input_tokens\n" * 50)[:20],
            "a corrupt or truncated zstd file",
        ),
        (gzip.compress(b"\xff\xfe\x00bin", mtime=0), "not a text trace"),
    ],
)
def test_binary_files_get_a_clear_error(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "trace.bin"
    path.write_bytes(data)
    with pytest.raises(InputError, match=f"trace.bin: {message}"):
        read_trace(path)
    with pytest.raises(InputError, match=r"gzip \(.gz\) or zstd|corrupt"):
        read_trace(path, "csv")


def test_zstd_with_several_frames(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.zst"
    rows = b"".join(b"%d,5,5\n" % t for t in range(1, 3000))
    path.write_bytes(
        zstandard.compress(b"arrival_s,input_tokens,output_tokens\n0,5,5\n")
        + zstandard.compress(rows)
    )
    assert len(read_trace(path)) == 3000


_AZURE = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "traces"
    / "azure_llm_2023"
    / "AzureLLMInferenceTrace_code.csv"
)


@pytest.mark.skipif(not _AZURE.is_file(), reason="needs ../shared/data (development data)")
def test_a_real_trace_gzipped_reads_the_same(tmp_path: Path) -> None:
    packed = tmp_path / "code.csv.gz"
    packed.write_bytes(gzip.compress(_AZURE.read_bytes()))
    got, want = read_trace(packed), read_trace(_AZURE)
    assert got.name == "code.csv.gz" and len(got) == 8819
    assert got == Workload(want.arrival_s, want.input_tokens, want.output_tokens, got.name)
