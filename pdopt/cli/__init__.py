"""The ``pdopt`` command: a thin shell over the library.

Each sub-command lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``handler``; handlers return an exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pdopt.errors import PdoptError

_COMMAND_MODULES = ("calibrate", "workload", "profile", "simulate", "capacity", "plan", "tune")


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
    exit code 1 (2 for a bad command line, from argparse), Ctrl-C one line and exit code 130."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        # What was stored before (finished tuning trials) stays stored.
        print("pdopt: interrupted", file=sys.stderr)
        return 130


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except PdoptError as exc:
        print(f"pdopt: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader (e.g. `| head`) closed the pipe: not an error. Point stdout at devnull so
        # the interpreter's final flush does not raise again.
        import os

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
