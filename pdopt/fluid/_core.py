"""Pool-level arithmetic of the fluid simulator: request moments, stationary queue tables and one
segment of ticks at a fixed P/D allocation (see :mod:`pdopt.fluid` for the model).

Everything here is vectorised over ticks; a *segment* is a run of ticks over which the number of
prefill and decode workers does not change, so the only state carried between segments is the
two fluid backlogs (prefill work, decode admissions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdopt.cluster import ClusterSpec, Role, WorkerSpec
from pdopt.costmodel import DecodeModel
from pdopt.queueing import erlang_c

FloatArray = npt.NDArray[np.float64]

RHO_CAP = 0.98
"""Utilisation at which the stationary (pointwise) queue term stops growing; above it the fluid
backlog carries the excess (a stationary queue at rho -> 1 would be infinite)."""

_RHO_GRID = np.linspace(0.0, RHO_CAP, 99)

BATCH_JOIN_EXPONENT = 1.5
"""Empirical: a waiting request's batch gains later arrivals with probability rho^(1.5 (c − 1))
(1 for one worker, exact for gated batches; fitted on least-loaded routing over 1-8 workers)."""


@dataclass(frozen=True, slots=True)
class PoolConstants:
    """What the fluid model needs of the (homogeneous) workers and the request lengths.

    Times are seconds; ``service_*`` are one request prefilled alone (intercept included).
    """

    service_mean_s: float
    service_scv: float
    service_residual_s: float  # E[S^2] / (2 E[S]): mean work left in a busy worker's batch
    p_peak_flops: float
    mean_output_tokens: float
    decode_iterations: float  # E[o − 1]
    decode_share: float  # share of requests with o >= 2
    inv_iterations: float  # E[1 / (o − 1)] over requests with o >= 2
    context_tokens: float  # time-weighted mean context of a running decode request
    blocks_per_running: float
    decode: DecodeModel  # the decode worker's τ(B, C)
    max_running: float  # per decode worker, KV and max_running both respected
    transfer_s: float
    kv_capacity_blocks: int


def _first_of(cluster: ClusterSpec, roles: tuple[Role, ...]) -> WorkerSpec:
    for w in cluster.workers:
        if w.role in roles:
            return w
    return cluster.workers[0]


def _mean_transfer_tokens(cluster: ClusterSpec, input_tokens: FloatArray) -> float:
    """Mean prompt tokens a P→D transfer moves, as the engine counts them (the sliding layers
    of a :attr:`ClusterSpec.sliding_window` model send only their window)."""
    if cluster.sliding_window is None:
        return float(input_tokens.mean())
    return float(np.mean(cluster.sliding_window.held_tokens(input_tokens)))


def pool_constants(
    cluster: ClusterSpec, input_tokens: FloatArray, output_tokens: FloatArray
) -> PoolConstants:
    """Moments of the length sample under the workers' cost model (DESIGN.md "Cost model")."""
    pw = _first_of(cluster, (Role.PREFILL,))
    dw = _first_of(cluster, (Role.DECODE,))
    service = pw.cost.prefill.request_time_s(input_tokens)
    mean_s = float(service.mean())
    second = float(np.mean(service * service))
    iters = output_tokens - 1.0
    decoding = iters > 0
    kv_ctx = 0.0  # the same mean in KV-capacity tokens: sliding layers hold at most the window
    if decoding.any():
        mid = input_tokens + output_tokens / 2.0
        ctx = float(np.sum(iters * mid) / np.sum(iters))
        kv_ctx = ctx
        if cluster.sliding_window is not None:  # as the engines' blocks count it (kv_blocks)
            kv_ctx = float(np.sum(iters * cluster.sliding_window.held_tokens(mid)) / np.sum(iters))
        inv = float(np.mean(1.0 / iters[decoding]))
    else:
        ctx, inv = 0.0, 0.0
    bt = cluster.block_tokens
    blocks = kv_ctx / bt + 0.5
    by_kv = dw.kv_capacity_blocks / blocks if blocks > 0 else math.inf
    link = cluster.link
    transfer = (
        link.latency_s
        + _mean_transfer_tokens(cluster, input_tokens)
        * cluster.kv_bytes_per_token
        / link.bw_bytes_per_s
    )
    return PoolConstants(
        service_mean_s=mean_s,
        service_scv=max(second / (mean_s * mean_s) - 1.0, 0.0) if mean_s > 0 else 0.0,
        service_residual_s=second / (2.0 * mean_s) if mean_s > 0 else 0.0,
        p_peak_flops=pw.cost.prefill.p_peak_flops,
        mean_output_tokens=float(output_tokens.mean()),
        decode_iterations=float(iters.mean()),
        decode_share=float(decoding.mean()),
        inv_iterations=inv,
        context_tokens=ctx,
        blocks_per_running=blocks,
        decode=dw.cost.decode,
        max_running=float(min(dw.max_running, by_kv)),
        transfer_s=transfer,
        kv_capacity_blocks=dw.kv_capacity_blocks,
    )


@dataclass(frozen=True, slots=True)
class WaitTable:
    """Stationary prefill wait of ``servers`` workers on a utilisation grid (for np.interp)."""

    servers: int
    wait_s: FloatArray
    prob_wait: FloatArray


def wait_tables(sizes: range, k: PoolConstants, arrival_scv: float) -> dict[int, WaitTable]:
    """Allen–Cunneen G/G/c mean wait (:func:`pdopt.queueing.allen_cunneen`) and the Erlang-C
    wait probability (:func:`pdopt.queueing.erlang_c`) at each grid utilisation, for every
    prefill pool size in ``sizes`` (0 workers: zeros; the pool is then infinite-wait anyway).

    NOTE: all sizes in one vectorised Erlang C call, one recursion up to the largest size
    instead of one per size (a 1,000-GPU run visits ~100 sizes); each table is read by
    interpolation at every tick."""
    zeros = np.zeros_like(_RHO_GRID)
    tables = {c: WaitTable(c, zeros, zeros) for c in sizes}
    pools = [c for c in sizes if c > 0]
    if not pools or k.service_mean_s <= 0:
        return tables
    servers = np.asarray(pools, dtype=np.float64)[:, None]
    lam = _RHO_GRID[1:] * servers / k.service_mean_s
    probs = erlang_c(servers, lam * k.service_mean_s)
    variability = (arrival_scv + k.service_scv) / 2.0
    waits = probs / (servers / k.service_mean_s - lam) * variability
    for i, c in enumerate(pools):
        tables[c] = WaitTable(c, np.r_[0.0, waits[i]], np.r_[0.0, probs[i]])
    return tables


def lindley(arrivals: FloatArray, capacity: FloatArray, start: float) -> FloatArray:
    """Fluid backlog after each tick: ``b_{j+1} = max(0, b_j + a_j − c_j)`` from ``b_0 = start``.

    Closed form ``b_j = P_j − min(min_{m<=j} P_m, −start)`` with ``P`` the prefix sums of
    ``a − c`` (NOTE: one cumsum and one running minimum instead of a Python loop).
    """
    prefix = np.cumsum(arrivals - capacity)
    floor = np.minimum(np.minimum.accumulate(prefix), 0.0)
    out: FloatArray = prefix - np.minimum(floor, -start)
    return np.maximum(out, 0.0)


def drain_excess(
    work: FloatArray, capacity: FloatArray, backlog: FloatArray, backlog0: float, excess0: float
) -> FloatArray:
    """Outstanding prefill work above the pool's stationary level, worker-seconds per tick.

    The stationary queue of a larger pool is shorter, but the requests waiting when a worker
    joins do not vanish: the excess ``excess0`` (the outstanding work before the move minus the
    new stationary level) queues behind the fluid backlog ``backlog`` (:func:`lindley` from
    ``backlog0``) and drains with it at the pool's spare capacity, so the excess is the
    difference of the two backlogs' Lindley recursions from ``backlog0 + excess0`` and from
    ``backlog0``. It stays constant while the pool is overloaded and never grows.
    """
    if excess0 <= 0:
        return np.zeros_like(backlog)
    joint = lindley(work, capacity, backlog0 + excess0)
    return np.maximum(joint - backlog, 0.0)


@dataclass(frozen=True, slots=True)
class Segment:
    """Per-tick pool quantities over ticks ``[k0, k0 + len)`` at a fixed allocation."""

    n_prefill: int
    n_decode: int
    prefill_backlog_s: FloatArray  # worker-seconds of fluid backlog at the tick's end
    prefill_excess_s: FloatArray  # worker-seconds a move left above the stationary level
    decode_backlog: FloatArray  # requests waiting for decode admission (fluid)
    decode_inflow: FloatArray  # lagged prefill completions feeding decode, requests/s
    rho: FloatArray
    wait_s: FloatArray  # stationary wait until the batch starts (Allen–Cunneen − batch share)
    batch_extra_s: FloatArray  # x: batch-mates' work ahead (saved on the wait) = behind (added)
    fluid_wait_s: FloatArray
    ttft_s: FloatArray
    prob_wait: FloatArray
    prefill_queue: FloatArray
    prefill_outstanding_s: FloatArray
    completions_per_s: FloatArray
    running_decode: FloatArray  # per decode worker
    tau_s: FloatArray
    decode_wait_s: FloatArray
    phi_prefill: FloatArray
    phi_decode: FloatArray


def prefill_part(
    rate: FloatArray,
    tick_s: float,
    n_prefill: int,
    backlog0: float,
    excess0: float,
    k: PoolConstants,
    table: WaitTable,
    moved_outstanding_s: float | None = None,
) -> dict[str, FloatArray]:
    """Prefill pool over the segment: fluid backlog plus pointwise-stationary queue plus the
    excess a move left above it (:func:`drain_excess`). ``excess0``: the excess carried from
    the previous segment at the same allocation, worker-seconds; ``moved_outstanding_s``: the
    pool's outstanding work before the segment when its size changed there (it replaces
    ``excess0``: what exceeds the new stationary level)."""
    n = max(n_prefill, 0)
    work = rate * tick_s * k.service_mean_s
    cap = np.full_like(rate, n * tick_s)
    backlog = lindley(work, cap, backlog0)
    before = np.concatenate(([backlog0], backlog[:-1]))
    done_s = work + before - backlog  # worker-seconds served during the tick
    completions = done_s / (k.service_mean_s * tick_s) if k.service_mean_s > 0 else rate
    if n == 0:
        inf = np.full_like(rate, np.inf)
        return {
            "backlog": backlog, "excess": np.zeros_like(rate), "rho": inf, "wait": inf,
            "extra": np.zeros_like(rate),
            "fluid": inf, "pw": np.ones_like(rate), "queue": np.full_like(rate, np.nan),
            "outstanding": inf, "completions": np.zeros_like(rate),
        }  # fmt: skip
    rho = np.minimum(rate * k.service_mean_s / n, RHO_CAP)
    ac_wait = np.interp(rho, _RHO_GRID, table.wait_s)
    join = rho ** (BATCH_JOIN_EXPONENT * (n - 1)) * rho
    extra = join * ac_wait / (1.0 + join)  # x = rho·j·W_start with W_start = W_AC − x
    wait = ac_wait - extra
    stationary = backlog + rate * wait * k.service_mean_s + n * rho * k.service_residual_s
    if moved_outstanding_s is not None and math.isfinite(moved_outstanding_s):
        excess0 = max(moved_outstanding_s - float(stationary[0]), 0.0)
    excess = drain_excess(work, cap, backlog, backlog0, excess0)
    fluid = (backlog + excess) / n
    queue = rate * wait + (backlog + excess) / k.service_mean_s
    outstanding = stationary + excess
    return {
        "backlog": backlog, "excess": excess, "rho": rho, "wait": wait, "extra": extra,
        "fluid": fluid,
        "pw": np.interp(rho, _RHO_GRID, table.prob_wait), "queue": queue,
        "outstanding": outstanding, "completions": completions,
    }  # fmt: skip


def decode_time_constant_s(inflow: FloatArray, n_decode: int, k: PoolConstants) -> float:
    """Time a request spends decoding at the segment's mean inflow, seconds: the lag with which
    the decode population follows its inflow (Little's law needs that long to fill)."""
    iters = k.decode_iterations / k.decode_share if k.decode_share > 0 else 0.0
    if n_decode <= 0 or iters == 0 or not len(inflow):
        return 0.0
    per_worker = float(inflow.mean()) * k.decode_share / n_decode * iters
    batch = float(k.decode.mean_field_batch(per_worker, k.context_tokens))
    return iters * float(k.decode.mean_context_time_s(min(batch, k.max_running), k.context_tokens))


def smooth_inflow(inflow: FloatArray, tick_s: float, lag_s: float, start: float) -> FloatArray:
    """First-order lag ``y_k = a y_{k−1} + (1 − a) x_k``, ``a = exp(−Δt/lag)``, from ``y = start``.

    NOTE: scipy's lfilter runs the recursion in C (a constant coefficient per segment)."""
    if lag_s <= 0:
        return inflow
    from scipy.signal import lfilter

    a = math.exp(-tick_s / lag_s)
    out, _ = lfilter([1.0 - a], [1.0, -a], inflow, zi=[a * start])
    return np.asarray(out, dtype=np.float64)


def decode_part(
    inflow: FloatArray, tick_s: float, n_decode: int, backlog0: float, k: PoolConstants
) -> dict[str, FloatArray]:
    """Decode pool over the segment: Little's-law batch per worker (mean field, as
    :func:`pdopt.queueing.decode_load`) on the lagged inflow, capped by KV and ``max_running``;
    the excess waits in a fluid admission backlog drained at the saturated throughput."""
    n = max(n_decode, 0)
    visits = inflow * k.decode_share  # requests per second entering decode
    iters = k.decode_iterations / k.decode_share if k.decode_share > 0 else 0.0
    b_max = k.max_running
    tau_max = float(k.decode.mean_context_time_s(b_max, k.context_tokens))
    mu = b_max / (iters * tau_max) if iters > 0 and tau_max > 0 else math.inf
    if n == 0 or iters == 0:
        zero = np.zeros_like(inflow)
        fill = np.inf if (n == 0 and iters > 0) else 0.0
        return {"backlog": zero, "running": zero, "tau": zero + k.decode.d0_s,
                "wait": np.full_like(inflow, fill)}  # fmt: skip
    backlog = lindley(visits * tick_s, np.full_like(inflow, n * mu * tick_s), backlog0)
    per_worker = np.minimum(visits, n * mu) / n * iters  # decode iterations per s per worker
    batch = k.decode.mean_field_batch(per_worker, k.context_tokens)
    batch = np.where(backlog > 0, b_max, np.minimum(batch, b_max))
    tau = k.decode.mean_context_time_s(batch, k.context_tokens)
    return {"backlog": backlog, "running": batch, "tau": tau, "wait": backlog / (n * mu)}


def run_segment(
    rate: FloatArray,
    tick_s: float,
    n_prefill: int,
    n_decode: int,
    state: tuple[float, float, float, float],
    k: PoolConstants,
    table: WaitTable,
    ttft_slo_s: float,
    moved_outstanding_s: float | None = None,
) -> Segment:
    """Both pools over the ticks of ``rate`` at a fixed allocation, from ``state`` = (prefill
    backlog in worker-seconds, decode admission backlog in requests, lagged decode inflow,
    prefill excess in worker-seconds); ``moved_outstanding_s`` as :func:`prefill_part`."""
    p = prefill_part(rate, tick_s, n_prefill, state[0], state[3], k, table, moved_outstanding_s)
    lag = decode_time_constant_s(p["completions"], n_decode, k)
    inflow = smooth_inflow(p["completions"], tick_s, lag, state[2])
    d = decode_part(inflow, tick_s, n_decode, state[1], k)
    # TTFT = fluid wait + W_start + S + x: the batch ends after the batch-mates behind too
    ttft = p["fluid"] + p["wait"] + 2.0 * p["extra"] + k.service_mean_s
    with np.errstate(divide="ignore", invalid="ignore"):
        phi_p = 1.0 - p["outstanding"] / (max(n_prefill, 1) * ttft_slo_s)
    # waiting admissions hold no KV on the decode side (DES semantics), so only running counts
    used = d["running"] * k.blocks_per_running
    phi_d = 1.0 - used / k.kv_capacity_blocks
    return Segment(
        n_prefill, n_decode, p["backlog"], p["excess"], d["backlog"], inflow, p["rho"], p["wait"],
        p["extra"], p["fluid"], ttft, p["pw"], p["queue"], p["outstanding"], p["completions"],
        d["running"], d["tau"], d["wait"], phi_p, phi_d,
    )  # fmt: skip
