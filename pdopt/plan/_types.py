"""Limits on the GPU types of one deployment (issue 37): at most ``k`` types in all, or one type
per role (every prefill worker on one type, every decode worker on one type).

The sizing MILP mixes types freely (it found H100 prefill with H200 and A100 decode). Rather
than add binaries to it, a limit is met by enumeration: each allowed assignment of GPU types to
roles (:func:`type_choices`; few, since a plan considers a handful of types) restricts the
capacities (:func:`restrict_roles`: an option outside a role's types has no capacity in that
role), the MILP sizes each, and the cheapest wins (:func:`cheapest_types`); the verified loop
then runs on that assignment.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pdopt.plan._demand import Demand
from pdopt.plan._pd import _solve, capacities_for
from pdopt.plan._sizing import PdSizingPlan
from pdopt.plan._solve import DEFAULT_TIME_LIMIT_S
from pdopt.plan._workers import WorkerCapacity, WorkerOption

RoleGpus = Mapping[str, Collection[str]]
"""GPU types allowed per role (``"prefill"``, ``"decode"``); a role not named allows any."""


def restrict_roles(
    capacities: Sequence[WorkerCapacity], role_gpus: RoleGpus | None
) -> tuple[WorkerCapacity, ...]:
    """``capacities`` with no prefill capacity on options whose GPU type ``role_gpus`` does not
    allow in prefill, and no decode capacity where it does not allow decode (a Mixed worker
    needs both, so it is allowed only where both roles are)."""
    if not role_gpus:
        return tuple(capacities)
    out = []
    for c in capacities:
        prefill_ok = c.option.gpu in role_gpus.get("prefill", (c.option.gpu,))
        decode_ok = c.option.gpu in role_gpus.get("decode", (c.option.gpu,))
        rates = c.prefill_rate_per_worker if prefill_ok else tuple(0.0 for _ in c.pool_sizes)
        decode = c.decode_rate_per_worker
        if not decode_ok and math.isfinite(decode):
            decode = 0.0
        out.append(dataclasses.replace(c, prefill_rate_per_worker=rates,
                                       decode_rate_per_worker=decode))  # fmt: skip
    return tuple(out)


def type_choices(
    types: Sequence[str], max_types: int | None, one_per_role: bool
) -> list[dict[str, frozenset[str]]]:
    """Every assignment of GPU types to roles the limits allow: with ``one_per_role`` one type
    for prefill and one for decode (the same one when ``max_types`` is 1); else each set of at
    most ``max_types`` types, shared by both roles."""
    types = list(dict.fromkeys(types))
    if one_per_role:
        return [
            {"prefill": frozenset({a}), "decode": frozenset({b})}
            for a, b in itertools.product(types, types)
            if max_types is None or max_types >= 2 or a == b
        ]
    k = len(types) if max_types is None else min(max_types, len(types))
    return [
        {"prefill": frozenset(s), "decode": frozenset(s)}
        for n in range(1, k + 1)
        for s in itertools.combinations(types, n)
    ]


@dataclass(frozen=True, slots=True)
class TypeChoice:
    """The assignment the MILP prices cheapest (``role_gpus``) and what every one cost
    (``tried``: a readable assignment and its USD/h, None when it has no plan)."""

    role_gpus: dict[str, frozenset[str]]
    plan: PdSizingPlan
    tried: tuple[tuple[str, float | None], ...]


def describe_roles(role_gpus: RoleGpus) -> str:
    p, d = sorted(role_gpus["prefill"]), sorted(role_gpus["decode"])
    if p == d:
        return "+".join(p)
    return f"prefill {'+'.join(p)}, decode {'+'.join(d)}"


def cheapest_types(
    demand: Demand,
    options: Sequence[WorkerOption],
    choices: Sequence[dict[str, frozenset[str]]],
    *,
    inventory: Mapping[str, int] | None = None,
    max_gpus: int | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> TypeChoice | None:
    """The cheapest of ``choices`` by the sizing MILP (None when none has a plan)."""
    caps = capacities_for(options, demand, max_gpus, inventory)
    best: tuple[float, dict[str, frozenset[str]], PdSizingPlan] | None = None
    tried: list[tuple[str, float | None]] = []
    for choice in choices:
        plan = _solve(restrict_roles(caps, choice), demand, inventory, max_gpus, "min_cost",
                      None, time_limit_s)  # fmt: skip
        cost = plan.cost_per_hour if plan.is_ok else None
        tried.append((describe_roles(choice), cost))
        if cost is not None and (best is None or cost < best[0]):
            best = (cost, choice, plan)
    return None if best is None else TypeChoice(best[1], best[2], tuple(tried))
