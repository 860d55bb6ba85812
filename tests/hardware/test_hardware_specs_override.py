"""A ``$PDOPT_SPECS`` entry named as a catalogued GPU or model replaces the catalogue's row
wherever the name is resolved (``get_gpu``/``get_model``, ``pdopt profile catalog``, every TP
option of ``pdopt plan``), as README's ``mi300x.toml`` example expects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.hardware import GPUS, get_gpu
from pdopt.model_spec import MODELS, get_model

MY_MI300X = """
[gpu]
name = "MI300X"
peak_flops = 1.0e15
memory_bytes = 192e9
hbm_bw_bytes_per_s = 5.0e12
link_bw_bytes_per_s = 448e9
idle_power_w = 140.0
max_power_w = 750.0
cost_per_hour = 2.5
"""
# Llama-2-7B's shape with a shorter context than the catalogue's 4096
MY_LLAMA = {
    "model": {
        "name": "Llama-2-7B", "num_layers": 32, "hidden_size": 4096, "num_heads": 32,
        "num_kv_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
        "max_context_tokens": 2048,
    }
}  # fmt: skip


@pytest.fixture
def specs(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "mi300x.toml").write_text(MY_MI300X)
    (tmp_path / "llama.json").write_text(json.dumps(MY_LLAMA))
    files = [str(tmp_path / "mi300x.toml"), str(tmp_path / "llama.json")]
    return {"PDOPT_SPECS": os.pathsep.join(files)}


def test_a_specs_entry_replaces_the_catalogued_row(
    specs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert get_gpu("MI300X") == GPUS["MI300X"]  # unset: the catalogue
    monkeypatch.setenv("PDOPT_SPECS", specs["PDOPT_SPECS"])
    for name in ("MI300X", "mi300x", "MI300X-192GB"):  # aliases too
        gpu = get_gpu(name)
        assert (gpu.peak_flops, gpu.cost_per_hour) == (1.0e15, 2.5)
    model = get_model("llama-2-7b@fp8")
    assert model.max_context_tokens == 2048 and model.name == "Llama-2-7B@fp8/bfloat16"
    assert get_gpu("H100-SXM") == GPUS["H100-SXM"]  # other rows stay
    assert get_model("Llama-3.1-8B") == MODELS["Llama-3.1-8B"]


def _pdopt(*args: str, cwd: Path, env: dict[str, str]) -> str:
    repo = str(Path(__file__).resolve().parents[2])
    full = {**os.environ, "PYTHONPATH": repo, **env}
    done = subprocess.run(
        [sys.executable, "-m", "pdopt", *args], cwd=cwd, env=full, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_catalog_and_plan_use_the_file_everywhere(specs: dict[str, str], tmp_path: Path) -> None:
    rows = json.loads(_pdopt("profile", "catalog", "--json", cwd=tmp_path, env=specs))
    gpu = next(g for g in rows["gpus"] if g["name"] == "MI300X")
    assert (gpu["peak_flops"], gpu["cost_per_hour"]) == (1.0e15, 2.5)
    model = next(m for m in rows["models"] if m["name"] == "Llama-2-7B")
    assert model["max_context_tokens"] == 2048
    _pdopt(
        "profile", "roofline", "--gpu", "MI300X", "--model", "Llama-2-7B", "--out", "p.csv",
        cwd=tmp_path, env=specs,
    )  # fmt: skip
    out = _pdopt(
        "plan", "--profile", "p.csv", "--workload", "sharegpt", "--rate", "5", "--requests",
        "300", "--ttft-slo", "1", "--tpot-slo", "0.1", "--no-sim", "--json",
        "--too-long", "drop",  # the file's 2,048-token window rejects 3.7%: beyond P99's 1%
        cwd=tmp_path, env=specs,
    )  # fmt: skip
    options = json.loads(out)["options"]
    assert {o["option"] for o in options} >= {"MI300X/tp1", "MI300X/tp2"}
    # every TP option is priced at the file's 2.5 USD per GPU-hour, not the catalogue's
    for option in options:
        assert option["price_per_hour"] == pytest.approx(2.5 * option["tp"]), option
