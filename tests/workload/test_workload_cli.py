"""``pdopt workload`` end to end, through its --json output."""

from __future__ import annotations

import gzip
import json
import os
import re
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


def test_generate_shared_prefix_then_stats_reports_reuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sp.csv"
    argv = ["workload", "generate", "--kind", "shared-prefix", "--rate", "5", "--requests",
            "300", "--system-prompts", "3", "--system-prompt-tokens", "320", "--question-tokens",
            "64", "--output-tokens", "lognormal:40:30", "--seed", "2", "--out", str(out),
            "--json"]  # fmt: skip
    written = _run_json(capsys, argv)
    assert written["kind"] == "shared-prefix"
    reuse = written["reuse"]
    assert isinstance(reuse, dict)
    # 3 system prompts of 20 blocks: every request but the first of each reuses them
    assert reuse["reusable_token_fraction"] == pytest.approx(297 * 320 / (300 * 384))
    shown = _run_json(capsys, ["workload", "stats", str(out), "--cache-blocks", "20,1000",
                                "--json"])  # fmt: skip
    assert shown["reuse"] == reuse
    curve = shown["hit_curve"]
    assert isinstance(curve, list) and [row["cache_blocks"] for row in curve] == [20, 1000]
    assert curve[1]["token_hit_rate"] == pytest.approx(reuse["reusable_token_fraction"])


def test_generate_sessions_with_stages_human_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "se.csv"
    argv = ["workload", "generate", "--kind", "sessions", "--stages", "0:0.5,20:2",
            "--duration", "40", "--turns", "3", "--think-time", "5", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "(sessions, seed 0)" in text and "reusable_token_fraction" in text
    assert "cache_blocks  cache_tokens" in text


def test_stats_of_a_gzipped_mooncake_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "mc.jsonl.gz"
    trace.write_bytes(gzip.compress(
        b'{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}\n'
        b'{"timestamp": 5, "input_length": 1030, "output_length": 5, "hash_ids": [1, 2, 4]}\n'
    ))  # fmt: skip
    shown = _run_json(capsys, ["workload", "stats", str(trace), "--json"])
    assert shown["format"] == "mooncake"
    reuse = shown["reuse"]
    assert isinstance(reuse, dict) and reuse["block_tokens"] == 512
    assert reuse["reusable_token_fraction"] == pytest.approx(1024 / 2130)
    small = _run_json(capsys, ["workload", "stats", str(trace), "--hash-block-tokens", "400",
                               "--json"])  # fmt: skip
    assert small["reuse"]["block_tokens"] == 400  # type: ignore[index]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kind", "shared-prefix", "--requests", "5"], "needs --rate or --stages"),
        (["--archetype", "sharegpt", "--rate", "1", "--requests", "5", "--multi-turn"],
         "--multi-turn goes with --kind shared-prefix"),
        (["--rate", "1", "--requests", "5"], "needs --archetype"),
        (["--kind", "sessions", "--stages", "0:1", "--requests", "5"], "--stages goes with"),
        (["--kind", "sessions", "--rate", "1", "--requests", "5", "--turns", "x"],
         r"expected N \(tokens >= 1\) or lognormal:MEAN:MEDIAN"),
    ],
)  # fmt: skip
def test_generate_reuse_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["workload", "generate", *argv, "--out", str(tmp_path / "x.csv")])
    assert info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_stats_of_a_binary_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    assert main(["workload", "stats", str(trace)]) == 1
    assert "not a text trace" in capsys.readouterr().err
