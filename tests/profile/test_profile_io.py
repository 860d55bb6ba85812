"""Profile CSV reading and writing: exact round trip, and one exact message per broken rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdopt.costmodel import PrefillModel, read_parameter_file, write_parameter_file
from pdopt.errors import InputError
from pdopt.profile import (
    PROFILE_COLUMNS,
    Profile,
    ProfileMeta,
    format_profile,
    profile_from_records,
    read_profile,
    write_profile,
)

HEADER = """# pdopt-profile: 1
# gpu: V100-32GB
# model: Qwen2.5-7B
# dtype: float16
# tp: 1
# source: roofline
kind,batch_size,input_tokens,total_context_tokens,m,n,k,latency_s
"""
GOOD_ROWS = """gemm,,,,4096,4096,4096,0.00121
prefill,2,1024,,,,,0.0931
decode,32,,65536,,,,0.0214
"""


def _write(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_the_documented_example(tmp_path: Path) -> None:
    profile = read_profile(_write(tmp_path, HEADER + GOOD_ROWS))
    assert profile.meta == ProfileMeta("V100-32GB", "Qwen2.5-7B", "float16", 1, "roofline", "")
    assert list(profile.rows.columns) == list(PROFILE_COLUMNS)
    assert profile.rows["kind"].tolist() == ["gemm", "prefill", "decode"]
    assert profile.rows["latency_s"].tolist() == [0.00121, 0.0931, 0.0214]
    assert np.isnan(profile.rows.loc[0, "batch_size"])
    assert profile.of_kind("decode")["total_context_tokens"].tolist() == [65536.0]
    assert profile.path.endswith("p.csv")


def test_round_trip_is_exact(tmp_path: Path) -> None:
    first = read_profile(_write(tmp_path, HEADER + GOOD_ROWS))
    out = write_profile(first, tmp_path / "out.csv")
    assert out.read_text() == HEADER + GOOD_ROWS
    second = read_profile(out)
    pd.testing.assert_frame_equal(first.rows, second.rows)
    assert first.meta == second.meta


def test_multi_line_notes_round_trip(tmp_path: Path) -> None:
    meta = ProfileMeta("H100-SXM", "Llama-3-8B", "bfloat16", 2, "measured:test", "a\nb: c")
    profile = profile_from_records(
        meta, [{"kind": "prefill", "batch_size": 1, "input_tokens": 8, "latency_s": 0.5}]
    )
    text = format_profile(profile)
    assert "# notes: a\n# notes: b: c\n" in text
    assert read_profile(write_profile(profile, tmp_path / "n.csv")).meta == meta


@settings(max_examples=30, deadline=None)
@given(
    latencies=st.lists(
        st.floats(min_value=1e-9, max_value=1e3, allow_nan=False), min_size=1, max_size=20
    ),
    sizes=st.lists(st.integers(1, 10**6), min_size=1, max_size=20),
)
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory, latencies: list[float], sizes: list[int]
) -> None:
    records = [
        {"kind": "decode", "batch_size": s, "total_context_tokens": s * 3, "latency_s": t}
        for s, t in zip(sizes, latencies, strict=False)
    ]
    profile = profile_from_records(ProfileMeta("L20", "CodeLlama-34B"), records)
    path = write_profile(profile, tmp_path_factory.mktemp("rt") / "rt.csv")
    pd.testing.assert_frame_equal(read_profile(path).rows, profile.rows)


BAD_ROWS = [
    (
        "flop,,,,1,1,1,0.1",
        "p.csv row 2 (line 9): kind=flop must be one of gemm, prefill, decode, hybrid",
    ),
    (
        "prefill,,1024,,,,,0.1",
        "p.csv row 2 (line 9): batch_size=(empty) is required for prefill rows",
    ),
    ("prefill,1,1024,,,,,", "p.csv row 2 (line 9): latency_s=(empty) is required for prefill rows"),
    ("prefill,1,1024,,,,,-0.5", "p.csv row 2 (line 9): latency_s=-0.5 must be > 0"),
    ("prefill,1,1024,,,,,0", "p.csv row 2 (line 9): latency_s=0 must be > 0"),
    ("prefill,1,1024,,,,,nan", "p.csv row 2 (line 9): latency_s=nan must be a finite number"),
    ("prefill,1,1024,,,,,inf", "p.csv row 2 (line 9): latency_s=inf must be a finite number"),
    ("prefill,1,1024,,,,,fast", "p.csv row 2 (line 9): latency_s=fast must be a number"),
    ("prefill,0,1024,,,,,0.1", "p.csv row 2 (line 9): batch_size=0 must be an integer >= 1"),
    ("prefill,1,10.5,,,,,0.1", "p.csv row 2 (line 9): input_tokens=10.5 must be an integer >= 1"),
    ("gemm,,,,-4,4,4,0.1", "p.csv row 2 (line 9): m=-4 must be an integer >= 1"),
    (
        "prefill,1,1024,5,,,,0.1",
        "p.csv row 2 (line 9): total_context_tokens=5 must be empty for prefill rows",
    ),
    (
        "decode,8,,4,,,,0.1",
        "p.csv row 2 (line 9): total_context_tokens=4 must be >= batch_size=8 "
        "(each running request holds a token)",
    ),
    ("decode,8,,64,,,0.1", "p.csv row 2 (line 9): has 7 fields; the header has 8"),
]


@pytest.mark.parametrize(("row", "message"), BAD_ROWS)
def test_each_bad_row_has_an_exact_message(tmp_path: Path, row: str, message: str) -> None:
    path = _write(tmp_path, HEADER + "gemm,,,,16,16,16,0.001\n" + row + "\n")
    with pytest.raises(InputError) as info:
        read_profile(path)
    assert str(info.value) == message


def test_blank_lines_are_not_rows_but_lines_count(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "gemm,,,,16,16,16,0.001\n\nprefill,1,1,,,,,-1\n")
    with pytest.raises(InputError, match=r"^p.csv row 2 \(line 10\): latency_s=-1 must be > 0$"):
        read_profile(path)


BAD_FILES = [
    ("", "p.csv: metadata 'pdopt-profile' must be 1 (got None); is this a pdopt profile?"),
    (
        HEADER.replace("# gpu: V100-32GB\n", ""),
        "p.csv: metadata 'gpu' is missing (add a '# gpu: ...' line)",
    ),
    (HEADER.replace("# tp: 1", "# tp: two"), "p.csv: metadata tp=two must be an integer >= 1"),
    (HEADER.replace("# tp: 1", "# tp: 0"), "p.csv: metadata tp=0 must be an integer >= 1"),
    (
        HEADER.replace("# dtype: float16", "# dtype: fp64"),
        "p.csv: metadata dtype=fp64 must be one of "
        "['bfloat16', 'float16', 'float32', 'fp8', 'int4', 'int8', 'mxfp4']",
    ),
    (
        HEADER.replace("# source: roofline", "# colour: red"),
        "p.csv line 6: unknown metadata key 'colour' "
        "(known: ('gpu', 'model', 'dtype', 'tp', 'source', 'notes'))",
    ),
    (
        HEADER.replace("# source: roofline", "# gpu: A100"),
        "p.csv line 6: metadata key 'gpu' given twice",
    ),
    (
        HEADER.replace("# source: roofline", "# just a comment"),
        "p.csv line 6: metadata line must read '# key: value'",
    ),
    (HEADER, "p.csv: no data rows after the header"),
    (
        HEADER.replace("latency_s", "latency_ms"),
        "p.csv line 7: header is "
        "kind,batch_size,input_tokens,total_context_tokens,m,n,k,latency_ms; "
        "expected kind,batch_size,input_tokens,total_context_tokens,m,n,k,latency_s "
        "(and a last column prefix_tokens when there are hybrid rows)",
    ),
    (
        "# pdopt-profile: 1\n# gpu: a\n# model: b\n",
        "p.csv: no header line after the metadata "
        "(expected kind,batch_size,input_tokens,total_context_tokens,m,n,k,latency_s)",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_each_bad_file_has_an_exact_message(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        read_profile(_write(tmp_path, text))
    assert str(info.value) == message


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read profile file"):
        read_profile(tmp_path / "absent.csv")


def test_write_refuses_bad_rows_and_writes_nothing(tmp_path: Path) -> None:
    rows = pd.DataFrame(
        [{"kind": "prefill", "batch_size": 1, "input_tokens": 4, "latency_s": -1.0}],
        columns=list(PROFILE_COLUMNS),
    )
    path = tmp_path / "bad.csv"
    with pytest.raises(InputError, match=r"^bad.csv row 1 \(line 8\): latency_s=-1.0 must be > 0$"):
        write_profile(Profile(ProfileMeta("L20", "Llama-2-7B"), rows), path)
    assert not path.exists()


def test_profile_from_records_names_memory_rows() -> None:
    with pytest.raises(InputError, match=r"^<memory> row 1 \(line 8\): kind=x must be one of"):
        profile_from_records(ProfileMeta("L20", "Llama-2-7B"), [{"kind": "x", "latency_s": 1}])


# --- parameter files (published constants) ----------------------------------------------------


def _params_dict() -> dict[str, object]:
    return {
        "pdopt-parameters": 1,
        "gpu": "V100-32GB",
        "model": "Qwen2.5-7B",
        "source": "published constants: test",
        "units": "SI",
        "prefill": {"alpha_flop_per_token2": 1.0, "beta_flop_per_token": 2.0, "p_peak_flops": 3.0},
        "m_total_bytes": 4.0,
        "delta_t_s": 0.05,
        "theta_frag": 0.1,
        "theta_flow": 0.5,
    }


def test_parameter_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "params.json"
    path.write_text(json.dumps(_params_dict()))
    params = read_parameter_file(path)
    assert params.prefill == PrefillModel(1.0, 2.0, 3.0, 1.0, 0.0)
    again = read_parameter_file(write_parameter_file(params, tmp_path / "again.json"))
    assert again == params


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"pdopt-parameters": 2},
            "p.json: key 'pdopt-parameters' must be 1 (is this a parameter file?)",
        ),
        ({"source": ""}, "p.json: key 'source' must be a non-empty string (got '')"),
        ({"theta_frag": -0.1}, "p.json: key 'theta_frag'=-0.1 must be a finite number >= 0"),
        ({"delta_t_s": "50 ms"}, "p.json: key 'delta_t_s'='50 ms' must be a finite number >= 0"),
        (
            {"prefill": {"alpha_flop_per_token2": 1.0, "beta_flop_per_token": 2.0}},
            "p.json: key 'prefill.p_peak_flops'=None must be a finite number >= 0",
        ),
        (
            {
                "prefill": {
                    "alpha_flop_per_token2": 1.0,
                    "beta_flop_per_token": 2.0,
                    "p_peak_flops": 0,
                }
            },
            "p.json: key 'prefill': The 'p_peak_flops' parameter of PrefillModel must be a finite "
            "number > 0. Got 0.0.",
        ),
    ],
)
def test_parameter_file_errors(tmp_path: Path, change: dict[str, object], message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**_params_dict(), **change}))
    with pytest.raises(InputError) as info:
        read_parameter_file(path)
    assert str(info.value) == message
