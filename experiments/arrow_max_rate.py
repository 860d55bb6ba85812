"""Arrow (Wu et al. 2025) §7: the largest request rate at 90% SLO attainment, Arrow against its
paper's baselines and scheduling ablations, on the Azure 2023 code and conversation traces (and
BurstGPT from a user-given path).

Setup, as the paper configures it (§7.1) where pdopt can model it:

* **Hardware and model**: 8 × H800 serving Llama-3.1-8B (Arrow's testbed), roofline cost models
  (:func:`pdopt.costmodel.roofline_cost_model`, which also carries the quadratic TTFT
  predictor), KV capacity from memory, the GPU's NVLink between instances.
* **Rows** (:data:`ROWS`): ``arrow`` (the ``arrow`` policy with its defaults: stateless
  instances with chunked prefill and decode priority, Alg. 1-4 as written) on 8 single-GPU
  instances starting 4P4D; ``min_load`` (the paper's min-load baseline, §5.3: prefill by
  queueing delay, decode by running tokens, the ``min_load_tokens`` policy; before issue 36
  this row was ``least_loaded``, which balances decode by request count and is kept in
  :data:`ROWS`) and ``round_robin`` on 4P4D (§7.3:
  "we use 4 prefill instances and 4 decode instances"); ``vllm`` as the paper runs it: one
  instance at TP 8 with chunked prefill and decode priority (the ``sarathi`` policy's hybrid
  schedule, 512-token chunks); ``vllm_disagg``: 1P1D at TP 4 each (the ``static_split``
  policy). Ablations of Arrow's deviations (``--ablations``, and on the code trace by
  default): ``arrow_split`` (``colocated=False``: single-role instances, a flip reaches the
  engine at the next tick), ``arrow_flip_1s`` (``min_flip_interval_s=1``), ``arrow_static``
  (``elastic=False``), and with ``--ablations`` ``arrow_no_slo`` (``slo_aware=False``).
* **Traces and SLOs** (Table 1): Azure Code 3 s / 0.1 s, Azure Conversation 2 s / 0.15 s,
  BurstGPT 0.25 s / 0.075 s (TTFT / TPOT); attainment target 90%. The rate is scaled by
  :func:`pdopt.capacity.max_rate_under_slo` (time stamps ``t / s``), as the paper multiplies
  time stamps. The paper replays a 1-hour BurstGPT clip of 6009 requests; pdopt reads the
  file given with ``--burstgpt`` (:func:`pdopt.workload.read_burstgpt_trace`), its first
  ``--requests`` rows if given.

Run: ``python experiments/arrow_max_rate.py --trace ../shared/data/traces/azure_llm_2023/
AzureLLMInferenceTrace_code.csv --out results/ [--burstgpt PATH] [--requests N] [--quick]``;
the conversation trace is read from the code trace's folder (its first 6000 rows unless
``--conv-all``). Writes ``arrow_max_rate.csv``
(one row per trace and row), ``arrow_max_rate_points.csv`` (every simulation of the searches)
and ``arrow_max_rate_summary.csv`` (the ratios RESULTS.md compares with the paper).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as c
import pandas as pd

from pdopt.capacity import CapacityResult, RateSearch
from pdopt.cluster import ClusterSpec, Slo
from pdopt.scenario import Scenario
from pdopt.workload import Workload, read_azure_trace, read_burstgpt_trace

NAME = "arrow_max_rate"
GPU, MODEL = "H800", "Llama-3.1-8B"
PROFILE = c.ROOT / "profiles" / "h800_llama-3.1-8b_roofline.csv"


def testbed(tp: int) -> c.Testbed:
    """H800 × Llama-3.1-8B instances at TP ``tp`` on the GPU's own link."""
    return c.Testbed(f"{GPU} {MODEL} TP{tp}", GPU, MODEL, tp, PROFILE)


TESTBED = testbed(1)
"""Arrow's instances: one GPU each (module doc)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One compared system: a registered policy, its flags and its layout (P, D, mixed, TP)."""

    policy: str
    flags: dict[str, Any]
    layout: tuple[int, int, int, int] = (4, 4, 0, 1)


ROWS: dict[str, Row] = {
    "arrow": Row("arrow", {}),
    "min_load": Row("min_load_tokens", {}),
    "least_loaded": Row("least_loaded", {}),
    "round_robin": Row("round_robin", {}),
    "vllm": Row("sarathi", {}, (0, 0, 1, 8)),
    "vllm_disagg": Row("static_split", {}, (1, 1, 0, 4)),
    "arrow_split": Row("arrow", {"colocated": False}),
    "arrow_flip_1s": Row("arrow", {"min_flip_interval_s": 1.0}),
    "arrow_static": Row("arrow", {"elastic": False}),
    "arrow_no_slo": Row("arrow", {"slo_aware": False}),
}
"""Rows by name (module doc)."""
MAIN_ROWS = ("arrow", "min_load", "round_robin", "vllm", "vllm_disagg")
ABLATIONS = ("arrow_split", "arrow_flip_1s", "arrow_static")
"""Ablations run on the code trace by default (``--ablations``: also ``arrow_no_slo``, on every
trace)."""
CONV_REQUESTS = 6000
"""Rows of the conversation trace used by default (its first ~20 minutes): the whole trace
(19366 rows) takes about 6 minutes more; ``--requests 0 --conv-all`` runs it."""
TRACE_SLOS: dict[str, Slo] = {
    "azure_code": Slo(3.0, 0.1),
    "azure_conv": Slo(2.0, 0.15),
    "burstgpt": Slo(0.25, 0.075),
}
"""Arrow Table 1: TTFT / TPOT SLO per trace, seconds."""
CONV_NAME = "AzureLLMInferenceTrace_conv.csv"


def build_cluster(layout: tuple[int, int, int, int] = (4, 4, 0, 1)) -> ClusterSpec:
    """H800 × Llama-3.1-8B instances: ``(n_prefill, n_decode, n_mixed, tp)``."""
    n_p, n_d, n_m, tp = layout
    bed = testbed(tp)
    return c.build_cluster(c.testbed_cost_model(bed), n_p, n_d, n_m, testbed=bed)


def row_scenario(name: str, workload: Workload, slo: Slo) -> Scenario:
    """Row ``name`` of :data:`ROWS` serving ``workload`` under ``slo``."""
    row = ROWS[name]
    return Scenario(workload, build_cluster(row.layout), row.policy, slo, policy_flags=row.flags)


def compare(
    workload: Workload,
    slo: Slo,
    rows: tuple[str, ...] = MAIN_ROWS,
    *,
    rel_tol: float = 0.03,
    attainment: float = 0.9,
    args: argparse.Namespace | None = None,
) -> dict[str, CapacityResult]:
    """Max rate under the SLO-attainment target for each row (same workload, same seed); the
    rows' searches are independent, so ``args.dask`` runs them on Dask (:func:`c.map_runs`)."""
    search = RateSearch(attainment, rel_tol, 8.0)
    scenarios = [row_scenario(name, workload, slo) for name in rows]
    found = c.map_runs(search, scenarios, args or argparse.Namespace())
    return dict(zip(rows, found, strict=True))


def summary_frame(results: dict[str, CapacityResult], base: str = "min_load") -> pd.DataFrame:
    """One row per compared row: max rate, scale, attainment there, ratio to ``base``."""
    ref = results[base].max_rate_per_s if base in results else float("nan")
    rows = [
        {
            "policy": name,
            "max_rate_per_s": r.max_rate_per_s,
            "max_rate_scale": r.max_rate_scale,
            "attainment_at_max": r.attainment_at_max,
            "status": r.status,
            f"ratio_vs_{base}": r.max_rate_per_s / ref if ref > 0 else float("nan"),
        }
        for name, r in results.items()
    ]
    return pd.DataFrame(rows)


def ratio_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Summary rows: per trace, Arrow's max rate over each other row's, and min-load's over
    round-robin's (the paper's attainment comparison, as a max-rate ratio)."""
    out: list[dict[str, Any]] = []
    for trace, grp in table.groupby("trace", sort=False):
        rate = grp.set_index("policy")["max_rate_per_s"]
        n = int(grp["requests"].iloc[0])
        pairs = [("arrow", b) for b in rate.index if b != "arrow"]
        pairs.append(("min_load", "round_robin"))
        for top, base in pairs:
            if top not in rate.index or base not in rate.index or rate[base] <= 0:
                continue
            out.append(
                {
                    "experiment": "Arrow max rate",
                    "quantity": f"max rate at 90% attainment, {trace}, {top}/{base}",
                    "pdopt_value": float(rate[top] / rate[base]),
                    "unit": "ratio",
                    "detail": f"{top} {rate[top]:.3g} req/s vs {base} {rate[base]:.3g} req/s "
                    f"({n} requests)",
                }
            )
    return out


def traces(args: argparse.Namespace) -> dict[str, Workload]:
    """The traces to run: Azure code (``--trace``), conversation (its folder; skipped when
    absent or with ``--quick``) and BurstGPT (``--burstgpt``), each shifted to start at 0 and
    cut to ``--requests`` rows."""
    found: dict[str, Workload] = {"azure_code": read_azure_trace(args.trace)}
    conv = args.trace.parent / CONV_NAME
    if conv.exists() and not args.quick:
        found["azure_conv"] = read_azure_trace(conv)
    if args.burstgpt is not None:
        found["burstgpt"] = read_burstgpt_trace(args.burstgpt)
    out = {}
    for name, wl in found.items():
        wl = wl.shifted_to_zero()
        n = args.requests or (CONV_REQUESTS if name == "azure_conv" and not args.conv_all else 0)
        out[name] = wl[:n] if n else wl
    return out


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or NAME).splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True, help="Azure code trace CSV")
    ap.add_argument("--burstgpt", type=Path, default=None, help="BurstGPT CSV (optional)")
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--requests", type=int, default=0, help="first N rows only (0: all)")
    ap.add_argument("--rel-tol", type=float, default=0.05)
    ap.add_argument("--ablations", action="store_true", help="all ablations on every trace")
    ap.add_argument("--conv-all", action="store_true", help="the whole conversation trace")
    ap.add_argument(
        "--quick", action="store_true", help="code trace, first 300 rows (unless --requests)"
    )
    c.add_dask_arguments(ap)
    args = c.check_dask_arguments(ap, ap.parse_args(argv))
    for path in (args.trace, args.burstgpt):
        if path is not None and not path.exists():
            ap.error(f"trace file {path} not found")
    if args.quick:
        args.requests = args.requests or 300
        args.rel_tol = max(args.rel_tol, 0.1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    began = time.perf_counter()
    tables, points = [], []
    for trace, workload in traces(args).items():
        rows = MAIN_ROWS
        if args.ablations:
            rows = MAIN_ROWS + ABLATIONS + ("arrow_no_slo",)
        elif trace == "azure_code" and not args.quick:
            rows = MAIN_ROWS + ABLATIONS
        slo = TRACE_SLOS[trace]
        results = compare(workload, slo, rows, rel_tol=args.rel_tol, args=args)
        table = summary_frame(results)
        table.insert(0, "trace", trace)
        table["requests"] = len(workload)
        table["ttft_slo_s"], table["tpot_slo_s"] = slo.ttft_s, slo.tpot_s
        tables.append(table)
        points += [r.points.assign(trace=trace, policy=name) for name, r in results.items()]
        print(f"{trace}: {len(workload)} requests, {time.perf_counter() - began:.0f} s")
    table = pd.concat(tables, ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / f"{NAME}.csv", index=False)
    pd.concat(points, ignore_index=True).to_csv(args.out / f"{NAME}_points.csv", index=False)
    c.save_summary(ratio_rows(table), args.out, NAME)
    print(table.to_string(index=False))
    print(f"({time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
