"""Phasor's macro flow control: which Mixed-pool node moves to which pool (DESIGN.md "Control
loop"; Phasor §"Macro: pool flow").

Every Δt the controller compares the mean Φ of the prefill pool (Φ_T) and of the decode pool
(Φ_S). A pool is *starved* when its mean Φ falls below ``theta_flow ×`` the other's. A starved
pool receives one Mixed-pool node per tick (Phasor Alg. 1 lines 12–17); a node keeps a role it
was moved to for at least ``cool_s`` (T_cool, App. B.5), whether it was promoted or went home.
Only θ_flow's hysteresis and T_cool govern moves, as in the paper: a member promoted away from
its home role goes back only when its home pool is starved in turn (a promotion back, reported
as ``"return"``).

``release=True`` adds a rule the paper does not have (earlier pdopt default, kept as an ablation):
a cooled promoted member also goes home once the pools would stay unstarved without it. Under a
burst that rule makes members flap (promote, release, promote again), because a pool that just
received help looks unstarved.

The rule is a pure function of numbers so that the request-level policy
(:mod:`pdopt.policies.phasor`) and the fluid simulator run exactly the same decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdopt._validation import check_non_negative, check_positive, param_error

PREFILL = "prefill"
DECODE = "decode"
MIXED_POOL = "mixed"
_ROLES = ("prefill", "decode", "mixed")


@dataclass(frozen=True, slots=True)
class FlowDecision:
    """One macro decision per tick.

    Attributes
    ----------
    member : int
        Index into the Mixed-pool member sequences given to :func:`flow_control`; -1 when
        nothing moves.
    to_role : str
        The member's new role (``"prefill"``, ``"decode"``, or its home role on a return).
    to_pool : str
        ``"prefill"`` or ``"decode"`` on a promotion, ``"mixed"`` when it goes home.
    reason : str
        ``"promote"``, ``"return"`` or ``"none"``.
    """

    member: int = -1
    to_role: str = ""
    to_pool: str = ""
    reason: str = "none"

    @property
    def moves(self) -> bool:
        """True when a member moves."""
        return self.member >= 0


NO_MOVE = FlowDecision()


def starved_pool(mean_phi_prefill: float, mean_phi_decode: float, theta_flow: float) -> str:
    """``"prefill"``, ``"decode"`` or ``""``: the pool whose mean Φ < ``theta_flow`` × the other's.

    With both means negative both tests can hold; the pool with the smaller Φ is the starved one.

    >>> starved_pool(0.2, 0.9, 0.62), starved_pool(0.9, 0.5, 0.62), starved_pool(0.8, 0.9, 0.62)
    ('prefill', 'decode', '')
    """
    p, d = float(mean_phi_prefill), float(mean_phi_decode)
    p_starved = p < theta_flow * d
    d_starved = d < theta_flow * p
    if p_starved and d_starved:
        return PREFILL if p <= d else DECODE
    if p_starved:
        return PREFILL
    if d_starved:
        return DECODE
    return ""


def _mean_without(mean_phi: float, n: int) -> float:
    """Mean Φ of a pool of ``n`` once one worker leaves, its load (Σ 1 − Φ) kept."""
    return 1.0 - n * (1.0 - mean_phi) / (n - 1)


def _mean_with(mean_phi: float, n: int) -> float:
    """Mean Φ of a pool of ``n`` once an idle worker joins, its load (Σ 1 − Φ) kept."""
    return 1.0 - n * (1.0 - mean_phi) / (n + 1)


def _check(roles: Sequence[str], homes: Sequence[str], moved_at_s: Sequence[float]) -> None:
    owner = "flow_control"
    if not len(roles) == len(homes) == len(moved_at_s):
        raise param_error(
            "member_roles", owner, "as long as member_home_roles and moved_at_s", roles
        )
    for name, values in (("member_roles", roles), ("member_home_roles", homes)):
        if any(v not in _ROLES for v in values):
            raise param_error(name, owner, f"a sequence of {list(_ROLES)}", values)


def _cooled(moved_at: float, now_s: float, cool_s: float) -> bool:
    return math.isnan(moved_at) or now_s - moved_at >= cool_s


def _promotion(
    starved: str,
    roles: Sequence[str],
    homes: Sequence[str],
    moved_at_s: Sequence[float],
    now_s: float,
    cool_s: float,
    pool_sizes: dict[str, int],
) -> FlowDecision:
    """Move one member not serving ``starved`` into it: members at home first, then members whose
    cool-down ended in the other pool; never the last worker of a pool."""
    at_home = [i for i, (r, h) in enumerate(zip(roles, homes, strict=True)) if r == h]
    away = [i for i, (r, h) in enumerate(zip(roles, homes, strict=True)) if r != h]
    for i in at_home + away:
        role = roles[i]
        if role == starved or not _cooled(moved_at_s[i], now_s, cool_s):
            continue
        if role in pool_sizes and pool_sizes[role] < 2:
            continue
        if homes[i] == starved:
            return FlowDecision(i, starved, MIXED_POOL, "return")
        return FlowDecision(i, starved, starved, "promote")
    return NO_MOVE


def _release(
    mean_phi: dict[str, float],
    roles: Sequence[str],
    homes: Sequence[str],
    moved_at_s: Sequence[float],
    now_s: float,
    theta_flow: float,
    cool_s: float,
    pool_sizes: dict[str, int],
) -> FlowDecision:
    """Send home the first cooled promoted member whose pool stays unstarved without it."""
    for i, t in enumerate(moved_at_s):
        if not _cooled(t, now_s, cool_s):
            continue
        role, home = roles[i], homes[i]
        if role == home or role not in pool_sizes or pool_sizes[role] < 2:
            continue
        projected = dict(mean_phi)
        projected[role] = _mean_without(mean_phi[role], pool_sizes[role])
        if home in pool_sizes and pool_sizes[home] > 0:
            projected[home] = _mean_with(mean_phi[home], pool_sizes[home])
        if not starved_pool(projected[PREFILL], projected[DECODE], theta_flow):
            return FlowDecision(i, home, MIXED_POOL, "return")
    return NO_MOVE


def flow_control(
    mean_phi_prefill: float,
    mean_phi_decode: float,
    member_roles: Sequence[str],
    member_home_roles: Sequence[str],
    moved_at_s: Sequence[float],
    now_s: float,
    *,
    n_prefill: int,
    n_decode: int,
    theta_flow: float = 0.62,
    cool_s: float = 1.0,
    release: bool = False,
) -> FlowDecision:
    """Phasor's macro rule for one tick: at most one Mixed-pool node moves.

    Parameters
    ----------
    mean_phi_prefill, mean_phi_decode : float
        Mean Φ_T over the workers now serving prefill, mean Φ_S over those serving decode.
    member_roles : sequence of str
        Current role of each Mixed-pool member (``"prefill"``, ``"decode"`` or ``"mixed"``).
    member_home_roles : sequence of str
        The role each member has while it sits in the Mixed pool.
    moved_at_s : sequence of float
        When each member last moved (a promotion or a return), seconds; NaN if it never moved.
        T_cool runs from every move, so a member that just went home is not sent out again
        before T_cool either (no move of a member follows its previous one within T_cool).
    now_s : float
        Current time, seconds.
    n_prefill, n_decode : int
        Workers now serving prefill / decode (Mixed members included); a pool never loses its
        last worker, and a return is judged on the pools' projected means without the member.
    theta_flow : float
        Starvation ratio θ_flow (Phasor's V100 value 0.62).
    cool_s : float
        T_cool, seconds: a moved member keeps its role at least this long (default 20·Δt with
        Δt = 50 ms).
    release : bool
        Also send a cooled member home when neither pool is starved and both would stay so
        without it (not in the paper; see the module docstring).

    Returns
    -------
    FlowDecision
        A promotion into the starved pool (members at home first, then cooled members of the
        other pool; lowest index first); with ``release``, else a return of a cooled promoted
        member whose pools stay unstarved without it (projected with the pools' load kept);
        else no move.

    Examples
    --------
    >>> flow_control(0.1, 0.9, ["decode"], ["decode"], [float("nan")], 0.0, n_prefill=2,
    ...              n_decode=3)
    FlowDecision(member=0, to_role='prefill', to_pool='prefill', reason='promote')
    >>> flow_control(0.9, 0.9, ["prefill"], ["decode"], [0.0], 2.0, n_prefill=3, n_decode=2)
    FlowDecision(member=-1, to_role='', to_pool='', reason='none')
    >>> flow_control(0.9, 0.9, ["prefill"], ["decode"], [0.0], 2.0, n_prefill=3, n_decode=2,
    ...              release=True)
    FlowDecision(member=0, to_role='decode', to_pool='mixed', reason='return')
    """
    owner = "flow_control"
    _check(member_roles, member_home_roles, moved_at_s)
    theta = check_positive(theta_flow, "theta_flow", owner)
    cool = check_non_negative(cool_s, "cool_s", owner)
    sizes = {PREFILL: int(n_prefill), DECODE: int(n_decode)}
    means = {PREFILL: float(mean_phi_prefill), DECODE: float(mean_phi_decode)}
    if not all(math.isfinite(v) for v in means.values()):
        raise param_error("mean_phi_prefill", owner, "finite (with mean_phi_decode)", means)
    starved = starved_pool(means[PREFILL], means[DECODE], theta)
    times = [float(t) for t in moved_at_s]
    if starved:
        return _promotion(starved, member_roles, member_home_roles, times, now_s, cool, sizes)
    if not release:
        return NO_MOVE
    return _release(means, member_roles, member_home_roles, times, now_s, theta, cool, sizes)
