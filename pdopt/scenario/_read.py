"""Scenario files ↔ values: the ``[workload]``, ``[cluster]``, ``[policy]`` and ``[slo]`` tables
(format: :data:`pdopt.scenario.EXAMPLE_CONFIG`) read into a workload or closed-loop driver, a
:class:`pdopt.sim.ClusterSpec`, a policy and an SLO, and written back.

Two forms per table. What people write: ``[workload]`` names an archetype or a trace file and
``[cluster]`` names a GPU, a model and a layout. What :meth:`Scenario.to_toml` writes, so that any
scenario reads back equal: ``[workload]`` lists ``arrival_s``, ``input_tokens`` and
``output_tokens``; ``[cluster]`` lists its ``workers`` (cost models included), its ``link`` and
``pair_links``. Relative paths are relative to the file's folder.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from pdopt._toml import TomlTable, literal
from pdopt.cluster import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_MAX_RUNNING,
    KV_ALLOCATIONS,
    LINK_PRESETS,
    PREEMPTED_REQUEUES,
    SLO_TIMINGS,
    ClusterSpec,
    LinkSpec,
    Role,
    Slo,
    WorkerSpec,
    build_cluster,
)
from pdopt.costmodel import CostModel, ServerOverhead
from pdopt.errors import PdoptWarning
from pdopt.model_spec import ModelSpec, SlidingWindow
from pdopt.sim import ClosedLoop
from pdopt.workload import PrefixBlocks, Workload

TOP_KEYS = (
    "seed", "tick_s", "record_timeseries", "engine", "client_timeout_s", "workload", "cluster",
    "policy", "slo",
)  # fmt: skip
_ARRAYS = ("arrival_s", "input_tokens", "output_tokens")
_TRACE_OPTIONS = ("format", "columns", "time_unit", "arrival_kind", "hash_block_tokens")
_WORKLOAD = (
    "archetype", "rate_per_s", "n_requests", "cv", "trace", "closed_loop", "name", *_ARRAYS,
    "prefix_blocks", *_TRACE_OPTIONS,
)  # fmt: skip
_PREFIX_BLOCKS = ("block_tokens", "offsets", "hashes")
_CLOSED = ("clients", "think_time_s", "think", "start_spread_s")
_HARDWARE = (
    "gpu", "model", "tp", "profile", "n_prefill", "n_decode", "n_mixed", "mixed_pool_role",
    "link", "memory_utilization", "max_batch_tokens", "max_batch_size", "max_running",
    "max_context_tokens",
    "kv_allocation", "kv_capacity_blocks", "block_tokens", "activation_peak_gib",
    "preempted_requeue", "prefix_caching", "server_overhead",
    "max_num_batched_tokens", "max_num_seqs", "block_size", "gpu_memory_utilization",
    "num_gpu_blocks",
)  # fmt: skip
_VLLM_NAMES = {
    "max_batch_tokens": "max_num_batched_tokens",
    "max_running": "max_num_seqs",
    "block_tokens": "block_size",
    "memory_utilization": "gpu_memory_utilization",
    "kv_capacity_blocks": "num_gpu_blocks",
}
"""pdopt's ``[cluster]`` key -> vLLM's engine argument of the same setting (either may be given,
not both). ``max_num_batched_tokens`` is vLLM V1's token budget of one iteration: it also sets
the colocated workers' chunk budget (``chunk_tokens``); ``max_num_seqs`` also caps a prefill
batch (``max_batch_size``); ``num_gpu_blocks`` is ``--num-gpu-blocks-override``."""
_EXPLICIT = (
    "kv_bytes_per_token", "link", "pair_links", "workers", "max_context_tokens",
    "preempted_requeue", "sliding_window", "prefix_caching",
)  # fmt: skip
_ROLES = tuple(r.value for r in Role)
_Spec = TypeVar("_Spec")


def read_slo(top: TomlTable) -> Slo:
    """``[slo] ttft_s, tpot_s`` (both required, seconds > 0) and ``timing`` (optional,
    :attr:`pdopt.sim.Slo.timing`)."""
    part = top.table("slo", ("ttft_s", "tpot_s", "timing"))
    return Slo(
        part.number("ttft_s", positive=True),
        part.number("tpot_s", positive=True),
        part.string("timing", "first_token", choices=SLO_TIMINGS),
    )


def read_policy(top: TomlTable) -> tuple[str, dict[str, Any]]:
    """``[policy] name`` (registered) and ``[policy.flags]``."""
    from pdopt.policies import available_policies, make_policy, policy_flags

    part = top.table("policy", ("name", "flags"))
    name = part.string("name", choices=tuple(available_policies()))
    accepted = policy_flags(name)
    flags = part.table("flags")
    if accepted == [] and flags.data:  # "a key among []" would read as a bug
        stray = sorted(flags.data)[0]
        raise flags.error(stray, f"no flag ({name!r} has none)", shown="an unknown key")
    flags.only(accepted if accepted is not None else flags.data)
    with flags.naming():  # a flag's value is checked now, not at the first run
        make_policy(name, **flags.data)
    return name, dict(flags.data)


def read_driver(top: TomlTable, base: Path, seed: int) -> Workload | ClosedLoop:
    """``[workload]``: an open-loop workload or, with ``[workload.closed_loop]``, a driver."""
    part = top.table("workload", _WORKLOAD)
    given = [k for k in ("archetype", "trace", "arrival_s") if part.has(k)]
    if len(given) != 1:
        raise part.error(
            "archetype", "exactly one of 'archetype', 'trace' or the arrays", shown=str(given)
        )
    closed = part.table("closed_loop", _CLOSED) if part.has("closed_loop") else None
    n = part.integer("n_requests", 1000, min_value=1)
    wl = _workload(part, base, seed, n, open_loop=closed is None)
    if closed is None:
        return wl
    with closed.naming():
        return ClosedLoop(
            closed.integer("clients", min_value=1),
            closed.number("think_time_s", 0.0),
            wl,
            n,
            closed.string("think", "constant", choices=("constant", "exponential")),
            closed.number("start_spread_s", 0.0, non_negative=True),
        )


def _workload(part: TomlTable, base: Path, seed: int, n: int, *, open_loop: bool) -> Workload:
    from pdopt.workload import archetype_workload

    if part.has("trace"):
        return _trace(part, base)
    stray = [k for k in _TRACE_OPTIONS if part.has(k)]
    if stray:
        raise part.error(stray[0], "it only with 'trace'", part.raw(stray[0]))
    if part.has("arrival_s"):
        blocks = _prefix_blocks(part) if part.has("prefix_blocks") else None
        with part.naming():  # e.g. a request listing more blocks than its prompt holds
            return Workload(
                np.asarray(part.array("arrival_s", of=float), dtype=np.float64),
                np.asarray(part.array("input_tokens", of=int), dtype=np.int64),
                np.asarray(part.array("output_tokens", of=int), dtype=np.int64),
                part.string("name", "workload"),
                blocks,
            )
    if part.has("prefix_blocks"):
        raise part.error("prefix_blocks", "it only with the arrays (a trace carries its own)")
    name = part.string("archetype")
    with part.naming("archetype", {"name": "archetype"}):
        if not open_loop:
            return archetype_workload(name, 1.0, n_requests=n, seed=seed)
        rate = part.number("rate_per_s", positive=True)
        cv = part.number("cv", 1.0, positive=True)
        return archetype_workload(name, rate, n_requests=n, cv=cv, seed=seed)


def _prefix_blocks(part: TomlTable) -> PrefixBlocks:
    """``[workload.prefix_blocks] block_tokens, offsets, hashes`` (:class:`PrefixBlocks`)."""
    table = part.table("prefix_blocks", _PREFIX_BLOCKS)
    with table.naming():
        return PrefixBlocks(
            np.asarray(table.array("offsets", of=int), dtype=np.int64),
            np.asarray(table.array("hashes", of=int), dtype=np.int64),
            table.integer("block_tokens", min_value=1),
        )


def _trace(part: TomlTable, base: Path) -> Workload:
    """``trace`` read by :func:`pdopt.workload.read_trace` with ``format`` (default ``"auto"``)
    and, for the formats ``csv`` and ``jsonl``, the column map ``columns`` (a table from
    ``arrival_s``, ``input_tokens``, ``output_tokens`` and the prefix-block keys of
    :data:`pdopt.workload.BLOCK_COLUMNS` to the file's names), ``time_unit`` and
    ``arrival_kind``. A map naming a column the file lacks is an error listing the file's.
    ``hash_block_tokens``: tokens per block of the trace's block hashes (``block_tokens`` of
    :func:`pdopt.workload.read_trace`; Mooncake's default 512)."""
    from pdopt.errors import MissingColumnsError
    from pdopt.workload import (
        ARRIVAL_KINDS,
        COLUMN_MAP_KEYS,
        TIME_UNITS,
        TRACE_FORMATS,
        read_trace,
    )

    path = _existing_file(part, "trace", base)
    fmt = part.string("format", "auto", choices=TRACE_FORMATS)
    options: dict[str, Any] = {}
    if part.has("columns"):
        table = part.table("columns", COLUMN_MAP_KEYS)
        options["columns"] = {key: table.string(key) for key in table.data}
        for key, name in options["columns"].items():
            if not name.strip():
                raise table.error(key, "a column name of the trace", name)
    if part.has("time_unit"):
        options["time_unit"] = part.string("time_unit", choices=TIME_UNITS)
    if part.has("arrival_kind"):
        options["arrival_kind"] = part.string("arrival_kind", choices=ARRIVAL_KINDS)
    if part.has("hash_block_tokens"):
        block_tokens = part.integer("hash_block_tokens", min_value=1)
        if fmt not in ("auto", "mooncake", "csv", "jsonl"):
            raise part.error(
                "hash_block_tokens", f"none with format {fmt!r} (no blocks)", block_tokens
            )
    else:
        block_tokens = None
    if options and fmt not in ("auto", "csv", "jsonl"):
        key = next(iter(options))
        raise part.error(key, f"no {key} with format {fmt!r} (its columns are fixed)", options[key])
    if options.get("time_unit") == "datetime" and options.get("arrival_kind") == "gap":
        raise part.error("arrival_kind", '"time" with time_unit = "datetime"', "gap")
    with part.naming("trace"):  # a bad row: FILE [workload] trace: TRACE row N ...
        try:
            return read_trace(path, fmt, **options, block_tokens=block_tokens)
        except MissingColumnsError as exc:
            if "columns" not in options:
                raise
            expected = f"names of columns in {path.name}, which has {exc.present}"
            raise part.error("columns", expected, options["columns"]) from exc


def _existing_file(part: TomlTable, key: str, base: Path) -> Path:
    """The file ``key`` names, relative to the config's folder; a missing one is an error that
    gives the path looked at."""
    given = part.string(key)
    path = base / given
    if not path.is_file():
        what = "no such file" if not path.exists() else "not a file"
        shown = f"{literal(given)} ({what}: {path.absolute()})"
        raise part.error(key, "a file (a relative path is from the config's folder)", shown=shown)
    return path


def read_cluster(top: TomlTable, base: Path) -> ClusterSpec:
    """``[cluster]``: a GPU × model layout, or the explicit workers :func:`cluster_table` writes."""
    if top.table("cluster").has("workers"):
        return _explicit_cluster(top.table("cluster", _EXPLICIT))
    return _hardware_cluster(top.table("cluster", _HARDWARE), base)


def _hardware_cluster(part: TomlTable, base: Path) -> ClusterSpec:
    from pdopt.costmodel import fit_cost_model, roofline_cost_model
    from pdopt.errors import FitQualityWarning
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import get_model
    from pdopt.profile import read_profile

    gpu, model = _spec(part, "gpu", base, get_gpu), _spec(part, "model", base, get_model)
    tp = part.integer("tp", 1, min_value=1)
    source = part.string("profile", "roofline")
    window = _window(part, model.max_context_tokens)
    args = _layout(part)
    if source != "roofline":
        with part.naming("profile"):
            profile = read_profile(_existing_file(part, "profile", base))
        _check_profiled_model(part, profile.meta.model, model)
        with warnings.catch_warnings(), part.naming("profile"):
            warnings.simplefilter("ignore", FitQualityWarning)  # `pdopt calibrate` reports it
            cost, _ = fit_cost_model(profile, model=model)
    with part.naming():  # e.g. the weights do not fit, a TP the heads do not divide
        if source == "roofline":
            cost = roofline_cost_model(gpu, model, tp)
        cluster = ClusterSpec.from_hardware(gpu, model, cost, tp=tp, **args)
    cluster = with_server_overhead(cluster, _server_overhead(part))
    return dataclasses.replace(cluster, max_context_tokens=window, preempted_requeue=_requeue(part))


SERVER_OVERHEADS = ("none", "vllm_v1")
"""Named server overheads (:data:`pdopt.costmodel.VLLM_V1_OVERHEAD`; ``none``: the engine's
times only)."""


def _server_overhead(part: TomlTable) -> ServerOverhead | None:
    """``[cluster] server_overhead``: ``"none"`` (default), ``"vllm_v1"``, or a table of
    :class:`pdopt.costmodel.ServerOverhead`'s fields."""
    from pdopt.costmodel import VLLM_V1_OVERHEAD

    value = part.raw("server_overhead", "none")
    if isinstance(value, dict):
        fields = ("fixed_s", "per_input_token_s", "stream_iterations")
        table = part.table("server_overhead", fields)
        with part.naming("server_overhead"):
            return ServerOverhead(**{k: table.number(k, 0.0, non_negative=True) for k in fields})
    name = part.string("server_overhead", "none", choices=SERVER_OVERHEADS)
    return VLLM_V1_OVERHEAD if name == "vllm_v1" else None


def with_server_overhead(cluster: ClusterSpec, overhead: ServerOverhead | None) -> ClusterSpec:
    """``cluster`` with every worker's cost model given ``overhead`` (the client's view of TTFT
    and E2E, :attr:`pdopt.costmodel.CostModel.overhead`)."""
    workers = tuple(
        dataclasses.replace(w, cost=dataclasses.replace(w.cost, overhead=overhead))
        for w in cluster.workers
    )
    return dataclasses.replace(cluster, workers=workers)


def _check_profiled_model(part: TomlTable, named: str, model: ModelSpec) -> None:
    """``[cluster] profile`` must measure ``[cluster] model``
    (:func:`~pdopt.model_spec.profiled_model`)."""
    from pdopt.errors import PdoptError
    from pdopt.model_spec import profiled_model

    try:
        same = profiled_model(named, model) == model
    except PdoptError:
        same = False
    if not same:
        shown = f"{part.string('profile')!r}, a profile of {named}"
        raise part.error("profile", f"a profile of the model {model.name}", shown=shown)


def _requeue(part: TomlTable) -> str:
    """``preempted_requeue``: where a preempted request rejoins a prefill queue (default
    ``"front"``, :class:`pdopt.sim.ClusterSpec`)."""
    return part.string("preempted_requeue", "front", choices=PREEMPTED_REQUEUES)


def _key(part: TomlTable, ours: str) -> str:
    """The key ``[cluster]`` sets ``ours`` by: pdopt's name or vLLM's (:data:`_VLLM_NAMES`),
    refusing both."""
    theirs = _VLLM_NAMES[ours]
    if part.has(theirs):
        if part.has(ours):
            raise part.error(
                theirs, f"no value beside {ours!r} (vLLM's name of the same setting)",
                part.raw(theirs),
            )  # fmt: skip
        return theirs
    return ours


def _layout(part: TomlTable) -> dict[str, Any]:
    """The keyword arguments of :meth:`ClusterSpec.from_hardware` that ``[cluster]`` sets."""
    budget_key, seqs_key = _key(part, "max_batch_tokens"), _key(part, "max_running")
    args = {
        "n_prefill": part.integer("n_prefill", min_value=0),
        "n_decode": part.integer("n_decode", min_value=0),
        "n_mixed": part.integer("n_mixed", 0, min_value=0),
        **_kv_terms(part),
        "link": LINK_PRESETS[part.string("link", "nvlink", choices=tuple(sorted(LINK_PRESETS)))],
        "max_batch_tokens": part.integer(budget_key, 8192, min_value=1),
        "max_batch_size": part.integer("max_batch_size", 64, min_value=1),
        "max_running": part.integer(seqs_key, DEFAULT_MAX_RUNNING, min_value=1),
        "mixed_pool_role": Role(part.string("mixed_pool_role", "mixed", choices=_ROLES)),
        "kv_allocation": part.string("kv_allocation", "on_demand", choices=KV_ALLOCATIONS),
        "prefix_caching": part.boolean("prefix_caching", False),
    }
    if budget_key != "max_batch_tokens":  # vLLM's budget is the iteration's, chunks included
        args["chunk_tokens"] = args["max_batch_tokens"]
    if seqs_key != "max_running" and not part.has("max_batch_size"):
        args["max_batch_size"] = args["max_running"]
    return args


def _kv_terms(part: TomlTable) -> dict[str, Any]:
    """The KV capacity keys of ``[cluster]`` (:func:`pdopt.model_spec.kv_capacity` has the
    formula): ``block_tokens`` (:data:`pdopt.cluster.DEFAULT_BLOCK_TOKENS`, 16), and either
    ``kv_capacity_blocks`` (per worker; replaces the formula) or its terms
    ``memory_utilization`` (in (0, 1], 0.9) and ``activation_peak_gib``
    (GiB >= 0; absent: the activation peak of a ``max_batch_tokens``-token pass)."""
    block_key, blocks_key = _key(part, "block_tokens"), _key(part, "kv_capacity_blocks")
    utilization_key = _key(part, "memory_utilization")
    terms: dict[str, Any] = {
        "block_tokens": part.integer(block_key, DEFAULT_BLOCK_TOKENS, min_value=1)
    }
    if part.has(blocks_key):
        clash = [k for k in (utilization_key, "activation_peak_gib") if part.has(k)]
        if clash:
            raise part.error(
                clash[0], f"no value beside {blocks_key!r} (which replaces the formula)",
                part.raw(clash[0]),
            )  # fmt: skip
        terms["kv_capacity_blocks"] = part.integer(blocks_key, min_value=1)
        return terms
    utilization = part.raw(utilization_key, 0.9)
    is_number = isinstance(utilization, int | float) and not isinstance(utilization, bool)
    if not is_number or not 0 < utilization <= 1:
        raise part.error(utilization_key, "a number in (0, 1]", utilization)
    terms["memory_utilization"] = float(utilization)
    if part.has("activation_peak_gib"):
        gib = part.number("activation_peak_gib", non_negative=True)
        terms["activation_bytes"] = gib * 2**30
    return terms


def _window(part: TomlTable, model_window: int | None) -> int | None:
    """``max_context_tokens``: absent or ``"model"`` (the model's window, as ``pdopt plan``
    sizes with it: over-long requests are rejected, each a miss; absent with a model of no
    known window: no check), an int (the deployment's own, vLLM's ``--max-model-len``), or
    ``"none"`` (no check)."""
    value = part.raw("max_context_tokens", None)
    if value is None:
        return model_window
    if value == "none":
        return None
    if value == "model":
        if model_window is None:
            raise part.error("max_context_tokens", "an int: the catalogue has no window", value)
        return model_window
    return part.integer("max_context_tokens", min_value=1)


def _spec(part: TomlTable, key: str, base: Path, get: Callable[[str], _Spec]) -> _Spec:
    """``[cluster] gpu`` or ``model``: a catalogue name or a spec file (:mod:`pdopt._specs_file`;
    a relative path is relative to the config's folder)."""
    from pdopt.errors import ParameterError

    name = part.string(key)
    is_file = name.lower().endswith((".toml", ".json"))
    if is_file:
        name = str(base / name)
    try:
        spec = get(name)
    except ParameterError as exc:
        expected = str(exc).split(": expected ", 1)[-1]
        raise part.error(key, expected, part.string(key)) from exc
    resolved = str(getattr(spec, "name", name))
    if not is_file and resolved.lower() != name.strip().lower():
        # an alias (gpu = "H100" is the SXM board): say which catalogue row it is
        where = f"{part.file} [{part.name}]" if part.name else part.file
        warnings.warn(
            f"{where} {key}: {name!r} is read as {resolved}, the catalogue's row of that name; "
            "for another variant name it exactly or give a spec file",
            PdoptWarning,
            stacklevel=2,
        )
    return spec


def _explicit_cluster(part: TomlTable) -> ClusterSpec:
    workers = part.raw("workers")
    if not isinstance(workers, list) or not all(isinstance(w, dict) for w in workers):
        raise part.error("workers", "a list of tables", workers)
    pairs = part.raw("pair_links", [])
    window = part.raw("max_context_tokens", None)
    requeue = _requeue(part)
    try:
        return build_cluster(
            [_worker(w) for w in workers],
            part.number("kv_bytes_per_token", positive=True),
            link=_link(part.raw("link")),
            pair_links=tuple((p["src"], p["dst"], _link(p["link"])) for p in pairs),
            max_context_tokens=(
                None if window is None else part.integer("max_context_tokens", min_value=1)
            ),
            preempted_requeue=requeue,
            sliding_window=_sliding_window(part.raw("sliding_window", None)),
            prefix_caching=part.boolean("prefix_caching", False),
        )
    except (KeyError, TypeError, ValueError) as exc:
        # A hand-edited explicit table: name the offending field (the file itself is generated).
        raise part.error("workers", "the fields Scenario.to_toml writes", shown=repr(exc)) from exc


def _sliding_window(data: Any) -> SlidingWindow | None:
    return None if data is None else SlidingWindow(**data)


def _worker(data: dict[str, Any]) -> WorkerSpec:
    return WorkerSpec(
        **{**data, "role": Role(data["role"]), "cost": CostModel.from_dict(data["cost"])}
    )


def _link(data: dict[str, Any]) -> LinkSpec:
    return LinkSpec(**data)


def cluster_table(cluster: ClusterSpec) -> dict[str, Any]:
    """The explicit ``[cluster]`` table of ``cluster`` (read back equal by :func:`read_cluster`)."""
    window: dict[str, Any] = (
        {}
        if cluster.max_context_tokens is None
        else {"max_context_tokens": cluster.max_context_tokens}
    )
    sliding = cluster.sliding_window
    if sliding is not None:
        window = {**window, "sliding_window": dataclasses.asdict(sliding)}
    if cluster.prefix_caching:  # written only when on: a file without it reads as before
        window = {**window, "prefix_caching": True}
    return {
        **window,
        "preempted_requeue": cluster.preempted_requeue,
        "kv_bytes_per_token": cluster.kv_bytes_per_token,
        "link": dataclasses.asdict(cluster.link),
        "pair_links": [
            {"src": a, "dst": b, "link": dataclasses.asdict(spec)}
            for a, b, spec in cluster.pair_links
        ],
        "workers": [
            {
                **{f.name: getattr(w, f.name) for f in dataclasses.fields(w)},
                "role": str(w.role),
                "cost": w.cost.to_dict(),
            }
            for w in cluster.workers
        ],
    }


def workload_table(driver: Workload | ClosedLoop) -> dict[str, Any]:
    """The explicit ``[workload]`` table of ``driver`` (arrays; a closed loop's lengths)."""
    lengths = driver.lengths if isinstance(driver, ClosedLoop) else driver
    if not isinstance(lengths, Workload):  # a closed loop's (input, output) arrays
        inputs, outputs = np.asarray(lengths[0]), np.asarray(lengths[1])
        lengths = Workload(np.zeros(len(inputs)), inputs, outputs)
    table: dict[str, Any] = {
        "name": lengths.name,
        "arrival_s": lengths.arrival_s.tolist(),
        "input_tokens": lengths.input_tokens.tolist(),
        "output_tokens": lengths.output_tokens.tolist(),
    }
    blocks = lengths.prefix_blocks
    if blocks is not None:  # only when present, so files without blocks read back as before
        table["prefix_blocks"] = {
            "block_tokens": blocks.block_tokens,
            "offsets": blocks.offsets.tolist(),
            "hashes": blocks.hashes.tolist(),
        }
    if isinstance(driver, ClosedLoop):
        table["n_requests"] = driver.n_requests
        table["closed_loop"] = {
            "clients": driver.clients,
            "think_time_s": driver.think_time_s,
            "think": driver.think,
        }
        if driver.start_spread_s:  # written only when set, so older files read back equal
            table["closed_loop"]["start_spread_s"] = driver.start_spread_s
    return table
