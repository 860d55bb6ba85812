"""``pdopt profile`` end to end, through its --json output."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.cli._profile import ROOFLINE_KNOB_FLAGS
from pdopt.profile import RooflineKnobs, read_profile

VIDUR_70B = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "vidur-profiling"
    / "a100"
    / "Llama-2-70b-hf"
)


def _run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    assert main(argv) == 0
    payload: dict[str, object] = json.loads(capsys.readouterr().out)
    return payload


def test_roofline_then_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "h100.csv"
    written = _run_json(
        capsys,
        [
            "profile",
            "roofline",
            "--gpu",
            "h100",
            "--model",
            "Llama-3.1-8B",
            "--out",
            str(out),
            "--json",
        ],
    )
    meta = written["meta"]
    assert isinstance(meta, dict)
    assert (meta["gpu"], meta["model"], meta["tp"], meta["source"]) == (
        "H100-SXM",
        "Llama-3.1-8B",
        1,
        "roofline",
    )
    shown = _run_json(capsys, ["profile", "show", str(out), "--json"])
    profile = read_profile(out)
    counts = {kind: len(profile.of_kind(kind)) for kind in ("gemm", "prefill", "decode")}
    assert shown["rows"] == written["rows"] == counts
    assert counts["gemm"] == 24 and counts["prefill"] == 28 and counts["decode"] > 50
    ranges = shown["ranges"]
    assert isinstance(ranges, dict)
    assert ranges["prefill"]["input_tokens_max"] == 8192


def test_catalog_json(capsys: pytest.CaptureFixture[str]) -> None:
    payload = _run_json(capsys, ["profile", "catalog", "--json"])
    gpus, models = payload["gpus"], payload["models"]
    assert isinstance(gpus, list) and isinstance(models, list)
    assert [g["name"] for g in gpus][:2] == ["V100-32GB", "A100-80GB"]
    llama = next(m for m in models if m["name"] == "Llama-2-7B")
    assert llama["param_count"] == 6_738_415_616 and llama["kv_bytes_per_token"] == 524_288


def test_import_vidur_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not (VIDUR_70B / "mlp.csv").is_file():
        pytest.skip("shared Vidur profiling data not present")
    out = tmp_path / "v.csv"
    payload = _run_json(
        capsys,
        [
            "profile",
            "import-vidur",
            str(VIDUR_70B),
            "--model",
            "Llama-2-70B",
            "--tp",
            "2",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert payload["rows"] == {"gemm": 1036, "prefill": 81, "decode": 1501}
    assert read_profile(out).meta.source.startswith("vidur:")


def test_errors_exit_1_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("kind\n")
    assert main(["profile", "show", str(bad), "--json"]) == 1
    assert "bad.csv: metadata 'pdopt-profile' must be 1" in capsys.readouterr().err
    argv = [
        "profile",
        "roofline",
        "--gpu",
        "v100",
        "--model",
        "Llama-2-70B",
        "--out",
        str(tmp_path / "x.csv"),
    ]
    assert main(argv) == 1
    assert "does not fit on V100-32GB" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def _flags(**values: str) -> list[str]:
    """``--knob-name value`` pairs for :class:`RooflineKnobs` fields (``ROOFLINE_KNOB_FLAGS``)."""
    return [
        item for knob, value in values.items() for item in ("--" + knob.replace("_", "-"), value)
    ]


def test_roofline_all_reduce_knobs_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An NCCL-like all-reduce set from the CLI reaches the profile (its notes and a slower
    TP decode step) and a bad efficiency is a usage error naming the option."""
    base = ["profile", "roofline", "--gpu", "A100-80GB", "--model", "Llama-2-70B", "--tp", "2"]
    _run_json(capsys, [*base, "--out", str(tmp_path / "custom.csv"), "--json"])
    nccl = _flags(
        all_reduce_latency_s="45e-6",
        all_reduce_peer_latency_s="1e-6",
        all_reduce_bandwidth_efficiency="0.5",
    )
    _run_json(capsys, [*base, *nccl, "--out", str(tmp_path / "nccl.csv"), "--json"])
    custom, slow = read_profile(tmp_path / "custom.csv"), read_profile(tmp_path / "nccl.csv")
    assert "all_reduce_peer_latency_s=1e-06 all_reduce_bandwidth_efficiency=0.5" in (
        slow.meta.notes
    )
    first = custom.of_kind("decode")["latency_s"].iloc[0]
    assert slow.of_kind("decode")["latency_s"].iloc[0] > first + 2 * 80 * 30e-6
    with pytest.raises(SystemExit):
        main([*base, "--all-reduce-bandwidth-efficiency", "1.5", "--out", str(tmp_path / "x")])
    assert "--all-reduce-bandwidth-efficiency" in capsys.readouterr().err


def test_every_roofline_knob_has_a_flag_that_reaches_the_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One flag per :class:`RooflineKnobs` field, and each value set lands in the notes."""
    assert set(ROOFLINE_KNOB_FLAGS) == {f.name for f in dataclasses.fields(RooflineKnobs)}
    argv = ["profile", "roofline", "--gpu", "H100-SXM", "--model", "Qwen3-30B-A3B", "--tp", "2"]
    values = {knob: "0.5" for knob in ROOFLINE_KNOB_FLAGS}
    values |= {
        "ridge_exponent": "3",
        "moe_ridge_exponent": "1.5",
        "all_reduce_switch_min_gpus": "2",
    }
    _run_json(capsys, [*argv, *_flags(**values), "--out", str(tmp_path / "all.csv"), "--json"])
    notes = read_profile(tmp_path / "all.csv").meta.notes
    for knob, value in values.items():
        assert f"{knob}={float(value):.4g}" in notes, knob


def test_roofline_switch_knobs_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The in-switch all-reduce knobs reach the profile: switched off ('inf'), an H100 TP8
    prefill is slower than with the Hopper preset's branch; a count below 2 is an error naming
    the knob, and nothing is written."""
    base = ["profile", "roofline", "--gpu", "H100-SXM", "--model", "Llama-3.1-70B", "--tp", "8"]
    _run_json(capsys, [*base, "--out", str(tmp_path / "preset.csv"), "--json"])
    off = ["--all-reduce-switch-min-gpus", "inf"]
    _run_json(capsys, [*base, *off, "--out", str(tmp_path / "off.csv"), "--json"])
    switch = _flags(
        all_reduce_switch_min_gpus="4",
        all_reduce_switch_latency_s="30e-6",
        all_reduce_switch_efficiency="0.6",
    )
    _run_json(capsys, [*base, *switch, "--out", str(tmp_path / "set.csv"), "--json"])
    preset, link_only = read_profile(tmp_path / "preset.csv"), read_profile(tmp_path / "off.csv")
    assert "all_reduce_switch_min_gpus=8" in preset.meta.notes
    assert "all_reduce_switch_min_gpus=inf" in link_only.meta.notes
    notes = read_profile(tmp_path / "set.csv").meta.notes
    assert "all_reduce_switch_latency_s=3e-05 all_reduce_switch_efficiency=0.6" in notes
    longest = preset.of_kind("prefill")["latency_s"].idxmax()
    assert link_only.rows.loc[longest, "latency_s"] > preset.rows.loc[longest, "latency_s"]
    assert main([*base, "--all-reduce-switch-min-gpus", "1", "--out", str(tmp_path / "x.csv")]) == 1
    assert "all_reduce_switch_min_gpus" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()
