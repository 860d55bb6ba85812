"""The compiled engine: the request-level engine's semantics, bit for bit, in numba.

The Python engine (:mod:`pdopt.sim._engine`) is the reference and runs everything. This package
re-implements the part of it that long runs spend their time in, for runs that qualify
(``simulate``'s ``engine`` argument; ``pdopt.sim._simulate._compiled_codes`` decides and says
why a run does not): an open- or closed-loop driver under a built-in routing policy whose
``PolicyTraits.compiled_routing`` names its twin here (the policy object's hooks are not
called), on

* a disaggregated cluster (every worker prefill or decode) under round_robin, least_loaded,
  static_split, distserve, memory_centric, min_load_tokens, cache_aware, vllm, sarathi,
  splitwise, mooncake, phasor, arrow or ecoserve (whose first tick makes its instances mixed)
  (:mod:`pdopt.sim._compiled._mooncake` keeps the policy's own mirror of the links; the
  policies' one-iteration predictions, MoE expert term included, are
  :func:`pdopt.sim._compiled._decode.iteration_s`): arrivals, FCFS prefill batches, FIFO KV
  links, decode admission queues and continuous batching advanced in closed form;
* an all-mixed (colocated) cluster under vllm or ecoserve (``prefill_first``: whole prefill
  batches with the decodes stalled) or sarathi (``hybrid``: every iteration one fused pass of
  the running decodes and prefill chunks within ``chunk_tokens``, budget ``"iteration"`` or
  ``"prefill"``), with any of their routings (decodes stay where they were prefilled when that
  worker holds their peak KV): vLLM V1's ``max_num_seqs`` gate on new prompts, one KV cache
  shared by the prompts in prefill and the decodes, recompute preemption
  (:mod:`pdopt.sim._compiled._mixed`, :mod:`pdopt.sim._mixed`'s scheduling in a worker's phase);
  under min_load_tokens each worker keeps its own schedule and a request decodes on the mixed
  worker with the fewest running tokens (over a link when that is another worker).

Four policies act on control ticks here. Splitwise, whose ``on_tick`` twin
(:mod:`pdopt.sim._compiled._pools`, named by the policy's ``compiled_tick()``) moves one Mixed-pool
worker between prefill and decode (``MoveWorker``, Control.move_worker's semantics: queues routed
again, a batch finished or a decode batch drained before the worker serves its new role). Phasor:
its Φ routing (:mod:`pdopt.sim._compiled._phasor`) and its three loops
(:mod:`pdopt.sim._compiled._phasor_tick`: defragmentation, the Mixed pool's flow and the evacuation
of promoted members, the rules of :mod:`pdopt.sim._compiled._freeness`), whose migrations
(pipelined pre-copy, stop-and-copy) the engine runs as the Python engine's ``Migrations``
(:mod:`pdopt.sim._compiled._migration`). Arrow (:mod:`pdopt.sim._compiled._arrow`): its SLO-aware
routing, instance flips and monitor; its first tick makes every instance mixed (Control.move_worker
and Colocated.move, ``_loop._to_mixed``), after which its flips relabel pools, or, single-role,
flips move workers between prefill and decode. EcoServe (:mod:`pdopt.sim._compiled._ecoserve`):
its overall scheduler, Alg. 1 over its macro instances with Alg. 2's checks, its decode routing,
its prefill phases (SetPhase, :func:`pdopt.sim._compiled._loop.set_phase`: the engine's phase
gates of :mod:`pdopt.sim._compiled._mixed`) and its mitosis (instances joining from standby,
macro instances splitting and merging, idle instances back to standby as prefill workers). Their
ticks
then run every ``tick_s``. The others never act on a tick, so their runs never move a worker or
change a phase; a mixed worker leaves its role only idle, to the prefill role (``ERR_UNSUPPORTED``
hands any other such run back). With a time series, the control tick's false-OOM checks and
telemetry rows run too (each row's pool and role as at that tick). Workers with
``kv_allocation="reserve_output"`` (``W_RESERVE``, :func:`pdopt.sim._compiled._decode.blocks_for`)
run beside on-demand ones. Arrow with ``colocated=False`` on workers mixed from the start
(``Arrow.compiled_unsupported``: a flip would move a busy instance out of the mixed role), and
clusters that start with mixed workers beside prefill or decode ones stay on the Python engine.

Client timeouts (``client_timeout_s``, :mod:`pdopt.sim._engine`'s "Client timeouts"): under the
policies that act on no control tick, under Splitwise and under Phasor
(``pdopt.sim._simulate._no_timeouts``: Arrow's and EcoServe's runs with timeouts stay on the
Python engine), each arrival
schedules its client's ``Event.ABORT`` where Engine.on_arrival does (so the sequence numbers, and
the ties, are the Python engine's), and :func:`pdopt.sim._compiled._loop._on_abort` mirrors
Engine.on_abort and Engine._withdraw: a request queued for prefill or decode admission leaves
its queue (a scan of the linked list), a chunked prompt not in the iteration in flight is dropped
at once, one in it (``R_ABORTING``) and a whole batch's prompt when the step ends, a running
decode (``R_ABORTING``, ``W_ABORTING``) at its worker's next boundary, visited for it (dropped in
admission order, as DecodeSide._drop), and KV in flight when it lands; a migration is cancelled
(pre-copy, departing) or ended with both sides' holds freed (stop-and-copy, joining:
``_loop._abort_migration``, Migrations.abort); one Phasor started on a running request whose
client already gave up is cancelled after the boundary that drops it, before the next one is
scheduled (Engine._dropped; ``_decode.L_DROP``, ``G_DROP_N``). The run may end with a step in
flight (its busy time counted to the end, as the Python engine's ``busy_until``).

Prefix caching (:mod:`pdopt.sim._compiled._prefix`): each worker's cache of prompt blocks by
chained key, its LRU eviction at each lookup, references held from a prompt's start to its
request leaving the worker, the hits' skipped compute in batches, chunks and queued work, and the
cache-aware routings (``prefix_affinity``, ``kv_aware``) that read it.

Exactness: the decode closed forms are :mod:`pdopt.sim._closed_form`'s functions, compiled; the
codes are :mod:`pdopt.sim._enums`'; every other floating-point expression is written in the same
order as in the Python engine (numba compiles without fast-math, so IEEE semantics hold); events get
the same sequence numbers, and ties break the same way, so the per-request table, the event log,
busy times and makespan are identical (tests/sim/test_sim_compiled.py,
tests/sim/test_sim_compiled_colocated.py and tests/sim/test_sim_compiled_min_load.py compare them
on random workloads and clusters). Two things differ in form, not in result: a decode worker's
superseded boundary event is removed from the event heap instead of being skipped when popped, and
a decode worker's finish heap removes a preempted request at once instead of lazily. A run that
hits an error (a policy decision the engine must refuse) stops and returns a code; the caller
reruns it on the Python engine, which raises the full error.

The fused pass of a hybrid iteration is priced in the expression order of
:meth:`pdopt.costmodel.CostModel.hybrid_iteration_time_s`, its rule
:func:`pdopt.costmodel._hybrid.fused_iteration_s` compiled from its own source. A mixed worker's
superseded boundary event is removed from the heap too (the Python engine leaves it stale). A
compiled run that reaches a colocated state outside the scheduler's invariants (never observed)
stops with ``ERR_UNSUPPORTED`` and is rerun on the Python engine.

Modules, in the order they build on each other: ``_state`` (the run state, one
:class:`~pdopt.sim._compiled._state.State` tuple, and its column layout), ``_jit`` (compile
options, the compiled closed forms), ``_heap`` (event and finish heaps), ``_decode`` and
``_prefill`` (the two sides of a worker), ``_mixed`` (a mixed worker's steps), ``_mooncake``
(Mooncake's routing twin), ``_tick`` (false OOMs and the time series), ``_migration`` (migrations'
start, copies and record), ``_freeness`` (Phasor's flow and defragmentation rules), ``_phasor``
(its Φ and routing), ``_arrow`` (Arrow's routing and tick), ``_prefix`` (prefix caching),
``_routing`` (the policies' routing
twins), ``_pools`` (pool moves and
Splitwise's tick rule), ``_phasor_tick`` (Phasor's), ``_loop`` (the event loop and the request
path), ``_io`` (tables in, results out).
"""

from __future__ import annotations

from pdopt.sim._compiled._io import CompiledOutcome, run
from pdopt.sim._compiled._loop import run_events
from pdopt.sim._compiled._routing import routing_codes


def is_loaded() -> bool:
    """True once this process has compiled the engine or loaded it from numba's cache."""
    return bool(run_events.signatures)


__all__ = ["CompiledOutcome", "is_loaded", "routing_codes", "run"]
