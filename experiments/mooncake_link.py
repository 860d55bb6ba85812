"""Mooncake-style serving: goodput against the KV link's bandwidth, MHA against GQA (issue 5).

Mooncake moves every prompt's KV from the prefill node to the decode node through a KV pool over
the network (each byte crosses the hop twice). With a slow link an MHA model, whose KV is 4×
larger than a GQA model's of the same size, becomes bound by the transfer; EcoServe's paper makes
this point about commodity Ethernet.

Setup (our assumptions): A100-80GB roofline cost models, 2 prefill + 2 decode workers (TP 1),
Llama-2-7B (MHA, 32 KV heads, 512 KiB of KV per token) against Llama-3-8B (GQA, 8 KV heads,
128 KiB per token); 2048-token prompts with 64 output tokens, Poisson arrivals (200 requests,
seed 0); SLO TTFT 2 s / TPOT 100 ms; goodput = the largest rate at 90% attainment
(:func:`pdopt.capacity.max_rate_under_slo`, rel_tol 5%). Links: NVLink (300 GB/s) and KV pools
on 100, 25 and 10 GbE (:meth:`pdopt.sim.LinkSpec.kv_pool`).

Closed form on 10 GbE: one 2048-token prompt is 1.07 GB (MHA) / 0.27 GB (GQA) of KV; through the
pool at 625 MB/s a transfer takes 1.72 s / 0.43 s, so 4 prefill→decode pairs carry at most
2.33 / 9.3 req/s, against a prefill bound of about 14 req/s.

Writes ``mooncake_link.csv`` (one row per model × link) and ``mooncake_link.png``.

    python experiments/mooncake_link.py --out results/ [--quick]
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import _common as c
import numpy as np
import pandas as pd

from pdopt.capacity import max_rate_under_slo
from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import roofline_cost_model
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model, kv_bytes_per_token
from pdopt.scenario import Scenario
from pdopt.workload import Workload

NAME = "mooncake_link"
GPU = "A100-80GB"
MODELS = {"Llama-2-7B": "MHA", "Llama-3-8B": "GQA"}
SLO = Slo(ttft_s=2.0, tpot_s=0.1)
INPUT_TOKENS, OUTPUT_TOKENS = 2048, 64


def links(quick: bool) -> dict[str, LinkSpec]:
    """The links compared, fastest first (``quick``: NVLink and the 10 GbE pool only)."""
    out = {"nvlink": LinkSpec.nvlink()}
    for gbit in (() if quick else (100, 25)) + (10,):
        out[f"pool_{gbit}gbe"] = LinkSpec.kv_pool(LinkSpec.ethernet(gbit))
    return out


def cluster(model: str, link: LinkSpec) -> ClusterSpec:
    """2P2D A100-80GB workers serving ``model`` over ``link``."""
    cost = roofline_cost_model(GPU, model)
    return ClusterSpec.from_hardware(get_gpu(GPU), get_model(model), cost, 2, 2, link=link)


def workload(n: int, seed: int) -> Workload:
    """Poisson arrivals at 1 req/s (the search rescales them), fixed 2048/64 tokens."""
    rng = np.random.default_rng(seed)
    return Workload(
        np.cumsum(rng.exponential(1.0, n)), np.full(n, INPUT_TOKENS), np.full(n, OUTPUT_TOKENS)
    )


def sweep(quick: bool, seed: int, args: argparse.Namespace | None = None) -> pd.DataFrame:
    """Max rate at 90% attainment for every model × link (independent searches: ``--dask``)."""
    cases = [(model, name) for model in MODELS for name in links(quick)]
    task = functools.partial(_search, quick=quick, seed=seed)
    frame = pd.DataFrame(c.map_runs(task, cases, args or argparse.Namespace()))
    fastest = frame.groupby("model")["max_rate_per_s"].transform("first")
    frame["retained_vs_nvlink"] = frame["max_rate_per_s"] / fastest
    return frame


def _search(case: tuple[str, str], quick: bool, seed: int) -> dict[str, Any]:
    """One model × link: its transfer figures and its max rate at 90% attainment."""
    model, name = case
    link = links(quick)[name]
    wl = workload(100 if quick else 200, seed)
    kv_bytes = kv_bytes_per_token(get_model(model)) * INPUT_TOKENS
    scenario = Scenario(wl, cluster(model, link), "mooncake", SLO, seed=seed)
    cap = max_rate_under_slo(scenario, rel_tol=0.1 if quick else 0.05)
    return {
        "model": model,
        "attention": MODELS[model],
        "link": name,
        "link_bw_bytes_per_s": link.bw_bytes_per_s,
        "prompt_kv_bytes": kv_bytes,
        "transfer_s": link.transfer_time_s(kv_bytes),
        "link_bound_rps": 4.0 / link.transfer_time_s(kv_bytes),
        "max_rate_per_s": cap.max_rate_per_s,
        "status": cap.status,
    }


def plot(frame: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(1, width_in=5.0)
    for (model, attention), grp in frame.groupby(["model", "attention"], sort=False):
        axes[0].plot(
            grp["link_bw_bytes_per_s"] / 1e9,
            grp["max_rate_per_s"],
            marker="o",
            label=f"{model} ({attention})",
        )
    axes[0].set_xscale("log")
    axes[0].set_xlabel("link bandwidth (GB/s; KV pool halves it)")
    axes[0].set_ylabel("max rate at 90% attainment (req/s)")
    axes[0].legend()
    return fig


def summarise(frame: pd.DataFrame) -> list[dict[str, Any]]:
    slowest = frame.groupby("attention").last()
    rows = [
        {
            "experiment": "Mooncake link",
            "quantity": f"{att} goodput on the {slowest.loc[att, 'link']} pool / on NVLink",
            "pdopt_value": float(slowest.loc[att, "retained_vs_nvlink"]),
            "unit": "ratio",
            "detail": ", ".join(
                f"{r.link}: {r.max_rate_per_s:.3g} req/s"
                for r in frame[frame["attention"] == att].itertuples()
            ),
        }
        for att in ("MHA", "GQA")
    ]
    rows.append(
        {
            "experiment": "Mooncake link",
            "quantity": "MHA retained / GQA retained on the slowest link",
            "pdopt_value": float(
                slowest.loc["MHA", "retained_vs_nvlink"] / slowest.loc["GQA", "retained_vs_nvlink"]
            ),
            "unit": "ratio",
            "detail": "below 1: the slow link costs MHA more than GQA",
        }
    )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME)
    timer = c.Timer()
    frame = sweep(args.quick, args.seed, args)
    c.save_csv(frame, args.out, NAME)
    c.save_figure(plot(frame), args.out, NAME)
    c.save_summary(summarise(frame), args.out, NAME)
    print(frame.round(3).to_string(index=False))
    print(f"{NAME}: {len(frame)} searches in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
