"""The policy interface: what a policy sees (request info), decides (worker indices) and does
(actions on the control tick).

A policy is an object with four hooks; :class:`Policy` gives no-op defaults (route to the first
worker of the right role is *not* a default: routing hooks must be overridden). The engine calls

* ``start(ctx)`` once per run, before anything else, with the run's :class:`RunContext` (cluster,
  SLO, control tick, seed): reset per-run state here, so one policy object can run several
  simulations with identical results, and take the run's SLO and tick from ``ctx`` rather than
  from defaults of its own;
* ``route_prefill(request, view) -> int`` at arrival (and when a preempted request goes back to be
  re-prefilled): the index of a worker whose current role is prefill or mixed;
* ``route_decode(request, view) -> int`` when the request's prefill ends (output_tokens >= 2): the
  index of a worker whose current role is decode or mixed and whose KV capacity holds the
  request's peak footprint;
* ``on_tick(view) -> Sequence[Action]`` every ``tick_s`` of simulated time.

``view`` is a read-only :class:`pdopt.sim.ClusterView` valid only during the call.
Invalid decisions raise :class:`PolicyDecisionError` naming the policy.

What the engine must know about a policy before the run (does it act on ticks, does it force a
colocated schedule, has it a compiled twin) it reads once from ``policy.traits()``, a frozen
:class:`PolicyTraits`; it never probes a policy's attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import numpy as np

from pdopt.cluster._spec import CHUNK_BUDGETS, ClusterSpec, Slo
from pdopt.errors import ConfigError, PdoptError

if TYPE_CHECKING:
    from pdopt.cluster._spec import Role
    from pdopt.sim._view import ClusterView


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a policy legitimately knows about the run before it starts (``Policy.start``).

    Attributes
    ----------
    cluster : ClusterSpec
        The workers, their initial roles and pools, links and cost models.
    slo : Slo
        The run's SLOs: a policy that steers by an SLO (Φ_T's T_TTFT_SLO, Arrow's and EcoServe's
        TTFT/TPOT checks) uses these unless one of its flags overrides them explicitly.
    tick_s : float
        The control tick Δt, seconds: ``on_tick`` is called every ``tick_s`` of simulated time.
    seed : int
        The run's seed (for a policy that draws random numbers; none of the built-in ones do).
    """

    cluster: ClusterSpec
    slo: Slo
    tick_s: float
    seed: int = 0


@dataclass(frozen=True, slots=True)
class PolicyTraits:
    """What the engine must know about a policy before the run, declared once.

    Attributes
    ----------
    wants_ticks : bool
        ``on_tick`` does something: the engine skips control ticks (a large saving on long runs)
        when this is False and no time series is recorded.
    colocated_schedule : {"prefill_first", "hybrid"} or None
        Forces the schedule of every mixed worker (:mod:`pdopt.sim._mixed`); None keeps each
        worker's own ``WorkerSpec.colocated_schedule``.
    chunk_tokens : int or None
        Forces the chunked-prefill budget of every mixed worker; None keeps each worker's own.
    chunk_budget : {"iteration", "prefill"} or None
        Forces what that budget bounds on every mixed worker (``WorkerSpec.chunk_budget``:
        the whole iteration, decode tokens included, or the prefill chunks only); None keeps
        each worker's own.
    compiled_routing : (str, str) or None
        (prefill, decode) routing of this policy's twin in the compiled engine
        (:mod:`pdopt.sim._compiled`), or None. A twin must route exactly as the policy's hooks
        do, so a subclass that overrides them declares None.
    """

    wants_ticks: bool = False
    colocated_schedule: str | None = None
    chunk_tokens: int | None = None
    chunk_budget: str | None = None
    compiled_routing: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.colocated_schedule not in (None, "prefill_first", "hybrid"):
            raise ConfigError(
                f"PolicyTraits.colocated_schedule must be None, 'prefill_first' or 'hybrid'; "
                f"got {self.colocated_schedule!r}"
            )
        if self.chunk_budget not in (None, *CHUNK_BUDGETS):
            raise ConfigError(
                f"PolicyTraits.chunk_budget must be None, 'iteration' or 'prefill'; "
                f"got {self.chunk_budget!r}"
            )
        if self.chunk_tokens is not None and (
            isinstance(self.chunk_tokens, bool)
            or not isinstance(self.chunk_tokens, int)
            or self.chunk_tokens < 1
        ):
            raise ConfigError(
                f"PolicyTraits.chunk_tokens must be None or an int >= 1; got {self.chunk_tokens!r}"
            )


class PolicyDecisionError(PdoptError):
    """A policy returned a decision the engine cannot apply (message names the policy)."""


def as_index(value: object, size: int) -> int | None:
    """``value`` as an index in ``0..size-1`` (Python or numpy int, not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return None
    index = int(value)
    return index if 0 <= index < size else None


def action_worker(action: MoveWorker | SetPhase, n_workers: int, policy_name: str) -> int:
    """The worker index ``action`` names; raises PolicyDecisionError naming the policy."""
    w = as_index(action.worker, n_workers)
    if w is None:
        raise PolicyDecisionError(
            f"policy {policy_name!r}: {type(action).__name__} names worker {action.worker!r}; "
            f"valid indices are 0..{n_workers - 1}"
        )
    return w


class RequestInfo(NamedTuple):
    """What a routing hook knows about one request (immutable).

    NOTE: a NamedTuple, not a frozen dataclass: one is built per routing call, and a tuple is
    built several times faster, which matters at 10^5 requests per second.

    ``prefill_tokens`` is what the coming prefill computes: the prompt, plus the tokens already
    generated when the request was preempted (recompute). ``kv_blocks`` is the KV it needs to be
    admitted to decode now; ``peak_kv_blocks`` what it holds at its last decode iteration.
    """

    request_id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    prefill_tokens: int
    kv_blocks: int
    peak_kv_blocks: int
    preemptions: int


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move running request ``request_id``'s KV to decode worker ``dst_worker`` (pipelined
    pre-copy, :mod:`pdopt.sim._migration`).

    Pre-copy stops once a stage leaves at most ``stop_dirty_blocks`` blocks dirtied, or after
    ``max_precopy_stages`` stages; a stop-and-copy then moves the rest (the only downtime).
    """

    request_id: int
    dst_worker: int
    stop_dirty_blocks: int = 2
    max_precopy_stages: int = 8


@dataclass(frozen=True, slots=True)
class MoveWorker:
    """Put ``worker`` in ``pool`` with ``role`` (elastic pools); see the engine for draining."""

    worker: int
    pool: str
    role: Role | str


@dataclass(frozen=True, slots=True)
class SetPhase:
    """Temporal disaggregation: a mixed worker serves only ``phase`` ("prefill", "decode" or
    "both")."""

    worker: int
    phase: str


Action = Migrate | MoveWorker | SetPhase


@runtime_checkable
class PolicyProtocol(Protocol):
    """The hooks the engine calls (see the module docstring)."""

    name: str

    def traits(self) -> PolicyTraits: ...

    def start(self, ctx: RunContext) -> None: ...

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int: ...

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int: ...

    def on_tick(self, view: ClusterView) -> Sequence[Action]: ...


class Policy:
    """Base class with no-op hooks; subclasses override the routing hooks.

    ``traits()`` returns the class attribute ``TRAITS`` (no ticks, no forced schedule, no
    compiled twin); a subclass whose traits depend on its flags overrides ``traits``.
    """

    name: str = "policy"
    TRAITS = PolicyTraits()

    def traits(self) -> PolicyTraits:
        """What the engine must know before the run (:class:`PolicyTraits`)."""
        return self.TRAITS

    def start(self, ctx: RunContext) -> None:
        """Reset per-run state (no-op)."""

    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        raise NotImplementedError(f"policy {self.name!r} does not implement route_prefill")

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        raise NotImplementedError(f"policy {self.name!r} does not implement route_decode")

    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        """Actions to apply at this tick (none)."""
        return ()
