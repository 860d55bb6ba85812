"""``--dask [ADDRESS]``: the one spelling of "run the independent simulations on Dask" for every
command that has them (``pdopt capacity``, ``plan``, ``tune``; issue 38, item 3)."""

from __future__ import annotations

import argparse

from pdopt.parallel import LOCAL, OPTION, check_dask


def add_dask_flag(parser: argparse.ArgumentParser, runs: str) -> None:
    """Add ``--dask [ADDRESS]`` (dest ``dask``): ``runs`` says which simulations it fans out."""
    parser.add_argument(
        OPTION,
        nargs="?",
        const=LOCAL,
        default=None,
        metavar="ADDRESS",
        help=f"run {runs} on a Dask cluster: a scheduler address (tcp://HOST:8786), or no "
        "address for a LocalCluster of one worker per CPU on this machine; same results as "
        "serial (needs pip install 'pdopt[dask]')",
    )


def dask_of(args: argparse.Namespace) -> str | None:
    """The checked ``--dask`` value (None: serial); a malformed address is a ConfigError."""
    return check_dask(getattr(args, "dask", None))
