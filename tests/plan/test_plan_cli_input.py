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
