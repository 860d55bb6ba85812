"""The metric names a trial reports, and the check that a study's targets and constraints name
them (so ``min:e2e_p98_s`` is refused before any trial runs, with the closest valid names).

The names are not written down here: :func:`metric_names` runs each fidelity once on a
one-request workload and reads the keys of its metrics (:func:`pdopt.sim.compute_metrics` for
``"des"``, :meth:`pdopt.fluid.FluidResult.metrics` for ``"fluid"``) plus ``wall_s``, which
:func:`pdopt.tune.evaluate` adds. A metric the simulator gains is accepted at once.
"""

from __future__ import annotations

import difflib
import functools
from typing import TYPE_CHECKING

from pdopt._validation import check_one_of
from pdopt.errors import ConfigError
from pdopt.tune._objective import Objective

if TYPE_CHECKING:
    from pdopt.workload import Workload

ALL_NAMES_HINT = "pdopt.tune.metric_names() lists them"


@functools.cache
def metric_names(fidelity: str = "des") -> tuple[str, ...]:
    """The metrics a trial at ``fidelity`` (``"des"`` or ``"fluid"``) reports, in order.

    NOTE: one run of a one-request workload on a one-prefill, one-decode cluster (~0.1 s, once
    per process): the simulator is the one source of its metric names.

    Examples
    --------
    >>> "e2e_p99_s" in metric_names("des"), "e2e_p98_s" in metric_names("des")
    (True, False)
    """
    from pdopt.cluster import ClusterSpec, Slo
    from pdopt.costmodel import CostModel, DecodeModel, PrefillModel

    check_one_of(fidelity, ("fluid", "des"), "fidelity", "metric_names")
    cost = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))
    cluster = ClusterSpec.build(cost, 1, 1)
    slo = Slo(1.0, 0.1)
    if fidelity == "des":
        from pdopt.policies import make_policy
        from pdopt.sim import simulate

        keys = simulate(
            _one_request(), cluster, make_policy("least_loaded"), slo=slo, engine="python",
            record_timeseries=False,
        ).metrics().index  # fmt: skip
    else:
        from pdopt.fluid import simulate_fluid

        keys = simulate_fluid(_one_request(), cluster, None, slo=slo, n_samples=10).metrics().index
    return (*(str(k) for k in keys), "wall_s")


def _one_request() -> Workload:
    import numpy as np

    from pdopt.workload import Workload

    return Workload(np.array([0.0]), np.array([128]), np.array([8]), name="metric-names")


def closest_metrics(name: str, fidelity: str = "des") -> list[str]:
    """Up to three metric names of ``fidelity`` closest to ``name`` (:mod:`difflib`)."""
    return difflib.get_close_matches(name, metric_names(fidelity), n=3, cutoff=0.5)


def metric_problem(name: str, fidelity: str = "des") -> str | None:
    """None when a trial at ``fidelity`` reports ``name``; else what is wrong and what to write.

    Examples
    --------
    >>> metric_problem("e2e_p99_s") is None
    True
    >>> metric_problem("e2e_p98_s")
    "'e2e_p98_s' is not a metric of the des simulator; closest: e2e_p99_s, e2e_p90_s, e2e_p50_s"
    """
    if name in metric_names(fidelity):
        return None
    return f"{name!r} is not a metric of the {fidelity} simulator; {metric_hint(name, fidelity)}"


def metric_hint(name: str, fidelity: str = "des") -> str:
    """What to write instead of ``name``, a metric ``fidelity`` does not report: the closest
    names, or the DES fidelity for a metric only it reports."""
    if fidelity == "fluid" and name in metric_names("des"):
        return "only the des fidelity reports it (the fluid model has no such figure)"
    close = closest_metrics(name, fidelity)
    return f"closest: {', '.join(close)}" if close else ALL_NAMES_HINT


def check_objective(objective: Objective, fidelity: str = "des") -> Objective:
    """``objective`` when every target and constraint names a metric of ``fidelity``; else a
    :class:`ConfigError` naming the first that does not and the closest valid names."""
    for kind, metric in [
        *(("target", t.metric) for t in objective.targets),
        *(("constraint", c.metric) for c in objective.constraints),
    ]:
        problem = metric_problem(metric, fidelity)
        if problem is not None:
            raise ConfigError(f"objective {kind} {problem}")
    return objective
