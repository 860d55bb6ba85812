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
  When the stationary queue falls (a worker joins, the rate drops), the requests already waiting
  stay: the outstanding work falls only at the pool's spare capacity, and the excess ``e_k``
  above the stationary level counts like the backlog (``b_k + e_k`` in TTFT, queue and Φ_T;
  :func:`pdopt.fluid._core.drain_excess`), so Φ_T does not jump up when a member joins.
* **Decode pool** (n_d workers): mean-field continuous batching per worker,
  ``B = v d0 / (1 − v (d1 + d2 c̄))`` with v the decode iterations asked per second per worker
  and c̄ the time-weighted mean context (:func:`pdopt.queueing.decode_load`), capped by
  ``max_running`` and the KV capacity; above the cap a fluid admission backlog drains at the
  saturated throughput. τ = d0 + d1 B + d2 B c̄; TPOT = τ + (transfer + admission wait + τ/2)/(o−1).
* **Freeness and flow control**: mean Φ_T = 1 − outstanding prefill work /(n_p P_peak T_SLO),
  mean Φ_S = 1 − KV in use / KV capacity (no fragmentation: H_frag = 0). Every tick the exact
  rule of the request-level Phasor policy, :func:`pdopt.freeness.flow_control`, may move one
  Mixed-pool member; the move changes n_p and n_d from the next tick (no drain). θ_flow, T_cool,
  T_TTFT_SLO and whether the rule runs are the policy's own (:meth:`pdopt.policies.Phasor.settings`
  for the run's SLO and tick), so the two simulators read one set of thresholds.

What it does not model: per-request order, fragmentation and migration, preemption, the drain of
a moved worker, per-link contention (the transfer time is the mean of one transfer alone).

It shares only the cluster and SLO specs (:mod:`pdopt.sim`'s ``ClusterSpec``, ``Slo``) and the
result column names with the request-level simulator; importing it does not load the event
engine.
"""

from pdopt.fluid._out import FLUID_TIMESERIES_COLUMNS
from pdopt.fluid._simulate import FluidResult, simulate_fluid
from pdopt.fluid._workload import FluidWorkload

__all__ = [
    "FLUID_TIMESERIES_COLUMNS",
    "FluidResult",
    "FluidWorkload",
    "simulate_fluid",
]
