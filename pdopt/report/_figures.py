"""The three figures of one :class:`pdopt.sim.SimResult` (package docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pdopt.sim import SimResult

FIGURES = ("latency_cdf", "queue", "kv")
"""Names of :func:`run_figures`' figures, also their PNG file stems."""


def run_figures(result: SimResult) -> dict[str, Figure]:
    """``latency_cdf``: empirical CDFs of TTFT and TPOT (finished requests), SLOs dashed;
    ``queue``: waiting prefill requests summed per role over time; ``kv``: KV blocks in use as a
    fraction of each role's capacity over time (the time series must have been recorded)."""
    return {
        "latency_cdf": _latency_cdf(result),
        "queue": _over_time(result, "queue_len", "waiting requests"),
        "kv": _over_time(result, "kv_used_blocks", "KV blocks used (fraction of capacity)"),
    }


def save_run_figures(result: SimResult, folder: str | Path) -> list[Path]:
    """Write :func:`run_figures` as ``FOLDER/NAME.png`` (the folder is created); the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in run_figures(result).items():
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def _figure(width: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, 3.4), layout="constrained")


def _latency_cdf(result: SimResult) -> Figure:
    fig = _figure(9.0)
    done = result.requests[result.requests["status"] == "finished"]
    columns = (("ttft_s", result.slo.ttft_s, "TTFT (s)"), ("tpot_s", result.slo.tpot_s, "TPOT (s)"))
    for ax, (column, slo, label) in zip(fig.subplots(1, 2), columns, strict=True):
        values = np.sort(done[column].dropna().to_numpy())
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post")
        ax.axvline(slo, ls="--", c="k", lw=0.8, label=f"SLO {slo:g} s")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.legend(loc="lower right", fontsize=8)
    return fig


def _over_time(result: SimResult, column: str, ylabel: str) -> Figure:
    fig = _figure(7.0)
    ax = fig.subplots()
    ts = result.timeseries
    if len(ts):
        total = ts.groupby(["t_s", "role"])[column].sum().unstack("role")
        if column == "kv_used_blocks":
            cap = (ts["kv_used_blocks"] + ts["kv_free_blocks"]).groupby([ts["t_s"], ts["role"]])
            total = total / cap.sum().unstack("role").replace(0, np.nan)
        for role in total.columns:
            ax.plot(total.index, total[role], label=str(role), lw=1)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no time series recorded", ha="center", transform=ax.transAxes)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    return fig
