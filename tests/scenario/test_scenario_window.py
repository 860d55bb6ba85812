"""``pdopt simulate`` counts requests beyond the model's context window as ``pdopt plan`` does
(issue 37, deliver 8): a ``[cluster]`` built from a model with a known window rejects them
unless the config says otherwise, each a rejected request (a miss for ``--check``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.scenario import Scenario

CONFIG = """
[workload]
arrival_s = [0.0, 0.5, 1.0, 1.5]
input_tokens = [100, 5000, 200, 4000]
output_tokens = [10, 10, 10, 200]
[cluster]
gpu = "A100-80GB"
model = "Llama-2-7B"
n_prefill = 1
n_decode = 1
{window}
[policy]
name = "least_loaded"
[slo]
ttft_s = 1.0
tpot_s = 0.1
"""


def _config(tmp_path: Path, window: str) -> Path:
    path = tmp_path / "hw.toml"
    path.write_text(CONFIG.format(window=window))
    return path


def test_the_models_window_is_the_default(tmp_path: Path) -> None:
    assert Scenario.from_toml(_config(tmp_path, "")).cluster.max_context_tokens == 4096
    given = _config(tmp_path, "max_context_tokens = 8192")
    assert Scenario.from_toml(given).cluster.max_context_tokens == 8192
    off = _config(tmp_path, 'max_context_tokens = "none"')
    assert Scenario.from_toml(off).cluster.max_context_tokens is None


def test_simulate_rejects_and_check_counts_the_over_long_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, "")
    # half the requests exceed the window: a P99 over all requests misses
    assert main(["simulate", str(path), "--check", "--json", "--quiet"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["rejected_by_reason"] == {
        "prompt exceeds the 4096-token context window": 1,
        "prompt + output exceed the 4096-token context window": 1,
    }
    assert out["check"]["meets"] is False
    # without the check of the window every request runs and the check meets
    off = _config(tmp_path, 'max_context_tokens = "none"')
    assert main(["simulate", str(off), "--check", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rejected_by_reason"] == {} and out["check"]["meets"] is True
