"""An MLP-only profile plans (issue 37, deliver 4): Vidur's tables (no attention file) fit prefill
but cannot separate decode's terms, so plan prices decode with the roofline prior calibrated on
the profile's own GEMMs and says so in the options' provenance and a note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main

VIDUR = Path(__file__).resolve().parents[3] / "shared" / "data" / "vidur-profiling" / "a100"


@pytest.mark.skipif(not (VIDUR / "Meta-Llama-3-8B").is_dir(), reason=f"{VIDUR} absent")
def test_an_mlp_only_profile_plans_with_a_roofline_decode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "vidur8b.csv"
    assert (
        main(
            [
                "profile",
                "import-vidur",
                str(VIDUR / "Meta-Llama-3-8B"),
                "--model",
                "Llama-3-8B",
                "--out",
                str(profile),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(
        [
            "plan",
            "--profile",
            str(profile),
            "--workload",
            "sharegpt",
            "--rate",
            "4",
            "--requests",
            "600",
            "--ttft-slo",
            "1",
            "--tpot-slo",
            "0.1",
            "--tp",
            "1",
            "--verify-draws",
            "1",
            "--quiet",
            "--json",
        ]
    )
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["verdict"]["meets"]
    row = next(o for o in payload["options"] if o["tp"] == 1)
    assert row["cost_model"].endswith("; decode: roofline prior")
    note = next(n for n in payload["notes"] if "decode from the roofline prior" in n)
    assert "compute-bound GEMM rows" in note and "profile decode at several contexts" in note
