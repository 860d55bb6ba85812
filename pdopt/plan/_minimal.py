"""Minimal verified plans: after the size-simulate-correct loop meets the SLOs, try the plan's
smaller neighbours and keep the cheapest that still meets (issue 37, "minimal plans").

The MILP sizes on first-order capacities and the correction loop only grows a plan, so a plan
it verifies can hold a worker the simulation does not need (measured: 6 H100s recommended
where 5 met on the whole trace). A *neighbour* is the plan with one worker fewer in one of its
counts (one role × GPU type × TP degree: ``tp`` GPUs fewer), or one worker moved to the next
smaller TP degree of its GPU type, keeping at least one prefill and one decode worker. The
neighbours are checked cheapest first, each on every draw (a draw that misses settles it); the
first that meets replaces the plan and the search repeats from it, so the result has no
smaller neighbour that meets, and every neighbour tried is reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pdopt.plan._sizing import PdSizingPlan, WorkerCount
from pdopt.plan._workers import WorkerCapacity

MAX_TRIMS = 16
"""Neighbour steps at most (each one worker fewer): a bound on the simulations spent."""

ROLES = ("prefill", "decode")
"""Roles a simulated plan must keep at least one worker in."""


@dataclass(frozen=True, slots=True)
class NeighbourTrial:
    """One smaller neighbour checked: the plan, whether it met on every draw, and the draws it
    ran (it stops at the first that misses)."""

    plan: PdSizingPlan
    meets: bool
    draws_run: int
    removed: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(), "meets": self.meets, "draws_run": self.draws_run,
            "removed": self.removed,
        }  # fmt: skip


def with_counts(
    plan: PdSizingPlan, counts: Sequence[WorkerCount], capacities: Sequence[WorkerCapacity]
) -> PdSizingPlan:
    """``plan`` with other worker ``counts`` (zeros dropped): GPUs, cost and the pools'
    capacities recomputed as :func:`pdopt.plan.solve_pd_sizing` computes them."""
    by_key = {c.option.key: c for c in capacities}
    kept = tuple(c for c in counts if c.workers > 0)
    cost = sum(by_key[c.key].option.price_per_hour * c.workers for c in kept)
    p_cap = sum(by_key[c.key].prefill_capacity_rps(c.workers) for c in kept if c.role == "prefill")
    d_cap = sum(
        by_key[c.key].decode_rate_per_worker * c.workers for c in kept if c.role == "decode"
    )
    return dataclasses.replace(
        plan, counts=kept, n_gpus=sum(c.gpus for c in kept), cost_per_hour=float(cost),
        prefill_capacity_rps=float(p_cap), decode_capacity_rps=float(d_cap), binding=("trimmed",),
    )  # fmt: skip


def smaller_neighbours(
    plan: PdSizingPlan, capacities: Sequence[WorkerCapacity]
) -> list[tuple[PdSizingPlan, str]]:
    """The plans one step smaller than ``plan``, cheapest first, each with what changed: one
    worker fewer in one count, or one worker of a count at the next smaller TP degree of its
    GPU type (an option that holds the workload); at least one prefill and one decode worker
    stay."""
    out = []
    for i, count in enumerate(plan.counts):
        fewer = dataclasses.replace(count, workers=count.workers - 1)
        rest = [*plan.counts[:i], fewer, *plan.counts[i + 1 :]]
        if all(any(c.role == r and c.workers > 0 for c in rest) for r in ROLES):
            out.append(
                (with_counts(plan, rest, capacities), f"1 × {count.option_name} {count.role}")
            )
        narrower = _narrower(count, capacities)
        if narrower is not None:
            counts = _added(rest, dataclasses.replace(narrower, role=count.role, workers=1))
            text = f"1 × {count.option_name} {count.role} -> {narrower.option_name}"
            out.append((with_counts(plan, counts, capacities), text))
    return sorted(out, key=lambda pr: (pr[0].cost_per_hour, pr[0].n_gpus))


def _narrower(count: WorkerCount, capacities: Sequence[WorkerCapacity]) -> WorkerCount | None:
    """A worker of ``count``'s GPU type at the largest smaller TP degree among ``capacities``
    that holds the workload (same expert layout; dense at TP 1), or None."""
    found = [
        c.option
        for c in capacities
        if c.fits
        and c.option.gpu == count.gpu
        and c.option.tp < count.tp
        and (c.option.expert_parallel == count.expert_parallel or c.option.tp == 1)
    ]
    if not found:
        return None
    best = max(found, key=lambda o: o.tp)
    return WorkerCount(best.gpu, best.tp, count.role, 1, best.expert_parallel)


def _added(counts: Sequence[WorkerCount], extra: WorkerCount) -> list[WorkerCount]:
    """``counts`` with ``extra`` added to its own count (or appended)."""
    out = list(counts)
    for i, c in enumerate(out):
        if c.key == extra.key and c.role == extra.role:
            out[i] = dataclasses.replace(c, workers=c.workers + extra.workers)
            return out
    return [*out, extra]


def trim(
    plan: PdSizingPlan,
    capacities: Sequence[WorkerCapacity],
    meets_on_every_draw: Callable[[PdSizingPlan], tuple[bool, int, Any]],
) -> tuple[PdSizingPlan, Any, list[NeighbourTrial]]:
    """The smallest plan reached from ``plan`` by removing one worker at a time while the
    smaller plan meets (module docstring); ``meets_on_every_draw(plan)`` returns whether it
    meets, the draws it ran and what to keep of a plan that meets (its checks). Returns the
    final plan, the kept value of the last plan that met (None when ``plan`` itself stays) and
    every neighbour tried."""
    trials: list[NeighbourTrial] = []
    kept: Any = None
    for _ in range(MAX_TRIMS):
        for neighbour, removed in smaller_neighbours(plan, capacities):
            meets, ran, value = meets_on_every_draw(neighbour)
            trials.append(NeighbourTrial(neighbour, meets, ran, removed))
            if meets:
                plan, kept = neighbour, value
                break
        else:
            break
    return plan, kept, trials
