"""vLLM's engine arguments (issue 34, item 2): ClusterSpec.with_engine_args, the [cluster] keys by
vLLM's names (refused beside pdopt's own), and pdopt simulate's flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.cluster import ClusterSpec
from pdopt.errors import ConfigError
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model
from pdopt.scenario import EXAMPLE_CONFIG, Scenario

REPO = Path(__file__).resolve().parents[2]


def hardware_cluster() -> ClusterSpec:
    from pdopt.costmodel import roofline_cost_model

    gpu, model = get_gpu("H100-SXM"), get_model("Llama-2-7B")
    return ClusterSpec.from_hardware(gpu, model, roofline_cost_model(gpu, model, 1), 0, 0, 2)


def test_with_engine_args_sets_every_worker() -> None:
    base = hardware_cluster()
    out = base.with_engine_args(
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        num_gpu_blocks=7462,
        enable_prefix_caching=True,
    )
    for w in out.workers:
        assert (w.max_batch_tokens, w.chunk_tokens) == (2048, 2048)
        assert (w.max_running, w.max_batch_size) == (128, 128)
        assert w.kv_capacity_blocks == 7462
    assert out.prefix_caching and out.kv_accounting is None
    # gpu_memory_utilization re-runs vLLM's formula with the same weights and activations
    assert base.kv_accounting is not None
    lower = base.with_engine_args(gpu_memory_utilization=0.8, block_size=32)
    terms = base.kv_accounting
    kv = terms.memory_bytes * 0.8 - terms.weight_bytes - terms.activation_bytes
    assert lower.workers[0].kv_capacity_blocks == int(kv // terms.bytes_per_token) // 32
    assert lower.block_tokens == 32
    # a new block size alone keeps the KV tokens
    given = out.with_engine_args(block_size=32)
    assert given.workers[0].kv_capacity_blocks == 7462 * 16 // 32
    with pytest.raises(ConfigError, match="set num_gpu_blocks instead"):
        out.with_engine_args(gpu_memory_utilization=0.8)
    assert base.with_engine_args() == base


def config(tmp_path: Path, extra: str) -> Path:
    """The example config, its engine keys (pdopt's names) replaced by ``extra``."""
    ours = ("max_running", "block_tokens", "max_batch_tokens", "max_batch_size")
    lines = [ln for ln in EXAMPLE_CONFIG.splitlines() if ln.split("=")[0].strip() not in ours]
    text = "\n".join(lines).replace("[cluster]", f"[cluster]\n{extra}", 1)
    path = tmp_path / "sim.toml"
    path.write_text(text)
    return path


def test_cluster_keys_by_vllm_names(tmp_path: Path) -> None:
    keys = "max_num_seqs = 64\nblock_size = 32\nmax_num_batched_tokens = 4096\n"
    keys += "prefix_caching = true"
    mine = Scenario.from_toml(config(tmp_path, keys))
    w = mine.cluster.workers[0]
    assert (w.max_running, w.max_batch_size, w.block_tokens) == (64, 64, 32)
    assert (w.max_batch_tokens, w.chunk_tokens) == (4096, 4096)
    assert mine.cluster.prefix_caching
    # the written scenario reads back equal
    mine.to_toml(tmp_path / "out.toml")
    assert Scenario.from_toml(tmp_path / "out.toml").cluster == mine.cluster
    with pytest.raises(
        ConfigError,
        match=r"\[cluster\] block_size: expected no value beside "
        r"'block_tokens'",
    ):
        Scenario.from_toml(config(tmp_path, "block_size = 32\nblock_tokens = 16"))
    assert "max_batch_tokens" in EXAMPLE_CONFIG  # what config() replaces


def test_simulate_flags_override_the_config(tmp_path: Path) -> None:
    path = config(tmp_path, "")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdopt",
            "simulate",
            str(path),
            "--json",
            "--quiet",
            "--num-gpu-blocks",
            "3000",
            "--max-num-seqs",
            "32",
            "--enable-prefix-caching",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": ""},
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["kv_capacity"] == {"source": "given", "blocks": [3000], "block_tokens": 16}


def test_server_overhead_by_name_or_table(tmp_path: Path) -> None:
    from pdopt.costmodel import VLLM_V1_OVERHEAD, ServerOverhead
    from pdopt.scenario import SERVER_OVERHEADS

    named = Scenario.from_toml(config(tmp_path, 'server_overhead = "vllm_v1"'))
    assert all(w.cost.overhead == VLLM_V1_OVERHEAD for w in named.cluster.workers)
    table = Scenario.from_toml(config(tmp_path, "server_overhead = { fixed_s = 0.01 }"))
    assert table.cluster.workers[0].cost.overhead == ServerOverhead(fixed_s=0.01)
    assert Scenario.from_toml(config(tmp_path, "")).cluster.workers[0].cost.overhead is None
    with pytest.raises(ConfigError, match=r"server_overhead: expected one of"):
        Scenario.from_toml(config(tmp_path, 'server_overhead = "sglang"'))
    # the CLI's choices are the scenario's names
    from pdopt.cli import build_parser

    sim = build_parser()._subparsers._group_actions[0].choices["simulate"]  # type: ignore[union-attr]
    action = next(a for a in sim._actions if a.dest == "server_overhead")
    assert tuple(action.choices) == SERVER_OVERHEADS


def test_a_gpu_alias_says_which_board_it_is(tmp_path: Path) -> None:
    from pdopt.errors import PdoptWarning

    text = EXAMPLE_CONFIG.replace('gpu = "A100-80GB"', 'gpu = "H100"', 1)
    path = tmp_path / "sim.toml"
    path.write_text(text)
    with pytest.warns(PdoptWarning, match=r"\[cluster\] gpu: 'H100' is read as H100-SXM"):
        scenario = Scenario.from_toml(path)
    assert scenario.cluster.workers[0].idle_power_w > 0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", PdoptWarning)  # the exact name: no warning
        Scenario.from_toml(config(tmp_path, ""))
