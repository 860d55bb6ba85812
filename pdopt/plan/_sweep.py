"""A plan per value of one input (issue 37, deliver 5; ``pdopt plan --sweep``): the rows of GPUs,
cost and verdict against the swept value, each point the whole :func:`pdopt.plan.plan_deployment`
(a point with no plan is a row that says why).

:func:`sweep_deployment` takes the plan of one value as a callable, so the caller says what the
value changes (the command: ``--rate``, ``--ttft-slo``, ``--tpot-slo``, or ``price``, a factor on
every GPU type's price, :func:`scaled_prices`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdopt.errors import PdoptError
from pdopt.plan._deployment import DeploymentPlan

SWEEPABLE = ("rate", "ttft-slo", "tpot-slo", "price")
"""What ``pdopt plan --sweep`` varies (``price``: a factor on every GPU type's price)."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One swept value: its plan, or the error that stopped it (``error``)."""

    value: float
    result: DeploymentPlan | None
    error: str | None = None

    def row(self) -> dict[str, Any]:
        """The table row: GPUs, USD/h, USD per 1,000 requests and per million tokens of the
        recommended P/D plan (or the last tried), whether it meets, and the verdict."""
        row: dict[str, Any] = {"value": self.value, "meets": False, "gpus": None,
                               "cost_per_hour": None, "cost_per_1k_requests": None,
                               "usd_per_m_tokens": None, "verdict": None}  # fmt: skip
        if self.result is None:
            row["verdict"] = f"no plan: {self.error}"
            return row
        plan = {**self.result.plan.to_dict(), "tokens": self.result.tokens}
        verified = self.result.verified
        verdict = (
            "not verified (--no-sim): the queueing model's plan, unsimulated"
            if verified is None
            else verified.verdict()
        )
        row.update(
            meets=self.result.meets, gpus=plan["n_gpus"], cost_per_hour=plan["cost_per_hour"],
            cost_per_1k_requests=plan["cost_per_1k_requests"],
            usd_per_m_tokens=self.result.tokens.get("usd_per_m_tokens"), verdict=verdict,
            plan=plan,
        )  # fmt: skip
        return row


def sweep_deployment(
    plan_at: Callable[[float], DeploymentPlan], values: Sequence[float]
) -> list[SweepPoint]:
    """``plan_at(value)`` for each value; a value whose planning fails (a
    :class:`~pdopt.errors.PdoptError`: no plan within the limits, a refusal) is a point with
    the error's message."""
    points = []
    for value in values:
        try:
            points.append(SweepPoint(value, plan_at(value)))
        except PdoptError as exc:
            points.append(SweepPoint(value, None, str(exc)))
    return points


def scaled_prices(base: Mapping[str, float], factor: float) -> dict[str, float]:
    """Every GPU type's USD per GPU-hour times ``factor`` (the ``price`` sweep)."""
    return {gpu: price * factor for gpu, price in base.items()}
