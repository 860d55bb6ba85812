"""Multi-server queues: M/M/c (Erlang C) and the G/G/c Allen–Cunneen approximation.

``c`` identical servers fed from ONE shared FCFS queue. Rates per second, times in seconds.

References
----------
L. Kleinrock, *Queueing Systems, Vol. I*, §3.5 (M/M/m, Erlang C, Eq. 3.40–3.43).
A. O. Allen, *Probability, Statistics, and Queueing Theory*, 2nd ed., 1990, §6 (Allen–Cunneen).
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import numpy.typing as npt
from scipy import special

from pdopt._validation import (
    check_int_at_least,
    check_non_negative,
    check_positive,
    param_error,
)
from pdopt.queueing._single import (
    QueueMetrics,
    check_quantiles,
    check_stable,
    exponential_tail_quantile,
    metrics_from_wait,
)

FloatArray = npt.NDArray[np.float64]


@overload
def erlang_c(servers: int, offered_load: float) -> float: ...


@overload
def erlang_c(servers: npt.ArrayLike, offered_load: npt.ArrayLike) -> FloatArray: ...


def erlang_c(servers: npt.ArrayLike, offered_load: npt.ArrayLike) -> float | FloatArray:
    """Erlang C: probability that an arrival waits in M/M/c, with ``a = lambda / mu`` Erlangs.

    The Erlang B recursion ``B_0 = 1``, ``B_k = a·B_{k−1} / (k + a·B_{k−1})`` (no factorials or
    powers, so stable for any ``c``: a few ulp where the Poisson closed form
    ``B = pmf(c; a) / cdf(c; a)`` loses ~c·1e-15 to cancellation), then
    ``C = B_c / (1 − (a/c)(1 − B_c))`` (Kleinrock Eq. 3.40).

    Parameters
    ----------
    servers : int or array of int
        ``c >= 1`` (integral values; a float array of whole numbers is accepted).
    offered_load : float or array of float
        ``a >= 0`` Erlangs with ``a < c``; broadcast against ``servers``.

    Returns
    -------
    float or array of float
        A float for scalar inputs, else an array of the broadcast shape.

    Notes
    -----
    NOTE: vectorised over the inputs, O(max c) array steps up to ``c = 512``
    (:data:`RECURSION_MAX_SERVERS`); where ``c`` varies, entries past their own ``c`` keep their
    value. A larger ``c`` takes the Poisson closed form in log space with Stirling's series
    (relative error below 1e-12, O(1) for any ``c``), so a pool of 10^6 servers is as quick.
    Scalar inputs run the same loop on Python floats (a 0-d numpy step costs ~10× more).

    Examples
    --------
    >>> round(erlang_c(1, 0.5), 12)
    0.5
    >>> erlang_c([1, 2], [0.5, 1.0]).round(12).tolist()
    [0.5, 0.333333333333]
    """
    if np.ndim(servers) == 0 and np.ndim(offered_load) == 0:
        c = check_int_at_least(np.asarray(servers).item(), 1, "servers", "erlang_c")
        a = check_non_negative(np.asarray(offered_load).item(), "offered_load", "erlang_c")
        check_stable(a / c, "erlang_c", "offered_load", a)
        b = float(_erlang_b(c, a, None))
        return b / (1.0 - (a / c) * (1.0 - b))
    cs, loads = np.broadcast_arrays(
        np.asarray(servers, dtype=np.float64), np.asarray(offered_load, dtype=np.float64)
    )
    _check_arrays(cs, loads)
    top = int(cs.max()) if cs.size else 0
    varies = cs.size > 0 and bool(np.any(cs != top))
    blocking: FloatArray = _erlang_b(top, loads, cs if varies else None)
    out: FloatArray = blocking / (1.0 - (loads / cs) * (1.0 - blocking))
    return out


RECURSION_MAX_SERVERS = 512
"""Largest ``c`` whose Erlang B runs the recursion; a larger ``c`` uses the log-space closed
form (:func:`_erlang_b_log`), whose relative error ~``c·log(a)·1e-16`` is ~1e-12 there."""


def _erlang_b(servers: int, a: Any, per_entry: FloatArray | None) -> Any:
    """``B_servers`` for a float or an array ``a``; ``per_entry``: each entry's own ``c``,
    None when all equal ``servers``. The recursion up to :data:`RECURSION_MAX_SERVERS`
    servers, the log-space closed form beyond (O(1) in ``c``)."""
    if servers <= RECURSION_MAX_SERVERS:
        return _erlang_b_recursion(servers, a, per_entry)
    if per_entry is None:
        return _erlang_b_log(float(servers) if not isinstance(a, np.ndarray) else
                             np.full_like(a, float(servers)), a)  # fmt: skip
    small = per_entry <= RECURSION_MAX_SERVERS
    top = int(per_entry[small].max()) if np.any(small) else 0
    low = _erlang_b_recursion(top, a, per_entry) if top else np.ones_like(a)
    return np.where(small, low, _erlang_b_log(np.maximum(per_entry, 1.0), a))


def _erlang_b_recursion(servers: int, a: Any, per_entry: FloatArray | None) -> Any:
    """``B_k = a·B_{k−1} / (k + a·B_{k−1})`` from ``B_0 = 1`` to ``servers`` (entries past
    their own ``per_entry`` keep their value)."""
    blocking = np.ones_like(a) if isinstance(a, np.ndarray) else 1.0
    for k in range(1, servers + 1):
        ab = a * blocking
        step = ab / (k + ab)
        blocking = step if per_entry is None else np.where(k <= per_entry, step, blocking)
    return blocking


def _erlang_b_log(servers: Any, a: Any) -> Any:
    """Erlang B as ``pmf(c; a) / cdf(c; a)`` of a Poisson(a) count, in log space, for
    ``c > 100``: with ``a = c·(1 + x)`` and Stirling's series for ``lnΓ(c + 1)``,
    ``log pmf = c·(log1p(x) − x) − ½·log(2πc) − 1/(12c) + 1/(360c³)`` (no term of size
    ``c·log c`` is formed, so no cancellation even at ``c = 10^300``; the series' next term,
    ``1/(1260c⁵)``, is below 1e-13 for ``c > 100``), and ``cdf = Q(c + 1, a)``, the regularised
    upper incomplete gamma function. 0 at ``a = 0``.

    NOTE: O(1) per entry where the recursion is O(c): a pool of 10^6 servers costs what one of
    10 does (the planner bisects over such pools at extreme rates).
    """
    c = np.asarray(servers, dtype=np.float64)
    load = np.asarray(a, dtype=np.float64)
    x = load / c - 1.0
    with np.errstate(divide="ignore"):
        log_pmf = (
            c * (np.log1p(x) - x) - 0.5 * np.log(2.0 * np.pi * c) - 1.0 / (12.0 * c)
            + 1.0 / (360.0 * c) / c / c
        )  # fmt: skip
        log_cdf = np.log(special.gammaincc(c + 1.0, load))
        out = np.where(load > 0, np.exp(np.minimum(log_pmf - log_cdf, 0.0)), 0.0)
    return float(out) if out.ndim == 0 else out


def _check_arrays(servers: FloatArray, loads: FloatArray) -> None:
    owner = "erlang_c"
    if np.any(servers < 1) or np.any(servers != np.floor(servers)):
        raise param_error("servers", owner, "integers >= 1", servers)
    if not np.all(np.isfinite(loads)) or np.any(loads < 0):
        raise param_error("offered_load", owner, "finite and >= 0", loads)
    if servers.size:
        worst = int(np.argmax(loads / servers))
        check_stable(float(loads.flat[worst] / servers.flat[worst]), owner, "offered_load",
                     float(loads.flat[worst]))  # fmt: skip


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
