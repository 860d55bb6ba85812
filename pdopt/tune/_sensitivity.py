"""Sensitivity of a policy to its parameters, in the layout of the Phasor paper's Table 5.

Each row changes ONE parameter from the published defaults (θ_frag 0.168, θ_flow 0.62,
Δt 50 ms, α × 1; T_cool stays 20·Δt) and reports metrics normalised to the default run
(1.00 = no change; > 1 is higher):

============  ===========
parameter     settings
============  ===========
α (scale)     × 0.5, × 2
θ_frag        0.10, 0.35
Δt            20 ms, 200 ms
θ_flow        0.50, 0.80
============  ===========
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from pdopt._validation import check_one_of
from pdopt.parallel import DaskTarget, map_runs
from pdopt.scenario import Scenario
from pdopt.tune._scenario import FIDELITIES, evaluate

SENSITIVITY_DEFAULTS: dict[str, float] = {
    "theta_frag": 0.168,
    "theta_flow": 0.62,
    "delta_t_s": 0.05,
    "alpha_scale": 1.0,
}

TABLE5_ROWS: tuple[tuple[str, str, str, float], ...] = (
    ("α", "×0.5", "alpha_scale", 0.5),
    ("α", "×2", "alpha_scale", 2.0),
    ("θ_frag", "0.10", "theta_frag", 0.10),
    ("θ_frag", "0.35", "theta_frag", 0.35),
    ("Δt", "20 ms", "delta_t_s", 0.02),
    ("Δt", "200 ms", "delta_t_s", 0.2),
    ("θ_flow", "0.50", "theta_flow", 0.50),
    ("θ_flow", "0.80", "theta_flow", 0.80),
)
"""(parameter label, setting label, parameter name, value) of each Table 5 row."""

TABLE5_METRICS = ("goodput_rps", "slo_attainment", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s")


def sensitivity_table(
    scenario: Scenario,
    *,
    fidelity: str = "des",
    defaults: Mapping[str, float] | None = None,
    rows: Sequence[tuple[str, str, str, float]] = TABLE5_ROWS,
    metrics: Sequence[str] = TABLE5_METRICS,
    dask_scheduler: DaskTarget = None,
) -> pd.DataFrame:
    """One run per row plus the default run; columns ``parameter``, ``setting``, then each
    metric divided by its default value (``<metric>_norm``) and the raw values (``<metric>``).

    ``dask_scheduler`` runs the simulations on a Dask cluster (:func:`pdopt.parallel.map_runs`:
    ``tcp://…``, ``"local"`` or an open :class:`pdopt.parallel.Runs`; same results).
    """
    check_one_of(fidelity, FIDELITIES, "fidelity", "sensitivity_table")
    base = dict(SENSITIVITY_DEFAULTS if defaults is None else defaults)
    settings = [base] + [{**base, name: value} for _, _, name, value in rows]
    runs = _run_all(scenario, settings, fidelity, dask_scheduler)
    reference = runs[0]
    out = []
    labels = [("default", "default")] + [(p, s) for p, s, _, _ in rows]
    for (param, setting), m in zip(labels, runs, strict=True):
        row: dict[str, Any] = {"parameter": param, "setting": setting}
        for key in metrics:
            ref = float(reference.get(key, float("nan")))
            value = float(m.get(key, float("nan")))
            row[f"{key}_norm"] = value / ref if ref else float("nan")
        row.update({key: float(m.get(key, float("nan"))) for key in metrics})
        out.append(row)
    return pd.DataFrame(out)


def _run_all(
    scenario: Scenario,
    settings: list[dict[str, float]],
    fidelity: str,
    dask: DaskTarget,
) -> list[pd.Series]:
    return map_runs(_Evaluate(scenario, fidelity), settings, dask=dask)


@dataclass(frozen=True, slots=True)
class _Evaluate:
    """:func:`evaluate` of one setting on ``scenario`` at ``fidelity`` (a picklable value, so
    the settings can run on Dask workers)."""

    scenario: Scenario
    fidelity: str

    def __call__(self, setting: dict[str, float]) -> pd.Series:
        return evaluate(self.scenario, setting, self.fidelity)
