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
    """Entry point of the ``pdopt`` console script."""
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


def _version() -> str:
    from pdopt import __version__

    return f"pdopt {__version__}"
