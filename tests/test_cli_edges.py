"""Every edge a user touches, as a user meets it: ``pdopt`` run as a subprocess.

Each documented bad input, fed to each command that reads it, ends in one paragraph on stderr
(one ``error:`` line, no traceback, nothing on stdout) and exit code 1 (a bad file or value) or 2
(a bad command line, from argparse). Ctrl-C ends a running ``tune`` with one line and exit code
130, keeping its finished trials. A CSV with a UTF-8 byte-order mark reads. Progress goes to
stderr only when it is a terminal. The subprocesses run concurrently (each is ~1 s of imports).
"""

from __future__ import annotations

import functools
import os
import pty
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
PDOPT = [sys.executable, "-m", "pdopt"]


@functools.cache
def _example(command: str) -> str:
    """``pdopt COMMAND --example-config``, run once per command."""
    return subprocess.run(
        [*PDOPT, command, "--example-config"], env=ENV, capture_output=True, text=True, check=True
    ).stdout


def _config(folder: Path, name: str, replace: tuple[str, str] = ("", ""), extra: str = "") -> str:
    """The example config (``tune``'s for names starting with ``t``), one line replaced."""
    text = _example("tune" if name.startswith("t") else "simulate")
    text = text.replace("n_requests = 2000", "n_requests = 200")
    assert replace[0] in text
    (folder / name).write_text(text.replace(*replace) + extra)
    return name


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("edges")
    _config(folder, "good.toml")
    _config(folder, "tgood.toml")
    _config(folder, "four.toml", ("n_prefill = 4", 'n_prefill = "four"'))
    _config(folder, "tfour.toml", ("n_prefill = 4", 'n_prefill = "four"'))
    _config(folder, "float.toml", ("n_prefill = 4", "n_prefill = 2.7"))
    _config(folder, "bool.toml", ("n_prefill = 4", "n_prefill = true"))
    _config(folder, "bad_decode.toml", ("n_decode = 4", "n_decodes = 4"))
    _config(folder, "tmixed.toml", ("n_mixed = 0 ", "n_mixed = 2 "))
    _config(folder, "trials.toml", ("n_trials = 50", 'n_trials = "many"'))
    _config(folder, "mode.toml", extra='\n[capacity]\nmode = "fast"\n')
    (folder / "broken.toml").write_text("[cluster\nn_prefill = 4\n")
    (folder / "empty.csv").write_text("")
    (folder / "prof.csv").write_text("# pdopt-profile: 1\n# gpu: A100-80GB\n")
    return folder


# (name, argv, the expected error's words, exit code)
CASES = [
    ("simulate-four", ["simulate", "four.toml"],
     'four.toml [cluster] n_prefill: expected an int >= 0, got "four"', 1),
    ("capacity-four", ["capacity", "four.toml"],
     'four.toml [cluster] n_prefill: expected an int >= 0, got "four"', 1),
    ("tune-four", ["tune", "tfour.toml"],
     'tfour.toml [cluster] n_prefill: expected an int >= 0, got "four"', 1),
    ("simulate-float", ["simulate", "float.toml"],
     "float.toml [cluster] n_prefill: expected an int >= 0, got 2.7", 1),
    ("capacity-bool", ["capacity", "bool.toml"],
     "bool.toml [cluster] n_prefill: expected an int >= 0, got true", 1),
    ("simulate-typo", ["simulate", "bad_decode.toml"],
     "[cluster] n_decodes: expected a key among", 1),
    ("simulate-broken", ["simulate", "broken.toml"], "broken.toml: not valid TOML", 1),
    ("simulate-missing", ["simulate", "nope.toml"], "nope.toml: no such config file", 1),
    ("capacity-missing", ["capacity", "nope.toml"], "nope.toml: no such config file", 1),
    ("capacity-mode", ["capacity", "mode.toml"],
     "mode.toml [capacity] mode: expected one of ['open', 'closed'], got \"fast\"", 1),
    ("tune-trials", ["tune", "trials.toml"],
     'trials.toml [tune] n_trials: expected an int >= 1, got "many"', 1),
    ("tune-mixed", ["tune", "tmixed.toml", "--fidelity", "fluid"],
     'tmixed.toml [cluster] mixed_pool_role: expected "prefill" or "decode"', 1),
    ("tune-storage", ["tune", "tgood.toml", "--storage", "sqlite:///missing/dir/study.db"],
     "the folder 'missing/dir' does not exist", 1),
    ("tune-n-trials", ["tune", "tgood.toml", "--n-trials", "2.7"],
     "argument --n-trials: expected an int >= 1, got '2.7'", 2),
    ("tune-workers", ["tune", "tgood.toml", "--n-workers", "0"],
     "argument --n-workers: expected an int >= 1, got '0'", 2),
    ("stats-missing", ["workload", "stats", "nope.csv"], "nope.csv", 1),
    ("stats-empty", ["workload", "stats", "empty.csv"], "empty.csv: the first line is empty", 1),
    ("generate-rate", ["workload", "generate", "--archetype", "sharegpt", "--rate", "-1",
                       "--requests", "5", "--out", "w.csv"],
     "argument --rate: expected a number > 0, got '-1'", 2),
    ("generate-requests", ["workload", "generate", "--archetype", "sharegpt", "--rate", "1",
                           "--requests", "true", "--out", "w.csv"],
     "argument --requests: expected an int >= 1, got 'true'", 2),
    ("generate-out", ["workload", "generate", "--archetype", "sharegpt", "--rate", "1",
                      "--requests", "5", "--out", "nodir/w.csv"], "nodir", 1),
    ("roofline-gpu", ["profile", "roofline", "--gpu", "TPU-v5", "--model", "Llama-2-7B",
                      "--out", "r.csv"], "unknown GPU 'TPU-v5'", 1),
    ("roofline-tp", ["profile", "roofline", "--gpu", "A100-80GB", "--model", "Llama-2-7B",
                     "--tp", "0", "--out", "r.csv"], "argument --tp: expected an int >= 1", 2),
    ("roofline-out", ["profile", "roofline", "--gpu", "A100-80GB", "--model", "Llama-2-7B",
                      "--out", "nodir/r.csv"], "nodir/r.csv: No such file or directory", 1),
    ("show-missing", ["profile", "show", "nope.csv"], "nope.csv: cannot read profile file", 1),
    ("show-bad", ["profile", "show", "prof.csv"], "prof.csv", 1),
    ("calibrate-missing", ["calibrate", "nope.csv"], "nope.csv: cannot read profile file", 1),
    ("calibrate-reference", ["calibrate", str(REPO / "profiles/v100-32gb_qwen2.5-7b_roofline.csv"),
                             "--reference-model", "GPT-5"], "unknown model 'GPT-5'", 1),
    ("vidur-missing", ["profile", "import-vidur", "nodir", "--model", "Llama-2-7B", "--gpu",
                       "A100-80GB", "--out", "v.csv"], "nodir/mlp.csv: file not found", 1),
    ("plan-workload", ["plan", "--workload", "nope", "--rate", "1", "--ttft-slo", "1",
                       "--tpot-slo", "0.1", "--model", "Llama-2-7B", "--gpus", "A100-80GB=4"],
     "--workload 'nope' is neither an archetype", 1),
    ("plan-ttft", ["plan", "--workload", "sharegpt", "--rate", "1", "--ttft-slo", "-1",
                   "--tpot-slo", "0.1", "--model", "Llama-2-7B", "--gpus", "A100-80GB=4"],
     "--ttft-slo", 2),
]  # fmt: skip


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PDOPT, *argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def outcomes(files: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    cases = CASES
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = pool.map(lambda case: _run(case[1], files), cases)
        return {case[0]: out for case, out in zip(cases, done, strict=True)}


def _check(out: subprocess.CompletedProcess[str], words: str, code: int) -> None:
    err = out.stderr.strip()
    assert out.returncode == code, err
    assert out.stdout == ""
    assert "Traceback" not in err
    assert "\n\n" not in err  # one paragraph
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert words in errors[0], err
    if code == 1:
        assert err.startswith("pdopt: error: ")
    # errors name the user's file or option, never a library function
    for internal in ("get_gpu", "get_model", "poisson_arrivals", "Demand", "roofline_profile"):
        assert internal not in err


@pytest.mark.parametrize(("name", "argv", "words", "code"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_paragraph_and_exit_code(
    outcomes: dict[str, subprocess.CompletedProcess[str]],
    name: str,
    argv: list[str],
    words: str,
    code: int,
) -> None:
    _check(outcomes[name], words, code)


def test_a_trace_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    rows = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + rows.encode() + b"2023-11-16 18:15:50.99,396,109\n")
    out = _run(["workload", "stats", str(path), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert '"format": "azure"' in out.stdout and '"requests": 2' in out.stdout


def _completed_trials(db: Path) -> int:
    """Finished trials in the study, read with sqlite3 (no Optuna import in the poll loop)."""
    import sqlite3

    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            row = conn.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()
    except sqlite3.OperationalError:  # the schema is not written yet
        return 0
    return int(row[0])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_during_tune_is_one_line_exit_130_and_keeps_trials(
    files: Path, workers: int
) -> None:
    db = files / f"sigint{workers}.db"
    proc = subprocess.Popen(
        [*PDOPT, "tune", "tgood.toml", "--storage", f"sqlite:///{db}", "--n-trials", "100000",
         "--confirm-top", "0", "--n-workers", str(workers), "--quiet"],
        cwd=files, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while _completed_trials(db) < 2:  # wait for a condition: two finished trials
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no trial finished in 180 s"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "pdopt: interrupted" and out == ""
    assert _completed_trials(db) >= 2  # finished trials stay stored
    while _group_alive(proc.pid):  # the worker processes end too
        assert time.monotonic() < deadline + 60, "worker processes outlived pdopt"
        time.sleep(0.05)


def _stderr_on_a_terminal(argv: list[str], cwd: Path) -> bytes:
    """Run ``pdopt`` with stderr on a pseudo-terminal (80 columns); what it wrote there."""
    import fcntl
    import struct
    import termios

    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [*PDOPT, *argv], cwd=cwd, env=ENV, stdout=subprocess.DEVNULL, stderr=child_fd
    )
    os.close(child_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=120) == 0
    os.close(main_fd)
    return b"".join(chunks)


def test_progress_only_on_a_terminal_and_not_with_quiet(files: Path) -> None:
    assert b"simulating 200 requests" in _stderr_on_a_terminal(["simulate", "good.toml"], files)
    assert _stderr_on_a_terminal(["simulate", "good.toml", "--quiet"], files) == b""
    piped = _run(["simulate", "good.toml"], files)
    assert piped.returncode == 0 and piped.stderr == ""


def test_simulate_and_capacity_export_requests_timeseries_and_plots(
    files: Path, tmp_path: Path
) -> None:
    import pandas as pd

    from pdopt.cli import main

    config = files / "good.toml"
    argv = ["simulate", str(config), "--quiet", "--requests-csv", str(tmp_path / "r.csv"),
            "--timeseries-csv", str(tmp_path / "t.csv"),
            "--plots", str(tmp_path / "p")]  # fmt: skip
    assert main(argv) == 0
    requests = pd.read_csv(tmp_path / "r.csv")
    assert len(requests) == 200 and requests["request_id"].is_unique
    assert {"t_s", "worker", "queue_len", "kv_used_blocks"} <= set(pd.read_csv(tmp_path / "t.csv"))
    for name in ("latency_cdf", "queue", "kv"):
        assert (tmp_path / "p" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    capacity = tmp_path / "cap.toml"
    capacity.write_text(config.read_text() + "\n[capacity]\nmax_evaluations = 4\nrel_tol = 0.5\n")
    out = tmp_path / "at_max.csv"
    assert main(["capacity", str(capacity), "--quiet", "--requests-csv", str(out),
                 "--plots", str(tmp_path / "q")]) == 0  # fmt: skip
    assert len(pd.read_csv(out)) == 200
    assert (tmp_path / "q" / "kv.png").read_bytes()[:4] == b"\x89PNG"
