"""Every ``pdopt`` command run with ``--json`` as a subprocess prints valid JSON alone on stdout
(issue 17, item 4): the descriptor-level output of third-party code (HiGHS's banner, numba) is
seen here, which in-process ``capsys`` tests cannot see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
V100 = str(ROOT / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv")


def _pdopt(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pdopt", *args], cwd=cwd, env=env, capture_output=True,
        text=True, check=False, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cli")
    paths = {}
    for command in ("simulate", "capacity"):
        example = _pdopt(command, "--example-config", cwd=folder).stdout
        paths[command] = folder / f"{command}.toml"
        small = example.replace("n_requests = 2000", "n_requests = 300")
        paths[command].write_text(small.replace("max_evaluations = 40", "max_evaluations = 6"))
    trace = folder / "trace.csv"
    done = _pdopt("workload", "generate", "--archetype", "sharegpt", "--rate", "4",
                  "--requests", "200", "--out", str(trace), cwd=folder)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {"folder": folder, "sim": paths["simulate"], "cap": paths["capacity"], "trace": trace}


COMMANDS = {
    "plan": ["plan", "--profile", V100, "--workload", "sharegpt", "--rate", "4", "--requests",
             "300", "--ttft-slo", "1", "--tpot-slo", "0.1", "--gpus", "V100-32GB=8"],
    "simulate": ["simulate", "{sim}"],
    "capacity": ["capacity", "{cap}"],
    "calibrate": ["calibrate", V100],
    "profile show": ["profile", "show", V100],
    "profile catalog": ["profile", "catalog"],
    "profile roofline": ["profile", "roofline", "--gpu", "A100-80GB", "--model", "Llama-3-8B",
                         "--out", "{folder}/roof.csv"],
    "workload stats": ["workload", "stats", "{trace}"],
    "workload generate": ["workload", "generate", "--archetype", "short_short", "--rate", "2",
                          "--requests", "50", "--out", "{folder}/gen.csv"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_json_output_is_valid_json_alone_on_stdout(name: str, files: dict[str, Path]) -> None:
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in COMMANDS[name]]
    done = _pdopt(*args, "--json", cwd=files["folder"])
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads(done.stdout)  # the whole of stdout, nothing before or after
    assert isinstance(payload, dict | list) and payload
