"""The fluid simulator's entry point: :func:`simulate_fluid` and its :class:`FluidResult` (the
model is described in :mod:`pdopt.fluid`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from pdopt._validation import check_int_at_least, check_non_negative, check_positive
from pdopt.cluster import ClusterSpec, Role, Slo
from pdopt.errors import ConfigError
from pdopt.fluid._core import pool_constants
from pdopt.fluid._flow import FlowParams, run_flow
from pdopt.fluid._out import concat, metrics, timeseries
from pdopt.fluid._workload import FluidWorkload
from pdopt.sim import EVENT_COLUMNS
from pdopt.workload import Workload

if TYPE_CHECKING:
    from pdopt.policies import Phasor


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


def _macro_rule(policy: Phasor | None, slo: Slo, tick_s: float) -> tuple[FlowParams | None, float]:
    """The macro rule of ``policy`` for this run (None: it does not run) and T_TTFT_SLO of Φ_T,
    seconds, from :meth:`pdopt.policies.Phasor.settings`."""
    if policy is None:
        return None, slo.ttft_s
    # NOTE: imported here, not at module level, so that importing pdopt.fluid does not load the
    # event engine (policies import it); whoever built ``policy`` has imported it already.
    from pdopt.policies import Phasor

    if not isinstance(policy, Phasor):
        raise ConfigError(
            f"simulate_fluid models Phasor's macro rule only; got {policy!r}: pass a "
            "pdopt.policies.Phasor, or None for static pools"
        )
    run = policy.settings(slo, tick_s)
    if not math.isclose(run.delta_t_s, tick_s):
        raise ConfigError(
            f"the fluid model applies the macro rule every tick: run it with tick_s = the "
            f"policy's delta_t_s ({run.delta_t_s}), not {tick_s}"
        )
    flow = FlowParams(run.theta_flow, run.cool_s, run.release_balanced) if run.mixed_pool else None
    return flow, run.ttft_slo_s


def simulate_fluid(
    driver: Workload | FluidWorkload,
    cluster: ClusterSpec,
    policy: Phasor | None,
    *,
    slo: Slo,
    tick_s: float = 0.05,
    rate_window_s: float = 2.0,
    arrival_scv: float = 1.0,
    drain_s: float = 0.0,
    n_samples: int = 20000,
    seed: int = 0,
) -> FluidResult:
    """Run the fluid model of ``cluster`` on ``driver`` (see :mod:`pdopt.fluid`).

    Parameters
    ----------
    driver : Workload or FluidWorkload
        A workload is binned per tick (:meth:`FluidWorkload.from_workload`).
    cluster : ClusterSpec
        Identical workers; those in pool ``"mixed"`` are the Mixed pool, at home in their role.
    policy : Phasor or None
        Whose macro rule moves Mixed-pool members: its :meth:`~pdopt.policies.Phasor.settings`
        for ``slo`` and ``tick_s`` give θ_flow, T_cool, T_TTFT_SLO (Φ_T's denominator) and
        whether the rule runs (``mixed_pool``); its Δt must be the tick. Its request-level
        flags (routing, θ_frag, defragmentation) do not apply. None: static pools.
    slo : Slo
    tick_s : float
        Δt, seconds (a FluidWorkload brings its own, which must equal it).
    rate_window_s, arrival_scv : float
        Rate smoothing window (workload input) and c_a² of arrivals in the stationary queue.
    drain_s : float
        Extra ticks of zero arrivals after the driver's last tick.
    n_samples, seed : int
        Sampled requests for percentiles and attainment; same seed → identical result.

    Examples
    --------
    >>> from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
    >>> from pdopt.policies import Phasor
    >>> cost = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
    >>> from pdopt.workload import archetype_workload
    >>> wl = archetype_workload("production_mix", 20.0, duration_s=60.0, seed=1)
    >>> res = simulate_fluid(wl, ClusterSpec.build(cost, 4, 6), Phasor(), slo=Slo(1.0, 0.1))
    >>> bool(0.08 < res.metrics()["ttft_mean_s"] < 0.1)
    True
    """
    owner = "simulate_fluid"
    tick_s = check_positive(tick_s, "tick_s", owner)
    check_int_at_least(n_samples, 1, "n_samples", owner)
    check_int_at_least(seed, 0, "seed", owner)
    if not isinstance(slo, Slo):
        raise ConfigError(f"simulate_fluid needs slo=Slo(ttft_s, tpot_s); got {slo!r}")
    _check_cluster(cluster)
    flow, phi_slo = _macro_rule(policy, slo, tick_s)
    if isinstance(driver, Workload):
        driver = FluidWorkload.from_workload(driver, tick_s, rate_window_s=rate_window_s)
    elif not isinstance(driver, FluidWorkload):
        raise ConfigError(f"simulate_fluid needs a Workload or FluidWorkload; got {driver!r}")
    elif not math.isclose(driver.tick_s, tick_s):
        raise ConfigError(f"the FluidWorkload has tick_s={driver.tick_s}, not {tick_s}")
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
