"""A library check that fails on a value from a config file is reported as the file's error:
``sim.toml [table] key: expected RULE, got VALUE`` (never a library function's name), from the
scenario loader and through each command, exit code 1, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdopt.errors import ConfigError
from pdopt.scenario import EXAMPLE_CONFIG, Scenario

REPO = Path(__file__).resolve().parents[2]
INTERNALS = (
    "archetype_workload",
    "roofline_profile",
    "poisson_arrivals",
    "parameter of",
    "__init__",
)


def _config(folder: Path, *edits: tuple[str, str], flags: str = "") -> Path:
    text = EXAMPLE_CONFIG.replace("n_requests = 2000", "n_requests = 50")
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    text = text.replace("[policy.flags]", "[policy.flags]\n" + flags, 1)
    path = folder / "sim.toml"
    path.write_text(text)
    return path


PHASOR = ('name = "least_loaded"', 'name = "phasor"')
SARATHI = ('name = "least_loaded"', 'name = "sarathi"')


@pytest.mark.parametrize(
    ("edits", "flags", "message"),
    [
        ([('archetype = "production_mix"', 'archetype = "prod"')], "",
         "sim.toml [workload] archetype: expected one of ['alpaca', "),
        ([("tp = 1", "tp = 3")], "",
         "sim.toml [cluster] tp: expected a divisor of num_heads=32"),
        ([("rate_per_s = 20.0", "rate_per_s = inf")], "",
         "sim.toml [workload] rate_per_s: expected a number > 0, got inf"),
        ([("rate_per_s = 20.0", "rate_per_s = nan")], "",
         "sim.toml [workload] rate_per_s: expected a number > 0, got nan"),
        ([PHASOR], 'theta_flow = "high"',
         'sim.toml [policy.flags] theta_flow: expected a finite number > 0, got "high"'),
        ([PHASOR], "theta_flow = -3",
         "sim.toml [policy.flags] theta_flow: expected a finite number > 0, got -3"),
        ([PHASOR], "cool_s = -1",
         "sim.toml [policy.flags] cool_s: expected a finite number >= 0, got -1"),
        ([PHASOR], "delta_t_s = 0",
         "sim.toml [policy.flags] delta_t_s: expected a finite number > 0, got 0"),
        ([SARATHI], "chunk_tokens = 0",
         "sim.toml [policy.flags] chunk_tokens: expected an integer >= 1, got 0"),
        ([PHASOR], "theta_flo = 0.5",
         "sim.toml [policy.flags] theta_flo: expected a key among ['cool_s', 'decode_routing', "),
        ([], "foo = 1",
         "sim.toml [policy.flags] foo: expected no flag ('least_loaded' has none), got an "
         "unknown key"),
    ],
)  # fmt: skip
def test_a_bad_value_names_the_file_table_and_key(
    tmp_path: Path, edits: list[tuple[str, str]], flags: str, message: str
) -> None:
    path = _config(tmp_path, *edits, flags=flags)
    with pytest.raises(ConfigError) as info:
        Scenario.from_toml(path)
    text = str(info.value)
    assert text.startswith(f"{tmp_path}/{message}") or text.startswith(message), text
    assert not any(word in text for word in INTERNALS), text


@pytest.mark.parametrize(
    ("old", "new", "key", "given"),
    [
        ('archetype = "production_mix"', 'trace = "nope.csv"', "[workload] trace", "nope.csv"),
        ('profile = "roofline"', 'profile = "prof/nope.csv"', "[cluster] profile", "prof/nope.csv"),
    ],
)
def test_a_missing_file_gives_the_key_and_the_path_looked_at(
    tmp_path: Path, old: str, new: str, key: str, given: str
) -> None:
    path = _config(tmp_path, (old, new))
    with pytest.raises(ConfigError) as info:
        Scenario.from_toml(path)
    assert str(info.value) == (
        f"{path} {key}: expected a file (a relative path is from the config's folder), "
        f'got "{given}" (no such file: {tmp_path / given})'
    )


def test_a_bad_trace_row_names_the_config_key_and_the_row(tmp_path: Path) -> None:
    (tmp_path / "huge.csv").write_text(
        "arrival_s,input_tokens,output_tokens\n0,10,10\n1,99999999999999999999,5\n"
    )
    path = _config(tmp_path, ('archetype = "production_mix"', 'trace = "huge.csv"'))
    with pytest.raises(ConfigError) as info:
        Scenario.from_toml(path)
    assert str(info.value).startswith(
        f"{path} [workload] trace: huge.csv row 2 (line 3): input_tokens=99999999999999999999 "
        "must be <= 9007199254740991"
    )


def _cli(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pdopt", *argv],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("command", "extra", "message"),
    [
        ("simulate", "", "sim.toml [policy.flags] theta_flow: expected a finite number > 0, "
                         'got "high"'),
        ("capacity", "\n[capacity]\ntarget_attainment = 1.5\n",
         "sim.toml [capacity] target_attainment: expected a number in (0, 1], got 1.5"),
        ("tune", '\n[tune]\nspace = ["theta_frog=0.05:0.5"]\n',
         "sim.toml [tune] space: expected parameters among the flags of 'phasor' ["),
        ("tune", '\n[tune]\nspace = ["theta_frag=0.5:0.05"]\n', "sim.toml [tune] space: "),
        ("tune", '\n[tune]\nconstraints = ["slo_attainment>>0.9"]\n',
         "sim.toml [tune] constraints: constraint 'slo_attainment>>0.9': write METRIC>=NUMBER"),
    ],
)  # fmt: skip
def test_each_command_reports_it_in_one_line(
    tmp_path: Path, command: str, extra: str, message: str
) -> None:
    flags = 'theta_flow = "high"' if command == "simulate" else ""
    path = _config(tmp_path, PHASOR, ("mixed_pool_role = \"mixed\"", 'mixed_pool_role = "decode"'),
                   flags=flags)  # fmt: skip
    path.write_text(path.read_text() + extra)
    out = _cli(tmp_path, command, "sim.toml", "--quiet")
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith(f"pdopt: error: {message}"), out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
