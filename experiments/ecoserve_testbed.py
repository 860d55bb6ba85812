"""EcoServe on its paper's testbeds (Du et al. 2025, §5): goodput at P50/P90/P99 attainment
against vLLM, Sarathi, DistServe and Mooncake, and static scaling (Fig. 9).

``ecoserve_goodput.py`` runs the same comparison on Phasor's V100 / Qwen2.5-7B testbed with
assumed SLOs; this script uses the paper's own setup where pdopt can model it:

* **Clusters** (§5.4): L20-48GB nodes, GPUs joined by PCIe only, nodes by **10 Gbps**
  Ethernet (32 GPUs used); A800-80GB nodes, PCIe inside, **25 Gbps RoCE** between (16 GPUs).
  DistServe is the paper's *intra-node* FuDG, so its KV crosses PCIe (``pcie4``); Mooncake is
  *inter-node* FuDG through a KV pool, two hops over the nodes' network
  (:meth:`pdopt.sim.LinkSpec.kv_pool`); the colocated systems (EcoServe, vLLM, Sarathi) move
  no KV.
* **Models** (§5.5, from the catalogue): Llama-30B (MHA), CodeLlama-34B (GQA), Qwen2-72B (GQA).
  Tensor parallelism: Llama-30B TP 4 on L20 and TP 2 on A800 (the paper's text); CodeLlama-34B
  TP 4 on L20 (Fig. 9: "1 instance (4 GPUs)"); Qwen2-72B TP 8 on L20 (our assumption: its
  weights leave too little KV room at TP 4; the paper's value is not legible in our copy).
  :data:`CONFIGS` lists what runs: CodeLlama-34B on L20 over the three data sets, and
  ShareGPT for the model and cluster breakdowns (Llama-30B and Qwen2-72B on L20, Llama-30B on
  A800); the full cross product would take about an hour on two cores.
* **Layouts**: every GPU of the cluster used; colocated systems as that many mixed instances,
  the disaggregated ones half prefill, half decode (the paper picks Mooncake's best P/D ratio;
  we do not search it).
* **Workloads and SLOs** (Table 4): Alpaca-, ShareGPT- and LongBench-like archetypes (the
  published means and medians), inputs truncated at 4,096 tokens; TTFT / TPOT SLOs Alpaca
  1 s / 100 ms, ShareGPT 5 s / 100 ms, LongBench 15 s / 100 ms. Poisson arrivals.
* **Goodput**: as ``ecoserve_goodput.py`` (the same goodput rule over the same seeds) on a
  coarser grid (:data:`RATE_FACTORS`) with 300 to 2000 requests per run (:data:`RUN_SIZES`).
  The ``ecoserve_pdopt`` row is EcoServe with every earlier pdopt departure
  (``_common.ECOSERVE_PDOPT_FLAGS``: scan, minimum saved TPOT less the coming iteration,
  per-request CheckConstraints, tick-bounded phases), the ablation of the paper's Alg. 1/2
  and §4.
* **Static scaling** (Fig. 9): one macro instance of 1, 2 and 4 CodeLlama-34B TP 4 instances on
  L20, mitosis off, ShareGPT: P90 goodput and its ratio to one instance (paper: 5.6× at 4).

Writes ``ecoserve_testbed_attainment.csv`` (every run), ``ecoserve_testbed.csv`` (goodput per
config, system and workload), ``ecoserve_testbed_scaling.csv``, ``ecoserve_testbed_slos.csv``
and ``ecoserve_testbed.png``.

    python experiments/ecoserve_testbed.py --out results/ [--quick]
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, replace
from typing import Any

import _common as c
import ecoserve_goodput as eg
import numpy as np
import pandas as pd

from pdopt.cluster import Slo
from pdopt.model_spec import get_model, kv_bytes_per_token
from pdopt.workload import Workload

NAME = "ecoserve_testbed"
MAX_INPUT_TOKENS = 4096
"""§5.1: inputs truncated at 4,096 tokens."""
PAPER_SLOS: dict[str, Slo] = {
    "alpaca": Slo(1.0, 0.1),
    "sharegpt": Slo(5.0, 0.1),
    "longbench": Slo(15.0, 0.1),
}
"""EcoServe Table 4: TTFT / TPOT SLO per data set, seconds."""
SYSTEMS = ("ecoserve", "vllm", "sarathi", "distserve", "mooncake", "ecoserve_pdopt")
NODG, FUDG = ("vllm", "sarathi"), ("distserve", "mooncake")
SCALING_SIZES = (1, 2, 4)
RATE_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
"""A coarser grid than ``ecoserve_goodput.py``'s (× the nominal rate, grown ×1.5 at most three
times): every (config, system, workload) is one curve and the script must stay within a few
minutes on two cores."""
RUN_SIZES, QUICK_RUN_SIZES = (300, 2000), (150, 300)
"""(floor, cap) of requests per run."""


@dataclass(frozen=True, slots=True)
class Config:
    """One (cluster, model) pair: GPUs, model, TP, GPUs used, node network, data sets."""

    cluster: str
    gpu: str
    model: str
    tp: int
    gpus: int
    network: str
    workloads: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.cluster} {self.model} TP{self.tp}"

    @property
    def instances(self) -> int:
        return self.gpus // self.tp

    def testbed(self) -> c.Testbed:
        profile = c.ROOT / "profiles" / f"{self.gpu.lower()}_{self.model.lower()}_roofline.csv"
        return c.Testbed(self.label, self.gpu, self.model, self.tp, profile, self.network)


CONFIGS: tuple[Config, ...] = (
    Config("L20", "L20", "CodeLlama-34B", 4, 32, "10gbe", c.ECOSERVE_WORKLOADS),
    Config("L20", "L20", "Llama-30B", 4, 32, "10gbe", ("sharegpt",)),
    Config("L20", "L20", "Qwen2-72B", 8, 32, "10gbe", ("sharegpt",)),
    Config("A800", "A800-80GB", "Llama-30B", 2, 16, "25gbe", ("sharegpt",)),
)
"""What runs by default (module doc); the first is the main one and Fig. 9's."""


def truncated_workload(name: str, rate: float, n: int, seed: int) -> Workload:
    """The archetype workload with inputs truncated at :data:`MAX_INPUT_TOKENS`."""
    wl = c.workload(name, rate, n, seed)
    inputs = np.minimum(wl.input_tokens, MAX_INPUT_TOKENS)
    return Workload(wl.arrival_s, inputs, wl.output_tokens)


def system(label: str, instances: int) -> c.System:
    """The compared system ``label`` on ``instances`` instances (module doc)."""
    base = c.SYSTEMS[label]
    if base.n_mixed:
        return replace(base, n_mixed=instances)
    half = instances // 2
    link = "pcie4" if label == "distserve" else base.link  # intra-node FuDG: PCIe
    return replace(base, n_prefill=half, n_decode=instances - half, link=link)


def slo_table() -> pd.DataFrame:
    """Per config and workload: the Table 4 SLOs, unloaded prefill and decode times, the share
    of prompts whose prefill alone misses the TTFT SLO, and the KV transfer of a mean prompt
    over PCIe and through the Mooncake pool."""
    rows = []
    for cfg in CONFIGS:
        bed = cfg.testbed()
        cost = c.testbed_cost_model(bed)
        kv_b = float(kv_bytes_per_token(get_model(cfg.model), cfg.tp))
        pool = bed.link("kvpool")
        pcie = bed.link("pcie4")
        for name in cfg.workloads:
            slo = PAPER_SLOS[name]
            wl = truncated_workload(name, 1.0, 4000, 12345)
            prefill_s = cost.prefill.request_time_s(wl.input_tokens)
            mean_kv = float(np.mean(wl.input_tokens)) * kv_b
            rows.append(
                {
                    "config": cfg.label,
                    "workload": name,
                    "ttft_s": slo.ttft_s,
                    "tpot_s": slo.tpot_s,
                    "prefill_mean_s": float(np.mean(prefill_s)),
                    "decode_step_s": float(cost.decode.iteration_time_s(1, 1024)),
                    "impossible_ttft_frac": float(np.mean(prefill_s > slo.ttft_s)),
                    "kv_pcie_mean_s": pcie.transfer_time_s(mean_kv) if pcie else 0.0,
                    "kv_pool_mean_s": pool.transfer_time_s(mean_kv) if pool else 0.0,
                }
            )
    return pd.DataFrame(rows)


def run_configs(
    configs: list[Config],
    systems: list[str],
    quick: bool,
    seed: tuple[int, ...],
    args: argparse.Namespace | None = None,
) -> pd.DataFrame:
    """Attainment curves of ``systems`` on every workload of every config of ``configs``, one
    independent task per (config, workload, system) (``--dask``)."""
    jobs = [
        (cfg, w, s)
        for cfg in configs
        for w in (cfg.workloads[:1] if quick else cfg.workloads)
        for s in systems
    ]
    task = functools.partial(_config_curve, quick=quick, seed=seed)
    return pd.concat(c.map_runs(task, jobs, args or argparse.Namespace()), ignore_index=True)


def _config_curve(job: tuple[Config, str, str], quick: bool, seed: tuple[int, ...]) -> pd.DataFrame:
    """The attainment curve of system ``s`` on workload ``w`` of config ``cfg``."""
    cfg, w, s = job
    bed = cfg.testbed()
    cost = c.testbed_cost_model(bed)
    factors = eg.QUICK_RATE_FACTORS if quick else RATE_FACTORS
    half = cfg.instances // 2
    began = c.Timer()
    curve = eg.attainment_curve(
        system(s, cfg.instances), w, factors, QUICK_RUN_SIZES if quick else RUN_SIZES,
        seed, cost,
        PAPER_SLOS[w], testbed=bed, make_workload=truncated_workload,
        nominal_layout=(half, cfg.instances - half),
    )  # fmt: skip
    curve.insert(0, "config", cfg.label)
    print(f"{cfg.label} {w} {s}: {len(curve)} runs, {began.elapsed_s():.0f} s", flush=True)
    return curve


def scaling(
    quick: bool, seed: tuple[int, ...], args: argparse.Namespace | None = None
) -> pd.DataFrame:
    """Fig. 9: EcoServe goodput on one macro instance of 1, 2, 4 instances (main config), with
    the paper's algorithm (``ecoserve``) and pdopt's variant (``ecoserve_pdopt``); one
    independent task per (variant, size) (``--dask``)."""
    jobs = [
        (label, k)
        for label in (("ecoserve",) if quick else ("ecoserve", "ecoserve_pdopt"))
        for k in (SCALING_SIZES[:2] if quick else SCALING_SIZES)
    ]
    task = functools.partial(_scaling_curve, quick=quick, seed=seed)
    frames = c.map_runs(task, jobs, args or argparse.Namespace())
    table = eg.goodput_table(pd.concat(frames, ignore_index=True), ["system", "instances"])
    one = table.groupby("system")["goodput_p90_rps"].transform("first")
    table["speedup_p90_vs_1"] = table["goodput_p90_rps"] / one.replace(0.0, np.nan)
    return table


def _scaling_curve(job: tuple[str, int], quick: bool, seed: tuple[int, ...]) -> pd.DataFrame:
    """The attainment curve of variant ``label`` on one macro instance of ``k`` instances."""
    label, k = job
    cfg = CONFIGS[0]
    bed = cfg.testbed()
    cost = c.testbed_cost_model(bed)
    factors = eg.QUICK_RATE_FACTORS if quick else RATE_FACTORS
    flags = {**system(label, k).flags, "macro_size": k, "mitosis": False}
    flags |= {"n_lower": 1, "n_upper": max(2, k)}
    sys_k = replace(c.SYSTEMS["ecoserve"], label=label, n_mixed=k, flags=flags)
    scaled = tuple(f * k / cfg.instances for f in factors)
    curve = eg.attainment_curve(
        sys_k, "sharegpt", scaled, QUICK_RUN_SIZES if quick else RUN_SIZES, seed, cost,
        PAPER_SLOS["sharegpt"], testbed=bed, make_workload=truncated_workload,
        nominal_layout=(cfg.instances // 2, cfg.instances - cfg.instances // 2),
    )  # fmt: skip
    curve.insert(1, "instances", k)
    return curve


def _row(quantity: str, value: float, detail: str) -> dict[str, Any]:
    return {
        "experiment": "EcoServe paper testbed",
        "quantity": quantity,
        "pdopt_value": value,
        "unit": "ratio",
        "detail": detail,
    }


def _mean_ratio(
    table: pd.DataFrame, col: str, bases: tuple[str, ...], top: str = "ecoserve"
) -> tuple[float, str]:
    """Mean of ``top``'s goodput over each of ``bases``' (rows where both are > 0)."""
    wide = table.pivot_table(index=["config", "workload"], columns="system", values=col)
    ratios, parts = [], []
    for base in bases:
        if base not in wide or top not in wide:
            continue
        for key, eco, ref in zip(wide.index, wide[top], wide[base], strict=True):
            if ref > 0:
                ratios.append(eco / ref)
                parts.append(f"{key[0]} {key[1]} {base} {eco:.3g}/{ref:.3g}")
    return (float(np.mean(ratios)) if ratios else float("nan")), "; ".join(parts)


def summary_rows(table: pd.DataFrame, scale: pd.DataFrame) -> list[dict[str, Any]]:
    """The paper's §6.1-6.2 numbers, pdopt's side: overall per baseline at P50 and P90, by
    model, by cluster and by application (vs NoDG, vs FuDG), and the Fig. 9 speed-up."""
    rows: list[dict[str, Any]] = []
    for pct in (90, 50):
        col = f"goodput_p{pct}_rps"
        for base in NODG + FUDG + ("ecoserve_pdopt",):
            value, detail = _mean_ratio(table, col, (base,))
            if not np.isnan(value):
                rows.append(_row(f"P{pct} goodput, ecoserve/{base}", value, detail))
    for base in NODG + FUDG:  # pdopt's variant against the same paper numbers
        value, detail = _mean_ratio(table, "goodput_p90_rps", (base,), "ecoserve_pdopt")
        if not np.isnan(value):
            rows.append(_row(f"P90 goodput, ecoserve_pdopt/{base}", value, detail))
    groups = [("model", "config", cfg.label) for cfg in CONFIGS[:3]]
    groups += [("cluster", "cluster", cl) for cl in ("L20", "A800")]
    groups += [("application", "workload", w) for w in c.ECOSERVE_WORKLOADS]
    for kind, key, value_ in groups:
        if key == "cluster":
            sub = table[table["config"].str.startswith(value_)]
        else:
            sub = table[table[key] == value_]
        for side, bases in (("NoDG", NODG), ("FuDG", FUDG)):
            value, detail = _mean_ratio(sub, "goodput_p90_rps", bases)
            if not np.isnan(value):
                rows.append(
                    _row(f"P90 goodput by {kind}, {value_}, ecoserve/{side}", value, detail)
                )
    for label, grp in scale.groupby("system", sort=False) if len(scale) else ():
        last = grp.iloc[-1]
        rows.append(
            _row(
                f"static scaling, {label}: P90 goodput at {int(last['instances'])} instances / 1",
                float(last["speedup_p90_vs_1"]),
                ", ".join(
                    f"{int(k)}: {g:.3g} req/s"
                    for k, g in zip(grp["instances"], grp["goodput_p90_rps"], strict=True)
                ),
            )
        )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME, SYSTEMS[:5])
    timer = c.Timer()
    systems = list(args.systems)
    if not args.quick and "ecoserve" in systems and "ecoserve_pdopt" not in systems:
        systems.append("ecoserve_pdopt")  # the paper's Alg. 1 / C2 ablated
    configs = CONFIGS[:1] if args.quick else CONFIGS
    seeds = eg.seeds_of(args)
    curves = run_configs(configs, systems, args.quick, seeds, args)
    table = eg.goodput_table(curves, ["config", "system", "workload"])
    scale = (
        scaling(args.quick, eg.seeds_of(args), args) if "ecoserve" in systems else pd.DataFrame()
    )
    c.save_csv(slo_table(), args.out, f"{NAME}_slos")
    c.save_csv(curves, args.out, f"{NAME}_attainment")
    c.save_csv(table, args.out, NAME)
    if len(scale):
        c.save_csv(scale, args.out, f"{NAME}_scaling")
    main_cfg = table[table["config"] == CONFIGS[0].label].drop(columns="config")
    c.save_figure(eg.plot_goodput(main_cfg), args.out, NAME)
    c.save_summary(summary_rows(table, scale), args.out, NAME)
    print(f"{NAME}: {len(curves)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
