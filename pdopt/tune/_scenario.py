"""What a tuning trial runs: a :class:`pdopt.scenario.Scenario` (open-loop workload, cluster,
SLO, a registered policy name) with the trial's parameters as policy flags, at a fidelity.

Fidelities:

* ``"fluid"``: :func:`pdopt.fluid.simulate_fluid` (pool level, fast) with the policy built from
  the flags; it reads Phasor's macro settings for the run's SLO and tick
  (:meth:`pdopt.policies.Phasor.settings`: ``theta_flow``, ``cool_s``, ``ttft_slo_s``,
  ``mixed_pool``) and ticks every ``delta_t_s``; it has no fragmentation, so ``theta_frag`` and
  the other request-level flags do not change its result. Other policies run on static pools.
* ``"des"``: :meth:`Scenario.run` (request level); the engine tick is ``delta_t_s`` when the
  policy takes one (so a 20 ms Δt really acts every 20 ms; :func:`trial_scenario`).

``alpha_scale`` is not a policy flag: it multiplies α (the quadratic attention term of the
prefill cost model, DESIGN.md "Cost model") of every worker, i.e. the true prefill cost of long
prompts — the "α × 0.5 / × 2" rows of the sensitivity study.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import pandas as pd

from pdopt._validation import check_fraction, check_one_of, check_positive
from pdopt.cluster import ClusterSpec
from pdopt.errors import ConfigError
from pdopt.scenario import Scenario
from pdopt.workload import Workload

FIDELITIES = ("fluid", "des")
FLUID_READS = (
    "theta_flow", "cool_s", "ttft_slo_s", "mixed_pool", "release_balanced", "delta_t_s",
    "alpha_scale",
)  # fmt: skip
"""The parameters the fluid fidelity reads: Phasor's macro settings, Δt (its tick) and
``alpha_scale`` (the cluster). It has no fragmentation nor request-level routing."""


def inert_params(names: tuple[str, ...], policy: str, fidelity: str) -> tuple[str, ...]:
    """The parameters among ``names`` that ``fidelity`` cannot see for ``policy``: with
    ``"fluid"``, Phasor's flags outside :data:`FLUID_READS` (``theta_frag`` ...) and every other
    policy's flags (the fluid model runs it on static pools); none with ``"des"``."""
    if fidelity != "fluid":
        return ()
    reads = FLUID_READS if policy == "phasor" else ("alpha_scale",)
    return tuple(name for name in names if name not in reads)


def check_tunable(scenario: Scenario) -> Scenario:
    """``scenario`` if a study can run it: an open-loop workload and a registered policy name
    (trials pass their parameters as the policy's flags)."""
    if not isinstance(scenario.workload, Workload) or len(scenario.workload) == 0:
        raise ConfigError("tuning needs a scenario with a non-empty open-loop Workload")
    if not isinstance(scenario.policy, str):
        raise ConfigError(
            f"tuning needs a registered policy name, not a {scenario.policy_name} object "
            "(trials pass their parameters as its flags)"
        )
    return scenario


def scaled_alpha(cluster: ClusterSpec, scale: float) -> ClusterSpec:
    """``cluster`` with every worker's prefill α multiplied by ``scale``."""
    if scale == 1.0:
        return cluster
    check_positive(scale, "alpha_scale", "scaled_alpha")
    workers = []
    for w in cluster.workers:
        pm = w.cost.prefill
        prefill = dataclasses.replace(pm, alpha_flop_per_token2=pm.alpha_flop_per_token2 * scale)
        workers.append(dataclasses.replace(w, cost=dataclasses.replace(w.cost, prefill=prefill)))
    return dataclasses.replace(cluster, workers=tuple(workers))


def _window(workload: Workload, fraction: float) -> Workload:
    if fraction >= 1.0:
        return workload
    start = float(workload.arrival_s[0])
    end = start + fraction * (float(workload.arrival_s[-1]) - start)
    part = workload.window(start, end)
    return part if len(part) else workload[:1]


def trial_scenario(scenario: Scenario, params: Mapping[str, Any]) -> Scenario:
    """The scenario a trial with ``params`` runs (before any partial window): ``params`` as
    policy flags over the scenario's, ``alpha_scale`` applied to the cluster, and the engine tick
    ``tick_s`` = the ``delta_t_s`` flag when there is one — Δt is both the policy's control period
    and the engine tick (a 20 ms Δt acts every 20 ms). Running it with :meth:`Scenario.run` is
    the DES confirmation of those parameters; ``pdopt tune --best-config`` writes it for the best.
    """
    check_tunable(scenario)
    flags = {key: _plain(value) for key, value in {**scenario.policy_flags, **params}.items()}
    cluster = scaled_alpha(scenario.cluster, float(flags.pop("alpha_scale", 1.0)))
    return scenario.replace(
        cluster=cluster,
        policy_flags=flags,
        tick_s=float(flags.get("delta_t_s", scenario.tick_s)),
    )


def _plain(value: Any) -> Any:
    """A numpy scalar (a trials-table cell) as the Python value a flag or TOML file takes."""
    return value.item() if hasattr(value, "item") and callable(value.item) else value


def evaluate(
    scenario: Scenario,
    params: Mapping[str, Any],
    fidelity: str = "fluid",
    *,
    fraction: float = 1.0,
) -> pd.Series:
    """Metrics of one run with ``params`` (policy flags and ``alpha_scale``) at ``fidelity`` on
    the first ``fraction`` of the workload's time span; adds ``wall_s``."""
    owner = "evaluate"
    check_one_of(fidelity, FIDELITIES, "fidelity", owner)
    check_fraction(fraction, "fraction", owner)
    trial = trial_scenario(scenario, params)
    assert isinstance(trial.workload, Workload)  # check_tunable
    trial = trial.replace(workload=_window(trial.workload, fraction), record_timeseries=False)
    t0 = time.perf_counter()
    metrics = _fluid(trial) if fidelity == "fluid" else trial.run().metrics()
    metrics["wall_s"] = time.perf_counter() - t0
    return metrics


def _fluid(trial: Scenario) -> pd.Series:
    """The fluid model of ``trial``: Phasor's macro rule when its policy is Phasor (the fluid
    model reads the policy's settings), static pools otherwise."""
    from pdopt.fluid import simulate_fluid
    from pdopt.policies import Phasor

    policy = trial.make_policy()
    assert isinstance(trial.workload, Workload)  # check_tunable
    res = simulate_fluid(
        trial.workload,
        trial.cluster,
        policy if isinstance(policy, Phasor) else None,
        slo=trial.slo,
        tick_s=trial.tick_s,
        seed=trial.seed,
        n_samples=5000,
    )
    return res.metrics()
