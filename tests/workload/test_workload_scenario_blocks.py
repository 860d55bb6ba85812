"""Prefix blocks through scenario files: the explicit form round-trips them, a trace's block
options are read, and misplaced keys are config errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pdopt.errors import ConfigError
from pdopt.scenario import Scenario
from pdopt.workload import shared_prefix_workload

_REST = """
[cluster]
gpu = "A100-80GB"
model = "Llama-2-7B"
n_prefill = 1
n_decode = 1

[policy]
name = "least_loaded"

[slo]
ttft_s = 2.0
tpot_s = 0.1
"""


def _scenario_file(tmp_path: Path, workload: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f"seed = 0\n\n[workload]\n{workload}\n{_REST}")
    return path


def test_explicit_form_round_trips_blocks(tmp_path: Path) -> None:
    workload = shared_prefix_workload(
        np.arange(12, dtype=float),
        num_system_prompts=2,
        system_prompt_tokens=40,
        users_per_system_prompt=2,
        question_tokens=20,
        output_tokens=5,
        multi_turn=True,
        seed=0,
    )
    base = Scenario.from_toml(_scenario_file(tmp_path, 'archetype = "sharegpt"\nrate_per_s = 1'))
    scenario = base.replace(workload=workload)
    back = Scenario.from_toml(scenario.to_toml(tmp_path / "out.toml"))
    assert back.workload == workload
    assert "[workload.prefix_blocks]" in (tmp_path / "out.toml").read_text()
    without = base.replace(workload=workload.take(np.arange(3)))
    without = without.replace(workload=type(workload)(
        workload.arrival_s[:3], workload.input_tokens[:3], workload.output_tokens[:3]))  # fmt: skip
    text = without.to_toml(tmp_path / "plain.toml").read_text()
    assert "prefix_blocks" not in text  # files without blocks are written as before


def test_trace_hash_block_tokens(tmp_path: Path) -> None:
    trace = tmp_path / "mc.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1030, "output_length": 5, "hash_ids": [1, 2, 3]}\n'
    )
    default = Scenario.from_toml(_scenario_file(tmp_path, 'trace = "mc.jsonl"'))
    assert default.workload.prefix_blocks is not None  # type: ignore[union-attr]
    assert default.workload.prefix_blocks.counts().tolist() == [2]  # type: ignore[union-attr]
    small = Scenario.from_toml(
        _scenario_file(tmp_path, 'trace = "mc.jsonl"\nhash_block_tokens = 400')
    )
    assert small.workload.prefix_blocks.counts().tolist() == [2]  # type: ignore[union-attr]
    assert small.workload.prefix_blocks.block_tokens == 400  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="hash_ids"):
        Scenario.from_toml(_scenario_file(tmp_path, 'trace = "mc.jsonl"\nhash_block_tokens = 1024'))


def test_trace_column_map_with_block_columns(tmp_path: Path) -> None:
    trace = tmp_path / "g.csv"
    trace.write_text("t,n,o,g,p\n0,100,1,a,64\n1,90,1,a,80\n")
    columns = (
        'columns = { arrival_s = "t", input_tokens = "n", output_tokens = "o", '
        'prefix_group = "g", prefix_tokens = "p" }\nhash_block_tokens = 16'
    )
    sc = Scenario.from_toml(_scenario_file(tmp_path, f'trace = "g.csv"\n{columns}'))
    assert sc.workload.prefix_blocks.counts().tolist() == [6, 5]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("workload", "match"),
    [
        ('archetype = "sharegpt"\nrate_per_s = 1\n[workload.prefix_blocks]\nblock_tokens = 4',
         "prefix_blocks"),
        ("arrival_s = [0.0]\ninput_tokens = [8]\noutput_tokens = [1]\n"
         "[workload.prefix_blocks]\nblock_tokens = 4\noffsets = [0, 3]\nhashes = [1, 2, 3]",
         "prefix_blocks.0. lists 3 blocks of 4 tokens"),
        ("arrival_s = [0.0]\ninput_tokens = [8]\noutput_tokens = [1]\n"
         "[workload.prefix_blocks]\nblock_tokens = 4\noffsets = [1, 1]\nhashes = []",
         "offsets"),
    ],
)  # fmt: skip
def test_bad_prefix_blocks_are_config_errors(tmp_path: Path, workload: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Scenario.from_toml(_scenario_file(tmp_path, workload))
