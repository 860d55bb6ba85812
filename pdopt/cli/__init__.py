"""The ``pdopt`` command: a thin shell over the library.

Each sub-command lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``handler``; handlers return an exit code.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from pdopt.errors import PdoptError

_COMMAND_MODULES = (
    "calibrate",
    "workload",
    "profile",
    "simulate",
    "capacity",
    "plan",
    "tune",
    "validate",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, every sub-command registered."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="pdopt", description="Plan, simulate and tune P/D disaggregated LLM serving."
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"pdopt.cli._{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"pdopt.cli._{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pdopt`` console script: a user error is one paragraph on stderr and
    exit code 1 (2 for a bad command line, from argparse), Ctrl-C one line and exit code 130
    (:func:`_interrupted`)."""
    if threading.current_thread() is not threading.main_thread():
        return _run(argv)  # only the main thread may set a signal handler
    previous = signal.signal(signal.SIGINT, _interrupted)
    try:
        return _run(argv)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C: one line on stderr, worker processes ended, exit code 130, at once.

    NOTE: no unwinding (``os._exit``). A KeyboardInterrupt raised at an arbitrary point of an
    Optuna study can land inside a storage commit or a ``finally`` block and end in another
    traceback, or hang. Exiting at once is a killed process, which the stores are built for:
    committed trials stay (SQLite and PostgreSQL transactions, journal appends), and the running
    trial is marked failed when a worker starts again (``pdopt.tune``: tested by SIGKILL).
    """
    import multiprocessing
    import multiprocessing.util

    print("pdopt: interrupted", file=sys.stderr, flush=True)
    # That line is all the user should see: while the pool is torn down below, the feeder
    # threads of its queues may report the pipe closing under them (a traceback on stderr,
    # seen about once in three two-worker runs), so stderr goes to /dev/null first.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(5)
    if children:
        # The worker pool's queues hold named semaphores: unlink them as an orderly exit would
        # (multiprocessing's own exit finalizers), or its resource tracker warns of a leak.
        multiprocessing.util._run_finalizers()  # type: ignore[attr-defined]
    os._exit(130)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    from pdopt.cli._output import pdopt_warnings_on_stderr

    try:
        with pdopt_warnings_on_stderr():
            return int(args.handler(args))
    except PdoptError as exc:
        print(f"pdopt: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader (e.g. `| head`) closed the pipe: not an error. Point stdout at devnull so
        # the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if exc.filename is None:
            raise
        # A file the user named cannot be read or written (a missing folder, no permission).
        print(f"pdopt: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1


def _version() -> str:
    from pdopt import __version__

    return f"pdopt {__version__}"
