"""``[cluster]`` KV capacity keys (kv_capacity_blocks, block_tokens, memory_utilization,
activation_peak_gib): read, validated in the one error format, and shown by ``pdopt simulate``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.errors import ConfigError
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model, kv_capacity
from pdopt.scenario import EXAMPLE_CONFIG, Scenario

ROOT = Path(__file__).resolve().parents[2]
SMALL = EXAMPLE_CONFIG.replace("n_requests = 2000", "n_requests = 40")


def _read(tmp_path: Path, old: str = "", new: str = "") -> Scenario:
    path = tmp_path / "sim.toml"
    path.write_text(SMALL.replace(old, new) if old else SMALL)
    return Scenario.from_toml(path)


def _blocks(sc: Scenario) -> set[int]:
    return {w.kv_capacity_blocks for w in sc.cluster.workers}


def test_default_is_the_formula(tmp_path: Path) -> None:
    sc = _read(tmp_path)
    terms = kv_capacity(get_gpu("A100-80GB"), get_model("Llama-2-7B"))
    assert sc.cluster.kv_accounting == terms
    assert _blocks(sc) == {terms.blocks} == {7525}


def test_keys_set_the_terms(tmp_path: Path) -> None:
    util = _read(tmp_path, "memory_utilization = 0.9", "memory_utilization = 0.5")
    assert util.cluster.kv_accounting is not None
    assert util.cluster.kv_accounting.memory_utilization == 0.5
    act = _read(tmp_path, "# activation_peak_gib = 1.0", "activation_peak_gib = 1.0")
    # 1 GiB is the previous fixed reserve: the old default's 7481 blocks.
    assert _blocks(act) == {7481}
    bt = _read(tmp_path, "block_tokens = 16", "block_tokens = 32")
    assert bt.cluster.block_tokens == 32 and _blocks(bt) == {120_400 // 32}
    given = _read(
        tmp_path,
        "memory_utilization = 0.9",
        "kv_capacity_blocks = 1234",
    )
    assert _blocks(given) == {1234} and given.cluster.kv_accounting is None


def test_activation_peak_follows_max_batch_tokens(tmp_path: Path) -> None:
    small = _read(tmp_path, "max_batch_tokens = 8192", "max_batch_tokens = 2048")
    terms = kv_capacity(get_gpu("A100-80GB"), get_model("Llama-2-7B"), batched_tokens=2048)
    assert small.cluster.kv_accounting == terms


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "block_tokens = 16",
            'block_tokens = "16"',
            'sim.toml [cluster] block_tokens: expected an int >= 1, got "16"',
        ),
        (
            "memory_utilization = 0.9",
            "memory_utilization = 1.5",
            "sim.toml [cluster] memory_utilization: expected a number in (0, 1], got 1.5",
        ),
        (
            "memory_utilization = 0.9",
            "memory_utilization = true",
            "sim.toml [cluster] memory_utilization: expected a number in (0, 1], got true",
        ),
        (
            "# activation_peak_gib = 1.0",
            "activation_peak_gib = -1",
            "sim.toml [cluster] activation_peak_gib: expected a number >= 0, got -1",
        ),
        (
            "# kv_capacity_blocks = 4000",
            "kv_capacity_blocks = 0",
            "sim.toml [cluster] memory_utilization: expected no value beside "
            "'kv_capacity_blocks' (which replaces the formula), got 0.9",
        ),
        (
            "memory_utilization = 0.9",
            "kv_capacity_blocks = 2.5",
            "sim.toml [cluster] kv_capacity_blocks: expected an int >= 1, got 2.5",
        ),
    ],
)
def test_bad_values_give_the_one_error_format(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _read(tmp_path, old, new)
    assert str(info.value).endswith(message)


def test_weights_that_do_not_fit_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sim.toml \[cluster\]: Llama-2-70B at tp=1 does not"):
        _read(tmp_path, 'model = "Llama-2-7B"', 'model = "Llama-2-70B"')


def _pdopt(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pdopt", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_cli_bad_kv_key_exits_1_with_one_paragraph(tmp_path: Path) -> None:
    (tmp_path / "sim.toml").write_text(SMALL.replace("block_tokens = 16", "block_tokens = 0"))
    proc = _pdopt(["simulate", "sim.toml"], tmp_path)
    assert proc.returncode == 1
    assert "sim.toml [cluster] block_tokens: expected an int >= 1, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_cli_shows_the_kv_terms(tmp_path: Path) -> None:
    (tmp_path / "sim.toml").write_text(SMALL)
    line = (
        "KV per worker: 80 GiB × 0.90 − 12.55 GiB weights − 0.66 GiB activations = 58.79 GiB "
        "= 7525 blocks of 16 tokens"
    )
    text = _pdopt(["simulate", "sim.toml"], tmp_path)
    assert text.returncode == 0 and line in text.stdout
    as_json = _pdopt(["simulate", "sim.toml", "--json"], tmp_path)
    out = json.loads(as_json.stdout)  # valid JSON alone on stdout
    assert out["kv_capacity"]["source"] == "formula"
    assert out["kv_capacity"]["blocks"] == 7525
    assert out["kv_capacity"]["activation_bytes"] == 708_050_944
    assert as_json.stderr == ""
