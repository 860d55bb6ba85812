"""Candidate workers (GPU type × TP degree) and their queueing-derived per-worker capacities.

The sizing MILP is linear in worker counts, so each candidate's capacity is precomputed here:

* Prefill: the largest arrival rate a pool of ``c`` identical workers (one FCFS queue; the
  simulator's least-work routing is exactly that) serves with ``P(TTFT <= SLO) >= q``, TTFT =
  W + S, W the Allen–Cunneen G/G/c wait (atom ``1 − C`` at zero, exponential tail, as
  :func:`pdopt.queueing.predict_pd`), S the request's own batch-1 prefill time. Divided by
  ``c`` it is a per-worker rate ``mu(c)`` that never decreases with ``c`` (pooling), so
  ``n · mu(b) <= capacity(n)`` for every ``n >= b``: the MILP uses that bound on a grid of
  pool sizes ``b`` (:data:`POOL_GRID_FACTOR`).
* Decode: the mean-field batch of :func:`pdopt.queueing.decode_load`. With ``B`` running
  requests, Little's law gives the rate ``B / ((ō − 1) τ(B, B c̄))``; ``B`` is the largest with
  ``τ <= TPOT SLO``, ``B + z_q sqrt(B) <= KV tokens / c̄_kv`` (running requests are taken
  Poisson, as in an M/G/∞ queue, so KV overflows with probability about ``1 − q``) and ``B <=
  max_running``. ``c̄_kv`` is :meth:`Demand.decode_kv_tokens`: ``c̄`` itself, or less with
  sliding-window layers (:attr:`WorkerOption.model`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
from scipy import stats

from pdopt._validation import check_fraction, check_int_at_least, check_positive
from pdopt.cluster import DEFAULT_MAX_RUNNING
from pdopt.costmodel import CostModel
from pdopt.errors import ConfigError, ParameterError
from pdopt.model_spec import ModelSpec
from pdopt.model_spec._params import check_expert_parallel
from pdopt.plan._demand import Demand
from pdopt.queueing import erlang_c

FloatArray = npt.NDArray[np.float64]

POOL_GRID_FACTOR = 1.15
"""Successive prefill pool sizes of the capacity grid grow by this factor (about 7% of capacity
is the most the linearisation gives away between grid points)."""

DEFAULT_TPS: tuple[int, ...] = (1, 2, 4, 8)
_BISECT_STEPS = 32


@dataclass(frozen=True, slots=True)
class WorkerOption:
    """One candidate serving instance: ``tp`` GPUs of type ``gpu`` acting as one worker.

    ``price_per_gpu_hour`` is USD per GPU-hour (default :attr:`pdopt.hardware.GpuSpec.
    cost_per_hour`); ``kv_capacity_tokens`` is the instance's KV cache in tokens.
    ``expert_parallel``: an MoE model's experts are spread over the ``tp`` GPUs (expert
    parallelism, attention tensor-parallel) instead of each expert split ``tp`` ways; the same
    weights per GPU, so the same KV capacity, but all-to-all dispatch and combine instead of the
    MLP all-reduce (:func:`pdopt.profile.roofline_profile`).
    ``model`` is the served model when known: ``kv_capacity_tokens`` counts tokens held in every
    layer, and a request's share of it is its context through
    :meth:`pdopt.model_spec.ModelSpec.kv_context_tokens` (less than its context with
    sliding-window layers); None takes every context token as held in every layer.
    """

    gpu: str
    tp: int
    cost: CostModel
    kv_capacity_tokens: float
    price_per_gpu_hour: float
    max_running: int = DEFAULT_MAX_RUNNING
    expert_parallel: bool = False
    model: ModelSpec | None = None

    def __post_init__(self) -> None:
        check_int_at_least(self.tp, 1, "tp", "WorkerOption")
        check_positive(self.kv_capacity_tokens, "kv_capacity_tokens", "WorkerOption")
        check_positive(self.price_per_gpu_hour, "price_per_gpu_hour", "WorkerOption")
        check_int_at_least(self.max_running, 1, "max_running", "WorkerOption")
        if self.expert_parallel and self.tp < 2:
            raise ParameterError(
                "WorkerOption: expert_parallel needs tp >= 2 (the GPUs the experts spread over)"
            )

    @property
    def name(self) -> str:
        return option_name(self.gpu, self.tp, self.expert_parallel)

    @property
    def key(self) -> tuple[str, int, bool]:
        """(GPU, TP, expert parallel): what tells options apart (and a plan's worker counts)."""
        return (self.gpu, self.tp, self.expert_parallel)

    @property
    def price_per_hour(self) -> float:
        """USD per hour of one worker (all its GPUs)."""
        return self.price_per_gpu_hour * self.tp


def option_name(gpu: str, tp: int, expert_parallel: bool = False) -> str:
    """``A100-80GB/tp2``, or ``H200/tp8+ep`` with expert parallelism."""
    return f"{gpu}/tp{tp}" + ("+ep" if expert_parallel else "")


def worker_options(
    gpus: Sequence[str],
    model: str | ModelSpec,
    tps: Sequence[int] = DEFAULT_TPS,
    *,
    prices: Mapping[str, float] | None = None,
    memory_utilization: float = 0.9,
    costs: Mapping[tuple[str, int], CostModel] | None = None,
    expert_parallel: Sequence[bool] = (False,),
    compute_efficiency: Mapping[str, float] | None = None,
) -> tuple[WorkerOption, ...]:
    """Every (GPU, TP, expert parallelism) that can hold ``model`` (a spec, or a name
    :func:`pdopt.model_spec.get_model` resolves), each with a cost model.

    A pair's cost model is ``costs[(gpu_name, tp)]`` when given (e.g. fitted from a measured
    profile; it stands for the tensor-parallel layout it was measured in), else the roofline
    prior (:func:`pdopt.profile.roofline_profile` fitted by
    :func:`pdopt.costmodel.fit_cost_model`). Pairs whose weights do not fit, or whose TP does not
    divide the model's heads, are left out. ``prices`` maps a GPU name to USD per GPU-hour and
    overrides the catalogue's ``cost_per_hour``. ``expert_parallel`` lists the layouts to
    consider for an MoE model at TP >= 2: ``(False, True)`` adds the expert-parallel option next
    to the tensor-parallel one, ``(True,)`` replaces it (expert-parallel options are priced by
    the roofline prior); a dense model, or TP 1, has the tensor-parallel layout only.
    ``compute_efficiency`` maps a GPU name to the roofline prior's compute efficiency on it
    (:func:`pdopt.profile.calibrate_compute_efficiency`); unlisted GPUs keep their preset.
    """
    from pdopt.costmodel import roofline_cost_model
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import get_model, kv_capacity_tokens

    spec = get_model(model) if isinstance(model, str) else model
    if not spec.is_moe and expert_parallel and all(expert_parallel):
        check_expert_parallel(spec, 1, "worker_options")  # raises: the model is dense
    chosen = {k.lower(): v for k, v in (prices or {}).items()}
    calibrated = {get_gpu(k).name: v for k, v in (compute_efficiency or {}).items()}
    specs = [get_gpu(name) for name in gpus]
    if specs:  # a TP degree no GPU type's node holds is an error, not an option left out
        widest = max(specs, key=lambda g: g.gpus_per_node)
        for tp in tps:
            widest.check_tp(tp, "worker_options")
    out: list[WorkerOption] = []
    for name, gpu in zip(gpus, specs, strict=True):
        price = chosen.get(gpu.name.lower(), chosen.get(str(name).lower(), gpu.cost_per_hour))
        for tp in tps:
            if tp > gpu.gpus_per_node:
                continue  # a TP group wider than this type's node (GpuSpec.check_tp)
            try:
                kv = kv_capacity_tokens(gpu, spec, tp, memory_utilization)
            except (ConfigError, ParameterError):
                continue  # weights do not fit, or tp does not divide the heads
            # expert parallelism applies to an MoE model at TP >= 2 only; at TP 1 the
            # tensor-parallel layout stands in for it (a dense model with "on" was refused above)
            applies = spec.is_moe and tp >= 2 and _experts_spread(spec, tp, expert_parallel)
            for ep in dict.fromkeys(bool(e) and applies for e in expert_parallel):
                cost = None if ep else (costs or {}).get((gpu.name, tp))
                if cost is None:
                    cost = roofline_cost_model(
                        gpu,
                        spec,
                        tp,
                        memory_utilization=memory_utilization,
                        expert_parallel=ep,
                        compute_efficiency=calibrated.get(gpu.name),
                    )
                option = WorkerOption(gpu.name, tp, cost, float(kv), float(price), model=spec)
                out.append(replace(option, expert_parallel=ep) if ep else option)
    return tuple(out)


def _experts_spread(spec: ModelSpec, tp: int, layouts: Sequence[bool]) -> bool:
    """Whether ``spec``'s experts can be placed whole on ``tp`` GPUs
    (:func:`~pdopt.model_spec._params.check_expert_parallel`). When expert parallelism is the
    only layout asked for, a ``tp`` that cannot is an error; beside the tensor-parallel layout it
    just has no ``+ep`` option."""
    try:
        check_expert_parallel(spec, tp, "worker_options")
    except ParameterError:
        if all(layouts):
            raise
        return False
    return True


@dataclass(frozen=True, slots=True)
class WorkerCapacity:
    """Per-worker capacities of one :class:`WorkerOption` for one :class:`Demand`.

    Attributes
    ----------
    pool_sizes : tuple of int
        Grid of prefill pool sizes ``b`` (ascending, starting at 1).
    prefill_rate_per_worker : tuple of float
        ``mu(b)``: requests/s per worker that a pool of ``b`` serves within the TTFT SLO
        (0 when even an idle worker misses it).
    decode_rate_per_worker : float
        Requests/s one decode worker sustains within the TPOT SLO and KV (inf with no decode).
    decode_batch : float
        The mean running batch at that rate.
    decode_limited_by : str
        ``"tpot"``, ``"kv"``, ``"max_running"`` or ``"none"``.
    idle_ttft_s : float
        The ``q``-quantile of TTFT on an idle worker (its own prefill time): the smallest TTFT
        SLO this option can meet.
    fits : bool
        Every sampled prompt fits the prefill KV and every peak footprint the decode KV.
    """

    option: WorkerOption
    pool_sizes: tuple[int, ...]
    prefill_rate_per_worker: tuple[float, ...]
    decode_rate_per_worker: float
    decode_batch: float
    decode_limited_by: str
    idle_ttft_s: float
    fits: bool

    def prefill_capacity_rps(self, workers: int) -> float:
        """Rate ``workers`` prefill workers of this option serve (grid lower bound)."""
        if workers <= 0:
            return 0.0
        j = int(np.searchsorted(self.pool_sizes, workers, side="right")) - 1
        return workers * self.prefill_rate_per_worker[j]


def pool_grid(max_workers: int, factor: float = POOL_GRID_FACTOR) -> tuple[int, ...]:
    """Pool sizes 1, 2, 3, … growing by ``factor`` up to ``max_workers`` (always included)."""
    top = max(int(max_workers), 1)
    sizes = [1]
    while sizes[-1] < top:
        sizes.append(min(top, max(sizes[-1] + 1, math.ceil(sizes[-1] * factor))))
    return tuple(sizes)


def worker_capacity(
    option: WorkerOption, demand: Demand, max_workers: int | None = None
) -> WorkerCapacity:
    """The prefill capacity grid and decode rate of ``option`` under ``demand``.

    The grid stops at ``ceil(peak rate / mu(1))`` workers (that many always suffice, since
    ``mu`` grows with the pool) or ``max_workers`` if smaller.
    """
    service = demand.prefill_service_s(option.cost.prefill)
    idle = float(np.quantile(service, demand.ttft_quantile))
    args = (demand.ttft_slo_s, demand.ttft_quantile, demand.arrival_scv)
    mu1 = float(max_prefill_rate_per_worker(service, np.ones(1), *args)[0])
    top = 1 if mu1 <= 0 else math.ceil(demand.peak_rate_per_s / mu1 * (1 + 1e-9))
    if max_workers is not None:
        top = max(1, min(top, int(max_workers)))
    sizes = pool_grid(top)
    rates = max_prefill_rate_per_worker(service, np.asarray(sizes, dtype=np.float64), *args)
    dec_rate, batch, limited = _decode_rate(option, demand)
    fits = demand.peak_kv_tokens(option.model) <= option.kv_capacity_tokens
    return WorkerCapacity(
        option, sizes, tuple(float(r) for r in rates), dec_rate, batch, limited, idle, fits
    )


def prefill_workers_needed(capacity: WorkerCapacity, rate_per_s: float, demand: Demand) -> int:
    """Fewest prefill workers of one option meeting the TTFT SLO at ``rate_per_s`` (exact
    Allen–Cunneen model, no grid): the analytic sizing the MILP is compared with. 0 if none."""
    if rate_per_s <= 0:
        return 0
    service = demand.prefill_service_s(capacity.option.cost.prefill)
    mu1 = capacity.prefill_rate_per_worker[0]
    if mu1 <= 0:
        return 0
    hi = max(1, math.ceil(rate_per_s / mu1 * (1 + 1e-9)))
    lo = 0  # invariant: lo workers fail, hi workers meet it
    while hi - lo > 1:
        mid = (lo + hi) // 2
        att = ttft_attainment(
            service, np.array([rate_per_s]), np.array([float(mid)]),
            demand.ttft_slo_s, demand.arrival_scv,
        )  # fmt: skip
        if att[0] >= demand.ttft_quantile:
            hi = mid
        else:
            lo = mid
    return hi


def ttft_attainment(
    service_s: FloatArray,
    rate_per_s: FloatArray,
    servers: FloatArray,
    ttft_slo_s: float,
    arrival_scv: float,
) -> FloatArray:
    """``P(W + S <= slo)`` of a G/G/c prefill pool for arrays of rates and pool sizes.

    W: Allen–Cunneen mean ``C/(c/E[S] − lambda)·(c_a² + c_s²)/2``, an atom ``1 − C`` at zero and
    an exponential tail (conditional mean ``E[W]/C``); S: the sampled service times. 0 where
    the pool is unstable.
    """
    mean = float(service_s.mean())
    scv = float(service_s.var() / mean**2)
    values, counts = np.unique(service_s, return_counts=True)
    return _attainment(values, counts / counts.sum(), mean, scv, rate_per_s, servers, ttft_slo_s,
                       arrival_scv)  # fmt: skip


def _attainment(
    values: FloatArray,
    weights: FloatArray,
    mean: float,
    scv: float,
    rate_per_s: FloatArray,
    servers: FloatArray,
    ttft_slo_s: float,
    arrival_scv: float,
) -> FloatArray:
    lam = np.asarray(rate_per_s, dtype=np.float64)
    c = np.asarray(servers, dtype=np.float64)
    stable = lam * mean < c
    a = np.where(stable, lam * mean, 0.5 * c)
    p_wait = erlang_c(c, a)
    wait = p_wait / (c / mean - a / mean) * (arrival_scv + scv) / 2.0
    slack = ttft_slo_s - values
    keep = slack >= 0  # a request slower than the SLO alone never meets it
    slack, w = slack[keep], weights[keep]
    cond = np.where(p_wait > 0, wait / np.maximum(p_wait, 1e-300), 1.0)
    # A pool whose conditional wait is 0 (mu far above the rate) never waits past any slack.
    scaled = np.divide(
        slack[None, :],
        cond[:, None],
        out=np.full((cond.size, slack.size), np.inf),
        where=cond[:, None] > 0,
    )
    tail = p_wait[:, None] * np.exp(-scaled)
    within = (1.0 - tail) @ w
    return np.where(stable & (lam > 0), within, np.where(lam <= 0, w.sum(), 0.0))


def max_prefill_rate_per_worker(
    service_s: FloatArray,
    servers: FloatArray,
    ttft_slo_s: float,
    quantile: float,
    arrival_scv: float,
) -> FloatArray:
    """Largest ``lambda/c`` with ``P(TTFT <= slo) >= quantile`` for each pool size ``c``.

    Bisection on ``lambda`` in ``(0, c/E[S])`` (the attainment falls as the rate grows), all
    pool sizes at once, to a relative width of 2^-32. 0 where even an idle pool misses the
    quantile.
    """
    check_fraction(quantile, "quantile", "max_prefill_rate_per_worker")
    c = np.asarray(servers, dtype=np.float64)
    mean = float(service_s.mean())
    scv = float(service_s.var() / mean**2)
    values, counts = np.unique(service_s, return_counts=True)
    weights = counts / counts.sum()
    lo = np.zeros_like(c)
    hi = c / mean
    if float(np.mean(service_s <= ttft_slo_s)) < quantile:
        return np.zeros_like(c)
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        att = _attainment(values, weights, mean, scv, mid, c, ttft_slo_s, arrival_scv)
        ok = att >= quantile
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    per_worker = lo / c
    # NOTE: enforce the monotonicity the MILP relies on (bisection noise is ~1e-10 relative).
    return np.maximum.accumulate(per_worker)


def _decode_rate(option: WorkerOption, demand: Demand) -> tuple[float, float, str]:
    iters = demand.mean_decode_iterations
    if iters <= 0:
        return math.inf, 0.0, "none"
    model = option.cost.decode
    c_bar = demand.decode_context_tokens
    headroom = demand.tpot_slo_s - model.d0_s
    b_tpot = model.max_batch_within(demand.tpot_slo_s, c_bar)
    z = float(stats.norm.ppf(demand.ttft_quantile))
    k = option.kv_capacity_tokens / max(demand.decode_kv_tokens(option.model), 1.0)
    b_kv = ((-z + math.sqrt(z * z + 4.0 * k)) / 2.0) ** 2
    limits = {"tpot": b_tpot, "kv": b_kv, "max_running": float(option.max_running)}
    limited = min(limits, key=lambda key: limits[key])
    batch = max(limits[limited], 0.0)
    if batch <= 0 or headroom <= 0:
        return 0.0, 0.0, "tpot"
    tau = float(model.mean_context_time_s(batch, c_bar))
    return batch / (iters * tau), batch, limited
