"""The README's shell blocks run as written: every command a user copies (issue 19).

Each ```` ```bash ```` block runs from its first command to its last, one command at a time
under ``bash``, in a fresh folder of its own that links the repository's files (so
``profiles/...`` and ``experiments/...`` resolve) and sits beside a link ``../shared`` to the
development data when the repository has it; ``pdopt`` and ``python`` are the interpreter that
runs the tests. A command passes when it exits 0; one with ``--json`` whose stdout is not
redirected must print valid JSON alone on stdout.

What does not run here is listed in :data:`NOT_RUN` with the reason the skip prints. A command
that needs what a fresh clone lacks (:data:`NEEDS`: the ``../shared/data`` development data, the
``aic`` extra) runs where it is present and skips, saying so, where it is absent; so does a later
command of its block that reads a file a skipped one writes. The README's sizes are used
as written; the blocks together take about a minute on 2 cores.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared"
# What a block's folder links from the repository: the inputs its commands name.
LINKED = ("profiles", "experiments", "calibration", "pdopt", "Makefile", "pyproject.toml")
TIMEOUT_S = 300

# (text in the command, why it is not run here); every entry must match a README command.
NOT_RUN = (
    ("make demo", "make demo is CI's own quick-start job (it builds .venv)"),
    ("make test", "make test is CI itself"),
    (
        "make experiments TRACES",
        "every experiment at full size takes ~12 min on 2 cores; each script runs with --quick "
        "in tests/experiments/test_experiments_scripts.py",
    ),
    (
        "make experiments-quick",
        "make builds a .venv of its own in the folder first; the scripts it runs run with "
        "--quick in tests/experiments/test_experiments_scripts.py",
    ),
    (
        "postgresql://user:pw@dbhost",
        "needs a PostgreSQL server at the user's address; tests/tune/test_tune_postgres.py runs "
        "the two-process study on a throwaway server",
    ),
    (
        "tcp://scheduler:8786",
        "needs a Dask scheduler at the user's address; tests/tune/test_tune_parallel.py runs the "
        "study on a LocalCluster",
    ),
)


def _aic_installed() -> bool:
    from pdopt.profile._aic_data import AIC_DISTRIBUTIONS

    installed = {
        re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        for dist in importlib.metadata.distributions()
    }
    return any(name in installed for name in AIC_DISTRIBUTIONS)


# (text in the command, is what it needs here?, what it needs): run when present, else skipped.
NEEDS: tuple[tuple[str, Callable[[], bool], str], ...] = (
    ("../shared", lambda: (SHARED / "data").is_dir(), f"the development data {SHARED / 'data'}"),
    (
        # import-aic's --aic-dir defaults to auto (the installed extra)
        "pdopt profile import-aic",
        _aic_installed,
        'the aic extra (pip install "pdopt[aic]": aiconfigurator-core, about 82 MB)',
    ),
)


@dataclass(frozen=True, slots=True)
class Command:
    """One command of a README bash block: its block, its place and its text."""

    block: int
    index: int
    line: int
    text: str

    @property
    def label(self) -> str:
        head = " ".join(self.text.split("#")[0].split()[:3])
        return f"README.md:{self.line}:{head}"

    @property
    def writes(self) -> tuple[str, ...]:
        """Files the command writes (``--out F``, ``--requests-csv F``, ``> F``, …)."""
        return tuple(re.findall(r"(?:--out|-csv|--plots|>)\s+([^\s<>|;]+)", self.text))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What running (or skipping) one command gave."""

    skip: str = ""
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""


def _split(block: str) -> list[tuple[int, str]]:
    """The commands of a block as (line offset, text): continuation lines and heredocs joined."""
    lines = block.splitlines()
    commands: list[tuple[int, str]] = []
    start, current, i = 0, "", 0
    while i < len(lines):
        line = lines[i]
        if not current:
            if not line.strip() or line.lstrip().startswith("#"):
                i += 1
                continue
            start = i
        current += line + "\n"
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        if heredoc:
            while i + 1 < len(lines):
                i += 1
                current += lines[i] + "\n"
                if lines[i].strip() == heredoc.group(1):
                    break
        if not line.rstrip().endswith("\\") or heredoc:
            commands.append((start, current))
            current = ""
        i += 1
    return commands


def readme_commands() -> list[Command]:
    text = README.read_text()
    commands = []
    for block, match in enumerate(re.finditer(r"```bash\n(.*?)```", text, flags=re.S)):
        first_line = text.count("\n", 0, match.start(1)) + 1
        for index, (offset, command) in enumerate(_split(match.group(1))):
            commands.append(Command(block, index, first_line + offset, command))
    return commands


COMMANDS = readme_commands()


def _not_run_reason(command: Command) -> str:
    reasons = [reason for needle, reason in NOT_RUN if needle in command.text]
    if reasons:
        return f"not run here: {'; '.join(reasons)}"
    absent = [what for needle, present, what in NEEDS if needle in command.text and not present()]
    return f"needs {' and '.join(absent)}, absent here" if absent else ""


def _folder(tmp: Path) -> Path:
    """A fresh working folder linking the repository's inputs, with ``../shared`` beside it."""
    work = tmp / "repo"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    if SHARED.is_dir():
        (tmp / "shared").symlink_to(SHARED)
    return work


def _environment(tmp: Path) -> dict[str, str]:
    """``pdopt`` and ``python`` of the interpreter running the tests first on PATH, this
    checkout first on PYTHONPATH, and no user spec files from the caller's environment."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    # Scripts, not symlinks: a venv's python finds its packages from the path it is run by.
    entry_point = Path(sys.executable).parent / "pdopt"
    pdopt = f'"{entry_point}"' if entry_point.is_file() else f'"{sys.executable}" -m pdopt'
    for name, target in (("python", f'"{sys.executable}"'), ("pdopt", pdopt)):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PDOPT_SPECS"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["MPLBACKEND"] = "Agg"
    return env


def _run_block(block: int, tmp: Path) -> list[Outcome]:
    work, env = _folder(tmp), _environment(tmp)
    outcomes: list[Outcome] = []
    missing: dict[str, str] = {}  # file a skipped command would have written -> why
    for command in (c for c in COMMANDS if c.block == block):
        reason = _not_run_reason(command)
        if not reason:
            reason = next((why for f, why in missing.items() if f in command.text), "")
        if reason:
            why = f"needs a file that a skipped command writes ({reason})"
            missing.update(dict.fromkeys(command.writes, why))
            outcomes.append(Outcome(skip=reason))
            continue
        done = subprocess.run(
            ["bash", "-c", command.text],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        outcomes.append(Outcome("", done.returncode, done.stdout, done.stderr))
    return outcomes


@pytest.fixture(scope="module")
def block_outcomes(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], list[Outcome]]:
    """Runs each block once, on first use, whatever order the tests run in."""
    runs: dict[int, list[Outcome]] = {}

    def outcomes(block: int) -> list[Outcome]:
        if block not in runs:
            runs[block] = _run_block(block, tmp_path_factory.mktemp(f"readme-block{block}"))
        return runs[block]

    return outcomes


def _expects_json(command: Command) -> bool:
    code = re.sub(r"#.*", "", command.text)  # a comment's "->" is no redirection
    return "--json" in code and not re.search(r">\s*\S", code)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.label for c in COMMANDS])
def test_readme_command_runs_as_written(
    command: Command, block_outcomes: Callable[[int], list[Outcome]]
) -> None:
    outcome = block_outcomes(command.block)[command.index]
    if outcome.skip:
        pytest.skip(outcome.skip)
    assert outcome.returncode == 0, (
        f"{command.label} exited {outcome.returncode}\n{command.text}\n"
        f"stderr (last 2,000 characters):\n{outcome.stderr[-2000:]}"
    )
    if _expects_json(command):
        json.loads(outcome.stdout)  # raises, naming the position, when it is not JSON alone


def test_readme_has_the_commands_it_documents() -> None:
    texts = [c.text for c in COMMANDS]
    assert len(COMMANDS) >= 30
    for needle in ("pdopt simulate", "pdopt capacity", "pdopt plan", "pdopt tune", "calibrate"):
        assert any(needle in t for t in texts), needle
    # A heredoc ends inside its block; a dangling one would swallow the next commands.
    assert all(c.text.count("<<") <= 1 for c in COMMANDS)


def test_every_listed_exclusion_names_a_readme_command() -> None:
    texts = [c.text for c in COMMANDS]
    needles = [needle for needle, _ in NOT_RUN] + [needle for needle, _, _ in NEEDS]
    stale = [needle for needle in needles if not any(needle in t for t in texts)]
    assert not stale, f"NOT_RUN or NEEDS entries match no README command (remove them): {stale}"


def test_readme_tune_table_is_the_example_configs(tmp_path: Path) -> None:
    """The README's ``[tune]`` excerpt shows the values ``pdopt tune --example-config`` writes."""
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    shown = [tomllib.loads(b) for b in blocks if "[tune]" in b]
    assert len(shown) == 1
    done = subprocess.run(
        ["pdopt", "tune", "--example-config"],
        cwd=tmp_path,
        env=_environment(tmp_path),
        capture_output=True,
        text=True,
        check=True,
    )
    example = tomllib.loads(done.stdout)
    for table, values in shown[0].items():
        for key, value in values.items():
            assert example[table][key] == value, f"README [{table}] {key} = {value!r}"
