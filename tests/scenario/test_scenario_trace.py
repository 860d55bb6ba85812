"""``[workload] trace`` with ``format``, a column map ``columns``, ``time_unit`` and
``arrival_kind``: the renamed file is the canonical one's workload; bad keys, maps and names are
errors in the one config format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.errors import ConfigError
from pdopt.scenario import Scenario
from pdopt.workload import Workload, read_trace, write_csv_trace

CONFIG = """
seed = 0
record_timeseries = false

[workload]
trace = "{trace}"
{options}

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
MAP = (
    'columns = { arrival_s = "ts_ms", input_tokens = "num_prefill_tokens", '
    'output_tokens = "num_decode_tokens" }'
)


def _files(tmp_path: Path) -> tuple[Path, Path]:
    """A canonical CSV and the same requests as JSON lines with other names, in milliseconds."""
    workload = Workload([0.0, 0.5, 0.75, 2.0], [100, 2000, 30, 512], [20, 4, 300, 64])
    canonical = tmp_path / "canonical.csv"
    write_csv_trace(workload, canonical)
    renamed = tmp_path / "traces" / "renamed.jsonl"
    renamed.parent.mkdir()
    renamed.write_text(
        "".join(
            json.dumps(
                {"ts_ms": 1000 * a, "num_prefill_tokens": int(n), "num_decode_tokens": int(o)}
            )
            + "\n"
            for a, n, o in zip(
                workload.arrival_s, workload.input_tokens, workload.output_tokens, strict=True
            )
        )
    )
    return canonical, renamed


def _config(tmp_path: Path, options: str, trace: str = "traces/renamed.jsonl") -> Path:
    path = tmp_path / "sim.toml"
    path.write_text(CONFIG.format(trace=trace, options=options))
    return path


def test_a_renamed_trace_reads_as_the_canonical_one(tmp_path: Path) -> None:
    canonical, _ = _files(tmp_path)
    config = _config(tmp_path, f'format = "jsonl"\n{MAP}\ntime_unit = "ms"')
    workload = Scenario.from_toml(config).workload
    expected = read_trace(canonical)
    assert isinstance(workload, Workload)
    assert workload.arrival_s.tolist() == expected.arrival_s.tolist()
    assert workload.input_tokens.tolist() == expected.input_tokens.tolist()
    assert workload.output_tokens.tolist() == expected.output_tokens.tolist()
    # "auto" with a map: JSON lines by the file's type; the same workload.
    auto = Scenario.from_toml(_config(tmp_path, f'{MAP}\ntime_unit = "ms"')).workload
    assert auto == workload


def test_simulate_runs_a_renamed_trace_from_its_config(tmp_path: Path) -> None:
    _files(tmp_path)
    config = _config(tmp_path, f'{MAP}\ntime_unit = "ms"\narrival_kind = "time"')
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [sys.executable, "-m", "pdopt", "simulate", str(config), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout)["metrics"]
    assert metrics["requests"] == 4 and metrics["finished"] == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            'columns = { arrival_s = "ts_ms", input_tokens = "prompt" }',
            "sim.toml [workload] columns: expected names of columns in renamed.jsonl, which has "
            "['ts_ms', 'num_prefill_tokens', 'num_decode_tokens'], got "
            '{arrival_s = "ts_ms", input_tokens = "prompt"}',
        ),
        (
            'columns = { arrival = "ts_ms" }',
            "sim.toml [workload.columns] arrival: expected a key among ['arrival_s', "
            "'block_hashes', 'block_tokens', 'input_tokens', 'output_tokens', 'prefix_group', "
            "'prefix_tokens'], got an unknown key",
        ),
        (
            "columns = { input_tokens = 3 }",
            "sim.toml [workload.columns] input_tokens: expected a string, got 3",
        ),
        (
            'columns = { input_tokens = " " }',
            "sim.toml [workload.columns] input_tokens: expected a column name of the trace, "
            'got " "',
        ),
        ('columns = "ts_ms"', 'sim.toml [workload] columns: expected a table, got "ts_ms"'),
        (
            'time_unit = "hours"',
            "sim.toml [workload] time_unit: expected one of ['s', 'ms', 'us', 'ns', 'datetime'], "
            'got "hours"',
        ),
        (
            'format = "vidur"\ntime_unit = "ms"',
            "sim.toml [workload] time_unit: expected no time_unit with format 'vidur' (its "
            'columns are fixed), got "ms"',
        ),
        (
            'time_unit = "datetime"\narrival_kind = "gap"',
            'sim.toml [workload] arrival_kind: expected "time" with time_unit = "datetime", '
            'got "gap"',
        ),
        (
            'format = "parquet"',
            "sim.toml [workload] format: expected one of ['auto', 'azure', 'burstgpt', "
            "'mooncake', 'vidur', 'splitwise_sim', 'csv', 'jsonl'], got \"parquet\"",
        ),
    ],
)
def test_bad_trace_options_are_config_errors(tmp_path: Path, options: str, message: str) -> None:
    _files(tmp_path)
    with pytest.raises(ConfigError) as info:
        Scenario.from_toml(_config(tmp_path, options))
    assert str(info.value) == f"{tmp_path / 'sim.toml'} {message.removeprefix('sim.toml ')}"


def test_trace_options_need_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "sim.toml"
    text = CONFIG.replace('trace = "{trace}"', 'archetype = "short_short"\nrate_per_s = 1.0')
    path.write_text(text.format(options='time_unit = "ms"'))
    with pytest.raises(ConfigError) as info:
        Scenario.from_toml(path)
    assert (
        str(info.value) == f"{path} [workload] time_unit: expected it only with 'trace', got \"ms\""
    )
