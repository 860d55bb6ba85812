"""``simulate``: one request-level run from a driver, a cluster and a policy."""

from __future__ import annotations

import dataclasses
import sys
from array import array
from collections.abc import Callable

import numpy as np
import pandas as pd

from pdopt._validation import check_int_at_least, check_one_of, check_positive
from pdopt.cluster._spec import ClusterSpec, Role, Slo
from pdopt.errors import ConfigError
from pdopt.sim._drivers import ClosedLoop
from pdopt.sim._engine import Engine
from pdopt.sim._enums import Status
from pdopt.sim._policy import PolicyProtocol, PolicyTraits, RunContext
from pdopt.sim._requests import RequestTable
from pdopt.sim._result import EVENT_COLUMNS, EventRows, SimResult
from pdopt.sim._window import split_by_window, with_rejections
from pdopt.workload import Workload

ENGINES = ("auto", "python", "compiled")
COMPILED_MIN_REQUESTS = 20_000
"""engine="auto" compiles runs of at least this many requests (the first compile takes seconds;
later processes load it from numba's cache)."""


def simulate(
    driver: Workload | ClosedLoop,
    cluster: ClusterSpec,
    policy: PolicyProtocol,
    *,
    slo: Slo,
    tick_s: float = 0.05,
    seed: int = 0,
    record_timeseries: bool = True,
    progress: bool = False,
    engine: str = "auto",
    client_timeout_s: float | None = None,
) -> SimResult:
    """Simulate ``cluster`` serving ``driver``'s requests under ``policy``.

    Parameters
    ----------
    driver : Workload or ClosedLoop
        Open loop (the workload's arrivals) or closed loop (clients with think time).
    cluster : ClusterSpec
    policy : Policy
        A policy object (:func:`pdopt.policies.make_policy` builds one from a registered name;
        :class:`pdopt.scenario.Scenario` resolves names from a config). It is started with the
        run's :class:`RunContext` (cluster, ``slo``, ``tick_s``, ``seed``).
    slo : Slo
        The run's SLOs: the policy steers by them (``RunContext.slo``) and the result's metrics
        use them by default.
    tick_s : float
        Control tick Δt, seconds: telemetry rows and ``policy.on_tick`` calls happen every tick.
    seed : int
        Seeds the driver's randomness (closed-loop exponential think times) and is passed to
        the policy in its ``RunContext``. The engine itself draws no random numbers.
    record_timeseries : bool
        Keep the per-tick time series (turn off for speed when no one reads it).
    progress : bool
        Reserved (no progress bar is drawn: the engine writes nothing).
    client_timeout_s : float, optional
        Each client gives up this many seconds after its request arrived, whatever the
        request's state (queued, in prefill, in a KV transfer, waiting for decode admission,
        decoding), as inference-perf's and vLLM's benchmark clients do: the request ends with
        status ``"aborted"`` at that deadline (a failure: out of the latency metrics, a miss in
        every attainment) and frees its KV (:mod:`pdopt.sim._engine` says when). None (the
        default): clients wait. The compiled engine runs them, but under arrow and ecoserve
        (the Python engine runs those).
    engine : {"auto", "python", "compiled"}
        ``"python"``: the reference engine, which runs everything. ``"compiled"``: the numba engine
        (:mod:`pdopt.sim._compiled`), which gives the identical result many times faster but runs
        only all-disaggregated or all-mixed clusters under a built-in policy's twin (round_robin,
        least_loaded, static_split, distserve, memory_centric, min_load_tokens, cache_aware,
        splitwise, mooncake, phasor, arrow, the colocated vllm and sarathi with any of their
        routings, ecoserve with any of its settings; arrow but with ``colocated=False`` on
        workers mixed from the start),
        open or closed loop, with or without prefix caching, KV allocated on demand or reserved
        at admission, with client timeouts but under arrow and ecoserve; a ConfigError
        says why when the run does not qualify. ``"auto"``: compiled when the run qualifies and
        either has at least ``COMPILED_MIN_REQUESTS`` requests or the compiled engine is already
        loaded in this process (compiling it cold takes several minutes, loading it from numba's
        cache ~0.5 s, more than a small run saves), else Python.

    Returns
    -------
    SimResult
        Same inputs and seed → identical result. No side effects.

    Examples
    --------
    >>> from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
    >>> from pdopt.policies import make_policy
    >>> from pdopt.workload import Workload
    >>> cost = CostModel(PrefillModel(0.0, 2e9, 1e14), DecodeModel(0.01, 1e-4, 1e-7))
    >>> cluster = ClusterSpec.build(cost, 1, 1)
    >>> wl = Workload([0.0, 0.1], [512, 256], [8, 1])
    >>> res = simulate(wl, cluster, make_policy("round_robin"), slo=Slo(1.0, 0.1))
    >>> list(res.requests["status"])
    ['finished', 'finished']
    """
    owner = "simulate"
    tick_s = check_positive(tick_s, "tick_s", owner)
    seed = check_int_at_least(seed, 0, "seed", owner)
    if not isinstance(slo, Slo):
        raise ConfigError(f"simulate needs slo=Slo(ttft_s, tpot_s); got {slo!r}")
    traits = _policy_traits(policy)
    check_one_of(engine, ENGINES, "engine", owner)
    if client_timeout_s is not None:
        client_timeout_s = check_positive(client_timeout_s, "client_timeout_s", owner)
    window = cluster.max_context_tokens if isinstance(cluster, ClusterSpec) else None
    if window is not None and isinstance(driver, Workload):
        kept, kept_ids, reasons = split_by_window(driver, window)
        if len(kept) < len(driver):
            inner = dataclasses.replace(cluster, max_context_tokens=None)
            served = simulate(
                kept, inner, policy, slo=slo, tick_s=tick_s, seed=seed,
                record_timeseries=record_timeseries, progress=progress, engine=engine,
                client_timeout_s=client_timeout_s,
            )  # fmt: skip
            return with_rejections(served, driver, kept_ids, reasons, cluster)
    table, n, think = _load_driver(driver, seed)
    _check_cluster(cluster, table, n)
    ctx = RunContext(cluster, slo, tick_s, seed)
    codes = _compiled_codes(engine, policy, traits, cluster, n, client_timeout_s)
    if codes is not None:
        loop = None if think is None else (driver.clients, think)  # type: ignore[union-attr]
        result = _simulate_compiled(
            table, n, codes, loop, ctx, policy, traits, record_timeseries, client_timeout_s
        )
        if result is not None:
            return result
        table, n, think = _load_driver(driver, seed)  # an error: the Python engine words it
    return _simulate_python(
        table, n, think, driver, ctx, policy, traits, record_timeseries, client_timeout_s
    )


def _policy_traits(policy: object) -> PolicyTraits:
    """``policy.traits()``, or a ConfigError saying what a policy must be."""
    if isinstance(policy, str):
        raise ConfigError(
            f"simulate takes a policy object, not the name {policy!r}: build it with "
            f"pdopt.policies.make_policy({policy!r}, **flags) (or run a pdopt.scenario.Scenario)"
        )
    traits = policy.traits() if isinstance(policy, PolicyProtocol) else None
    if not isinstance(traits, PolicyTraits):
        raise ConfigError(
            f"simulate needs a policy with name, traits(), start(ctx), route_prefill, "
            f"route_decode and on_tick (subclass pdopt.sim.Policy); got {policy!r}"
        )
    return traits


def _simulate_compiled(
    table: RequestTable,
    n: int,
    codes: tuple[int, int, int, tuple[float, ...]],
    closed_loop: tuple[int, list[float]] | None,
    ctx: RunContext,
    policy: PolicyProtocol,
    traits: PolicyTraits,
    record_timeseries: bool,
    client_timeout_s: float | None = None,
) -> SimResult | None:
    """The run on the compiled engine; None when it stopped on an error (see _compiled.run)."""
    from pdopt.sim import _compiled
    from pdopt.sim._compiled._warm import compile_notice

    policy.start(ctx)
    codes = _compiled.routing_codes(traits, policy) or codes  # a twin's constants, once started
    cluster = ctx.cluster
    with compile_notice():  # a line on stderr when this run compiles the engine (issue 38)
        outcome = _compiled.run(
            table, cluster, codes, ctx.tick_s, record_timeseries, closed_loop, traits,
            client_timeout_s,
        )  # fmt: skip
    if outcome is None:
        return None
    names = tuple(w.name for w in cluster.workers)
    busy = list(outcome.busy_s)
    result = _result(
        table, n, names, outcome.now_s, lambda end: busy, outcome.timeseries,
        outcome.event_rows, ctx, pools=outcome.pools, roles=outcome.roles,
        forced_schedule=traits.colocated_schedule,
    )  # fmt: skip
    if outcome.prefix_counters is not None:
        _cache_columns(result, outcome.prefix_counters)
    return result


def _compiled_codes(
    engine: str,
    policy: PolicyProtocol,
    traits: PolicyTraits,
    cluster: ClusterSpec,
    n: int,
    client_timeout_s: float | None = None,
) -> tuple[int, int, int, tuple[float, ...]] | None:
    """The compiled engine's codes of the policy's twin (routing, tick rule and its parameters)
    when it runs this simulation, else None."""
    if engine == "python":
        return None
    if engine == "auto" and n < COMPILED_MIN_REQUESTS and not _compiled_loaded():
        return None
    why = _not_compilable(cluster) or _no_twin(policy, traits, cluster)
    if why is None:
        from pdopt.sim import _compiled

        codes = _compiled.routing_codes(traits, policy)
        why = None if codes is None else _no_timeouts(policy, codes[2], client_timeout_s)
        if why is None:
            return codes
    if engine == "compiled":
        raise ConfigError(
            f"engine='compiled' cannot run this simulation: {why}; use engine='python' (or 'auto')"
        )
    return None


def load_compiled_engine() -> bool:
    """Load the compiled engine into this process from numba's cache, so that
    ``engine="auto"`` runs every qualifying simulation on it whatever its size (it picks the
    Python engine for runs under ``COMPILED_MIN_REQUESTS`` requests only while loading would
    cost more than the run). For a process about to run many small simulations (an
    experiment's grid): about a second once, then each run at compiled speed with the
    identical result. True when the engine is loaded (now or before); False, doing nothing,
    when numba's cache does not hold it (compiling takes minutes: ``python -m
    pdopt.sim._compiled``, the install's warm step, does it ahead)."""
    if _compiled_loaded():
        return True
    from pdopt.sim._compiled import _warm

    if _warm.cache_is_cold():
        return False
    _warm.warm()
    return _compiled_loaded()


def _compiled_loaded() -> bool:
    """True once this process has compiled (or loaded from cache) the compiled engine."""
    module = sys.modules.get("pdopt.sim._compiled")
    return module is not None and bool(module.is_loaded())


def _compiled_tick(policy: PolicyProtocol) -> bool:
    """True when ``policy`` names an ``on_tick`` twin the compiled engine has."""
    try:
        from pdopt.sim._compiled._routing import compiled_tick
    except ImportError:  # numba is not installed (_not_compilable says so first)
        return False
    return compiled_tick(policy) is not None


def _not_compilable(cluster: ClusterSpec) -> str | None:
    """Why the compiled engine cannot run ``cluster`` (None: it can, under a twin)."""
    roles = {w.role for w in cluster.workers}
    if Role.MIXED in roles and roles != {Role.MIXED}:
        return (
            "the cluster has mixed workers beside prefill or decode workers (the compiled "
            "engine runs all-mixed or all-disaggregated clusters)"
        )
    if roles != {Role.MIXED} and roles != {Role.PREFILL, Role.DECODE}:
        return "the cluster has prefill or decode workers only (it needs both, or all mixed)"
    try:
        import numba  # noqa: F401
    except ImportError:
        return "numba is not installed"
    return None


def _no_twin(policy: PolicyProtocol, traits: PolicyTraits, cluster: ClusterSpec) -> str | None:
    """Why ``policy`` has no compiled twin for ``cluster`` (None: it has one)."""
    names = traits.compiled_routing
    if names is None:
        return (
            f"policy {policy.name!r} has no compiled twin (the built-in policies' routing rules "
            "have one, not a subclass's own hooks)"
        )
    unsupported = getattr(policy, "compiled_unsupported", None)
    why = unsupported(cluster) if callable(unsupported) else None
    if why is not None:
        return f"policy {policy.name!r} has no compiled twin for {why}"
    if traits.wants_ticks and not _compiled_tick(policy):
        return (
            f"policy {policy.name!r} acts on control ticks in a way the compiled engine does "
            "not run (a subclass's own tick rules run on the Python engine; it has Splitwise's, "
            "Phasor's, Arrow's and EcoServe's tick rules)"
        )
    mixed = any(w.role is Role.MIXED for w in cluster.workers)
    if mixed and names[1] not in ("origin", "min_load_tokens", "ecoserve", "arrow"):
        return (
            "the cluster has mixed workers, which the compiled engine runs under the colocated "
            f"policies (vllm, sarathi, ecoserve, arrow) and min_load_tokens only; policy "
            f"{policy.name!r}'s twin routes disaggregated clusters"
        )
    if names[0] in ("phasor", "phasor_queue", "ecoserve"):
        from pdopt.sim._compiled._phasor import max_pool

        if len(cluster.workers) > max_pool():
            return (
                f"the cluster has {len(cluster.workers)} workers; policy {policy.name!r}'s "
                f"compiled twin reproduces numpy's mean over pools of at most {max_pool()}"
            )
    return None


def _no_timeouts(
    policy: PolicyProtocol, tick_code: int, client_timeout_s: float | None
) -> str | None:
    """Why the compiled engine cannot run ``policy``'s run (its twin's tick rule
    ``tick_code``) with client timeouts (None: it can, or the run has none).

    NOTE: the compiled engine runs client timeouts (pdopt.sim._compiled._loop._on_abort) under
    the policies that act on no control tick, under Splitwise's tick (worker moves between
    prefill and decode) and Phasor's (its migrations: Migrations.abort's twin); Arrow's and
    EcoServe's mixed instances, phases, flips and held prompts would meet requests withdrawn by
    their clients in states (a prompt held by the policy, a worker leaving the mixed role, its
    records of prompts routed) that its abort path does not mirror."""
    from pdopt.sim._compiled._state import TICK_NONE, TICK_PHASOR, TICK_SPLITWISE

    if client_timeout_s is None or tick_code in (TICK_NONE, TICK_SPLITWISE, TICK_PHASOR):
        return None
    return (
        f"policy {policy.name!r} acts on control ticks with mixed instances: client timeouts "
        "under Arrow's and EcoServe's tick rules run on the Python engine only"
    )


def _simulate_python(
    table: RequestTable,
    n: int,
    think: list[float] | None,
    driver: Workload | ClosedLoop,
    ctx: RunContext,
    policy: PolicyProtocol,
    traits: PolicyTraits,
    record_timeseries: bool,
    client_timeout_s: float | None = None,
) -> SimResult:
    closed_loop = None if think is None else (driver.clients, think)  # type: ignore[union-attr]
    engine = Engine(
        ctx.cluster,
        policy,
        traits,
        table,
        n,
        tick_s=ctx.tick_s,
        record_timeseries=record_timeseries,
        closed_loop=closed_loop,
        client_timeout_s=client_timeout_s,
    )
    policy.start(ctx)
    engine.run()
    if engine.n_done != n:
        stuck = [i for i in range(n) if table.status[i] == Status.PENDING][:5]
        raise RuntimeError(
            f"pdopt.sim internal error: {n - engine.n_done} requests never ended "
            f"(first ids {stuck}); please report it with the inputs"
        )

    def busy_until(end: float) -> list[float]:
        return [
            p.busy_until(end) + d.busy_until(end)
            for p, d in zip(engine.prefill, engine.decode, strict=True)
        ]

    now = engine.kernel.now if n else 0.0
    timeseries = engine.control.timeseries()
    result = _result(
        table,
        n,
        engine.names,
        now,
        busy_until,
        timeseries,
        engine.event_rows,
        ctx,
        pools=engine.pools,
        roles=[str(r) for r in engine.roles],
        forced_schedule=traits.colocated_schedule,
    )
    if engine.caches:
        caches = engine.caches
        counters = ([c.hit_tokens for c in caches], [c.lookups for c in caches])
        _cache_columns(result, (*counters, [c.evictions for c in caches]))
    return result


def _cache_columns(result: SimResult, counters: tuple[list[int], list[int], list[int]]) -> None:
    """The workers frame's prefix-cache columns (a run with a prefix cache): per worker, the
    prompt tokens its cache served, its lookups and its evictions."""
    hits, lookups, evictions = counters
    result.workers["prefix_hit_tokens"] = hits
    result.workers["prefix_lookups"] = lookups
    result.workers["prefix_evictions"] = evictions


def _load_driver(
    driver: Workload | ClosedLoop, seed: int
) -> tuple[RequestTable, int, list[float] | None]:
    if isinstance(driver, ClosedLoop):
        inputs, outputs = driver.tokens()
        arrival = np.full(len(inputs), np.nan)
        first = driver.first_send_s()
        arrival[: len(first)] = first
        think: list[float] | None = driver.think_times(seed).tolist()
    elif isinstance(driver, Workload):
        inputs, outputs, arrival = driver.input_tokens, driver.output_tokens, driver.arrival_s
        think = None
        blocks = driver.prefix_blocks
    else:
        raise ConfigError(f"simulate needs a Workload or a ClosedLoop driver; got {driver!r}")
    n = len(inputs)
    table = RequestTable(n)
    table.arrival_s = array("d", np.ascontiguousarray(arrival, dtype=np.float64).tobytes())
    table.input_tokens = array("q", np.ascontiguousarray(inputs, dtype=np.int64).tobytes())
    table.output_tokens = array("q", np.ascontiguousarray(outputs, dtype=np.int64).tobytes())
    if isinstance(driver, Workload) and blocks is not None:
        table.prefix_offsets = np.asarray(blocks.offsets, dtype=np.int64)
        table.prefix_keys = np.asarray(blocks.chained_keys(), dtype=np.int64)
        table.prefix_block_tokens = int(blocks.block_tokens)
    return table, n, think


def _check_cluster(cluster: ClusterSpec, table: RequestTable, n: int) -> None:
    if not isinstance(cluster, ClusterSpec):
        raise ConfigError(f"simulate needs a ClusterSpec; got {cluster!r}")
    roles = {w.role for w in cluster.workers}
    needs_decode = n > 0 and max(table.output_tokens) > 1
    if needs_decode and not roles & {Role.DECODE, Role.MIXED}:
        raise ConfigError(
            "the workload has requests with output_tokens > 1 but the cluster has no decode "
            "worker; add decode workers (or mixed ones)"
        )
    for w in cluster.workers:
        if w.cost.decode.iteration_time_s(1, 1) <= 0 and needs_decode:
            raise ConfigError(
                f"worker {w.name!r}: the decode iteration time τ(1, 1) is 0, so decoding "
                "would never advance the clock; fit or set d0_s, d1_s_per_request or d2"
            )


def _client_view(requests: pd.DataFrame, cluster: ClusterSpec) -> pd.DataFrame:
    """``ttft_s`` and ``e2e_s`` as the client sees them: the engine's plus the server overhead
    of the request's prefill worker (:attr:`pdopt.costmodel.CostModel.overhead`; TPOT and every
    time stamp stay the engine's). Unchanged when no worker has an overhead."""
    overheads = {w.name: w.cost.overhead for w in cluster.workers if w.cost.overhead is not None}
    if not overheads or requests.empty:
        return requests
    extra = np.zeros(len(requests))
    where = requests["prefill_worker"].to_numpy()
    tokens = requests["input_tokens"].to_numpy()
    tpot = requests["tpot_s"].to_numpy()
    for name, overhead in overheads.items():
        mine = where == name
        extra[mine] = overhead.client_extra_s(tokens[mine], tpot[mine])
    requests["ttft_s"] = requests["ttft_s"] + extra
    requests["e2e_s"] = requests["e2e_s"] + extra
    return requests


def _result(
    table: RequestTable,
    n: int,
    names: tuple[str, ...],
    now_s: float,
    busy_until: Callable[[float], list[float]],
    timeseries: pd.DataFrame,
    event_rows: EventRows,
    ctx: RunContext,
    *,
    pools: list[str] | None = None,
    roles: list[str] | None = None,
    forced_schedule: str | None = None,
) -> SimResult:
    """The SimResult of a finished run (``pools``/``roles`` at the end; default: initial;
    ``forced_schedule``: the policy's ``PolicyTraits.colocated_schedule``)."""
    cached = ctx.cluster.prefix_caching and table.prefix_keys is not None
    requests = _client_view(table.to_frame(n, names, cached=cached), ctx.cluster)
    ends = requests["finish_s"].to_numpy()
    makespan = float(np.nanmax(ends)) if np.isfinite(ends).any() else 0.0
    makespan = max(makespan, now_s)
    events = pd.DataFrame(event_rows, columns=list(EVENT_COLUMNS))
    busy = busy_until(makespan)
    specs = ctx.cluster.workers
    energy = [
        w.idle_power_w * makespan + (w.max_power_w - w.idle_power_w) * b
        for w, b in zip(specs, busy, strict=True)
    ]
    workers = pd.DataFrame(
        {
            "worker": list(names),
            "pool": list(pools) if pools is not None else [w.pool for w in specs],
            "role": list(roles) if roles is not None else [str(w.role) for w in specs],
            "busy_s": busy,
            "energy_j": energy,
            "colocated_schedule": [forced_schedule or w.colocated_schedule for w in specs],
        }
    )
    return SimResult(requests, timeseries, events, workers, ctx.slo, ctx.tick_s, ctx.seed, makespan)
