"""``pdopt workload`` end to end, through its --json output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.workload import read_csv_trace

AZURE_CONV = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "traces"
    / "azure_llm_2023"
    / "AzureLLMInferenceTrace_conv.csv"
)


def _run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    assert main(argv) == 0
    payload: dict[str, object] = json.loads(capsys.readouterr().out)
    return payload


def test_generate_then_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gen.csv"
    argv = [
        "workload",
        "generate",
        "--archetype",
        "sharegpt",
        "--rate",
        "4",
        "--requests",
        "500",
        "--cv",
        "3",
        "--seed",
        "7",
        "--out",
        str(out),
        "--json",
    ]
    written = _run_json(capsys, argv)
    assert written["archetype"] == "sharegpt" and written["seed"] == 7
    assert written["warnings"] == []
    stats = written["stats"]
    assert isinstance(stats, dict) and stats["requests"] == 500
    # The file reads back as the same workload, and stats agrees with the generator's report.
    workload = read_csv_trace(out)
    assert len(workload) == 500
    shown = _run_json(capsys, ["workload", "stats", str(out), "--json"])
    assert shown["format"] == "csv" and shown["stats"] == stats
    # Same seed, same file.
    again = tmp_path / "again.csv"
    _run_json(capsys, [*argv[:-3], "--out", str(again), "--json"])
    assert again.read_bytes() == out.read_bytes()


def test_generate_by_duration_human_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.csv"
    code = main(
        [
            "workload",
            "generate",
            "--archetype",
            "long_short",
            "--rate",
            "2",
            "--duration",
            "30",
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0 and text.startswith(f"wrote {len(read_csv_trace(out))} requests to {out}")
    assert "input_tokens_p50" in text and "2048" in text


def test_stats_reports_repairs_as_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "burst.csv"
    trace.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "3,ChatGPT,10,5,15,API log\n1,ChatGPT,20,0,20,API log\n2,GPT-4,30,6,36,API log\n"
    )
    payload = _run_json(capsys, ["workload", "stats", str(trace), "--json"])
    assert payload["format"] == "burstgpt"
    assert payload["warnings"] == [
        "burst.csv: left out 1 of 3 rows that are failed requests (Response tokens = 0)",
        "burst.csv: 1 of 2 rows arrive before the row above them; sorted all rows by arrival "
        "time (stable, none dropped)",
    ]
    stats = payload["stats"]
    assert isinstance(stats, dict)
    assert stats["requests"] == 2 and stats["input_tokens_mean"] == 20.0
    assert stats["interarrival_cv"] is None  # one gap: undefined, NaN becomes null


def test_stats_errors_exit_1_with_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,input_tokens,output_tokens\n0,5,5\n1,-3,5\n")
    assert main(["workload", "stats", str(bad), "--json"]) == 1
    err = capsys.readouterr().err
    assert "bad.csv row 2 (line 3): input_tokens=-3 must be >= 1" in err
    assert main(["workload", "stats", str(tmp_path / "missing.csv")]) == 1
    assert "missing.csv" in capsys.readouterr().err


def test_stats_on_real_azure_trace(capsys: pytest.CaptureFixture[str]) -> None:
    if not AZURE_CONV.exists():
        pytest.skip(f"shared data not present: {AZURE_CONV}")
    payload = _run_json(
        capsys, ["workload", "stats", str(AZURE_CONV), "--format", "azure", "--json"]
    )
    stats = payload["stats"]
    assert isinstance(stats, dict)
    assert stats["requests"] == 19_366
    assert stats["rate_per_s"] == pytest.approx(5.530, abs=0.001)
    assert stats["input_tokens_p50"] == 1020.0 and stats["output_tokens_p99"] == 601.0


def _pdopt(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "pdopt", *argv], capture_output=True, text=True, env=env
    )


def test_stats_with_a_column_map_as_a_user_runs_it(tmp_path: Path) -> None:
    canonical = tmp_path / "canonical.csv"
    canonical.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n0.25,20,6\n1.5,30,7\n")
    renamed = tmp_path / "renamed.csv"
    renamed.write_text("num_decode_tokens,ts,num_prefill_tokens\n5,0,10\n6,250,20\n7,1500,30\n")
    vidur = tmp_path / "vidur.csv"
    vidur.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n0.25,20,6\n1.5,30,7\n"
    )
    columns = "arrival_s=ts, input_tokens=num_prefill_tokens,output_tokens=num_decode_tokens"
    runs = {
        "canonical": _pdopt("workload", "stats", str(canonical), "--json"),
        "renamed": _pdopt(
            "workload", "stats", str(renamed), "--columns", columns, "--time-unit", "ms", "--json"
        ),
        "vidur": _pdopt("workload", "stats", str(vidur), "--json"),
    }
    out = {name: json.loads(run.stdout) for name, run in runs.items()}
    assert [out[name]["format"] for name in runs] == ["csv", "csv", "vidur"]
    assert out["renamed"]["stats"] == out["canonical"]["stats"] == out["vidur"]["stats"]
    assert out["canonical"]["stats"]["requests"] == 3

    bad_map = _pdopt("workload", "stats", str(renamed), "--columns", "arrival=ts")
    assert bad_map.returncode == 2 and bad_map.stdout == ""
    assert "argument --columns: expected KEY=NAME,... with each KEY once among" in bad_map.stderr
    missing = _pdopt(
        "workload", "stats", str(renamed), "--columns", "arrival_s=time", "--format", "csv"
    )
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert (
        "renamed.csv: missing column(s) ['time', 'input_tokens', 'output_tokens'] (from the "
        "column map: arrival_s = 'time'); the header has ['num_decode_tokens', 'ts', "
        "'num_prefill_tokens']" in missing.stderr
    )
    fixed = _pdopt("workload", "stats", str(vidur), "--format", "vidur", "--time-unit", "ms")
    assert fixed.returncode == 2
    assert "argument" not in fixed.stderr and "read_trace" not in fixed.stderr
    assert "error: --time-unit goes with --format csv, jsonl or auto, not vidur" in fixed.stderr
