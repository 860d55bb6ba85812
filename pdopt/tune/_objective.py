"""What a study optimises: one or more metric targets, and constraints (e.g. a capacity floor).

Text form (CLI, config): targets ``"min:e2e_p99_s"``, ``"max:goodput_rps"``; constraints
``"slo_attainment>=0.9"``, ``"ttft_p99_s<=2"``. Metric names are those of
:func:`pdopt.sim.compute_metrics` (both fidelities give them).

A trial that breaks a constraint stays in the study (its values are kept) but is marked
infeasible through Optuna's ``constraints_func`` (violation > 0), so samplers steer away from it
and it never counts as the best or on the Pareto front.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from pdopt.errors import ConfigError

_DIRECTIONS = {"min": "minimize", "max": "maximize"}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=)\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True, slots=True)
class Target:
    """Optimise ``metric`` in ``direction`` (``"minimize"`` or ``"maximize"``)."""

    metric: str
    direction: str

    def __post_init__(self) -> None:
        if self.direction not in _DIRECTIONS.values():
            raise ConfigError(f"target {self.metric!r}: direction must be minimize or maximize")


@dataclass(frozen=True, slots=True)
class Constraint:
    """``metric >= bound`` (``op=">="``) or ``metric <= bound``."""

    metric: str
    op: str
    bound: float

    def violation(self, metrics: pd.Series) -> float:
        """How far the metric is on the wrong side (0 when met; NaN or missing breaks it)."""
        value = float(metrics.get(self.metric, math.nan))
        if not math.isfinite(value):
            return math.inf
        gap = self.bound - value if self.op == ">=" else value - self.bound
        return max(gap, 0.0)


@dataclass(frozen=True, slots=True)
class Objective:
    """Targets (one: single objective; several: Pareto front) and constraints."""

    targets: tuple[Target, ...]
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        object.__setattr__(self, "constraints", tuple(self.constraints))
        if not self.targets:
            raise ConfigError("objective: give at least one target, e.g. min:e2e_p99_s")

    @property
    def directions(self) -> list[str]:
        return [t.direction for t in self.targets]

    @property
    def is_multi(self) -> bool:
        return len(self.targets) > 1

    def values(self, metrics: pd.Series) -> list[float]:
        """Target values of a run; a missing or NaN metric becomes the worst value (inf)."""
        out = []
        for t in self.targets:
            v = float(metrics.get(t.metric, math.nan))
            if not math.isfinite(v):
                v = math.inf if t.direction == "minimize" else -math.inf
            out.append(v)
        return out

    def violations(self, metrics: pd.Series) -> list[float]:
        return [c.violation(metrics) for c in self.constraints]

    @classmethod
    def parse(cls, targets: Sequence[str], constraints: Sequence[str] = ()) -> Objective:
        """From text (module docstring)."""
        return cls(
            tuple(parse_target(t) for t in targets),
            tuple(parse_constraint(c) for c in constraints),
        )


def parse_target(text: str) -> Target:
    """``"min:metric"`` or ``"max:metric"``."""
    way, sep, metric = text.partition(":")
    if not sep or way.strip() not in _DIRECTIONS or not metric.strip():
        raise ConfigError(f"target {text!r}: write min:METRIC or max:METRIC")
    return Target(metric.strip(), _DIRECTIONS[way.strip()])


def parse_constraint(text: str) -> Constraint:
    """``"metric>=bound"`` or ``"metric<=bound"``."""
    match = _CONSTRAINT.match(text)
    if not match:
        raise ConfigError(f"constraint {text!r}: write METRIC>=NUMBER or METRIC<=NUMBER")
    try:
        bound = float(match.group(3))
    except ValueError as exc:
        raise ConfigError(f"constraint {text!r}: {match.group(3)!r} is not a number") from exc
    return Constraint(match.group(1), match.group(2), bound)


P99_UNDER_CAPACITY_FLOOR = Objective(
    (Target("e2e_p99_s", "minimize"),), (Constraint("slo_attainment", ">=", 0.9),)
)
"""The default single objective: P99 E2E latency while at least 90% of requests meet the SLO."""

LATENCY_CAPACITY_OVERHEAD = Objective(
    (
        Target("e2e_p99_s", "minimize"),
        Target("goodput_rps", "maximize"),
        Target("migrations", "minimize"),
    )
)
"""The default multi-objective: P99 latency, SLO capacity (goodput) and migration overhead."""
