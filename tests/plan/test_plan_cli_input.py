"""``pdopt plan`` on bad option values: one line naming the option, exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdopt.cli import main

ROOT = Path(__file__).resolve().parents[2]
V100 = str(ROOT / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv")
BASE = ["plan", "--profile", V100, "--workload", "sharegpt", "--rate", "12", "--ttft-slo", "1",
        "--tpot-slo", "0.1", "--no-sim"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--gpus", "V100-32GB=-2"], "--gpus"),
        (["--gpus", "V100-32GB=0"], "--gpus"),
        (["--gpus", "V100-32GB=1.5"], "--gpus"),
        (["--gpus", "V100-32GB"], "--gpus"),  # a bare name: refused, say =inf for no limit
        (["--gpus", "V100-32GB=abc"], "--gpus"),
        (["--gpus", "=4"], "--gpus"),
        (["--prices", "V100-32GB=-1"], "--prices"),
        (["--prices", "V100-32GB=nan"], "--prices"),
        (["--prices", "V100-32GB"], "--prices"),
        (["--peak-rate", "6"], "--peak-rate"),
    ],
)
def test_bad_option_value_exits_2_naming_it(
    args: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*BASE, *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if "error" in x]
    assert f"argument {option}:" in line and "Traceback" not in err


def test_gpus_inf_means_no_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--gpus", "V100-32GB=inf,A100-80GB=2", "--json"]) == 0


@pytest.mark.parametrize("rate", ["1e6", "1e300"])
def test_an_extreme_rate_answers_quickly_with_the_closest_plan(rate: str) -> None:
    # Before: 1e6 req/s bisected Erlang B over pools of ~10^5 servers (minutes); 1e300 ended in
    # a solver traceback. The grids are now capped by the GPU limits and Erlang B is O(1).
    import subprocess
    import sys

    args = [*BASE[:6], rate, *BASE[7:-1], "--requests", "500",
            "--gpus", "V100-32GB=16,A100-80GB=8,H100-SXM=8"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pdopt", *args], capture_output=True, text=True, timeout=90,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("pdopt: error:")]
    assert "binding: GPU inventory" in line and "the closest within the limits serves" in line
    assert "Traceback" not in done.stderr
