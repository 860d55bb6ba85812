"""Phasor's control tick, compiled (:meth:`pdopt.policies.phasor.Phasor.on_tick`): every Δt,
on the first engine tick at or after it, the macro loop (``flow_actions``) moves at most one
Mixed-pool member (:func:`pdopt.sim._compiled._freeness.flow_decision` on the pools' mean Φ,
:func:`pdopt.sim._compiled._pools.move_worker`). A member promoted from decode to prefill
drains its running decodes in place (``W_DRAINING``; its drain time counts in its Φ_T).

Runs here without migrations only (``Phasor.compiled_tick`` says when): ``defrag=False``, and
``evacuate=False`` or no Mixed pool; the meso loop and the evacuation need the engine's
``Migrate``, which only the Python engine runs.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pdopt.sim._compiled._freeness import flow_decision
from pdopt.sim._compiled._phasor import EPS, pairwise_sum, spatial_phi, temporal_phi
from pdopt.sim._compiled._pools import move_worker
from pdopt.sim._compiled._state import (
    G_N_DECODE,
    G_N_PREFILL,
    K_COOL,
    K_DELTA_T,
    K_MIXED_POOL,
    K_NEXT_ACT,
    K_RELEASE,
    K_THETA_FLOW,
    ROLE_DECODE,
    ROLE_PREFILL,
    V_MOVED_AT,
    W_DRAINING,
    W_HOME_DECODE,
    W_IS_DECODE,
    W_MEMBER,
)


@njit(cache=True)
def phasor_tick(s, log, now):
    """Phasor.on_tick at ``now``: nothing before the next Δt; then the macro loop."""
    k = s.tick_f
    if now + EPS < k[K_NEXT_ACT]:
        return
    delta_t = k[K_DELTA_T]
    k[K_NEXT_ACT] = (math.floor((now + EPS) / delta_t) + 1) * delta_t
    if k[K_MIXED_POOL] != 0.0:
        _flow(s, log, now)


@njit(cache=True)
def _flow(s, log, now):
    """Phasor.flow_actions: at most one member moves, judged on the mean Φ_T of the prefill
    workers and the mean Φ_S of the decode workers."""
    wi, wf, k = s.wi, s.wf, s.tick_f
    members = np.flatnonzero(wi[:, W_MEMBER])
    n_p, n_d = s.g[G_N_PREFILL], s.g[G_N_DECODE]
    if not len(members) or n_p == 0 or n_d == 0:
        return
    phi = s.phi
    for i in range(n_p):
        phi[i] = temporal_phi(s, s.prefill_idx[i], now)
    mean_p = pairwise_sum(phi, 0, n_p) / n_p
    for i in range(n_d):
        phi[i] = spatial_phi(s, s.decode_idx[i], now)
    mean_d = pairwise_sum(phi, 0, n_d) / n_d
    roles = wi[members, W_IS_DECODE]
    homes = wi[members, W_HOME_DECODE]
    moved_at = wf[members, V_MOVED_AT]
    member, to_role, to_pool = flow_decision(
        mean_p, mean_d, roles, homes, moved_at, len(members), now, n_p, n_d,
        k[K_THETA_FLOW], k[K_COOL], k[K_RELEASE] != 0.0,
    )  # fmt: skip
    if member < 0:
        return
    w = members[member]
    wf[w, V_MOVED_AT] = now  # T_cool runs from every move
    if wi[w, W_IS_DECODE] == ROLE_DECODE and to_role == ROLE_PREFILL:
        wi[w, W_DRAINING] = 1
    elif to_role != ROLE_PREFILL:
        wi[w, W_DRAINING] = 0
    move_worker(s, log, w, to_role, to_pool, now)
