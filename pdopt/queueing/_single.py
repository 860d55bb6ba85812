"""Single-server queues: M/M/1, M/D/1, M/G/1 (Pollaczek–Khinchine) and Kingman's G/G/1.

All functions are pure functions of floats (quantile functions also accept arrays of
probabilities). Rates are per second, times in seconds. A queue with utilisation
``rho = lambda · E[S] >= 1`` has no steady state; every function then raises
:class:`~pdopt.errors.ParameterError` saying so.

References
----------
L. Kleinrock, *Queueing Systems, Vol. I*, Wiley 1975: §3.2 (M/M/1), §5.6–5.7 (M/G/1 mean and
Takács' moments). J. F. C. Kingman, "The single server queue in heavy traffic", 1961.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_non_negative, check_positive, param_error

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """Steady-state means of a FCFS queue.

    Attributes
    ----------
    utilization : float
        rho: the fraction of time each server is busy, ``lambda · E[S] / c``.
    prob_wait : float
        P(W > 0): the probability an arrival has to wait (rho for one server with Poisson
        arrivals; Erlang C for M/M/c; an approximation for G/G/c).
    mean_wait_s : float
        E[W]: mean time in the queue before service starts, seconds.
    mean_response_s : float
        E[W] + E[S]: mean time in the system, seconds.
    mean_queue_length : float
        L_q = lambda · E[W] (Little's law), requests waiting.
    mean_in_system : float
        L = lambda · (E[W] + E[S]), requests waiting or in service.
    """

    utilization: float
    prob_wait: float
    mean_wait_s: float
    mean_response_s: float
    mean_queue_length: float
    mean_in_system: float


def metrics_from_wait(
    arrival_rate_per_s: float,
    service_mean_s: float,
    utilization: float,
    prob_wait: float,
    mean_wait_s: float,
) -> QueueMetrics:
    """Fill a :class:`QueueMetrics` from the mean wait by Little's law."""
    response = mean_wait_s + service_mean_s
    return QueueMetrics(
        utilization=utilization,
        prob_wait=prob_wait,
        mean_wait_s=mean_wait_s,
        mean_response_s=response,
        mean_queue_length=arrival_rate_per_s * mean_wait_s,
        mean_in_system=arrival_rate_per_s * response,
    )


def check_stable(utilization: float, owner: str, name: str, value: float) -> None:
    """Raise the standard error when rho >= 1 (no steady state exists)."""
    if utilization >= 1.0:
        rule = (
            f"low enough for a stable queue (unstable: ρ = {utilization:.3g} ≥ 1; "
            "add servers or lower the rate)"
        )
        raise param_error(name, owner, rule, value)


def check_quantiles(q: npt.ArrayLike, owner: str) -> FloatArray:
    """Probabilities in [0, 1) as a float array (1 would be an infinite quantile)."""
    probs = np.asarray(q, dtype=np.float64)
    if probs.size == 0 or not np.all(np.isfinite(probs)) or np.any((probs < 0) | (probs >= 1)):
        raise param_error("q", owner, "probabilities in [0, 1)", q)
    return probs


def exponential_tail_quantile(
    probs: FloatArray, prob_wait: float, conditional_mean_s: float
) -> FloatArray:
    """Quantiles of ``W`` with ``P(W > t) = p_w · exp(−t / m)`` (atom ``1 − p_w`` at zero).

    Solving ``p_w · exp(−t/m) = 1 − q`` gives ``t = m · ln(p_w / (1 − q))`` where ``q > 1 − p_w``,
    else 0.
    """
    tail = 1.0 - probs
    with np.errstate(divide="ignore"):
        t = conditional_mean_s * np.log(prob_wait / tail)
    return np.where(tail >= prob_wait, 0.0, t)


def mm1(arrival_rate_per_s: float, service_rate_per_s: float) -> QueueMetrics:
    """M/M/1: Poisson arrivals, exponential service, one server (Kleinrock §3.2).

    ``E[W] = rho / (mu − lambda)``, ``P(W > 0) = rho``.

    Examples
    --------
    >>> round(mm1(0.5, 1.0).mean_wait_s, 12)
    1.0
    """
    lam = check_non_negative(arrival_rate_per_s, "arrival_rate_per_s", "mm1")
    mu = check_positive(service_rate_per_s, "service_rate_per_s", "mm1")
    rho = lam / mu
    check_stable(rho, "mm1", "arrival_rate_per_s", lam)
    return metrics_from_wait(lam, 1.0 / mu, rho, rho, rho / (mu - lam))


def mm1_wait_quantile_s(
    arrival_rate_per_s: float, service_rate_per_s: float, q: npt.ArrayLike
) -> FloatArray:
    """Exact M/M/1 waiting-time quantiles from ``P(W > t) = rho · exp(−mu (1 − rho) t)``.

    Returns 0 for ``q <= 1 − rho`` (the atom of arrivals that find the server idle).
    """
    probs = check_quantiles(q, "mm1_wait_quantile_s")
    m = mm1(arrival_rate_per_s, service_rate_per_s)
    mu = float(service_rate_per_s)
    return exponential_tail_quantile(probs, m.utilization, 1.0 / (mu * (1.0 - m.utilization)))


def mg1(arrival_rate_per_s: float, service_mean_s: float, service_scv: float) -> QueueMetrics:
    """M/G/1 by the Pollaczek–Khinchine formula (Kleinrock §5.7, Eq. 5.105).

    ``E[W] = lambda · E[S²] / (2 (1 − rho)) = rho · E[S] · (1 + scv) / (2 (1 − rho))``, where
    ``scv = Var[S] / E[S]²`` is the squared coefficient of variation of the service time. It reduces
    to M/M/1 at scv = 1 and to M/D/1 at scv = 0. ``P(W > 0) = rho`` exactly.
    """
    lam = check_non_negative(arrival_rate_per_s, "arrival_rate_per_s", "mg1")
    mean = check_positive(service_mean_s, "service_mean_s", "mg1")
    scv = check_non_negative(service_scv, "service_scv", "mg1")
    rho = lam * mean
    check_stable(rho, "mg1", "arrival_rate_per_s", lam)
    wait = rho * mean * (1.0 + scv) / (2.0 * (1.0 - rho))
    return metrics_from_wait(lam, mean, rho, rho, wait)


def md1(arrival_rate_per_s: float, service_s: float) -> QueueMetrics:
    """M/D/1: P–K with a constant service time, ``E[W] = rho · S / (2 (1 − rho))``."""
    return mg1(arrival_rate_per_s, service_s, 0.0)


def mg1_wait_quantile_s(
    arrival_rate_per_s: float,
    service_mean_s: float,
    service_scv: float,
    q: npt.ArrayLike,
    *,
    service_third_moment_s3: float | None = None,
) -> FloatArray:
    """Approximate M/G/1 waiting-time quantiles (FCFS).

    The atom ``P(W = 0) = 1 − rho`` is exact. Given ``W > 0`` the wait is approximated by

    * with ``service_third_moment_s3`` (``E[S³]``): a gamma distribution matching the first two
      moments of ``W | W > 0``, from the P–K mean and Takács' second moment
      ``E[W²] = 2 E[W]² + lambda E[S³] / (3 (1 − rho))`` (Kleinrock Eq. 5.114);
    * without it: an exponential with mean ``E[W] / rho`` (the P–K mean kept exactly).

    Both are exact for M/M/1 (the conditional wait is then exponential). The exponential tail
    is the heavy-traffic (Kingman) limit; for low-variance service at low load it overestimates
    high quantiles, and the gamma fit is closer.
    """
    probs = check_quantiles(q, "mg1_wait_quantile_s")
    m = mg1(arrival_rate_per_s, service_mean_s, service_scv)
    rho = m.utilization
    if rho == 0.0:
        return np.zeros_like(probs)
    cond_mean = m.mean_wait_s / rho
    if service_third_moment_s3 is None:
        return exponential_tail_quantile(probs, rho, cond_mean)
    s3 = check_positive(service_third_moment_s3, "service_third_moment_s3", "mg1_wait_quantile_s")
    lam = float(arrival_rate_per_s)
    second = 2.0 * m.mean_wait_s**2 + lam * s3 / (3.0 * (1.0 - rho))
    cond_var = second / rho - cond_mean**2
    if cond_var <= 0.0:  # a degenerate fit: all waits equal their mean
        return np.where(1.0 - probs >= rho, 0.0, cond_mean)
    from scipy import stats

    shape = cond_mean**2 / cond_var
    scale = cond_var / cond_mean
    # P(W > t) = rho · G(t) with G the gamma survival function: G(t) = (1 − q) / rho.
    tail = np.minimum((1.0 - probs) / rho, 1.0)
    out = stats.gamma.isf(tail, shape, scale=scale)
    return np.where(1.0 - probs >= rho, 0.0, np.asarray(out, dtype=np.float64))


def kingman_wait_s(
    arrival_rate_per_s: float, service_mean_s: float, arrival_scv: float, service_scv: float
) -> float:
    """Kingman's G/G/1 approximation ``E[W] ≈ rho/(1 − rho) · (c_a² + c_s²)/2 · E[S]``.

    Exact for M/G/1 (``c_a² = 1``); for bursty arrivals (``c_a² > 1``) it is the heavy-traffic
    limit and accurate as rho → 1. ``arrival_scv`` is the squared CV of inter-arrival times.
    """
    lam = check_non_negative(arrival_rate_per_s, "arrival_rate_per_s", "kingman_wait_s")
    mean = check_positive(service_mean_s, "service_mean_s", "kingman_wait_s")
    ca2 = check_non_negative(arrival_scv, "arrival_scv", "kingman_wait_s")
    cs2 = check_non_negative(service_scv, "service_scv", "kingman_wait_s")
    rho = lam * mean
    check_stable(rho, "kingman_wait_s", "arrival_rate_per_s", lam)
    return rho / (1.0 - rho) * (ca2 + cs2) / 2.0 * mean


def utilization(arrival_rate_per_s: float, service_mean_s: float, servers: int = 1) -> float:
    """rho = lambda · E[S] / c, the per-server utilisation (may be >= 1)."""
    return float(arrival_rate_per_s) * float(service_mean_s) / float(servers)


def md1_wait_cdf(arrival_rate_per_s: float, service_s: float, t_s: npt.ArrayLike) -> FloatArray:
    """Exact M/D/1 waiting-time CDF ``P(W <= t)`` (Erlang 1909; Crommelin 1932).

    With ``D`` the service time and ``u = t / D``,
    ``P(W <= t) = (1 − rho) Σ_{k=0}^{⌊u⌋} (rho (k − u))^k / k! · exp(−rho (k − u))``.
    The alternating terms grow like ``exp(2 rho u)``, so the sum is taken in decimal arithmetic
    with enough digits for the cancellation. Beyond ``u = 100`` the (exact) dominant-pole
    asymptote ``P(W > t) = (1 − rho) / (lambda D e^{theta D} − 1) · e^{−theta t}`` is used, with
    ``theta > 0`` the root of ``lambda (e^{theta D} − 1) = theta``; the other poles' terms are
    smaller by many orders of magnitude there.
    """
    lam = check_non_negative(arrival_rate_per_s, "arrival_rate_per_s", "md1_wait_cdf")
    d = check_positive(service_s, "service_s", "md1_wait_cdf")
    rho = lam * d
    check_stable(rho, "md1_wait_cdf", "arrival_rate_per_s", lam)
    times = np.asarray(t_s, dtype=np.float64)
    out = np.array([_md1_cdf_units(rho, float(t) / d) for t in times.ravel()])
    return out.reshape(times.shape)


def md1_wait_tail_asymptote(rho: float, u: float) -> float:
    """Dominant-pole asymptote of ``P(W > u·D)`` for M/D/1 (units of the service time D)."""
    from scipy.optimize import brentq

    if rho == 0.0:
        return 0.0
    # theta·D solves rho (e^x − 1) = x, x > 0; x in (0, 2 ln(1/rho) + 2] brackets it.
    x = brentq(lambda v: rho * np.expm1(v) - v, 1e-12 if rho < 1 else 0, 2 * np.log(1 / rho) + 2)
    return float((1 - rho) / (rho * np.exp(x) - 1) * np.exp(-x * u))


def _md1_cdf_units(rho: float, u: float) -> float:
    """P(W <= u·D) in units of the service time (see :func:`md1_wait_cdf`)."""
    import decimal

    if not np.isfinite(u):
        return 1.0 if u > 0 else 0.0
    if u < 0:
        return 0.0
    if u > 100.0:
        return 1.0 - md1_wait_tail_asymptote(rho, u)
    digits = 30 + int(2.0 * rho * u / 2.302585) + len(str(int(u)))
    with decimal.localcontext() as ctx:
        ctx.prec = digits
        r, t = decimal.Decimal(rho), decimal.Decimal(u)
        total, factorial = decimal.Decimal(0), decimal.Decimal(1)
        for k in range(int(np.floor(u)) + 1):
            if k:
                factorial *= k
            x = r * (k - t)
            power = x**k if k else decimal.Decimal(1)  # Decimal(0) ** 0 is undefined
            total += power / factorial * (-x).exp()
        value = (1 - r) * total
    return min(max(float(value), 0.0), 1.0)
