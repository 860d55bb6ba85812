"""Which simulator a study's trials run when the user leaves it to pdopt (``fidelity = "auto"``,
issue 38 item 2): the request-level DES wherever the study fits the time budget, the fluid model
for scale.

The DES sees everything the policy does (θ_frag's defragmentation included, which the fluid model
cannot: :func:`pdopt.tune.inert_params`), so it is the default whenever its estimated study time
fits the budget. The estimate is measured, not guessed: the configured scenario (the policy's
own flags) runs at DES fidelity on its first :data:`PROBE_REQUESTS` requests, on the engine the
trials run on (the compiled engine, loaded from numba's cache first, where it runs the scenario),
after a small untimed warm-up run (imports), and the time is scaled linearly to
the whole workload (a DES run's cost follows its requests and, through the control ticks, its
simulated time, which a prefix of the arrivals shrinks in the same proportion):

    study_s ≈ probe_s × n_requests / probe_requests × n_trials / parallel workers

The fluid model is chosen when that exceeds the budget, or never (DES) when the cluster has
colocated workers (the fluid model has none) or a target or constraint names a metric only the
DES reports; always when one names a metric only the fluid model reports.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pdopt._validation import check_int_at_least, check_positive
from pdopt.cluster import Role
from pdopt.scenario import Scenario
from pdopt.sim import load_compiled_engine
from pdopt.tune._scenario import check_tunable, evaluate
from pdopt.workload import Workload

AUTO = "auto"
"""The fidelity value that asks for :func:`choose_fidelity`."""

DEFAULT_BUDGET_S = 600.0
"""Wall-clock seconds a study may take at DES fidelity before ``"auto"`` screens with the fluid
model instead (``pdopt tune --budget-s``)."""

PROBE_REQUESTS = 1000
"""Requests of the timed DES probe run (the whole workload when it is smaller)."""

WARMUP_REQUESTS = 50
"""Requests of the untimed warm-up run before the probe."""


@dataclass(frozen=True, slots=True)
class FidelityChoice:
    """The fidelity a study runs at and why.

    ``des_trial_s`` and ``des_study_s`` are the estimated wall seconds of one DES trial and of
    the whole study at DES fidelity (NaN when no probe ran); ``probe_requests`` the requests the
    timed probe simulated (0: none); ``workers`` the parallel workers the estimate divides by.
    """

    fidelity: str
    reason: str
    budget_s: float
    des_trial_s: float = math.nan
    des_study_s: float = math.nan
    probe_requests: int = 0
    workers: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_fidelity(
    scenario: Scenario,
    n_trials: int,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    workers: int = 1,
    des_only_metrics: Sequence[str] = (),
    fluid_only_metrics: Sequence[str] = (),
    probe_requests: int = PROBE_REQUESTS,
    clock: Callable[[], float] = time.perf_counter,
) -> FidelityChoice:
    """``"des"`` when the study's estimated DES time (module docstring) fits ``budget_s``
    seconds, else ``"fluid"``; without a probe, ``"des"`` when the cluster has colocated workers
    or ``des_only_metrics`` (targets or constraints the fluid model does not report) is not
    empty, and ``"fluid"`` when ``fluid_only_metrics`` is not. ``clock`` times the probe
    (seconds)."""
    owner = "choose_fidelity"
    check_positive(budget_s, "budget_s", owner)
    check_int_at_least(n_trials, 1, "n_trials", owner)
    check_int_at_least(workers, 1, "workers", owner)
    check_int_at_least(probe_requests, 1, "probe_requests", owner)
    workload = check_tunable(scenario).workload
    assert isinstance(workload, Workload)  # check_tunable
    if any(w.role is Role.MIXED for w in scenario.cluster.workers):
        why = "the cluster has colocated workers, which the fluid model does not simulate"
        return FidelityChoice("des", why, budget_s, workers=workers)
    for fidelity, only, who in (
        ("des", des_only_metrics, "the DES"),
        ("fluid", fluid_only_metrics, "the fluid model"),
    ):
        if only:
            names = ", ".join(sorted(set(only)))
            why = f"the objective names {names}, which only {who} reports"
            return FidelityChoice(fidelity, why, budget_s, workers=workers)
    n = len(workload)
    m = min(n, probe_requests)
    # the trials run on the compiled engine (TrialRunner loads it), so the probe must too: on
    # its own a 1,000-request run is below engine="auto"'s size and timed the Python engine,
    # 16x slower for Phasor, which sent hour-long studies that fit the budget to the fluid model
    load_compiled_engine()
    evaluate(scenario.replace(workload=workload[: min(m, WARMUP_REQUESTS)]), {}, "des")
    began = clock()
    evaluate(scenario.replace(workload=workload[:m]), {}, "des")
    trial_s = (clock() - began) * n / m
    study_s = trial_s * n_trials / workers
    on = f"on {workers} workers" if workers > 1 else "in this process"
    estimate = (
        f"{n_trials} DES trials of {n:,} requests ≈ {_duration(study_s)} {on} "
        f"({_duration(trial_s)} a trial, timed on {m:,} requests)"
    )
    if study_s <= budget_s:
        why = f"{estimate} fit the {_duration(budget_s)} budget (--budget-s)"
        return FidelityChoice("des", why, budget_s, trial_s, study_s, m, workers)
    why = (
        f"{estimate} exceed the {_duration(budget_s)} budget (--budget-s): screening with the "
        "fluid model (θ_frag and the other request-level flags are then inert; raise "
        "--budget-s or give --fidelity des to tune them)"
    )
    return FidelityChoice("fluid", why, budget_s, trial_s, study_s, m, workers)


def _duration(seconds: float) -> str:
    """``"42 s"``, ``"12 min"`` or ``"3.2 h"``."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
