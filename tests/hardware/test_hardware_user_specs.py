"""User-supplied GPU and model spec files (pdopt._specs_file): read by path or by name through
$PDOPT_SPECS, checked in the config reader's error format, and accepted along the whole path
from a profile of an uncatalogued GPU to a plan and a simulation. A Hugging Face config.json
(or its folder) is a model spec file too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.errors import ConfigError, InputError, ParameterError
from pdopt.hardware import GpuSpec, get_gpu
from pdopt.model_spec import from_hf_config, get_model, profiled_model

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


# the fields of meta-llama/Llama-3.2-3B's config.json (no _name_or_path, as on the Hub)
LLAMA_32_3B = {
    "model_type": "llama", "num_hidden_layers": 28, "hidden_size": 3072,
    "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_a_hugging_face_config_is_a_model_spec_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "Llama-3.2-3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_32_3B))
    (tmp_path / "llama32.json").write_text(json.dumps(LLAMA_32_3B))
    by_file = get_model(str(folder / "config.json"))
    # named after the folder holding config.json, else the file's stem
    assert by_file.name == "Llama-3.2-3B" and get_model(str(folder)) == by_file
    assert get_model(str(tmp_path / "llama32.json")).name == "llama32"
    assert by_file == from_hf_config(LLAMA_32_3B, name="Llama-3.2-3B")
    assert get_model(f"{folder}@fp8/fp8").name == "Llama-3.2-3B@fp8/fp8"
    # by name through $PDOPT_SPECS, next to a pdopt spec file
    files = os.pathsep.join([str(folder / "config.json"), str(tmp_path / "tiny.json")])
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    monkeypatch.setenv("PDOPT_SPECS", files)
    assert get_model("llama-3.2-3b@fp8").dtype == "fp8"
    assert get_model("Tiny-1B").num_layers == 16
    with pytest.raises(ParameterError, match=r"a Hugging Face config.json \(or its folder\)"):
        get_model("Llama-3.2-1B")


def test_a_profile_names_the_users_spec_or_a_catalogue_model() -> None:
    mine = from_hf_config(LLAMA_32_3B, name="Llama-3.2-3B")
    assert profiled_model("llama-3.2-3b", mine) is mine  # only the user's file defines it
    assert profiled_model("meta-llama/Llama-3.1-8B", mine) == get_model("Llama-3.1-8B")
    with pytest.raises(ParameterError, match=r"unknown model 'Llama-3\.2-3B'"):
        profiled_model("Llama-3.2-3B")


def test_an_unmodelled_hugging_face_config_names_its_field(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_32_3B, "mlp_only_layers": [0, 1]}))
    with pytest.raises(InputError, match=r"config.json: field mlp_only_layers"):
        get_model(str(tmp_path))


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
