"""What a simulation runs on: SLOs, links, workers and the cluster (frozen values).

Units are SI: seconds, bytes, bytes/s, watts. KV is counted in blocks of ``block_tokens`` tokens
(DESIGN.md "Cost model"); a request holding ``c`` context tokens uses ``ceil(c / block_tokens)``
blocks.

Sliding-window models (:attr:`ClusterSpec.sliding_window`): the sliding layers hold only the
last ``W`` tokens, as vLLM's hybrid KV-cache manager (v0.10 on) frees the blocks that leave the
window. A request of ``c`` context tokens holds ``E(c) = (F·c + S·min(c, W)) / N`` full-token
equivalents (bytes held / ``kv_bytes_per_token``;
:func:`pdopt.model_spec._window.window_held_tokens`) and uses ``ceil(E(c) / block_tokens)``
blocks (:meth:`ClusterSpec.kv_blocks`), in prefill, decode growth, preemption, migration and
transfers alike; P→D transfers move ``E(c)`` tokens' bytes. A first-order pool: real engines
keep a separate block pool per attention type (and a sliding layer's window spans one block
more), which ``ceil`` of the equivalents does not model. The planner
(:meth:`pdopt.plan.Demand.decode_kv_tokens`) counts the same window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING

from pdopt._validation import (
    check_int_at_least,
    check_non_negative,
    check_one_of,
    check_positive,
)
from pdopt.cluster._blocks import kv_blocks
from pdopt.costmodel import CostModel
from pdopt.errors import ConfigError
from pdopt.model_spec import DEFAULT_BLOCK_TOKENS as DEFAULT_BLOCK_TOKENS
from pdopt.model_spec import DEFAULT_MAX_SEQS

if TYPE_CHECKING:
    from pdopt.hardware import GpuSpec
    from pdopt.model_spec import KvCapacity, ModelSpec, SlidingWindow


DEFAULT_MAX_RUNNING = DEFAULT_MAX_SEQS
"""Most requests in a worker's decode running batch unless given (vLLM's ``max_num_seqs``,
256; owned by :data:`pdopt.model_spec.DEFAULT_MAX_SEQS`)."""


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level objectives: time to first token and time per output token, seconds.

    ``timing`` chooses which TTFT/TPOT the SLO counts (:data:`SLO_TIMINGS`):
    ``"first_token"`` (pdopt's, DESIGN.md "Requests": TTFT to the first token, TPOT from it)
    or ``"decode_start"`` (EcoServe's §4.4 / Fig. 6: the wait between the first token and the
    start of decoding counts in TTFT, TPOT starts after it;
    :func:`pdopt.sim.decode_begin_s`). Metrics report both.
    """

    ttft_s: float
    tpot_s: float
    timing: str = "first_token"

    def __post_init__(self) -> None:
        check_positive(self.ttft_s, "ttft_s", "Slo")
        check_positive(self.tpot_s, "tpot_s", "Slo")
        check_one_of(self.timing, SLO_TIMINGS, "timing", "Slo")


SLO_TIMINGS = ("first_token", "decode_start")
"""What an SLO's TTFT and TPOT count (:attr:`Slo.timing`)."""


COLOCATED_SCHEDULES = ("prefill_first", "hybrid")
"""How a mixed worker interleaves phases (see :mod:`pdopt.sim._mixed`)."""

CHUNK_BUDGETS = ("iteration", "prefill")
"""What a hybrid iteration's ``chunk_tokens`` bounds (:attr:`WorkerSpec.chunk_budget`)."""

PREEMPTED_REQUEUES = ("front", "back")
"""Where a preempted request rejoins a prefill queue (:attr:`ClusterSpec.preempted_requeue`)."""

KV_ALLOCATIONS = ("on_demand", "reserve_output")
"""How a decode side allocates a request's KV blocks (:attr:`WorkerSpec.kv_allocation`)."""

PHASES = ("prefill", "decode", "both")
"""Phase modes of a mixed worker (:class:`pdopt.sim.SetPhase`)."""


class Role(StrEnum):
    """What a worker does: prefill only, decode only, or both (colocated)."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A point-to-point link carrying KV: ``time = latency_s + bytes / bw_bytes_per_s``.

    Bandwidth is one direction. Transfers on one link are served first-in first-out: a transfer
    starts when the previous one has put its last byte on the wire (latency overlaps).
    """

    name: str
    bw_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        check_positive(self.bw_bytes_per_s, "bw_bytes_per_s", "LinkSpec")
        check_non_negative(self.latency_s, "latency_s", "LinkSpec")

    def transfer_time_s(self, n_bytes: float) -> float:
        """Seconds to move ``n_bytes`` alone on this link."""
        return self.latency_s + n_bytes / self.bw_bytes_per_s

    @classmethod
    def nvlink(cls) -> LinkSpec:
        """NVLink 3 (A100): 300 GB/s per direction, ~5 µs."""
        return cls("nvlink", 300e9, 5e-6)

    @classmethod
    def pcie4(cls) -> LinkSpec:
        """PCIe Gen4 x16: 32 GB/s per direction, ~10 µs."""
        return cls("pcie4", 32e9, 10e-6)

    @classmethod
    def ethernet(cls, gbit_per_s: float) -> LinkSpec:
        """Ethernet/RDMA at ``gbit_per_s`` (10, 25, 100): line rate / 8 bytes/s, ~20 µs."""
        check_positive(gbit_per_s, "gbit_per_s", "LinkSpec.ethernet")
        return cls(f"{gbit_per_s:g}gbe", gbit_per_s * 1e9 / 8.0, 20e-6)

    @classmethod
    def kv_pool(cls, hop: LinkSpec | None = None) -> LinkSpec:
        """Through a KV pool (Mooncake-style): two store-and-forward hops over ``hop``.

        Each byte crosses ``hop`` twice, so the bandwidth halves and the latency doubles.
        The default hop is 100 GbE.
        """
        hop = cls.ethernet(100) if hop is None else hop
        return cls(f"kvpool({hop.name})", hop.bw_bytes_per_s / 2.0, 2.0 * hop.latency_s)


LINK_PRESETS: dict[str, LinkSpec] = {
    "nvlink": LinkSpec.nvlink(),
    "pcie4": LinkSpec.pcie4(),
    "10gbe": LinkSpec.ethernet(10),
    "25gbe": LinkSpec.ethernet(25),
    "100gbe": LinkSpec.ethernet(100),
    "kvpool": LinkSpec.kv_pool(),
}
"""Named links for configs: ``nvlink``, ``pcie4``, ``10gbe``, ``25gbe``, ``100gbe``, ``kvpool``."""


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One serving instance (a GPU, or a TP group of GPUs acting as one).

    Parameters
    ----------
    name : str
        Unique within the cluster.
    role : Role
        Initial role; policies may change it at run time (elastic pools).
    pool : str
        Pool name (defaults to the role), e.g. ``"mixed"`` for Phasor's spare pool.
    cost : CostModel
        Prefill batch and decode iteration times of this worker.
    kv_capacity_blocks : int
        Paged KV cache size in blocks.
    block_tokens : int
        Tokens per KV block (:data:`DEFAULT_BLOCK_TOKENS`, 16).
    max_batch_tokens : int
        Prefill token budget of one batch; a single longer prompt runs alone.
    max_batch_size : int
        Most requests in one prefill batch.
    max_running : int
        Most requests in the decode running batch.
    idle_power_w, max_power_w : float
        Power at 0 and 100% busy: ``P = P_idle + (P_max - P_idle) * busy``.
    colocated_schedule : {"prefill_first", "hybrid"}
        Used while the role is ``mixed``: ``"prefill_first"`` (vLLM) runs whole prefill batches
        whenever prefills wait, stalling decode; ``"hybrid"`` (Sarathi) runs every running decode
        plus prefill chunks within a budget of ``chunk_tokens`` tokens in each iteration. A
        policy may override these three for every worker (``PolicyTraits``'
        ``colocated_schedule``, ``chunk_tokens``, ``chunk_budget``).
    chunk_tokens : int
        Token budget of one hybrid iteration (Sarathi-Serve's chunk size), see ``chunk_budget``.
    chunk_budget : {"iteration", "prefill"}
        What ``chunk_tokens`` bounds. ``"iteration"`` (Sarathi-Serve): the whole iteration's
        tokens, decode tokens included, so with ``B`` running decodes the prefill chunks get at
        most ``chunk_tokens − B`` tokens, and none when ``B >= chunk_tokens`` (that iteration
        decodes only; decodes are never cut by the budget, ``max_running`` caps them).
        ``"prefill"``: the prefill chunks' tokens only, on top of all running decodes.
    kv_allocation : {"on_demand", "reserve_output"}
        How the decode side allocates KV (DESIGN.md "Fragmentation"; :mod:`pdopt.sim._decode`).
        ``"on_demand"`` (vLLM's paging): admit when the current context's blocks fit, then grow
        a block every ``block_tokens`` generated tokens (with a sliding window, whenever
        :meth:`ClusterSpec.kv_blocks` of its context steps up), preempting the youngest request when
        growth does not fit. ``"reserve_output"``: admit only when the request's whole expected
        footprint fits, prompt plus expected output (``input + output − 1`` tokens: the
        request's own ``output_tokens``, an oracle of its length), and hold those blocks from
        admission to its end (no growth, no growth preemption). Reserving strands free space
        that no waiting request's full reservation fits in, the fragmentation the Phasor paper
        measures. Workers of one cluster may allocate differently; both engines run both.
    """

    name: str
    role: Role
    cost: CostModel
    kv_capacity_blocks: int
    pool: str = ""
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    max_batch_tokens: int = 8192
    max_batch_size: int = 64
    max_running: int = DEFAULT_MAX_RUNNING
    idle_power_w: float = 0.0
    max_power_w: float = 0.0
    colocated_schedule: str = "prefill_first"
    chunk_tokens: int = 512
    kv_allocation: str = "on_demand"
    chunk_budget: str = "iteration"

    def __post_init__(self) -> None:
        owner = "WorkerSpec"
        check_one_of(self.colocated_schedule, COLOCATED_SCHEDULES, "colocated_schedule", owner)
        check_one_of(self.chunk_budget, CHUNK_BUDGETS, "chunk_budget", owner)
        check_one_of(self.kv_allocation, KV_ALLOCATIONS, "kv_allocation", owner)
        check_int_at_least(self.chunk_tokens, 1, "chunk_tokens", owner)
        object.__setattr__(self, "role", Role(self.role))
        if not self.pool:
            object.__setattr__(self, "pool", str(self.role))
        check_int_at_least(self.kv_capacity_blocks, 1, "kv_capacity_blocks", owner)
        check_int_at_least(self.block_tokens, 1, "block_tokens", owner)
        check_int_at_least(self.max_batch_tokens, 1, "max_batch_tokens", owner)
        check_int_at_least(self.max_batch_size, 1, "max_batch_size", owner)
        check_int_at_least(self.max_running, 1, "max_running", owner)
        check_non_negative(self.idle_power_w, "idle_power_w", owner)
        check_non_negative(self.max_power_w, "max_power_w", owner)
        if self.max_power_w < self.idle_power_w:
            raise ConfigError(
                f"worker {self.name!r}: max_power_w={self.max_power_w} is below "
                f"idle_power_w={self.idle_power_w}"
            )


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Workers, KV size per token and the links between them.

    ``link`` joins every pair of workers unless ``pair_links`` names a link for an ordered pair
    ``(src_name, dst_name, LinkSpec)``. Each ordered pair is its own FIFO link.
    ``kv_bytes_per_token`` is what one transfer moves per context token held in every layer;
    ``sliding_window`` (:class:`pdopt.model_spec.SlidingWindow`, the served model's sliding-window
    layers; None: all layers full attention) makes a transfer of ``L`` prompt tokens move
    ``kv_bytes_per_token · held_tokens(L)`` bytes (the sliding layers send only their window).
    The workers' KV blocks count the window too (:meth:`kv_blocks`, module docstring).
    ``max_context_tokens`` is the served model's context window: :func:`pdopt.sim.simulate`
    rejects an open-loop request whose prompt (or prompt + output) exceeds it, before the run,
    with the reason (:mod:`pdopt.sim._window`); None (the default) checks nothing.
    ``preempted_requeue`` is where a request preempted by recompute rejoins the prefill queue of
    the worker its policy routes it to (:mod:`pdopt.sim._engine`): ``"front"`` (the default,
    vLLM and Sarathi-Serve: ahead of every request waiting there, several preempted at one
    boundary keeping their admission order) or ``"back"`` (behind them, as a new arrival).
    ``prefix_caching`` turns on every worker's prefix cache (:mod:`pdopt.sim._prefix_cache`,
    vLLM's automatic prefix caching): a workload's prompt blocks
    (:attr:`pdopt.workload.Workload.prefix_blocks`) already computed on a worker skip their
    prefill compute there; off (the default), or without prefix blocks, runs are exactly those
    without a cache.
    ``kv_accounting`` records how :meth:`from_hardware` derived the workers' KV capacity (its
    terms, :class:`pdopt.model_spec.KvCapacity`); None when the capacity was given. It describes
    and never decides (the workers' ``kv_capacity_blocks`` do), so equality ignores it.
    """

    workers: tuple[WorkerSpec, ...]
    kv_bytes_per_token: float
    link: LinkSpec = field(default_factory=LinkSpec.nvlink)
    pair_links: tuple[tuple[str, str, LinkSpec], ...] = ()
    max_context_tokens: int | None = None
    preempted_requeue: str = "front"
    kv_accounting: KvCapacity | None = field(default=None, compare=False)
    sliding_window: SlidingWindow | None = None
    prefix_caching: bool = False

    def __post_init__(self) -> None:
        check_one_of(self.preempted_requeue, PREEMPTED_REQUEUES, "preempted_requeue", "ClusterSpec")
        if not isinstance(self.prefix_caching, bool):
            raise ConfigError(f"prefix_caching must be true or false; got {self.prefix_caching!r}")
        object.__setattr__(self, "workers", tuple(self.workers))
        object.__setattr__(self, "pair_links", tuple(self.pair_links))
        check_positive(self.kv_bytes_per_token, "kv_bytes_per_token", "ClusterSpec")
        if self.max_context_tokens is not None:
            check_int_at_least(self.max_context_tokens, 1, "max_context_tokens", "ClusterSpec")
        if not self.workers:
            raise ConfigError("the cluster has no workers; give at least one prefill worker")
        names = [w.name for w in self.workers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"worker names must be unique; repeated: {dupes}")
        known = set(names)
        for src, dst, _ in self.pair_links:
            if src not in known or dst not in known:
                raise ConfigError(f"pair link ({src!r}, {dst!r}) names an unknown worker")
        sizes = sorted({w.block_tokens for w in self.workers})
        if len(sizes) > 1:
            raise ConfigError(f"all workers must use the same block_tokens; got {sizes}")
        roles = {w.role for w in self.workers}
        if not roles & {Role.PREFILL, Role.MIXED}:
            raise ConfigError("the cluster has no prefill or mixed worker: no one can prefill")

    @property
    def block_tokens(self) -> int:
        """Tokens per KV block (the same on every worker)."""
        return self.workers[0].block_tokens

    @property
    def kv_window(self) -> tuple[int, int, int]:
        """``(W, S, N)``: window tokens, sliding layers, all layers, as
        :func:`pdopt.cluster._blocks.kv_blocks` takes them; ``(0, 0, 1)`` without a window."""
        w = self.sliding_window
        return (0, 0, 1) if w is None else (w.window_tokens, w.sliding_layers, w.num_layers)

    def kv_blocks(self, tokens: int) -> int:
        """KV blocks of a request holding ``tokens`` context tokens:
        ``ceil(E(tokens) / block_tokens)`` (:func:`pdopt.cluster._blocks.kv_blocks`)."""
        return kv_blocks(tokens, self.block_tokens, *self.kv_window)

    def block_counter(self) -> Callable[[int], int]:
        """:meth:`kv_blocks` with the cluster's constants bound once.

        NOTE: a ``functools.partial`` (called in C) for the engines' hot paths, where the
        method's property look-ups cost ~10% of a dense run."""
        window, sliding, layers = self.kv_window
        return partial(
            kv_blocks, bt=self.block_tokens, window=window, sliding=sliding, layers=layers
        )

    def link_between(self, src: str, dst: str) -> LinkSpec:
        """The link used from worker ``src`` to worker ``dst``."""
        for a, b, spec in self.pair_links:
            if a == src and b == dst:
                return spec
        return self.link

    def count(self, role: Role | str) -> int:
        """Workers whose initial role is ``role``."""
        return sum(1 for w in self.workers if w.role == Role(role))

    @classmethod
    def build(
        cls,
        cost: CostModel,
        n_prefill: int,
        n_decode: int,
        n_mixed: int = 0,
        *,
        kv_capacity_blocks: int = 4096,
        kv_bytes_per_token: float = 131072.0,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        max_batch_tokens: int = 8192,
        max_batch_size: int = 64,
        max_running: int = DEFAULT_MAX_RUNNING,
        link: LinkSpec | None = None,
        idle_power_w: float = 60.0,
        max_power_w: float = 400.0,
        mixed_pool_role: Role | str = Role.MIXED,
        colocated_schedule: str = "prefill_first",
        chunk_tokens: int = 512,
        kv_allocation: str = "on_demand",
        chunk_budget: str = "iteration",
        preempted_requeue: str = "front",
        prefix_caching: bool = False,
    ) -> ClusterSpec:
        """A homogeneous cluster ``p0..``, ``d0..``, ``m0..`` of identical workers.

        Mixed-pool workers get role ``mixed_pool_role`` in pool ``"mixed"``: ``"mixed"`` for
        colocated serving, or ``"prefill"``/``"decode"`` for a spare pool a policy promotes from.
        ``kv_allocation`` and ``chunk_budget`` are every worker's (:class:`WorkerSpec`),
        ``preempted_requeue`` the cluster's.
        The default KV bytes per token is Llama-3-8B in FP16 (2·32 layers·8 KV heads·128·2 B =
        131072); pass your model's value (:attr:`pdopt.model_spec.ModelSpec.kv_bytes_per_token`).
        """
        owner = "ClusterSpec.build"
        n_prefill = check_int_at_least(n_prefill, 0, "n_prefill", owner)
        n_decode = check_int_at_least(n_decode, 0, "n_decode", owner)
        n_mixed = check_int_at_least(n_mixed, 0, "n_mixed", owner)
        common = dict(
            kv_capacity_blocks=kv_capacity_blocks,
            block_tokens=block_tokens,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            max_running=max_running,
            idle_power_w=idle_power_w,
            max_power_w=max_power_w,
            colocated_schedule=colocated_schedule,
            chunk_tokens=chunk_tokens,
            kv_allocation=kv_allocation,
            chunk_budget=chunk_budget,
        )
        workers = [worker_spec(f"p{i}", Role.PREFILL, cost, **common) for i in range(n_prefill)]  # type: ignore[arg-type]
        workers += [worker_spec(f"d{i}", Role.DECODE, cost, **common) for i in range(n_decode)]  # type: ignore[arg-type]
        workers += [
            worker_spec(f"m{i}", mixed_pool_role, cost, pool="mixed", **common)  # type: ignore[arg-type]
            for i in range(n_mixed)
        ]
        return build_cluster(
            workers,
            kv_bytes_per_token,
            link=link,
            preempted_requeue=preempted_requeue,
            prefix_caching=prefix_caching,
        )

    def with_engine_args(
        self,
        *,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        block_size: int | None = None,
        gpu_memory_utilization: float | None = None,
        num_gpu_blocks: int | None = None,
        enable_prefix_caching: bool | None = None,
    ) -> ClusterSpec:
        """This cluster with vLLM's engine arguments set on every worker (None: unchanged).

        ``max_num_batched_tokens`` is vLLM V1's token budget of one iteration: each worker's
        ``max_batch_tokens`` and its colocated chunk budget ``chunk_tokens``; ``max_num_seqs``
        its ``max_running`` and ``max_batch_size``; ``block_size`` its ``block_tokens``;
        ``num_gpu_blocks`` (``--num-gpu-blocks-override``) its KV blocks; ``gpu_memory_utilization``
        recomputes the KV blocks by :attr:`kv_accounting`'s formula (a cluster whose KV was given
        in blocks has no formula: give ``num_gpu_blocks``); a new ``block_size`` alone keeps the
        KV tokens (whole blocks); ``enable_prefix_caching`` sets :attr:`prefix_caching`.
        """
        owner = "ClusterSpec.with_engine_args"
        changes: dict[str, object] = {}
        if max_num_batched_tokens is not None:
            budget = check_int_at_least(max_num_batched_tokens, 1, "max_num_batched_tokens", owner)
            changes.update(max_batch_tokens=budget, chunk_tokens=budget)
        if max_num_seqs is not None:
            seqs = check_int_at_least(max_num_seqs, 1, "max_num_seqs", owner)
            changes.update(max_running=seqs, max_batch_size=seqs)
        block = self.block_tokens
        if block_size is not None:
            block = check_int_at_least(block_size, 1, "block_size", owner)
            changes["block_tokens"] = block
        terms = self.kv_accounting
        if num_gpu_blocks is not None:
            blocks = check_int_at_least(num_gpu_blocks, 1, "num_gpu_blocks", owner)
            terms = None
        elif gpu_memory_utilization is not None:
            if terms is None:
                raise ConfigError(
                    "gpu_memory_utilization needs a cluster whose KV capacity comes from the GPU's "
                    "memory (built from gpu and model); this one gives its KV in blocks: set "
                    "num_gpu_blocks instead"
                )
            utilization = float(gpu_memory_utilization)
            if not 0 < utilization <= 1:
                raise ConfigError(
                    f"gpu_memory_utilization must be in (0, 1]; got {gpu_memory_utilization!r}"
                )
            terms = dataclasses.replace(terms, memory_utilization=utilization, block_tokens=block)
            blocks = terms.blocks
        elif block_size is not None and terms is not None:
            terms = dataclasses.replace(terms, block_tokens=block)
            blocks = terms.blocks
        elif block_size is not None:
            blocks = -1  # per worker: its KV tokens in the new blocks
        else:
            blocks = 0  # unchanged
        workers = []
        for w in self.workers:
            mine = dict(changes)
            if blocks > 0:
                mine["kv_capacity_blocks"] = blocks
            elif blocks < 0:
                mine["kv_capacity_blocks"] = max(w.kv_capacity_blocks * w.block_tokens // block, 1)
            workers.append(dataclasses.replace(w, **mine))  # type: ignore[arg-type]
        caching = self.prefix_caching if enable_prefix_caching is None else enable_prefix_caching
        return dataclasses.replace(
            self, workers=tuple(workers), kv_accounting=terms, prefix_caching=bool(caching)
        )

    @classmethod
    def from_hardware(
        cls,
        gpu: GpuSpec,
        model: ModelSpec,
        cost: CostModel,
        n_prefill: int,
        n_decode: int,
        n_mixed: int = 0,
        *,
        tp: int = 1,
        memory_utilization: float = 0.9,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        activation_bytes: float | None = None,
        kv_capacity_blocks: int | None = None,
        max_batch_tokens: int = 8192,
        max_running: int = DEFAULT_MAX_RUNNING,
        link: LinkSpec | None = None,
        **kwargs: object,
    ) -> ClusterSpec:
        """A homogeneous cluster of ``gpu`` × ``tp`` instances serving ``model``.

        KV capacity: ``kv_capacity_blocks`` when given (the formula is skipped); otherwise
        :func:`pdopt.model_spec.kv_capacity` (vLLM's accounting: memory × ``memory_utilization``
        − weights per GPU − ``activation_bytes``, by default the activation peak of a
        ``max_batch_tokens``-token pass over ``max_running`` sequences, in blocks of
        ``block_tokens``), whose terms :attr:`kv_accounting` keeps. KV bytes per token are per
        GPU (each GPU of a TP group sends its share over its own link in parallel); power is the
        GPUs' data-sheet power × tp. The model's sliding-window layers (if any) set
        :attr:`sliding_window`. The default link is the GPU's intra-node link. ``kwargs``
        go to :meth:`build` (e.g. ``kv_allocation="reserve_output"``).
        """
        from pdopt.model_spec import kv_bytes_per_token, kv_capacity

        terms = None
        if kv_capacity_blocks is None:
            terms = kv_capacity(
                gpu,
                model,
                tp,
                memory_utilization=memory_utilization,
                block_tokens=block_tokens,
                activation_bytes=activation_bytes,
                batched_tokens=max_batch_tokens,
                max_seqs=max_running,
            )
            kv_capacity_blocks = terms.blocks
        if link is None:
            link = gpu_link(gpu)
        cluster = cls.build(
            cost,
            n_prefill,
            n_decode,
            n_mixed,
            kv_capacity_blocks=kv_capacity_blocks,
            kv_bytes_per_token=float(kv_bytes_per_token(model, tp)),
            block_tokens=block_tokens,
            max_batch_tokens=max_batch_tokens,
            max_running=max_running,
            link=link,
            idle_power_w=gpu.idle_power_w * tp,
            max_power_w=gpu.max_power_w * tp,
            **kwargs,  # type: ignore[arg-type]
        )
        return dataclasses.replace(
            cluster, kv_accounting=terms, sliding_window=model.sliding_window
        )


def gpu_link(gpu: GpuSpec) -> LinkSpec:
    """The intra-node link of ``gpu`` (its data-sheet bandwidth, 5 µs latency)."""
    return LinkSpec(f"{gpu.name}-link", gpu.link_bw_bytes_per_s, 5e-6)


def worker_spec(
    name: str,
    role: Role | str,
    cost: CostModel,
    *,
    kv_capacity_blocks: int | None = None,
    kv_tokens: float | None = None,
    gpu: GpuSpec | None = None,
    tp: int = 1,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    max_running: int = DEFAULT_MAX_RUNNING,
    **fields: object,
) -> WorkerSpec:
    """One worker as every cluster builder makes it (:func:`build_cluster`).

    KV: ``kv_capacity_blocks``, or ``kv_tokens`` in whole blocks of ``block_tokens`` (at least
    one). Power: with ``gpu``, its data-sheet idle and maximum power × ``tp`` (so a plan's
    simulation reports energy; issue 37), unless ``fields`` give ``idle_power_w`` /
    ``max_power_w``. ``fields`` are the other :class:`WorkerSpec` fields.
    """
    if kv_capacity_blocks is None:
        if kv_tokens is None:
            raise ConfigError(f"worker {name!r}: give kv_capacity_blocks or kv_tokens")
        kv_capacity_blocks = max(1, int(kv_tokens // block_tokens))
    if gpu is not None:
        fields.setdefault("idle_power_w", gpu.idle_power_w * tp)
        fields.setdefault("max_power_w", gpu.max_power_w * tp)
    return WorkerSpec(
        name, Role(role), cost, kv_capacity_blocks, block_tokens=block_tokens,
        max_running=max_running, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def build_cluster(
    workers: Sequence[WorkerSpec],
    kv_bytes_per_token: float,
    *,
    link: LinkSpec | None = None,
    gpu: GpuSpec | None = None,
    model: ModelSpec | None = None,
    **fields: object,
) -> ClusterSpec:
    """The one cluster builder: :meth:`ClusterSpec.build` and :meth:`ClusterSpec.from_hardware`
    (hence scenarios' ``[cluster]`` tables), the planner's checks
    (:func:`pdopt.plan.cluster_for_plan`, its colocated modes) and explicit scenario tables make
    their clusters here.

    ``link`` defaults to ``gpu``'s intra-node link (:func:`gpu_link`), else NVLink. ``model``
    (the served model) sets :attr:`ClusterSpec.sliding_window` and
    :attr:`ClusterSpec.max_context_tokens` unless ``fields`` give them. ``fields`` are the
    other :class:`ClusterSpec` fields.
    """
    if link is None:
        link = gpu_link(gpu) if gpu is not None else LinkSpec.nvlink()
    if model is not None:
        fields.setdefault("sliding_window", model.sliding_window)
        fields.setdefault("max_context_tokens", model.max_context_tokens)
    return ClusterSpec(tuple(workers), kv_bytes_per_token, link, **fields)  # type: ignore[arg-type]
