"""The fluid simulator's time loop: segments of fixed allocation cut by macro flow-control moves.

Between two moves the pools are computed for a chunk of ticks at once (vectorised); the exact
Phasor rule :func:`pdopt.freeness.flow_control` is then called only at ticks where a move is
possible at all: a pool is starved (``Φ_pool < θ_flow × Φ_other``) or a cooled promoted member
could go home without starving its pools. The first tick where the rule moves a member ends the
segment; the allocation changes from the next tick on (DESIGN.md "Control loop").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pdopt.cluster import ClusterSpec, Role
from pdopt.fluid._core import PoolConstants, Segment, run_segment, wait_tables
from pdopt.freeness import flow_control

FloatArray = npt.NDArray[np.float64]
CHUNK_TICKS = 400


@dataclass(slots=True)
class FlowState:
    """Mutable per-run state of the Mixed pool (owned by one run, never shared)."""

    names: list[str]
    homes: list[str]
    roles: list[str]
    moved_at_s: list[float]
    n_prefill: int
    n_decode: int
    events: list[tuple[float, str, str, int, str]] = field(default_factory=list)

    @classmethod
    def from_cluster(cls, cluster: ClusterSpec) -> FlowState:
        members = [w for w in cluster.workers if w.pool == "mixed"]
        roles = [str(w.role) for w in members]
        n_p = sum(1 for w in cluster.workers if w.role is Role.PREFILL)
        n_d = sum(1 for w in cluster.workers if w.role is Role.DECODE)
        nan = [math.nan] * len(members)
        return cls([w.name for w in members], list(roles), roles, nan, n_p, n_d)

    def apply(self, member: int, role: str, pool: str, now_s: float) -> None:
        old = self.roles[member]
        self.roles[member] = role
        self.moved_at_s[member] = now_s  # T_cool runs from every move
        self.n_prefill += (role == "prefill") - (old == "prefill")
        self.n_decode += (role == "decode") - (old == "decode")
        self.events.append(
            (now_s, "pool_move", self.names[member], -1, f"{old}->{role} pool={pool}")
        )

    def next_expiry_s(self, now_s: float, cool_s: float) -> float:
        later = [t + cool_s for t in self.moved_at_s if not math.isnan(t) and t + cool_s > now_s]
        return min(later, default=math.inf)


@dataclass(frozen=True, slots=True)
class FlowParams:
    """The macro rule's θ_flow, T_cool (seconds) and release ablation, as the Phasor policy runs
    it (:func:`pdopt.freeness.flow_control`)."""

    theta_flow: float
    cool_s: float
    release: bool = False


def _starved_kind(phi_p: FloatArray, phi_d: FloatArray, theta: float) -> npt.NDArray[np.int8]:
    """Vectorised screen: 1 prefill starved, 2 decode starved, 0 neither (ties as the rule)."""
    p_st = phi_p < theta * phi_d
    d_st = phi_d < theta * phi_p
    both = p_st & d_st
    kind = np.where(p_st, 1, np.where(d_st, 2, 0)).astype(np.int8)
    return np.where(both, np.where(phi_p <= phi_d, 1, 2), kind).astype(np.int8)


def _release_possible(seg: Segment, st: FlowState, theta: float) -> npt.NDArray[np.bool_]:
    """Ticks where some promoted member's pools would stay unstarved without it (a superset
    screen of the rule's return test: its cool-down is checked by the rule itself). The pools'
    means are projected as :func:`pdopt.freeness.flow_control` documents, load kept:
    1 − n(1 − Φ)/(n − 1) for the pool left, 1 − n(1 − Φ)/(n + 1) for the home pool."""
    out = np.zeros(len(seg.phi_prefill), dtype=bool)
    pairs = {
        (r, h)
        for r, h, t in zip(st.roles, st.homes, st.moved_at_s, strict=True)
        if not math.isnan(t) and r != h
    }
    sizes = {"prefill": st.n_prefill, "decode": st.n_decode}
    for role, home in pairs:
        if sizes.get(role, 0) < 2:
            continue
        means = {"prefill": seg.phi_prefill, "decode": seg.phi_decode}
        n_r = sizes[role]
        means[role] = 1.0 - n_r * (1.0 - means[role]) / (n_r - 1)
        if sizes.get(home, 0) > 0:
            n_h = sizes[home]
            means[home] = 1.0 - n_h * (1.0 - means[home]) / (n_h + 1)
        out |= _starved_kind(means["prefill"], means["decode"], theta) == 0
    return out


def _first_move(seg: Segment, st: FlowState, flow: FlowParams, t_end_s: FloatArray) -> int:
    """Index in ``seg`` of the first tick where the rule moves a member (applied), else -1."""
    kind = _starved_kind(seg.phi_prefill, seg.phi_decode, flow.theta_flow)
    cand = kind > 0
    if flow.release and any(not math.isnan(t) for t in st.moved_at_s):
        cand |= (kind == 0) & _release_possible(seg, st, flow.theta_flow)
    skip_kind, skip_until = -1, -math.inf
    for j in np.flatnonzero(cand):
        now = float(t_end_s[j])
        if kind[j] == skip_kind and kind[j] > 0 and now < skip_until:
            continue
        decision = flow_control(
            float(seg.phi_prefill[j]), float(seg.phi_decode[j]), st.roles, st.homes,
            st.moved_at_s, now, n_prefill=st.n_prefill, n_decode=st.n_decode,
            theta_flow=flow.theta_flow, cool_s=flow.cool_s, release=flow.release,
        )  # fmt: skip
        if decision.moves:
            st.apply(decision.member, decision.to_role, decision.to_pool, now)
            return int(j)
        # NOTE: with the same starved pool nothing can change before a cool-down ends.
        skip_kind, skip_until = int(kind[j]), st.next_expiry_s(now, flow.cool_s)
    return -1


def _cut(seg: Segment, stop: int) -> Segment:
    arrays = {
        name: getattr(seg, name)[:stop]
        for name in Segment.__slots__
        if name not in ("n_prefill", "n_decode")
    }
    return Segment(seg.n_prefill, seg.n_decode, **arrays)


def run_flow(
    rate: FloatArray,
    tick_s: float,
    start_s: float,
    cluster: ClusterSpec,
    k: PoolConstants,
    ttft_slo_s: float,
    arrival_scv: float,
    flow: FlowParams | None,
) -> tuple[list[Segment], FlowState]:
    """All ticks of ``rate``: the segments in time order and the final Mixed-pool state
    (``flow`` None: the Mixed pool stays as built)."""
    st = FlowState.from_cluster(cluster)
    # the prefill pool spans its own workers plus, with the macro rule, any Mixed-pool members
    own = st.n_prefill - st.roles.count("prefill")
    sizes = (
        range(own, own + len(st.names) + 1)
        if flow is not None
        else range(st.n_prefill, st.n_prefill + 1)
    )
    tables = wait_tables(sizes, k, arrival_scv)
    segments: list[Segment] = []
    state = (0.0, 0.0, 0.0, 0.0)
    ends = start_s + tick_s * np.arange(1, len(rate) + 1, dtype=np.float64)
    k0 = 0
    moved: float | None = None  # outstanding prefill work when the prefill pool's size changed
    while k0 < len(rate):
        k1 = min(len(rate), k0 + CHUNK_TICKS)
        n_p, n_d = st.n_prefill, st.n_decode
        seg = run_segment(rate[k0:k1], tick_s, n_p, n_d, state, k, tables[n_p], ttft_slo_s, moved)
        stop = _first_move(seg, st, flow, ends[k0:k1]) if flow is not None and st.names else -1
        if stop >= 0:
            seg = _cut(seg, stop + 1)
        segments.append(seg)
        state = (
            float(seg.prefill_backlog_s[-1]),
            float(seg.decode_backlog[-1]),
            float(seg.decode_inflow[-1]),
            float(seg.prefill_excess_s[-1]),
        )
        moved = float(seg.prefill_outstanding_s[-1]) if st.n_prefill != n_p else None
        k0 += len(seg.rho)
    return segments, st
