"""User-supplied GPU and model spec files (pdopt._specs_file): read by path or by name through
$PDOPT_SPECS, checked in the config reader's error format, and accepted along the whole path
from a profile of an uncatalogued GPU to a plan and a simulation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.errors import ConfigError, ParameterError
from pdopt.hardware import GpuSpec, get_gpu
from pdopt.model_spec import get_model

MI300X = """
[gpu]
name = "MI300X"
peak_flops = 1.307e15
memory_bytes = 192e9
hbm_bw_bytes_per_s = 5.3e12
link_bw_bytes_per_s = 448e9
idle_power_w = 140.0
max_power_w = 750.0
cost_per_hour = 4.0
"""
TINY = {
    "model": {
        "name": "Tiny-1B", "num_layers": 16, "hidden_size": 2048, "num_heads": 32,
        "num_kv_heads": 8, "intermediate_size": 8192, "vocab_size": 32000,
    }
}  # fmt: skip


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "mi300x.toml").write_text(MI300X)
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    return tmp_path


def test_a_gpu_file_reads_by_path_with_its_values(spec_dir: Path) -> None:
    gpu = get_gpu(str(spec_dir / "mi300x.toml"))
    assert gpu == GpuSpec("MI300X", 1.307e15, 192e9, 5.3e12, 448e9, 140.0, 750.0, 4.0)


def test_a_model_file_reads_by_path_and_derives_kv_bytes(spec_dir: Path) -> None:
    model = get_model(str(spec_dir / "tiny.json"))
    assert model.name == "Tiny-1B" and model.head_dim == 2048 // 32
    assert model.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2  # 2·layers·kv_heads·head_dim·bytes


def test_names_resolve_through_the_specs_variable(
    spec_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = os.pathsep.join([str(spec_dir / "tiny.json"), str(spec_dir / "mi300x.toml")])
    monkeypatch.setenv("PDOPT_SPECS", files)
    assert get_gpu("mi300x").name == "MI300X"
    assert get_model("Tiny-1B").num_kv_heads == 8
    with pytest.raises(ParameterError, match="unknown GPU 'TPU-v5'"):
        get_gpu("TPU-v5")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('peak_flops = "fast"', 'mi300x.toml [gpu] peak_flops: expected a number, got "fast"'),
        ("peak_flops = -1.0", "mi300x.toml [gpu]: The 'peak_flops' parameter of GpuSpec must be"),
        ("peak_flop = 1.0", "mi300x.toml [gpu] peak_flop: expected a key among"),
    ],
)
def test_bad_gpu_files_fail_in_the_config_format(tmp_path: Path, line: str, message: str) -> None:
    text = MI300X.replace("peak_flops = 1.307e15", line)
    (tmp_path / "mi300x.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        get_gpu(str(tmp_path / "mi300x.toml"))
    assert str(info.value).endswith(message) or message in str(info.value)


def test_bad_model_file_names_the_key(tmp_path: Path) -> None:
    bad = {"model": {**TINY["model"], "num_kv_heads": 5}}
    (tmp_path / "tiny.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=r"tiny.json \[model\]: .*'num_kv_heads'.* a divisor"):
        get_model(str(tmp_path / "tiny.json"))


def _pdopt(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    repo = str(Path(__file__).resolve().parents[2])
    full = {**os.environ, "PYTHONPATH": repo, **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "pdopt", *args], cwd=cwd, env=full, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_profile_of_an_uncatalogued_gpu_plans(spec_dir: Path) -> None:
    _pdopt(
        "profile", "roofline", "--gpu", "mi300x.toml", "--model", "tiny.json", "--out", "p.csv",
        cwd=spec_dir,
    )  # fmt: skip
    specs = {"PDOPT_SPECS": os.pathsep.join(["mi300x.toml", "tiny.json"])}
    out = _pdopt(
        "plan", "--profile", "p.csv", "--workload", "sharegpt", "--rate", "5",
        "--ttft-slo", "1", "--tpot-slo", "0.1", "--no-sim", cwd=spec_dir, env=specs,
    )  # fmt: skip
    assert "MI300X/tp1 prefill" in out
