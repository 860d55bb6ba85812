"""What a tuning trial runs: a scenario (workload, cluster, SLO, policy) evaluated at a fidelity.

Fidelities:

* ``"fluid"``: :func:`pdopt.fluid.simulate_fluid` (pool level, fast) with the policy built from
  the flags; it reads Phasor's macro settings (:meth:`pdopt.policies.Phasor.settings`:
  ``theta_flow``, ``cool_s``, ``ttft_slo_s``, ``mixed_pool``) and ticks every ``delta_t_s``; it
  has no fragmentation, so ``theta_frag`` and the other request-level flags do not change its
  result. Other policies run on static pools.
* ``"des"``: :func:`pdopt.sim.simulate` with ``make_policy(policy, **flags)``; the engine tick is
  ``delta_t_s`` when the policy takes one (so a 20 ms Δt really acts every 20 ms).

``alpha_scale`` is not a policy flag: it multiplies α (the quadratic attention term of the
prefill cost model, DESIGN.md "Cost model") of every worker, i.e. the true prefill cost of long
prompts — the "α × 0.5 / × 2" rows of the sensitivity study.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from pdopt._validation import check_fraction, check_int_at_least, check_one_of, check_positive
from pdopt.errors import ConfigError
from pdopt.sim import ClusterSpec, Slo
from pdopt.workload import Workload

FIDELITIES = ("fluid", "des")
_FLUID_FLAGS = ("theta_flow", "cool_s", "delta_t_s", "ttft_slo_s", "mixed_pool")


@dataclass(frozen=True, slots=True)
class TuneScenario:
    """The fixed inputs of every trial.

    Parameters
    ----------
    workload : Workload
    cluster : ClusterSpec
    slo : Slo
    policy : str
        A registered policy name (:func:`pdopt.policies.available_policies`).
    policy_flags : mapping
        Flags every trial passes to the policy; tuned parameters override them.
    tick_s : float
        Engine tick and fluid Δt when no ``delta_t_s`` is tuned or fixed, seconds.
    seed : int
    """

    workload: Workload
    cluster: ClusterSpec
    slo: Slo
    policy: str = "phasor"
    policy_flags: Mapping[str, Any] = field(default_factory=dict)
    tick_s: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        owner = "TuneScenario"
        if not isinstance(self.workload, Workload) or len(self.workload) == 0:
            raise ConfigError("TuneScenario needs a non-empty open-loop Workload")
        if not isinstance(self.cluster, ClusterSpec):
            raise ConfigError(f"TuneScenario needs a ClusterSpec; got {self.cluster!r}")
        check_positive(self.tick_s, "tick_s", owner)
        check_int_at_least(self.seed, 0, "seed", owner)
        object.__setattr__(self, "policy_flags", dict(self.policy_flags))


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


def evaluate(
    scenario: TuneScenario,
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
    flags = {**scenario.policy_flags, **params}
    cluster = scaled_alpha(scenario.cluster, float(flags.pop("alpha_scale", 1.0)))
    workload = _window(scenario.workload, fraction)
    t0 = time.perf_counter()
    if fidelity == "fluid":
        metrics = _fluid(scenario, cluster, workload, flags)
    else:
        metrics = _des(scenario, cluster, workload, flags)
    metrics["wall_s"] = time.perf_counter() - t0
    return metrics


def _des(
    scenario: TuneScenario, cluster: ClusterSpec, workload: Workload, flags: dict[str, Any]
) -> pd.Series:
    from pdopt.policies import make_policy
    from pdopt.sim import simulate

    policy = make_policy(scenario.policy, **flags)
    tick = float(flags.get("delta_t_s", scenario.tick_s))
    res = simulate(
        workload,
        cluster,
        policy,
        slo=scenario.slo,
        tick_s=tick,
        seed=scenario.seed,
        record_timeseries=False,
    )
    return res.metrics()


def _fluid(
    scenario: TuneScenario, cluster: ClusterSpec, workload: Workload, flags: dict[str, Any]
) -> pd.Series:
    from pdopt.fluid import simulate_fluid
    from pdopt.policies import Phasor, make_policy

    policy = make_policy(scenario.policy, **flags)
    tick = float(flags.get("delta_t_s", scenario.tick_s))
    res = simulate_fluid(
        workload,
        cluster,
        policy if isinstance(policy, Phasor) else None,
        slo=scenario.slo,
        tick_s=tick,
        seed=scenario.seed,
        n_samples=5000,
    )
    return res.metrics()
