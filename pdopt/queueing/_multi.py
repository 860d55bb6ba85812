"""Multi-server queues: M/M/c (Erlang C) and the G/G/c Allen–Cunneen approximation.

``c`` identical servers fed from ONE shared FCFS queue. Rates per second, times in seconds.

References
----------
L. Kleinrock, *Queueing Systems, Vol. I*, §3.5 (M/M/m, Erlang C, Eq. 3.40–3.43).
A. O. Allen, *Probability, Statistics, and Queueing Theory*, 2nd ed., 1990, §6 (Allen–Cunneen).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_int_at_least, check_non_negative, check_positive
from pdopt.queueing._single import (
    QueueMetrics,
    check_quantiles,
    check_stable,
    exponential_tail_quantile,
    metrics_from_wait,
)

FloatArray = npt.NDArray[np.float64]


def erlang_c(servers: int, offered_load: float) -> float:
    """Erlang C: probability that an arrival waits in M/M/c, with ``a = lambda / mu`` Erlangs.

    Computed through the Erlang B recursion ``B_k = a·B_{k−1} / (k + a·B_{k−1})`` (stable for
    large ``c``, no factorials) and ``C = B_c / (1 − (a/c)(1 − B_c))`` (Kleinrock Eq. 3.40).
    Requires ``a < c``.

    Examples
    --------
    >>> round(erlang_c(1, 0.5), 12)
    0.5
    """
    c = check_int_at_least(servers, 1, "servers", "erlang_c")
    a = check_non_negative(offered_load, "offered_load", "erlang_c")
    check_stable(a / c, "erlang_c", "offered_load", a)
    blocking = 1.0
    for k in range(1, c + 1):
        blocking = a * blocking / (k + a * blocking)
    return blocking / (1.0 - (a / c) * (1.0 - blocking))


def mmc(arrival_rate_per_s: float, service_rate_per_s: float, servers: int) -> QueueMetrics:
    """M/M/c with one shared queue: ``E[W] = C(c, a) / (c·mu − lambda)``."""
    lam = check_non_negative(arrival_rate_per_s, "arrival_rate_per_s", "mmc")
    mu = check_positive(service_rate_per_s, "service_rate_per_s", "mmc")
    c = check_int_at_least(servers, 1, "servers", "mmc")
    rho = lam / (c * mu)
    check_stable(rho, "mmc", "arrival_rate_per_s", lam)
    p_wait = erlang_c(c, lam / mu)
    return metrics_from_wait(lam, 1.0 / mu, rho, p_wait, p_wait / (c * mu - lam))


def mmc_wait_quantile_s(
    arrival_rate_per_s: float, service_rate_per_s: float, servers: int, q: npt.ArrayLike
) -> FloatArray:
    """Exact M/M/c waiting-time quantiles: ``P(W > t) = C(c, a) · exp(−(c·mu − lambda) t)``."""
    probs = check_quantiles(q, "mmc_wait_quantile_s")
    m = mmc(arrival_rate_per_s, service_rate_per_s, servers)
    drain = servers * float(service_rate_per_s) - float(arrival_rate_per_s)
    return exponential_tail_quantile(probs, m.prob_wait, 1.0 / drain)


def allen_cunneen(
    arrival_rate_per_s: float,
    service_mean_s: float,
    servers: int,
    *,
    arrival_scv: float = 1.0,
    service_scv: float = 1.0,
) -> QueueMetrics:
    """G/G/c by Allen–Cunneen: ``E[W] ≈ C(c, a)/(c·mu − lambda) · (c_a² + c_s²)/2``.

    The M/M/c wait scaled by the variability factor; ``arrival_scv`` (c_a²) is the squared CV of
    inter-arrival times (1 for Poisson, > 1 for bursty traffic), ``service_scv`` (c_s²) that of
    service times. Exact for M/M/c; for c = 1 it equals Kingman's formula and so P–K for Poisson
    arrivals. ``prob_wait`` is the Erlang C value (an approximation away from M/M/c).
    """
    lam = check_non_negative(arrival_rate_per_s, "arrival_rate_per_s", "allen_cunneen")
    mean = check_positive(service_mean_s, "service_mean_s", "allen_cunneen")
    c = check_int_at_least(servers, 1, "servers", "allen_cunneen")
    ca2 = check_non_negative(arrival_scv, "arrival_scv", "allen_cunneen")
    cs2 = check_non_negative(service_scv, "service_scv", "allen_cunneen")
    rho = lam * mean / c
    check_stable(rho, "allen_cunneen", "arrival_rate_per_s", lam)
    p_wait = erlang_c(c, lam * mean)
    wait = p_wait / (c / mean - lam) * (ca2 + cs2) / 2.0
    return metrics_from_wait(lam, mean, rho, p_wait, wait)


def allen_cunneen_wait_quantile_s(
    arrival_rate_per_s: float,
    service_mean_s: float,
    servers: int,
    q: npt.ArrayLike,
    *,
    arrival_scv: float = 1.0,
    service_scv: float = 1.0,
) -> FloatArray:
    """Approximate G/G/c wait quantiles: atom ``1 − C`` at zero, exponential tail given a wait.

    The conditional mean is ``E[W] / C`` so the Allen–Cunneen mean is kept exactly; exact for
    M/M/c, a heavy-traffic approximation otherwise (the wait of a G/G/c queue is asymptotically
    exponential as rho → 1).
    """
    probs = check_quantiles(q, "allen_cunneen_wait_quantile_s")
    m = allen_cunneen(
        arrival_rate_per_s,
        service_mean_s,
        servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    if m.prob_wait == 0.0 or m.mean_wait_s == 0.0:
        return np.zeros_like(probs)
    return exponential_tail_quantile(probs, m.prob_wait, m.mean_wait_s / m.prob_wait)
