"""Fluid (pool-level) simulation of a P/D cluster with Phasor's Mixed pool, in steps of Δt.

The request-level simulator (:func:`pdopt.sim.simulate`) follows every request; this model
follows the *pools*: it is exact in nothing but runs an hour of a thousand-GPU cluster in well
under a second, so it screens configurations and policy thresholds before the discrete-event
simulator confirms the best (:mod:`pdopt.tune`).

Model (DESIGN.md "Scale"; per tick k of length Δt, λ_k the smoothed arrival rate):

* **Prefill pool** (n_p identical workers, service S = t0 + (α l² + β P_m l)/P_peak): a fluid
  work backlog ``b_{k+1} = max(0, b_k + λ_k Δt E[S] − n_p Δt)`` (overload, shocks) plus a
  pointwise-stationary queue at utilisation ρ_k = min(λ_k E[S]/n_p, 0.98): the Allen–Cunneen
  G/G/c mean wait W (:func:`pdopt.queueing.allen_cunneen`). The engine batches a worker's queue
  when it frees, so a waiting request starts earlier by the work of its batch-mates ahead and
  ends later by that of those behind; both are ``x = ρ j W_start`` with ``j = ρ^{1.5(n_p − 1)}``
  (exact for one worker, fitted to the engine for 1–8 workers). Hence, with W the FCFS wait,
  ``TTFT_k = b_k/n_p + (W − x) + E[S] + 2x`` and the queue ``λ_k (W − x) + b_k/E[S]`` requests.
* **Decode pool** (n_d workers): mean-field continuous batching per worker,
  ``B = v d0 / (1 − v (d1 + d2 c̄))`` with v the decode iterations asked per second per worker
  and c̄ the time-weighted mean context (:func:`pdopt.queueing.decode_load`), capped by
  ``max_running`` and the KV capacity; above the cap a fluid admission backlog drains at the
  saturated throughput. τ = d0 + d1 B + d2 B c̄; TPOT = τ + (transfer + admission wait + τ/2)/(o−1).
* **Freeness and flow control**: mean Φ_T = 1 − outstanding prefill work /(n_p P_peak T_SLO),
  mean Φ_S = 1 − KV in use / KV capacity (no fragmentation: H_frag = 0). Every tick the exact
  rule of the request-level Phasor policy, :func:`pdopt.freeness.flow_control` (θ_flow, T_cool),
  may move one Mixed-pool member; the move changes n_p and n_d from the next tick (no drain).

What it does not model: per-request order, fragmentation and migration, preemption, the drain of
a moved worker, per-link contention (the transfer time is the mean of one transfer alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from pdopt._validation import check_int_at_least, check_non_negative, check_positive
from pdopt.errors import ConfigError
from pdopt.sim._fluid_core import pool_constants
from pdopt.sim._fluid_flow import FlowParams, run_flow
from pdopt.sim._fluid_out import FLUID_TIMESERIES_COLUMNS, concat, metrics, timeseries
from pdopt.sim._result import EVENT_COLUMNS
from pdopt.sim._spec import ClusterSpec, Role, Slo
from pdopt.workload import LengthDistribution, RateSchedule, Workload

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "FLUID_TIMESERIES_COLUMNS",
    "FluidResult",
    "FluidWorkload",
    "simulate_fluid",
]


@dataclass(frozen=True, slots=True)
class FluidWorkload:
    """What the fluid model reads: an arrival rate per tick and a sample of request lengths.

    Parameters
    ----------
    rate_per_s : array of float, shape (n_ticks,)
        Mean arrival rate on tick ``k`` = ``[start_s + k·tick_s, start_s + (k+1)·tick_s)``.
    tick_s : float
        Δt, seconds.
    input_tokens, output_tokens : array of int, shape (m,)
        A sample of (input, output) length pairs: the length moments the pools use.
    start_s : float
        Time of the first tick's start, seconds.
    """

    rate_per_s: FloatArray
    tick_s: float
    input_tokens: FloatArray
    output_tokens: FloatArray
    start_s: float = 0.0

    def __post_init__(self) -> None:
        owner = "FluidWorkload"
        check_positive(self.tick_s, "tick_s", owner)
        check_non_negative(self.start_s, "start_s", owner)
        rate = np.asarray(self.rate_per_s, dtype=np.float64)
        if rate.ndim != 1 or not np.all(np.isfinite(rate)) or np.any(rate < 0):
            raise ConfigError("FluidWorkload: rate_per_s must be a 1-D array of finite rates >= 0")
        inputs = np.asarray(self.input_tokens, dtype=np.float64)
        outputs = np.asarray(self.output_tokens, dtype=np.float64)
        if inputs.shape != outputs.shape or inputs.ndim != 1 or inputs.size == 0:
            raise ConfigError("FluidWorkload: input_tokens and output_tokens must be equal, 1-D")
        if np.any(inputs < 1) or np.any(outputs < 1):
            raise ConfigError("FluidWorkload: token counts must be >= 1")
        object.__setattr__(self, "rate_per_s", rate)
        object.__setattr__(self, "input_tokens", inputs)
        object.__setattr__(self, "output_tokens", outputs)

    @classmethod
    def from_workload(
        cls, workload: Workload, tick_s: float = 0.05, *, rate_window_s: float = 2.0
    ) -> FluidWorkload:
        """Arrivals binned per tick and smoothed by a centred moving average of
        ``rate_window_s`` (mass kept at the edges); lengths are the workload's own."""
        check_positive(tick_s, "tick_s", "FluidWorkload.from_workload")
        check_non_negative(rate_window_s, "rate_window_s", "FluidWorkload.from_workload")
        if len(workload) == 0:
            raise ConfigError("FluidWorkload.from_workload: the workload has no requests")
        n_ticks = math.floor(float(workload.arrival_s[-1]) / tick_s) + 1
        bins = np.minimum((workload.arrival_s / tick_s).astype(np.int64), n_ticks - 1)
        counts = np.bincount(bins, minlength=n_ticks).astype(np.float64)
        width = max(1, round(rate_window_s / tick_s))
        smooth = _moving_average(counts, width)
        return cls(
            smooth / tick_s,
            tick_s,
            workload.input_tokens.astype(np.float64),
            workload.output_tokens.astype(np.float64),
        )

    @classmethod
    def from_schedule(
        cls,
        schedule: RateSchedule,
        input_lengths: LengthDistribution,
        output_lengths: LengthDistribution,
        tick_s: float = 0.05,
        *,
        n_length_samples: int = 4096,
        seed: int = 0,
    ) -> FluidWorkload:
        """The schedule's rate at each tick's midpoint; lengths sampled (``seed``) from the two
        distributions, ``n_length_samples`` pairs."""
        check_positive(tick_s, "tick_s", "FluidWorkload.from_schedule")
        n_ticks = math.ceil(schedule.end_s / tick_s)
        mids = (np.arange(n_ticks) + 0.5) * tick_s
        starts = np.asarray(schedule.start_s)
        idx = np.searchsorted(starts, mids, side="right") - 1
        rates = np.asarray(schedule.rate_per_s)[np.maximum(idx, 0)]
        rates = np.where((idx < 0) | (mids >= schedule.end_s), 0.0, rates)
        rng = np.random.default_rng(seed)
        inputs = input_lengths.sample(n_length_samples, rng)
        outputs = output_lengths.sample(n_length_samples, rng)
        return cls(rates, tick_s, inputs.astype(np.float64), outputs.astype(np.float64))


def _moving_average(counts: FloatArray, width: int) -> FloatArray:
    """Centred moving mean over ``width`` ticks, the window clipped at the edges, then rescaled so
    the total count is kept (NOTE: cumulative sums, O(n) whatever the width)."""
    n = len(counts)
    if width <= 1 or n <= 1:
        return counts
    half = min(width // 2, n)
    csum = np.concatenate(([0.0], np.cumsum(counts)))
    idx = np.arange(n)
    lo = np.maximum(idx - half, 0)
    hi = np.minimum(idx + half + 1, n)
    out: FloatArray = (csum[hi] - csum[lo]) / (hi - lo)
    total = float(out.sum())
    return out * (float(counts.sum()) / total) if total > 0 else out


@dataclass(frozen=True, slots=True)
class FluidResult:
    """The outcome of one fluid run.

    Attributes
    ----------
    timeseries : DataFrame
        Two rows per tick, pools ``prefill`` and ``decode`` (columns
        :data:`FLUID_TIMESERIES_COLUMNS`: the request-level ones, pool totals, plus ``workers``).
    events : DataFrame
        ``pool_move`` rows in the request-level format (:data:`pdopt.sim.EVENT_COLUMNS`).
    metrics_ : Series
        The :func:`pdopt.sim.compute_metrics` keys (means weighted by arrivals; percentiles and
        SLO attainment from sampled requests), plus ``prefill_queue_mean`` (time-average
        requests waiting for prefill, pool total, over the arrival window) and ``pool_moves``.
    """

    timeseries: pd.DataFrame
    events: pd.DataFrame
    metrics_: pd.Series
    slo: Slo
    tick_s: float
    makespan_s: float

    def metrics(self) -> pd.Series:
        """The mean metrics (a copy)."""
        return self.metrics_.copy()


def _check_cluster(cluster: ClusterSpec) -> None:
    if not isinstance(cluster, ClusterSpec):
        raise ConfigError(f"simulate_fluid needs a ClusterSpec; got {cluster!r}")
    first = cluster.workers[0]
    for w in cluster.workers:
        same = (w.cost, w.kv_capacity_blocks, w.max_running) == (
            first.cost,
            first.kv_capacity_blocks,
            first.max_running,
        )
        if not same:
            raise ConfigError(
                f"simulate_fluid models identical workers; {w.name!r} differs from "
                f"{first.name!r} (cost, KV capacity or max_running): simulate it with "
                "pdopt.sim.simulate"
            )
        if w.role is Role.MIXED:
            raise ConfigError(
                f"worker {w.name!r}: colocated (role 'mixed') workers are not modelled; give "
                "Mixed-pool members role 'prefill' or 'decode' with pool='mixed'"
            )


def simulate_fluid(
    driver: Workload | FluidWorkload,
    cluster: ClusterSpec,
    *,
    slo: Slo,
    tick_s: float = 0.05,
    theta_flow: float = 0.62,
    cool_s: float = 1.0,
    flow_control: bool = True,
    rate_window_s: float = 2.0,
    arrival_scv: float = 1.0,
    drain_s: float = 0.0,
    phi_ttft_slo_s: float | None = None,
    n_samples: int = 20000,
    seed: int = 0,
) -> FluidResult:
    """Run the fluid model of ``cluster`` on ``driver`` (see the module docstring).

    Parameters
    ----------
    driver : Workload or FluidWorkload
        A workload is binned per tick (:meth:`FluidWorkload.from_workload`).
    cluster : ClusterSpec
        Identical workers; those in pool ``"mixed"`` are the Mixed pool, at home in their role.
    slo : Slo
    tick_s : float
        Δt, seconds (a FluidWorkload brings its own, which must equal it).
    theta_flow, cool_s : float
        Phasor's θ_flow and T_cool (seconds) of the macro rule.
    flow_control : bool
        Apply the macro rule (only matters with a Mixed pool).
    rate_window_s, arrival_scv : float
        Rate smoothing window (workload input) and c_a² of arrivals in the stationary queue.
    drain_s : float
        Extra ticks of zero arrivals after the driver's last tick.
    phi_ttft_slo_s : float or None
        T_TTFT_SLO inside Φ_T (the Phasor policy's ``ttft_slo_s``); None: ``slo.ttft_s``.
    n_samples, seed : int
        Sampled requests for percentiles and attainment; same seed → identical result.

    Examples
    --------
    >>> from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
    >>> cost = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
    >>> from pdopt.workload import archetype_workload
    >>> wl = archetype_workload("production_mix", 20.0, duration_s=60.0, seed=1)
    >>> res = simulate_fluid(wl, ClusterSpec.build(cost, 4, 6), slo=Slo(1.0, 0.1))
    >>> bool(0.08 < res.metrics()["ttft_mean_s"] < 0.1)
    True
    """
    owner = "simulate_fluid"
    tick_s = check_positive(tick_s, "tick_s", owner)
    flow = FlowParams(
        check_positive(theta_flow, "theta_flow", owner),
        check_non_negative(cool_s, "cool_s", owner),
        bool(flow_control),
    )
    check_int_at_least(n_samples, 1, "n_samples", owner)
    check_int_at_least(seed, 0, "seed", owner)
    if not isinstance(slo, Slo):
        raise ConfigError(f"simulate_fluid needs slo=Slo(ttft_s, tpot_s); got {slo!r}")
    _check_cluster(cluster)
    if isinstance(driver, Workload):
        driver = FluidWorkload.from_workload(driver, tick_s, rate_window_s=rate_window_s)
    elif not isinstance(driver, FluidWorkload):
        raise ConfigError(f"simulate_fluid needs a Workload or FluidWorkload; got {driver!r}")
    elif not math.isclose(driver.tick_s, tick_s):
        raise ConfigError(f"the FluidWorkload has tick_s={driver.tick_s}, not {tick_s}")
    phi_slo = slo.ttft_s if phi_ttft_slo_s is None else phi_ttft_slo_s
    phi_slo = check_positive(phi_slo, "phi_ttft_slo_s", owner)
    extra = math.ceil(check_non_negative(drain_s, "drain_s", owner) / tick_s)
    rate = np.concatenate([driver.rate_per_s, np.zeros(extra)])
    k = pool_constants(cluster, driver.input_tokens, driver.output_tokens)
    segments, state = run_flow(rate, tick_s, driver.start_s, cluster, k, phi_slo, arrival_scv, flow)
    arrays = concat(segments)
    ends = driver.start_s + tick_s * np.arange(1, len(rate) + 1, dtype=np.float64)
    lengths = (driver.input_tokens, driver.output_tokens)
    mets = metrics(arrays, ends, tick_s, rate, lengths, k, cluster, slo, n_samples, seed)
    mets["pool_moves"] = float(len(state.events))
    events = pd.DataFrame(state.events, columns=list(EVENT_COLUMNS))
    ts = timeseries(arrays, ends, k, cluster)
    return FluidResult(ts, events, mets, slo, tick_s, float(mets["makespan_s"]))
