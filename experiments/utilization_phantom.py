"""Phasor Fig. 2: the utilization phantom — compute headroom against memory headroom as the decode
batch grows.

A decode worker's compute utilization (achieved FLOP/s over peak) stays low at every batch size
while its KV memory fills: a scheduler that reads compute utilization sees lots of headroom
(the "phantom") just when the worker cannot admit another request. Two views, same V100-32GB /
Qwen2.5-7B worker as every Phasor script:

* **Analytic sweep** over the decode batch B (1 to the worker's 256-request cap) at a per-request
  context of L tokens (production mix: 1024 + 128 = 1152, half-way through its output; long/long:
  2048 + 256 = 2304): iteration time τ(B, B·L) from the fitted cost model, compute utilization
  ``decode_step_flops(B, B·L) / (τ · P_peak)``, HBM bandwidth utilization
  ``decode_step_bytes / (τ · BW)`` (:mod:`pdopt.model_spec`) and KV memory used ``B·L / capacity``
  (capacity from memory × 0.9 − weights − activation peak, 253k tokens).
* **Simulated**: DistServe 4P4D serving Code Generation (``phasor_s_l``, mean 128/2048) at 1.2×
  the nominal rate; every engine tick of every decode worker gives (B, C = used KV blocks × 16
  tokens) and the same two utilizations.

Writes ``utilization_phantom.csv`` (analytic), ``utilization_phantom_sim.csv`` (simulated ticks),
``utilization_phantom.png`` and the summary.

    python experiments/utilization_phantom.py --out results/ [--quick]
"""

from __future__ import annotations

from typing import Any

import _common as c
import _phasor as ph
import numpy as np
import pandas as pd

from pdopt.hardware import get_gpu
from pdopt.model_spec import decode_step_bytes, decode_step_flops, get_model, kv_capacity_tokens

NAME = "utilization_phantom"
CONTEXTS = {"production_mix": 1024 + 128, "long_long": 2048 + 256}
"""Tokens of KV per running request, half-way through its output."""
MAX_BATCH = 256
SIM_WORKLOAD, SIM_RATE_FACTOR = "phasor_s_l", 1.2


def utilizations(cost: Any, batch: np.ndarray, context_tokens: np.ndarray) -> pd.DataFrame:
    """Compute and HBM utilization of one decode iteration of ``batch`` requests holding
    ``context_tokens`` in all (arrays of equal length), and its time τ (s)."""
    gpu, model = get_gpu(c.GPU_NAME), get_model(c.MODEL_NAME)
    pairs = list(zip(batch.tolist(), context_tokens.tolist(), strict=True))
    tau = np.array([cost.decode.iteration_time_s(int(b), float(x)) for b, x in pairs])
    flops = np.array([decode_step_flops(model, int(b), float(x)) for b, x in pairs])
    moved = np.array([decode_step_bytes(model, int(b), float(x)) for b, x in pairs])
    return pd.DataFrame(
        {
            "step_s": tau,
            "compute_util_pct": 100.0 * flops / (tau * gpu.peak_flops),
            "hbm_util_pct": 100.0 * np.minimum(moved / (tau * gpu.hbm_bw_bytes_per_s), 1.0),
        }
    )


def kv_capacity() -> int:
    return kv_capacity_tokens(get_gpu(c.GPU_NAME), get_model(c.MODEL_NAME))


def analytic(cost: Any) -> pd.DataFrame:
    """The batch sweep for every context length of :data:`CONTEXTS`."""
    cap = kv_capacity()
    frames = []
    for name, per_request in CONTEXTS.items():
        batch = np.arange(1, MAX_BATCH + 1)
        ctx = batch * per_request
        util = utilizations(cost, batch, ctx)
        util.insert(0, "batch", batch)
        util.insert(0, "workload", name)
        util["context_per_request"] = per_request
        util["kv_used_pct"] = 100.0 * ctx / cap
        util["fits"] = ctx <= cap
        frames.append(util)
    return pd.concat(frames, ignore_index=True)


def simulated(cost: Any, quick: bool, seed: int) -> pd.DataFrame:
    """Per tick and decode worker: batch, context, utilizations and KV used (DistServe 4P4D)."""
    rate = SIM_RATE_FACTOR * c.nominal_rate_per_s(SIM_WORKLOAD, cost)
    n = 200 if quick else c.requests_for(SIM_WORKLOAD, cost, rate, 600, 1500)
    wl = c.workload(SIM_WORKLOAD, rate, n, seed)
    system = c.SYSTEMS["distserve"]
    res = c.run_system(system, wl, cost, ph.slo(SIM_WORKLOAD), seed=seed, record_timeseries=True)
    ts = res.timeseries
    dec = ts[(ts["role"] == "decode") & (ts["running"] > 0)].copy()
    block = c.system_cluster(system, cost).workers[-1].block_tokens
    ctx = dec["kv_used_blocks"].to_numpy(dtype=float) * block
    util = utilizations(cost, dec["running"].to_numpy(), ctx)
    total = (dec["kv_used_blocks"] + dec["kv_free_blocks"]).to_numpy(dtype=float)
    return pd.DataFrame(
        {
            "t_s": dec["t_s"].to_numpy(),
            "worker": dec["worker"].to_numpy(),
            "batch": dec["running"].to_numpy(),
            "context_tokens": ctx,
            "kv_used_pct": 100.0 * dec["kv_used_blocks"].to_numpy(dtype=float) / total,
            "compute_util_pct": util["compute_util_pct"].to_numpy(),
            "hbm_util_pct": util["hbm_util_pct"].to_numpy(),
        }
    )


def plot(table: pd.DataFrame, sim: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(2, width_in=4.5)
    for name, grp in table.groupby("workload", sort=False):
        line = axes[0].plot(grp["batch"], grp["compute_util_pct"], label=f"compute, {name}")
        axes[0].plot(
            grp["batch"],
            np.maximum(100.0 - grp["kv_used_pct"], 0.0),
            ls="--",
            c=line[0].get_color(),
            label=f"KV headroom, {name}",
        )
    axes[0].set_xlabel("decode batch (requests)")
    axes[0].set_ylabel("%")
    axes[0].set_title("analytic (fitted V100 cost model)", fontsize=9)
    axes[0].legend(fontsize=6)
    axes[1].scatter(sim["kv_used_pct"], sim["compute_util_pct"], s=2, alpha=0.3)
    axes[1].set_xlabel("KV memory used (%)")
    axes[1].set_ylabel("compute utilization (%)")
    axes[1].set_title(f"simulated ticks, DistServe, {SIM_WORKLOAD}", fontsize=9)
    return fig


def summarise(table: pd.DataFrame, sim: pd.DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, grp in table.groupby("workload", sort=False):
        full = grp[grp["fits"]].iloc[-1]
        rows.append(
            {
                "experiment": "Fig. 2 utilization phantom",
                "quantity": f"compute utilization with KV full, {name} (analytic)",
                "pdopt_value": float(full["compute_util_pct"]),
                "unit": "%",
                "detail": f"batch {int(full['batch'])} × {int(full['context_per_request'])} "
                f"tokens fills {full['kv_used_pct']:.0f}% of KV; HBM bandwidth "
                f"{full['hbm_util_pct']:.0f}% busy, step {full['step_s'] * 1e3:.0f} ms",
            }
        )
    high = sim[sim["kv_used_pct"] >= 80.0]
    part = high if len(high) else sim.nlargest(max(1, len(sim) // 20), "kv_used_pct")
    rows.append(
        {
            "experiment": "Fig. 2 utilization phantom",
            "quantity": "compute utilization at the fullest simulated ticks (mean)",
            "pdopt_value": float(part["compute_util_pct"].mean()),
            "unit": "%",
            "detail": f"{len(part)} decode-worker ticks with KV used >= "
            f"{part['kv_used_pct'].min():.0f}% (max {sim['kv_used_pct'].max():.0f}%), "
            f"mean batch {part['batch'].mean():.0f}",
        }
    )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME)
    timer = c.Timer()
    cost = c.v100_cost_model()
    table = analytic(cost)
    sim = simulated(cost, args.quick, args.seed)
    c.save_csv(table, args.out, NAME)
    c.save_csv(sim, args.out, f"{NAME}_sim")
    c.save_figure(plot(table, sim), args.out, NAME)
    c.save_summary(summarise(table, sim), args.out, NAME)
    print(f"{NAME}: done in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
