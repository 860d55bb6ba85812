"""Deployable output (issue 37, deliver 6): ``--emit vllm|sglang|dynamo`` launch configurations
that parse and name every role of the plan, and a compact ``--out`` with the workload by
reference."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pdopt.cli import main
from pdopt.plan._emit import emit, role_launches
from pdopt.scenario import Scenario

PLAN = ["plan", "--model", "Qwen2.5-7B", "--gpus", "H100-SXM=8", "--workload", "sharegpt",
        "--rate", "20", "--requests", "300", "--ttft-slo", "1", "--tpot-slo", "0.1"]  # fmt: skip


def _emit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> tuple[str, dict[str, Any]]:
    out = tmp_path / f"launch.{fmt}"
    assert main([*PLAN, "--no-sim", "--emit", fmt, "--emit-out", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["emitted"]["path"] == str(out)
    return out.read_text(encoding="utf-8"), payload


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_shell_launches_parse_and_name_every_role(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    text, payload = _emit(capsys, tmp_path, fmt)
    assert "STARTING POINT" in text
    subprocess.run(["bash", "-n", str(tmp_path / f"launch.{fmt}")], check=True)
    servers = [shlex.split(line, comments=True) for line in text.splitlines()
               if line.startswith(("vllm serve", "python -m sglang.launch_server"))]  # fmt: skip
    counts = payload["recommendation"]["counts"]
    assert len(servers) == sum(c["workers"] for c in counts)
    tp_flag = "--tensor-parallel-size" if fmt == "vllm" else "--tp-size"
    seqs_flag = "--max-num-seqs" if fmt == "vllm" else "--max-running-requests"
    for c in counts:
        assert f"# {c['role']}: {c['workers']} × {c['gpu']}/tp{c['tp']}" in text
    for args in servers:
        assert args[args.index(tp_flag) + 1] in {str(c["tp"]) for c in counts}
        assert int(args[args.index(seqs_flag) + 1]) >= 1
        if fmt == "vllm":
            kv = json.loads(args[args.index("--kv-transfer-config") + 1])
            assert kv["kv_connector"]
        else:
            assert args[args.index("--disaggregation-mode") + 1] in ("prefill", "decode")


def test_dynamo_yaml_parses_and_names_every_role(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    yaml = pytest.importorskip("yaml")
    text, payload = _emit(capsys, tmp_path, "dynamo")
    config = yaml.safe_load(text)
    counts = payload["recommendation"]["counts"]
    workers = {name: section for name, section in config.items() if "ServiceArgs" in section}
    assert sum(s["ServiceArgs"]["workers"] for s in workers.values()) == sum(
        c["workers"] for c in counts
    )
    assert {"PrefillWorker", "VllmWorker"} <= set(workers)
    assert workers["VllmWorker"]["remote-prefill"] is True
    assert config["Common"]["model"] == "Qwen2.5-7B"


def test_emit_out_without_emit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*PLAN, "--emit-out", "x.sh"])
    assert info.value.code == 2 and "give --emit" in capsys.readouterr().err


def test_out_writes_the_workload_by_reference_and_replays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "plan.toml"
    assert main([*PLAN, "--verify-draws", "2", "--out", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["scenario_workload"].startswith("reference: archetype")
    assert out.stat().st_size < 10_000 and "input_tokens" not in out.read_text()
    replay = Scenario.from_toml(out).run().metrics()
    assert float(replay["slo_attainment"]) == pytest.approx(payload["check"]["sim_attainment"])
    assert main([*PLAN, "--verify-draws", "1", "--out", str(out), "--emit", "vllm",
                 "--emit-out", str(tmp_path / "l.sh")]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert f"scenario written to {out}" in text and "launch configuration written to" in text


def test_a_colocated_deployment_launches_without_kv_transfer() -> None:
    counts = [{"gpu": "H100-SXM", "tp": 2, "role": "colocated", "workers": 3}]
    launches = role_launches(counts, {("H100-SXM", 2, False): 128}, longest_prompt_tokens=9000,
                             max_model_len=None)  # fmt: skip
    text = emit("vllm", "Qwen2.5-7B", launches, [])
    servers = [line for line in text.splitlines() if line.startswith("vllm serve")]
    assert len(servers) == 3 and "--kv-transfer-config" not in text
    assert "--max-num-seqs 128" in servers[0] and "--max-num-batched-tokens 512" in servers[0]
    assert "--disaggregation-mode" not in emit("sglang", "Qwen2.5-7B", launches, [])
