"""SLO-constrained capacity: bracketing (doubling) then bisection over a rate scale or a
client count, each point one simulation with a fixed seed (issue 3, "SLO-constrained capacity").

:func:`largest_meeting` is the search itself, independent of the simulator, so it is tested on
functions with known answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd

from pdopt._validation import (
    check_fraction,
    check_int_at_least,
    check_non_negative,
    check_positive,
    param_error,
)
from pdopt.capacity._crossing import is_flat
from pdopt.scenario import Scenario
from pdopt.sim import ClosedLoop, compute_metrics
from pdopt.workload import Workload


@dataclass(frozen=True, slots=True)
class Probe:
    """One evaluated point: ``value`` (a rate scale or a client count) and what it gave."""

    value: float
    meets: bool
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    """Result of :func:`largest_meeting`.

    ``status`` is ``"ok"`` (bracket found and narrowed to the tolerance), ``"below_min"`` (even the
    smallest value tried fails: ``best`` is 0), ``"above_max"`` (the largest value allowed still
    meets: ``best`` is that value, the true answer may be larger) or ``"max_evaluations"`` (the
    budget ran out before the bracket was narrow enough).
    """

    best: float
    bracket: tuple[float, float]
    status: str
    probes: tuple[Probe, ...]

    def frame(self) -> pd.DataFrame:
        """Points tried, in order: ``value``, ``meets`` and the metrics of each point."""
        rows = [{"value": p.value, "meets": p.meets, **p.metrics} for p in self.probes]
        return pd.DataFrame(rows)


def largest_meeting(
    evaluate: Callable[[float], Probe],
    *,
    start: float,
    rel_tol: float = 0.02,
    integer: bool = False,
    min_value: float = 0.0,
    max_value: float = math.inf,
    max_evaluations: int = 60,
) -> SearchOutcome:
    """Largest ``x`` with ``evaluate(x).meets``, assuming "meets" holds below a threshold only.

    Bracketing: from ``start``, double while the point meets (or halve while it fails) until one
    point meets and its double fails. Bisection: halve the bracket ``[lo, hi]`` until
    ``hi − lo <= rel_tol · lo`` (or ``hi − lo <= 1`` with ``integer=True``). The answer is ``lo``,
    the largest value seen to meet; the true threshold lies in ``[lo, hi)`` if the criterion is
    monotone (noisy criteria are evaluated with fixed seeds, so each point is reproducible).
    """
    owner = "largest_meeting"
    check_positive(start, "start", owner)
    check_positive(rel_tol, "rel_tol", owner)
    check_int_at_least(max_evaluations, 2, "max_evaluations", owner)
    probes: list[Probe] = []

    def probe(x: float) -> bool:
        value = float(round(x)) if integer else x
        result = evaluate(value)
        probes.append(result)
        return result.meets

    bracket = _bracket(probe, start, integer, min_value, max_value, max_evaluations)
    lo, hi, status = bracket
    if status != "ok":
        return SearchOutcome(lo, (lo, hi), status, tuple(probes))
    while not _narrow_enough(lo, hi, rel_tol, integer):
        if len(probes) >= max_evaluations:
            return SearchOutcome(lo, (lo, hi), "max_evaluations", tuple(probes))
        mid = math.floor((lo + hi) / 2) if integer else (lo + hi) / 2.0
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return SearchOutcome(lo, (lo, hi), status, tuple(probes))


def _narrow_enough(lo: float, hi: float, rel_tol: float, integer: bool) -> bool:
    if integer:
        return hi - lo <= 1
    return hi - lo <= rel_tol * lo


def _bracket(
    probe: Callable[[float], bool],
    start: float,
    integer: bool,
    min_value: float,
    max_value: float,
    budget: int,
) -> tuple[float, float, str]:
    """``(lo, hi, status)`` with ``lo`` meeting and ``hi = 2·lo`` failing (doubling/halving)."""
    x = start
    if probe(x):
        for _ in range(budget - 1):
            nxt = min(2.0 * x, max_value)
            if nxt <= x:
                return x, x, "above_max"
            if not probe(nxt):
                return x, nxt, "ok"
            x = nxt
        return x, x, "above_max"
    for _ in range(budget - 1):
        nxt = math.floor(x / 2) if integer else x / 2.0
        if nxt <= min_value or (integer and nxt < 1):
            return 0.0, x, "below_min"
        if probe(nxt):
            return nxt, x, "ok"
        x = nxt
    return 0.0, x, "below_min"


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """The largest open-loop rate meeting an SLO-attainment target, and how it was found.

    Attributes
    ----------
    max_rate_scale : float
        Largest factor ``s`` (arrivals ``t / s``, :meth:`Workload.scale_rate`) seen to meet the
        target; the threshold lies in ``bracket_scale``.
    max_rate_per_s : float
        ``s`` × the workload's own mean rate, requests per second.
    attainment_at_max : float
        Attainment measured at ``max_rate_scale``.
    target_attainment, rel_tol : float
        What was asked: the target fraction and the relative width the bracket was narrowed to.
    bracket_scale : (float, float)
        ``(lo, hi)``: ``lo`` meets, ``hi`` fails (``hi − lo <= rel_tol · lo`` when ``status`` is
        ``"ok"``).
    status : str
        See :class:`SearchOutcome`; also ``"flat"``: the attainment of every point tried lies
        within sampling noise of the others (:func:`pdopt.capacity.is_flat`), so the curve does
        not cross the target where the search can tell, and ``max_rate_scale`` is undetermined.
    seed : int
        The simulation seed used at every point.
    points : DataFrame
        Every simulation run, in order: ``rate_scale``, ``meets``, ``rate_per_s``,
        ``attainment``, ``ttft_p99_s``, ``tpot_p99_s``, ``requests``, ``rejected``.
    """

    max_rate_scale: float
    max_rate_per_s: float
    attainment_at_max: float
    target_attainment: float
    rel_tol: float
    bracket_scale: tuple[float, float]
    status: str
    seed: int
    points: pd.DataFrame


@dataclass(frozen=True, slots=True)
class ConcurrencyResult:
    """The largest closed-loop client count with P99 TTFT and P99 TPOT within the SLO.

    ``bracket_clients = (lo, hi)``: ``lo`` clients meet, ``hi`` fail (``hi = lo + 1`` when
    ``status`` is ``"ok"``). ``think_time_s`` is the think time used (mean think time with
    ``think = "exponential"``) and ``start_spread_s`` the window the clients' first requests
    were spread over, seconds. ``points`` lists every run: ``clients``, ``meets``,
    ``ttft_p99_s``, ``tpot_p99_s``, ``attainment``, ``requests``, ``rejected``.
    """

    max_clients: int
    ttft_p99_s: float
    tpot_p99_s: float
    think_time_s: float
    start_spread_s: float
    bracket_clients: tuple[int, int]
    status: str
    seed: int
    points: pd.DataFrame


def max_rate_under_slo(
    scenario: Scenario,
    *,
    attainment: float = 0.9,
    rel_tol: float = 0.02,
    start_scale: float = 1.0,
    max_evaluations: int = 40,
    on_point: Callable[[Probe], None] | None = None,
) -> CapacityResult:
    """Largest arrival-rate scale at which SLO attainment stays >= ``attainment`` (open loop).

    Each point runs ``scenario`` on ``scenario.workload.scale_rate(s)`` (same requests, time
    stamps ``t / s``) with a fresh policy and the scenario's seed, tick and engine, without time
    series; attainment is :func:`pdopt.sim.compute_metrics`'s ``slo_attainment`` (TTFT and TPOT
    both met; rejected requests fail). Search: from ``start_scale``, double (or halve) until the
    target is bracketed, then bisect until ``hi − lo <= rel_tol · lo`` (see
    :func:`largest_meeting`). Attainment is assumed to fall as the rate grows; every point is
    reported, so a non-monotone curve shows in ``points``. ``on_point`` is called with each
    point once it is simulated (a progress bar's hook; it cannot change the search).

    Returns
    -------
    CapacityResult
        ``max_rate_per_s = max_rate_scale × workload.rate_per_s``.
    """
    owner = "max_rate_under_slo"
    target = check_fraction(attainment, "attainment", owner)
    workload = scenario.workload
    if not isinstance(workload, Workload):
        raise param_error("scenario", owner, "an open-loop workload (not a ClosedLoop)", workload)
    if len(workload) < 2:
        raise param_error("workload", owner, "a workload of at least 2 requests", len(workload))
    base_rate = workload.rate_per_s

    def evaluate(scale: float) -> Probe:
        res = scenario.run(workload=workload.scale_rate(scale), record_timeseries=False)
        m = compute_metrics(res, scenario.slo)
        att = float(m["slo_attainment"])
        probe = Probe(
            scale,
            att >= target,
            {"rate_per_s": scale * base_rate, "attainment": att, **_point_metrics(m)},
        )
        if on_point is not None:
            on_point(probe)
        return probe

    out = largest_meeting(
        evaluate,
        start=start_scale,
        rel_tol=rel_tol,
        min_value=1e-6,
        max_evaluations=max_evaluations,
    )
    frame = out.frame().rename(columns={"value": "rate_scale"})
    at_best = frame.loc[frame["rate_scale"] == out.best, "attainment"]
    status = "flat" if is_flat(list(frame["attainment"]), target, len(workload)) else out.status
    return CapacityResult(
        max_rate_scale=out.best,
        max_rate_per_s=out.best * base_rate,
        attainment_at_max=float(at_best.iloc[-1]) if len(at_best) else float("nan"),
        target_attainment=target,
        rel_tol=rel_tol,
        bracket_scale=out.bracket,
        status=status,
        seed=scenario.seed,
        points=frame,
    )


@dataclass(frozen=True, slots=True)
class RateSearch:
    """:func:`max_rate_under_slo` with these settings, called on a scenario: one replicate's
    search, as :func:`pdopt.capacity.max_rate_crossing` maps it over seeds (a picklable value,
    so the searches can run on Dask workers). ``on_point`` is a serial run's progress hook only
    (a worker's calls would not reach the caller); returns the :class:`CapacityResult`, whose
    ``(status, max_rate_per_s)`` the crossing combines (:meth:`answer`)."""

    attainment: float = 0.9
    rel_tol: float = 0.02
    start_scale: float = 1.0
    max_evaluations: int = 40
    on_point: Callable[[Probe], None] | None = None

    def __call__(self, scenario: Scenario) -> CapacityResult:
        return max_rate_under_slo(
            scenario, attainment=self.attainment, rel_tol=self.rel_tol,
            start_scale=self.start_scale, max_evaluations=self.max_evaluations,
            on_point=self.on_point,
        )  # fmt: skip

    @staticmethod
    def answer(result: CapacityResult) -> tuple[str, float]:
        """What the crossing over seeds combines: ``(status, max_rate_per_s)``."""
        return result.status, result.max_rate_per_s


def max_concurrency_under_slo(
    scenario: Scenario,
    *,
    think_time_s: float | None = None,
    think: str | None = None,
    start_spread_s: float | None = None,
    requests_per_client: int = 20,
    start_clients: int = 1,
    max_clients: int = 65536,
    max_evaluations: int = 40,
    on_point: Callable[[Probe], None] | None = None,
) -> ConcurrencyResult:
    """Largest closed-loop client count with P99 TTFT <= ``slo.ttft_s`` and P99 TPOT <=
    ``slo.tpot_s``.

    Each point runs ``scenario`` with a :class:`pdopt.sim.ClosedLoop` of ``clients`` users
    cycling through the length rows of ``scenario.workload`` (a workload, whose arrival times
    are ignored, or a closed-loop driver, whose client count is ignored),
    ``requests_per_client × clients`` requests in all (plus one warm-up request per client).
    ``think_time_s``, ``think`` and ``start_spread_s`` default to the driver's (for a workload:
    0 s think time, constant, every client starting at t = 0). The result states the think time
    and spread used. The paper measures capacity with a fixed non-zero think time and staggered
    client starts (Phasor §4.3); pass both (e.g. ``think_time_s=1.0, start_spread_s=10.0``) to
    measure it that way: client ``i`` of ``n`` then starts at ``i · start_spread_s / n``
    (:class:`pdopt.sim.ClosedLoop`). Each client's first request (the start-up transient) is left
    out of the P99s. Integer search: double from ``start_clients`` until the SLO fails, then
    bisect to a bracket ``(n, n + 1)``. P99 TPOT is over requests with more than one output
    token (NaN, counted as met, when there are none). ``on_point`` is called with each point
    once it is simulated.
    """
    owner = "max_concurrency_under_slo"
    check_int_at_least(requests_per_client, 1, "requests_per_client", owner)
    check_int_at_least(start_clients, 1, "start_clients", owner)
    driver, slo = scenario.workload, scenario.slo
    lengths = driver.lengths if isinstance(driver, ClosedLoop) else driver
    if isinstance(driver, ClosedLoop):
        think_time_s = driver.think_time_s if think_time_s is None else think_time_s
        think = driver.think if think is None else think
        start_spread_s = driver.start_spread_s if start_spread_s is None else start_spread_s
    think_s, think_kind = think_time_s or 0.0, think or "constant"
    spread_s = check_non_negative(start_spread_s or 0.0, "start_spread_s", owner)

    def evaluate(clients: float) -> Probe:
        n = int(clients)
        loop = ClosedLoop(
            n, think_s, lengths, requests_per_client * n + n, think=think_kind,
            start_spread_s=spread_s,
        )  # fmt: skip
        res = scenario.run(workload=loop, record_timeseries=False)
        steady = replace(res, requests=res.requests.iloc[n:])
        m = compute_metrics(steady, slo)
        ttft, tpot = float(m["ttft_p99_s"]), float(m["tpot_p99_s"])
        ok = ttft <= slo.ttft_s and (math.isnan(tpot) or tpot <= slo.tpot_s)
        ok = ok and float(m["rejected"]) == 0.0
        probe = Probe(float(n), ok, {"attainment": float(m["slo_attainment"]), **_point_metrics(m)})
        if on_point is not None:
            on_point(probe)
        return probe

    out = largest_meeting(
        evaluate,
        start=start_clients,
        integer=True,
        max_value=max_clients,
        max_evaluations=max_evaluations,
    )
    frame = out.frame().rename(columns={"value": "clients"})
    frame["clients"] = frame["clients"].astype(int)
    row = frame[frame["clients"] == out.best]
    best = row.iloc[-1] if len(row) else None
    return ConcurrencyResult(
        max_clients=int(out.best),
        ttft_p99_s=float(best["ttft_p99_s"]) if best is not None else float("nan"),
        tpot_p99_s=float(best["tpot_p99_s"]) if best is not None else float("nan"),
        think_time_s=think_s,
        start_spread_s=spread_s,
        bracket_clients=(int(out.bracket[0]), int(out.bracket[1])),
        status=out.status,
        seed=scenario.seed,
        points=frame,
    )


def _point_metrics(m: pd.Series) -> dict[str, float]:
    keys = ("ttft_p99_s", "tpot_p99_s", "requests", "rejected")
    return {k: float(m[k]) for k in keys}
