"""Profile rows of kind ``hybrid`` (measured mixed iterations, issue 18): the optional
``prefix_tokens`` column, exact round trip, and one exact message per broken rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pdopt.errors import InputError
from pdopt.profile import (
    LEGACY_COLUMNS,
    PROFILE_COLUMNS,
    ProfileMeta,
    format_profile,
    profile_from_records,
    read_profile,
    write_profile,
)

META = """# pdopt-profile: 1
# gpu: V100-32GB
# model: Qwen2.5-7B
# dtype: float16
# tp: 1
# source: roofline
"""
HEADER = META + ",".join(PROFILE_COLUMNS) + "\n"
ROWS = """gemm,,,,4096,4096,4096,0.00121,
prefill,2,1024,,,,,0.0931,
decode,32,,65536,,,,0.0214,
hybrid,32,256,65536,,,,0.0305,512
hybrid,1,512,100,,,,0.02,0
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_hybrid_rows_read_and_round_trip_exactly(tmp_path: Path) -> None:
    profile = read_profile(_write(tmp_path, HEADER + ROWS))
    hybrid = profile.of_kind("hybrid")
    assert hybrid[
        ["batch_size", "input_tokens", "total_context_tokens", "prefix_tokens"]
    ].to_numpy().tolist() == [[32, 256, 65536, 512], [1, 512, 100, 0]]
    assert np.isnan(profile.rows.loc[0, "prefix_tokens"])
    out = write_profile(profile, tmp_path / "out.csv")
    assert out.read_text() == HEADER + ROWS


def test_a_legacy_file_reads_with_an_empty_prefix_column_and_is_written_unchanged(
    tmp_path: Path,
) -> None:
    legacy = META + ",".join(LEGACY_COLUMNS) + "\ndecode,32,,65536,,,,0.0214\n"
    profile = read_profile(_write(tmp_path, legacy))
    assert list(profile.rows.columns) == list(PROFILE_COLUMNS)
    assert profile.rows["prefix_tokens"].isna().all()
    assert format_profile(profile) == legacy


def test_records_without_prefix_give_a_legacy_file_and_hybrid_records_the_full_one() -> None:
    meta = ProfileMeta("V100-32GB", "Qwen2.5-7B", source="roofline")
    plain = profile_from_records(
        meta, [{"kind": "decode", "batch_size": 2, "total_context_tokens": 8, "latency_s": 0.01}]
    )
    assert format_profile(plain).splitlines()[6] == ",".join(LEGACY_COLUMNS)
    mixed = profile_from_records(
        meta,
        [
            {
                "kind": "hybrid",
                "batch_size": 2,
                "input_tokens": 4,
                "total_context_tokens": 8,
                "prefix_tokens": 0,
                "latency_s": 0.01,
            }
        ],
    )
    assert format_profile(mixed).splitlines()[6] == ",".join(PROFILE_COLUMNS)


BAD_ROWS = [
    (
        "hybrid,4,64,100,,,,0.01,",
        "p.csv row 2 (line 9): prefix_tokens=(empty) is required for hybrid rows",
    ),
    (
        "hybrid,4,,100,,,,0.01,0",
        "p.csv row 2 (line 9): input_tokens=(empty) is required for hybrid rows",
    ),
    (
        "hybrid,4,64,100,,,,0.01,-1",
        "p.csv row 2 (line 9): prefix_tokens=-1 must be an integer >= 0",
    ),
    (
        "hybrid,4,64,100,,,,0.01,2.5",
        "p.csv row 2 (line 9): prefix_tokens=2.5 must be an integer >= 0",
    ),
    ("hybrid,0,64,100,,,,0.01,0", "p.csv row 2 (line 9): batch_size=0 must be an integer >= 1"),
    (
        "hybrid,8,64,4,,,,0.01,0",
        "p.csv row 2 (line 9): total_context_tokens=4 must be >= batch_size=8 "
        "(each running request holds a token)",
    ),
    ("hybrid,4,64,100,8,,,0.01,0", "p.csv row 2 (line 9): m=8 must be empty for hybrid rows"),
    (
        "decode,32,,65536,,,,0.0214,16",
        "p.csv row 2 (line 9): prefix_tokens=16 must be empty for decode rows",
    ),
    ("hybrid,4,64,100,,,,0.01", "p.csv row 2 (line 9): has 8 fields; the header has 9"),
]


@pytest.mark.parametrize(("row", "message"), BAD_ROWS)
def test_each_bad_hybrid_row_has_an_exact_message(tmp_path: Path, row: str, message: str) -> None:
    path = _write(tmp_path, HEADER + "gemm,,,,16,16,16,0.001,\n" + row + "\n")
    with pytest.raises(InputError) as info:
        read_profile(path)
    assert str(info.value) == message


def test_a_hybrid_row_in_a_file_without_the_prefix_column_names_the_fix(tmp_path: Path) -> None:
    text = META + ",".join(LEGACY_COLUMNS) + "\nhybrid,4,64,100,,,,0.01\n"
    with pytest.raises(InputError) as info:
        read_profile(_write(tmp_path, text))
    assert str(info.value) == (
        "p.csv row 1 (line 8): hybrid rows need the prefix_tokens column; add it to the header "
        f"({','.join(PROFILE_COLUMNS)})"
    )
