"""Figures of a tuning result as PNG files: the Pareto front and parameter importances.

matplotlib is imported when a figure is drawn (``matplotlib.figure.Figure``, no pyplot: no
display needed and no backend forced on the caller). Each function
writes one file and returns its path; nothing is shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdopt.errors import ConfigError

if TYPE_CHECKING:
    from pdopt.tune._results import TuneResult


def _axes(figsize: tuple[float, float]) -> tuple[Any, Any]:
    """A figure and its axes without pyplot: no backend is chosen, so a notebook that draws a
    study keeps showing its figures inline."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


def plot_pareto_front(
    result: TuneResult, path: str | Path, x: str | None = None, y: str | None = None
) -> Path:
    """Scatter of every completed trial on two targets (default: the first two; with one
    target, the target against the first constraint-free metric ``goodput_rps``), feasible
    Pareto trials highlighted and joined."""
    metrics = [t.split(":", 1)[1] for t in result.targets]
    x = x or metrics[0]
    y = y or (metrics[1] if len(metrics) > 1 else "goodput_rps")
    done = result.trials[result.trials["state"] == "COMPLETE"]
    for col in (x, y):
        if col not in done:
            raise ConfigError(f"plot_pareto_front: no metric {col!r} in the trials")
    fig, ax = _axes((6, 4.5))
    ok = done[done["feasible"]]
    bad = done[~done["feasible"]]
    ax.scatter(bad[x], bad[y], s=12, c="0.75", label="infeasible")
    ax.scatter(ok[x], ok[y], s=14, c="tab:blue", label="feasible")
    best = result.best
    if not best.empty and x in best and y in best:
        order = best.sort_values(x)
        ax.plot(order[x], order[y], "o-", c="tab:red", ms=5, label="Pareto / best")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(f"study {result.study_name}: {len(done)} trials")
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def plot_importances(result: TuneResult, path: str | Path) -> Path:
    """Horizontal bars of the fANOVA importance of each parameter for the first target."""
    items = sorted(result.importances.items(), key=lambda kv: kv[1])
    fig, ax = _axes((6, 0.5 + 0.45 * max(len(items), 1)))
    if items:
        ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
    else:
        ax.text(0.5, 0.5, "too few complete trials", ha="center", va="center")
    ax.set_xlabel(f"importance for {result.targets[0]}")
    ax.set_xlim(0, 1)
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out
