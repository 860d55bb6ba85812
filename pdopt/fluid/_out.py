"""The fluid simulator's outputs: per-pool time series and SimResult-style mean metrics."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from pdopt.cluster import ClusterSpec, Role, Slo
from pdopt.fluid._core import PoolConstants, Segment
from pdopt.sim import TIMESERIES_COLUMNS

FloatArray = npt.NDArray[np.float64]
FLUID_TIMESERIES_COLUMNS = (*TIMESERIES_COLUMNS, "workers")
"""The request-level columns (one row per *pool* per tick, ``worker`` = the pool) plus the
pool's worker count."""


def concat(segments: list[Segment]) -> dict[str, FloatArray]:
    """Per-tick arrays over the whole run (allocation sizes repeated per tick)."""
    names = [n for n in Segment.__slots__ if n not in ("n_prefill", "n_decode")]
    out = {n: np.concatenate([getattr(s, n) for s in segments]) for n in names}
    sizes = [len(s.rho) for s in segments]
    out["n_prefill"] = np.repeat([float(s.n_prefill) for s in segments], sizes)
    out["n_decode"] = np.repeat([float(s.n_decode) for s in segments], sizes)
    return out


def _power(cluster: ClusterSpec) -> tuple[float, float]:
    w = cluster.workers[0]
    return w.idle_power_w, w.max_power_w


def busy_fractions(a: dict[str, FloatArray]) -> tuple[FloatArray, FloatArray]:
    """Mean busy share of a prefill and of a decode worker in each tick."""
    p_busy = np.where(a["prefill_backlog_s"] > 0, 1.0, np.minimum(a["rho"], 1.0))
    d_busy = np.minimum(a["running_decode"], 1.0)
    return p_busy, d_busy


def timeseries(
    a: dict[str, FloatArray], ends_s: FloatArray, k: PoolConstants, cluster: ClusterSpec
) -> pd.DataFrame:
    """Two rows per tick (``prefill`` and ``decode`` pools), columns
    :data:`FLUID_TIMESERIES_COLUMNS`; counts are pool totals, ``busy_frac`` the pool mean."""
    idle, peak = _power(cluster)
    p_busy, d_busy = busy_fractions(a)
    n_p, n_d = a["n_prefill"], a["n_decode"]
    cap = float(k.kv_capacity_blocks)
    d_used = n_d * a["running_decode"] * k.blocks_per_running
    zeros = np.zeros_like(ends_s)
    p_rows = {
        "t_s": ends_s, "queue_len": a["prefill_queue"],
        "queued_prefill_flop": a["prefill_outstanding_s"] * k.p_peak_flops,
        "running": n_p * np.minimum(a["rho"], 1.0), "kv_used_blocks": zeros,
        "kv_free_blocks": n_p * cap, "kv_stranded_blocks": zeros, "busy_frac": p_busy,
        "power_w": n_p * (idle + (peak - idle) * p_busy), "workers": n_p,
    }  # fmt: skip
    d_rows = {
        "t_s": ends_s, "queue_len": a["decode_backlog"], "queued_prefill_flop": zeros,
        "running": n_d * a["running_decode"], "kv_used_blocks": d_used,
        "kv_free_blocks": np.maximum(n_d * cap - d_used, 0.0), "kv_stranded_blocks": zeros,
        "busy_frac": d_busy, "power_w": n_d * (idle + (peak - idle) * d_busy), "workers": n_d,
    }  # fmt: skip
    frames = []
    for role, rows in ((Role.PREFILL, p_rows), (Role.DECODE, d_rows)):
        df = pd.DataFrame(rows)
        df["worker"] = df["pool"] = df["role"] = str(role)
        frames.append(df)
    both = pd.concat(frames, ignore_index=True).sort_values("t_s", kind="stable")
    return both[list(FLUID_TIMESERIES_COLUMNS)].reset_index(drop=True)


def tpot_e2e(a: dict[str, FloatArray], k: PoolConstants) -> tuple[FloatArray, FloatArray]:
    """Per-tick mean TPOT (decoding requests) and mean E2E (all requests) of arrivals."""
    overhead = k.transfer_s + a["decode_wait_s"] + a["tau_s"] / 2.0
    tpot = a["tau_s"] + overhead * k.inv_iterations
    iters = k.decode_iterations / k.decode_share if k.decode_share > 0 else 0.0
    e2e = a["ttft_s"] + k.decode_share * (overhead + iters * a["tau_s"])
    return tpot, e2e


def _samples(
    a: dict[str, FloatArray],
    weights: FloatArray,
    inputs_s: FloatArray,
    outputs: FloatArray,
    n: int,
    seed: int,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Sampled (TTFT, TPOT, E2E) of ``n`` representative requests: a tick drawn by arrivals, a
    length pair from the sample, the stationary wait as an atom at 0 plus an exponential."""
    rng = np.random.default_rng(seed)
    tick = rng.choice(len(weights), size=n, p=weights / weights.sum())
    pick = rng.integers(len(inputs_s), size=n)
    pw = a["prob_wait"][tick]
    mean_if_wait = np.where(pw > 0, a["wait_s"][tick] / np.maximum(pw, 1e-12), 0.0)
    waits = np.where(rng.random(n) < pw, rng.exponential(1.0, n) * mean_if_wait, 0.0)
    ttft = a["fluid_wait_s"][tick] + waits + 2.0 * a["batch_extra_s"][tick] + inputs_s[pick]
    iters = outputs[pick] - 1.0
    tau = a["tau_s"][tick]
    overhead = np.where(iters > 0, a["decode_wait_s"][tick] + tau / 2.0, 0.0)
    e2e = ttft + overhead + iters * tau
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(iters > 0, tau + overhead / iters, np.nan)
    return ttft, tpot, e2e


def metrics(
    a: dict[str, FloatArray],
    ends_s: FloatArray,
    tick_s: float,
    rate: FloatArray,
    lengths: tuple[FloatArray, FloatArray],
    k: PoolConstants,
    cluster: ClusterSpec,
    slo: Slo,
    n_samples: int,
    seed: int,
) -> pd.Series:
    """The keys of :func:`pdopt.sim.compute_metrics` the fluid model can give (means weighted by
    arrivals; percentiles and attainment from sampled requests), plus ``prefill_queue_mean``
    and ``pool_moves`` is added by the caller."""
    weights = rate * tick_s
    total = float(weights.sum())
    out: dict[str, float] = {"requests": total, "finished": total, "rejected": 0.0}
    tpot, e2e = tpot_e2e(a, k)
    inputs_s = (
        cluster.workers[0].cost.prefill.request_time_s(lengths[0]) if total > 0 else np.zeros(1)
    )
    ttft_s, tpot_s, e2e_s = (
        _samples(a, weights, inputs_s, lengths[1], n_samples, seed)
        if total > 0
        else (np.full(1, np.nan),) * 3
    )
    for name, mean, sample in (
        ("ttft", a["ttft_s"], ttft_s), ("tpot", tpot, tpot_s), ("e2e", e2e, e2e_s),
    ):  # fmt: skip
        known = sample[np.isfinite(sample)]
        for q in (50, 90, 99):
            out[f"{name}_{'p'}{q}_s"] = float(np.percentile(known, q)) if len(known) else np.nan
        out[f"{name}_mean_s"] = float(np.sum(weights * mean) / total) if total else np.nan
    meets = (ttft_s <= slo.ttft_s) & (np.isnan(tpot_s) | (tpot_s <= slo.tpot_s))
    out["slo_attainment"] = float(meets.mean()) if total else np.nan
    last = int(np.flatnonzero(weights > 0)[-1]) if total else 0
    start = float(ends_s[0] - tick_s)
    makespan = float(max(ends_s[-1], ends_s[last] + e2e[last])) if total else 0.0
    span = makespan - start
    out["throughput_rps"] = total / span if span > 0 else np.nan
    out["goodput_rps"] = out["throughput_rps"] * out["slo_attainment"]
    out["output_tokens_per_s"] = out["throughput_rps"] * k.mean_output_tokens
    out["fragmentation_pct"] = 0.0  # no fragmentation in the fluid model (H_frag = 0)
    out["fragmentation_mean_pct"] = 0.0
    out["fragmentation_peak_pct"] = 0.0
    out["false_oom"] = 0.0
    out["preemptions"] = 0.0
    out["migrations"] = 0.0
    idle, peak = _power(cluster)
    p_busy, d_busy = busy_fractions(a)
    busy_s = float(np.sum(a["n_prefill"] * p_busy + a["n_decode"] * d_busy) * tick_s)
    energy = idle * len(cluster.workers) * span + (peak - idle) * busy_s
    tokens = total * k.mean_output_tokens
    out["energy_j"] = energy
    out["energy_per_output_token_j"] = energy / tokens if tokens > 0 else np.nan
    out["makespan_s"] = makespan
    window = ends_s <= ends_s[last] + tick_s
    out["prefill_queue_mean"] = float(np.mean(a["prefill_queue"][window]))
    return pd.Series(out, name="metrics")
