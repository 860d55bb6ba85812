"""``pdopt plan --sweep NAME=V1,V2,...``: one verified plan per value, a table and a chart.

Each point is the whole ``pdopt plan`` (sizing, simulation, correction, minimal neighbours) at
that value of ``--rate``, ``--ttft-slo``, ``--tpot-slo`` or a factor on every GPU type's price;
a point with no plan is a row that says why. The table gives GPUs, USD/h, USD per 1,000
requests and per million tokens and the verdict; ``--sweep-chart`` draws GPUs and USD/h against
the swept value (matplotlib, PNG); ``--json`` prints the rows.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdopt.cli._output import print_json

EXIT_MISSES = 3


def run_sweep(args: argparse.Namespace, plan: Callable[[argparse.Namespace], Any]) -> int:
    """Plan each point of ``args.sweep`` with ``plan`` (the options of one point ->
    :class:`pdopt.plan.DeploymentPlan`) through :func:`pdopt.plan._sweep.sweep_deployment` and
    report; exit 0 when every point has a plan that meets, else 3 (1 when no point has any
    plan)."""
    from pdopt.plan._sweep import sweep_deployment

    name, values = args.sweep
    points = sweep_deployment(lambda value: plan(_point_args(args, name, value)), values)
    rows = [p.row() for p in points]
    chart = None
    if args.sweep_chart:
        chart = str(_chart(rows, name, Path(args.sweep_chart)))
    if args.json:
        print_json({"sweep": name, "rows": rows, "chart": chart})
    else:
        _print(rows, name, chart)
    if not any(r["gpus"] is not None for r in rows):
        return 1
    return 0 if all(r["meets"] for r in rows) else EXIT_MISSES


def _point_args(args: argparse.Namespace, name: str, value: float) -> argparse.Namespace:
    """The options of one sweep point: ``args`` with the swept option set to ``value``."""
    from pdopt.plan._sweep import scaled_prices

    point = copy.copy(args)
    point.sweep = None
    if name == "rate":
        point.rate = value
    elif name == "ttft-slo":
        point.ttft_slo = value
    elif name == "tpot-slo":
        point.tpot_slo = value
    else:
        point.prices = scaled_prices(_base_prices(args), value)
    return point


def _base_prices(args: argparse.Namespace) -> dict[str, float]:
    """Every GPU type's USD per GPU-hour before the price factor (``--prices``, else the
    catalogue's), for the types of ``--gpus`` and the profiles."""
    from pdopt.hardware import get_gpu
    from pdopt.profile import read_profile

    types = list(args.gpus) + [read_profile(Path(p)).meta.gpu for p in args.profile]
    given = {k.lower(): v for k, v in args.prices.items()}
    out = {}
    for name in dict.fromkeys(types):
        spec = get_gpu(name)
        out[spec.name] = given.get(name.lower(), given.get(spec.name.lower(), spec.cost_per_hour))
    return out


def _print(rows: list[dict[str, Any]], name: str, chart: str | None) -> None:
    from pdopt.cli._plan_report import _num

    print(f"pdopt plan --sweep {name}: one verified plan per value")
    print(f"  {name:>10s}  {'GPUs':>5s}  {'USD/h':>9s}  {'USD/1k req':>10s}  {'USD/M tok':>9s}  "
          "meets  verdict")  # fmt: skip
    for r in rows:
        gpus = "-" if r["gpus"] is None else str(r["gpus"])
        verdict = str(r["verdict"] or "")
        print(
            f"  {_num(r['value']):>10s}  {gpus:>5s}  {_num(r['cost_per_hour']):>9s}  "
            f"{_num(r['cost_per_1k_requests']):>10s}  {_num(r['usd_per_m_tokens']):>9s}  "
            f"{'yes' if r['meets'] else 'no':5s}  {verdict[:160]}"
        )
    if chart:
        print(f"chart written to {chart}")


def _chart(rows: list[dict[str, Any]], name: str, path: Path) -> Path:
    """GPUs and USD/h against the swept value (points without a plan left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    done = [r for r in rows if r["gpus"] is not None]
    xs = [r["value"] for r in done]
    fig, left = plt.subplots(figsize=(6.4, 4.0))
    left.plot(xs, [r["gpus"] for r in done], "o-", color="tab:blue", label="GPUs")
    left.set_xlabel(name)
    left.set_ylabel("GPUs", color="tab:blue")
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    right = left.twinx()
    right.plot(xs, [r["cost_per_hour"] for r in done], "s--", color="tab:orange", label="USD/h")
    right.set_ylabel("USD per hour", color="tab:orange")
    for r in done:
        if not r["meets"]:
            left.annotate("misses", (r["value"], r["gpus"]), textcoords="offset points",
                          xytext=(0, 6), ha="center", fontsize=8)  # fmt: skip
    left.set_title(f"pdopt plan --sweep {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
