"""Edges found while planning for a capacity planner (issue 37, deliver 8): a journal storage
path is relative like SQLite's, ``PDOPT_SPECS=config.json`` does not break GPU lookups, an alias
such as ``H100`` is said, and ``pdopt simulate --check`` exits 3 on an SLO miss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.hardware import get_gpu
from pdopt.tune._storage import journal_path, open_storage

HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}  # fmt: skip
PLAN = ["plan", "--model", "Qwen2.5-7B", "--workload", "sharegpt", "--rate", "2",
        "--requests", "100", "--ttft-slo", "1", "--tpot-slo", "0.1"]  # fmt: skip


def test_journal_urls_read_like_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert journal_path("journal:///study.log") == "study.log"
    assert journal_path(f"journal:///{tmp_path}/s.log") == f"{tmp_path}/s.log"
    monkeypatch.chdir(tmp_path)
    open_storage("journal:///runs/study.log")
    assert (tmp_path / "runs").is_dir()


def test_a_hugging_face_config_in_pdopt_specs_leaves_gpus_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PDOPT_SPECS", "config.json")
    assert get_gpu("H100-SXM").name == "H100-SXM"
    assert main(["profile", "catalog"]) == 0
    capsys.readouterr()
    code = main([*PLAN[:2], "my-llama", *PLAN[3:], "--gpus", "H100-SXM=2", "--no-sim", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["model"] == "my-llama"


def test_an_alias_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--gpus", "H100=2", "--no-sim", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("--gpus H100 is read as H100-SXM" in n for n in notes)


def test_simulate_check_exits_3_on_a_miss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.toml"
    assert main([*PLAN, "--gpus", "H100-SXM=4", "--verify-draws", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(out), "--check", "--json"]) == 0
    check = json.loads(capsys.readouterr().out)["check"]
    assert check["meets"] and check["quantile"] == 0.99
    text = out.read_text().replace("ttft_s = 1.0", "ttft_s = 0.0001")
    assert text != out.read_text()
    out.write_text(text)
    assert main(["simulate", str(out), "--check"]) == 3
    assert "check: MISSES the SLOs: P99 TTFT" in capsys.readouterr().out
    assert main(["simulate", str(out)]) == 0  # no --check: the run's report only
