"""Figures of a simulation run (matplotlib): latency CDFs, queue and KV use over time.

The figures are :class:`matplotlib.figure.Figure` objects built without pyplot, so no backend is
chosen or forced: Jupyter shows a returned figure inline, and :func:`save_run_figures` writes PNGs
from a script or the CLI (``pdopt simulate --plots DIR``).
"""

from pdopt.report._figures import run_figures, save_run_figures

__all__ = ["run_figures", "save_run_figures"]
