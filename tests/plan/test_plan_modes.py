"""The deployment-mode comparison: the count search against brute force, and the CLI table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdopt.cli import main
from pdopt.plan._modes import smallest_meeting

V100 = str(Path(__file__).resolve().parents[2] / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv")


@given(threshold=st.integers(1, 80), start=st.integers(1, 100), most=st.integers(1, 100))
def test_smallest_meeting_equals_brute_force(threshold: int, start: int, most: int) -> None:
    calls: list[int] = []

    def meets(n: int) -> bool:
        calls.append(n)
        return n >= threshold

    expected = next((n for n in range(1, most + 1) if n >= threshold), None)
    assert smallest_meeting(meets, start, most) == expected
    assert all(1 <= n <= most for n in calls)
    assert len(calls) <= 2 * (most.bit_length() + 2)  # logarithmic, not a scan


def test_compare_modes_sizes_each_mode_by_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--profile", V100, "--ttft-slo", "1.0", "--tpot-slo", "0.1",
            "--workload", "short_short", "--rate", "4", "--requests", "300",
            "--gpus", "V100-32GB=16", "--tp", "1", "--compare-modes", "--json"]  # fmt: skip
    assert main(args) == 0
    payload = json.loads(capsys.readouterr().out)
    modes = payload["modes"]
    assert [m["policy"] for m in modes] == ["least_loaded", "vllm", "sarathi", "ecoserve"]
    assert modes[0]["gpus"] == payload["milp"]["n_gpus"]
    for m in modes[1:]:
        assert m["simulations"] >= 1 and m["gpus"] >= 1
        assert m["cost_per_1k_requests"] == pytest.approx(m["cost_per_hour"] / 4 / 3.6)
        if m["meets"]:
            assert m["ttft_q_s"] <= 1.0 and m["tpot_q_s"] <= 0.1
    assert main(args[:-1]) == 0
    text = capsys.readouterr().out
    assert "deployment modes, each verified by simulation" in text
    assert text.splitlines()[0].startswith("pdopt plan: RECOMMENDED ")
