"""The Phasor paper's testbed, workloads, SLOs and capacity rule, shared by the Phasor scripts
(issue 15).

* **Testbed** (paper §4.1): 8 × V100-32GB serving Qwen2.5-7B-Instruct (the paper's primary model)
  or Llama-3-8B (its cross-model ablation), TP 1. Two cost models, chosen with ``--cost-model``
  and named in every result (:func:`cost_label`):

  - ``roofline`` (default): :func:`pdopt.costmodel.roofline_cost_model` of the GPU and model.
  - ``phasor``: the paper's Table 4 prefill constants (P_peak ≈ 121 TFLOP/s, α = 4.25e-5,
    β = 6.8e-3, P_m by parameter count; ``profiles/phasor_v100_qwen2.5-7b.json``) through
    :func:`pdopt.costmodel.published_cost_model`, with the roofline decode of the same GPU and
    model (the paper publishes no decode model).

  The roofline is the default because the paper's own numbers disagree with its Table 4 prefill:
  α/β price a 1,024-token prefill at 0.43 s, above the 0.40 s TTFT SLO it sets for the 1,024-token
  workloads (Table 3) and ~3.7× the ~116 ms prefill latency it measures at low load (§2.1); the
  roofline prices it at 0.14 s.
* **Workloads** (Table 1): the ``phasor_*`` archetypes of :mod:`pdopt.workload` (lognormal lengths
  around the paper's means, Azure-conversation spread). The production mix (the paper's
  BurstGPT) is, in order of preference: a BurstGPT file (``--burstgpt PATH``), the Azure LLM
  inference 2023 conversation trace under ``--traces`` (time-compressed to the target rate), or,
  without either, ``phasor_mix`` lengths with gamma (CV 3) bursty arrivals; :func:`mix_source`
  says which was used.
* **SLOs** (Table 3): :attr:`pdopt.workload.Archetype.slo_s`.
* **Capacity** (§4.3): the largest closed-loop in-flight concurrency meeting P99 TTFT and P99
  TPOT, with a fixed think time :data:`THINK_TIME_S` and client starts spread over
  :data:`START_SPREAD_S` (the paper gives neither value; these are ours).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import _common as c
import numpy as np
import pandas as pd

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import (
    CostModel,
    published_cost_model,
    read_parameter_file,
    roofline_cost_model,
)
from pdopt.scenario import Scenario
from pdopt.sim import PolicyDecisionError
from pdopt.workload import (
    Workload,
    archetype_workload,
    get_archetype,
    read_azure_trace,
    read_burstgpt_trace,
)

MODELS: tuple[str, ...] = ("Qwen2.5-7B", "Llama-3-8B")
COST_MODELS: tuple[str, ...] = ("roofline", "phasor")
DEFAULT_COST_MODEL = "roofline"
PHASOR_PARAMETERS = c.ROOT / "profiles" / "phasor_v100_qwen2.5-7b.json"
CONV_TRACE_NAME = "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"

WORKLOADS: tuple[str, ...] = (
    "phasor_s_s",
    "phasor_m_m",
    "phasor_mix",
    "phasor_s_l",
    "phasor_l_s",
    "phasor_l_l",
)
"""Table 1, in the paper's order of Appendix E / Fig. 10."""

TASKS: dict[str, str] = {
    "phasor_s_s": "Short QA (S-S)",
    "phasor_m_m": "Dialog (M-M)",
    "phasor_mix": "Production Mix",
    "phasor_s_l": "Code Gen. (S-L)",
    "phasor_l_s": "Summarization (L-S)",
    "phasor_l_l": "Translation (L-L)",
}

MIX_CV = 3.0
"""Inter-arrival CV of the synthetic production mix (the paper's MGP arrivals, §2.1)."""

START_CLIENTS: dict[str, int] = {
    "phasor_s_s": 512,
    "phasor_m_m": 64,
    "phasor_mix": 128,
    "phasor_s_l": 512,
    "phasor_l_s": 32,
    "phasor_l_l": 32,
}
"""Where a capacity search starts doubling (near each workload's knee on the 4P4D roofline
testbed, so that few evaluations bracket it; any start gives the same answer with enough)."""

THINK_TIME_S = 1.0
"""Fixed client think time of the capacity runs, seconds (the paper: "fixed client think-time",
value not given)."""

START_SPREAD_S = 5.0
"""Clients of a capacity run start uniformly over this window, seconds (staggered starts)."""

HEAD_TO_HEAD = ("phasor", "distserve", "splitwise")
"""Every head-to-head starts from the same 4 prefill + 4 decode split (:data:`_common.SYSTEMS`):
DistServe 4P4D static, Splitwise and Phasor 4P + 2D + 2 Mixed members at home on decode."""


# -- testbed --------------------------------------------------------------------------------------


def cost_model(kind: str = DEFAULT_COST_MODEL, model: str = c.MODEL_NAME) -> CostModel:
    """The V100-32GB cost model of ``model``: ``"roofline"`` or ``"phasor"`` (module doc)."""
    base = roofline_cost_model(c.GPU_NAME, model)
    if kind == "roofline":
        return base
    if kind == "phasor":
        return published_cost_model(read_parameter_file(PHASOR_PARAMETERS), model, base)
    raise ValueError(f"--cost-model must be one of {COST_MODELS}, got {kind!r}")


def cost_label(kind: str, model: str = c.MODEL_NAME) -> str:
    """How a result names its cost model (stated in every summary row)."""
    if kind == "phasor":
        return f"paper Table 4 prefill + roofline decode, {c.GPU_NAME} / {model}"
    return f"roofline, {c.GPU_NAME} / {model}"


def testbed(model: str) -> c.Testbed:
    """8 × V100-32GB, TP 1, serving ``model``."""
    return replace(c.V100, label=f"{c.GPU_NAME} {model} TP1", model=model)


def slo(name: str) -> Slo:
    """The paper's Table 3 SLO of a ``phasor_*`` workload."""
    budget = get_archetype(name).slo_s
    if budget is None:
        raise ValueError(f"{name} has no published SLO")
    return Slo(ttft_s=budget[0], tpot_s=budget[1])


# -- workloads ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MixSource:
    """Where the production mix comes from: ``kind`` ``"burstgpt"``, ``"azure"`` or
    ``"synthetic"``, the file (if any) and a sentence for the results."""

    kind: str
    path: Path | None
    text: str


def mix_source(args: argparse.Namespace) -> MixSource:
    """The production-mix source chosen by ``--burstgpt`` / ``--traces`` (module doc)."""
    if args.burstgpt is not None:
        if not args.burstgpt.exists():
            raise SystemExit(f"--burstgpt: no file at {args.burstgpt}")
        return MixSource("burstgpt", args.burstgpt, f"BurstGPT trace {args.burstgpt.name}")
    if args.traces is not None:
        path = args.traces if args.traces.suffix == ".csv" else args.traces / CONV_TRACE_NAME
        if path.exists():
            return MixSource(
                "azure", path, "Azure LLM inference 2023 conversation trace, time-compressed"
            )
    return MixSource(
        "synthetic",
        None,
        f"no trace given: phasor_mix lengths (1024/256 mean) with gamma arrivals, CV {MIX_CV:g}",
    )


_TRACE_CACHE: dict[Path, Workload] = {}


def _trace(source: MixSource) -> Workload:
    assert source.path is not None
    if source.path not in _TRACE_CACHE:
        reader = read_burstgpt_trace if source.kind == "burstgpt" else read_azure_trace
        _TRACE_CACHE[source.path] = reader(source.path).shifted_to_zero()
    return _TRACE_CACHE[source.path]


def workload(
    name: str, rate_per_s: float, duration_s: float, seed: int, source: MixSource | None = None
) -> Workload:
    """``duration_s`` seconds of ``name`` at ``rate_per_s``: Poisson arrivals for the ``phasor_*``
    archetypes; the production mix from ``source``: a trace's first ``rate_per_s · duration_s``
    requests (all of them if it has fewer), their time stamps compressed so that they span
    ``duration_s`` (the trace's own burstiness kept, its mean rate set to ``rate_per_s``)."""
    if name != "phasor_mix":
        return archetype_workload(name, rate_per_s, duration_s=duration_s, seed=seed)
    if source is None or source.kind == "synthetic":
        return archetype_workload(name, rate_per_s, duration_s=duration_s, cv=MIX_CV, seed=seed)
    part = _trace(source)[: max(2, round(rate_per_s * duration_s))]
    return part.scale_rate(float(part.arrival_s[-1]) / duration_s)


def lengths(name: str, seed: int, source: MixSource | None = None, n: int = 2000) -> Workload:
    """Length rows of ``name`` for a closed loop (arrival times unused)."""
    if name == "phasor_mix" and source is not None and source.kind != "synthetic":
        return _trace(source)[:n]
    return archetype_workload(name, 1.0, n_requests=n, seed=seed)


# -- running --------------------------------------------------------------------------------------


def run_metrics(scenario: Scenario) -> tuple[pd.Series | None, str]:
    """``(metrics, "")``, or ``(None, error)`` when the policy emits an invalid action (a
    simulator-reported policy bug; the row is kept with its error rather than dropped)."""
    try:
        return scenario.run().metrics(), ""
    except PolicyDecisionError as exc:
        return None, str(exc).splitlines()[0][:200]


def capacity_slo(name: str, cost: CostModel, lengths_wl: Workload) -> tuple[Slo, str]:
    """The SLO a capacity search uses: Table 3's, unless one request alone already misses its
    TTFT at P99 (the unloaded P99 prefill time of the workload's lengths exceeds the budget),
    in which case the TTFT budget becomes twice that P99 prefill time (stated in the results:
    with the paper's own budget every system's capacity would be 0)."""
    paper = slo(name)
    p99 = float(np.quantile(cost.prefill.request_time_s(lengths_wl.input_tokens), 0.99))
    if p99 <= paper.ttft_s:
        return paper, "Table 3"
    relaxed = math.ceil(2.0 * p99 * 100.0) / 100.0
    return (
        Slo(ttft_s=relaxed, tpot_s=paper.tpot_s),
        f"TTFT relaxed from {paper.ttft_s:g} s to {relaxed:g} s (unloaded P99 prefill {p99:.2f} s)",
    )


def capacity(
    system: c.System,
    name: str,
    cost: CostModel,
    *,
    seed: int,
    quick: bool,
    source: MixSource | None = None,
    model: str = c.MODEL_NAME,
    start_clients: int | None = None,
    max_evaluations: int = 9,
    cluster: ClusterSpec | None = None,
    **flags: Any,
) -> dict[str, Any]:
    """Largest closed-loop concurrency of ``system`` on ``name`` meeting both P99 SLOs (with
    :data:`THINK_TIME_S` think time and :data:`START_SPREAD_S` staggered starts); a row.
    ``cluster`` replaces the system's own; ``flags`` are extra policy flags (a ``delta_t_s``
    also sets the engine tick, as :func:`pdopt.tune.evaluate` does)."""
    from pdopt.capacity import max_concurrency_under_slo

    rows = lengths(name, seed, source)
    target, slo_note = capacity_slo(name, cost, rows)
    start = start_clients or START_CLIENTS[name]
    scenario = c.system_scenario(
        system,
        rows,
        target,
        cost=cost,
        testbed=testbed(model),
        cluster=cluster,
        seed=seed,
        **flags,
    )
    if "delta_t_s" in flags:
        scenario = scenario.replace(tick_s=float(flags["delta_t_s"]))
    row: dict[str, Any] = {
        "system": system.label,
        "workload": name,
        "model": model,
        "ttft_slo_s": target.ttft_s,
        "tpot_slo_s": target.tpot_s,
        "slo_note": slo_note,
        "think_time_s": THINK_TIME_S,
        "start_spread_s": START_SPREAD_S,
    }
    try:
        res = max_concurrency_under_slo(
            scenario,
            think_time_s=THINK_TIME_S,
            start_spread_s=START_SPREAD_S,
            requests_per_client=requests_per_client(start),
            start_clients=start,
            max_clients=4096,
            max_evaluations=6 if quick else max_evaluations,
        )
    except PolicyDecisionError as exc:
        return {
            **row,
            "max_clients": float("nan"),
            "status": "policy error",
            "error": str(exc).splitlines()[0][:200],
        }
    return {
        **row,
        "max_clients": res.max_clients,
        "ttft_p99_s": res.ttft_p99_s,
        "tpot_p99_s": res.tpot_p99_s,
        "bracket_lo": res.bracket_clients[0],
        "bracket_hi": res.bracket_clients[1],
        "status": res.status,
        "evaluations": len(res.points),
        "error": "",
    }


def capacity_job(job: tuple[c.System, str, CostModel, dict[str, Any]]) -> dict[str, Any]:
    """:func:`capacity` of ``(system, workload name, cost model, keyword arguments)``: one
    search of a script's grid, as :func:`_common.map_runs` maps it."""
    system, name, cost, kwargs = job
    return capacity(system, name, cost, **kwargs)


def requests_per_client(start_clients: int) -> int:
    """Steady requests per client of a capacity point (the first one is left out): 2, or 1 where
    the search starts at 512 clients or more, so that every point's P99s are over hundreds of
    requests while the long-output searches (Short QA, Code Generation) stay affordable."""
    return 1 if start_clients >= 512 else 2


def with_split(system: c.System, n_prefill: int) -> c.System:
    """``system`` starting from ``n_prefill`` prefill GPUs (the Mixed pool, if any, kept; the
    rest decode)."""
    n_decode = c.N_GPUS - n_prefill - system.n_mixed
    return replace(system, n_prefill=n_prefill, n_decode=n_decode)


# -- command line ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--cost-model``, ``--traces`` and ``--burstgpt`` (module doc)."""
    parser.add_argument("--model", choices=MODELS, default=MODELS[0], help="served model")
    parser.add_argument(
        "--cost-model",
        choices=COST_MODELS,
        default=DEFAULT_COST_MODEL,
        help="roofline, or the paper's Table 4 prefill constants (default: %(default)s)",
    )
    parser.add_argument(
        "--traces",
        type=Path,
        default=None,
        help=f"folder with {CONV_TRACE_NAME} (or that CSV): the production mix's arrivals and "
        "lengths; without it a synthetic CV-3 mix",
    )
    parser.add_argument(
        "--burstgpt", type=Path, default=None, help="a BurstGPT CSV for the production mix"
    )


def parse_args(description: str, systems: tuple[str, ...] = ()) -> argparse.Namespace:
    """:func:`_common.parse_args` with :func:`add_arguments`."""
    return c.parse_args(description, systems, extra=add_arguments)


def stated(args: argparse.Namespace, source: MixSource | None = None) -> str:
    """The setting every summary row states: model, cost model and production-mix source."""
    text = f"cost model: {cost_label(args.cost_model, args.model)}"
    return text + (f"; production mix: {source.text}" if source is not None else "")
