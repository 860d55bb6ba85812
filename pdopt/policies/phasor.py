"""Phasor: P/D/Mixed pools steered by Virtual Freeness Φ (DESIGN.md "Virtual Freeness",
"Fragmentation", "Migration", "Control loop"; the Phasor paper §3).

Three control loops:

* **micro** (every arrival): the prefill worker with the largest Φ_T
  (:func:`pdopt.freeness.temporal_freeness`); ablation ``phi_routing=False`` routes by queue length
  (queued plus running prefill requests). A worker still draining decode work after a move to the
  prefill pool counts that drain time as queued work (it cannot start prefill before).
* **meso** (every Δt, ASYNCDEFRAG, Alg. 1 lines 6–10): each decode worker whose Φ_S
  (:func:`pdopt.freeness.spatial_freeness`) is below ``theta_frag`` and which has stranded free
  blocks (graded H_frag, :func:`pdopt.freeness.stranded_blocks`, judged against the head of its
  admission queue, else the view's reference request) migrates running requests to other decode
  workers until one more such request fits (:func:`pdopt.freeness.plan_defrag`, issued as
  :class:`pdopt.sim.Migrate`; the engine runs the pipelined pre-copy and accounts bandwidth and
  downtime). This is proactive: it runs before a head blocks. ``proactive=False`` keeps the
  earlier reactive rule (only workers whose head already waits for KV); ``defrag=False`` turns
  the loop off.
* **macro** (every Δt, Alg. 1 lines 12–17): :func:`pdopt.freeness.flow_control` on the pools'
  mean Φ_T and Φ_S moves one Mixed-pool worker (pool ``"mixed"`` in the
  :class:`pdopt.sim.ClusterSpec`) per tick with :class:`pdopt.sim.MoveWorker`; a promoted worker
  keeps its role for ``cool_s`` (T_cool, default 20·Δt), and only θ_flow's hysteresis and T_cool
  govern moves (``release_balanced=True`` adds the earlier, non-paper rule that sends a member home
  once the pools are balanced). The Mixed pool is an elastic standby: a member promoted from
  decode to prefill hands its running decodes to the other decode workers by migration
  (``evacuate``, up to ``max_moves`` per Δt), so it serves prefill after its migrations rather
  than after its longest decode. Ablation ``mixed_pool=False``: members keep their initial
  role.

Decode routing: ``"free_kv"`` (default; most free KV net of the requests already waiting there)
or ``"phi_s"`` (largest Φ_S with stranded capacity judged against this request).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdopt._validation import (
    check_int_at_least,
    check_non_negative,
    check_one_of,
    check_positive,
    check_positive_or_none,
)
from pdopt.cluster import ClusterSpec, Role, Slo
from pdopt.freeness import (
    DefragMove,
    flow_control,
    plan_defrag,
    spatial_freeness,
    stranded_blocks,
)
from pdopt.policies._baselines import _feasible_decode, check_a_decoder_remains, routes_as
from pdopt.policies._registry import register_policy
from pdopt.sim import (
    Action,
    ClusterView,
    Migrate,
    MoveWorker,
    Policy,
    PolicyTraits,
    RequestInfo,
    RunContext,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class PhasorSettings:
    """Phasor's control settings for one run (:meth:`Phasor.settings`): Δt and T_cool in
    seconds, T_TTFT_SLO in seconds (Φ_T's denominator), the thresholds, whether the macro
    loop runs and whether it also releases members when the pools are balanced."""

    delta_t_s: float
    cool_s: float
    ttft_slo_s: float
    theta_flow: float
    theta_frag: float
    mixed_pool: bool
    release_balanced: bool = False


@register_policy("phasor")
class Phasor(Policy):
    """Phasor's micro/meso/macro control (module docstring).

    Parameters
    ----------
    phi_routing : bool
        Route prefill by largest Φ_T (else by queue length).
    defrag : bool
        Run the meso defragmentation loop (needs the engine's :class:`pdopt.sim.Migrate`).
    mixed_pool : bool
        Run the macro loop over the Mixed pool.
    decode_routing : str
        ``"free_kv"`` or ``"phi_s"``.
    delta_t_s : float or None
        Δt, seconds: the meso and macro period (acts on the first engine tick at or after each
        Δt; 50 ms on the published V100 testbed). None: the run's control tick
        (``RunContext.tick_s``).
    theta_frag, theta_flow : float
        Defragmentation and flow thresholds (0.168 and 0.62 published).
    cool_s : float or None
        T_cool, seconds; None means 20·Δt.
    ttft_slo_s : float or None
        T_TTFT_SLO in Φ_T, seconds. None: the run's TTFT SLO (``RunContext.slo.ttft_s``); a
        value overrides it.
    min_remaining_tokens : int
        Running requests closer than this to their end are not migrated (they free their KV soon).
    max_moves : int
        Most migrations per source per Δt.
    proactive : bool
        Defragment workers with Φ_S < θ_frag before their head blocks (the paper); False: only
        workers whose admission-queue head already waits for KV.
    evacuate : bool
        A member promoted from decode to prefill migrates its running decodes away (the paper's
        standby); False: it drains them in place before its first prefill.
    release_balanced : bool
        Also send promoted members home when the pools are balanced (not in the paper).
    """

    name = "phasor"
    TRAITS = PolicyTraits(wants_ticks=True)

    def __init__(
        self,
        *,
        phi_routing: bool = True,
        defrag: bool = True,
        mixed_pool: bool = True,
        decode_routing: str = "free_kv",
        delta_t_s: float | None = None,
        theta_frag: float = 0.168,
        theta_flow: float = 0.62,
        cool_s: float | None = None,
        ttft_slo_s: float | None = None,
        min_remaining_tokens: int = 16,
        max_moves: int = 4,
        proactive: bool = True,
        evacuate: bool = True,
        release_balanced: bool = False,
    ) -> None:
        owner = "phasor"
        self.phi_routing = bool(phi_routing)
        self.defrag = bool(defrag)
        self.mixed_pool = bool(mixed_pool)
        self.decode_routing = check_one_of(
            decode_routing, ("free_kv", "phi_s"), "decode_routing", owner
        )
        self.delta_t_s = check_positive_or_none(delta_t_s, "delta_t_s", owner)
        self.theta_frag = check_non_negative(theta_frag, "theta_frag", owner)
        self.theta_flow = check_positive(theta_flow, "theta_flow", owner)
        self.cool_s = None if cool_s is None else check_non_negative(cool_s, "cool_s", owner)
        self.ttft_slo_s = check_positive_or_none(ttft_slo_s, "ttft_slo_s", owner)
        self.min_remaining_tokens = check_int_at_least(
            min_remaining_tokens, 0, "min_remaining_tokens", owner
        )
        self.max_moves = check_int_at_least(max_moves, 1, "max_moves", owner)
        self.proactive = bool(proactive)
        self.evacuate = bool(evacuate)
        self.release_balanced = bool(release_balanced)
        self._run: PhasorSettings | None = None
        self._reset(None)

    def settings(self, slo: Slo, tick_s: float) -> PhasorSettings:
        """The control settings in force for a run with ``slo`` and control tick ``tick_s``:
        the flags, with None resolved to the run's values (Δt = tick, T_cool = 20·Δt,
        T_TTFT_SLO = the run's TTFT SLO). The fluid model reads them too."""
        delta_t_s = tick_s if self.delta_t_s is None else self.delta_t_s
        return PhasorSettings(
            delta_t_s=delta_t_s,
            cool_s=20.0 * delta_t_s if self.cool_s is None else self.cool_s,
            ttft_slo_s=slo.ttft_s if self.ttft_slo_s is None else self.ttft_slo_s,
            theta_flow=self.theta_flow,
            theta_frag=self.theta_frag,
            mixed_pool=self.mixed_pool,
            release_balanced=self.release_balanced,
        )

    # -- per-run state ---------------------------------------------------------------------------
    @staticmethod
    def _no_blocks(tokens: int) -> int:
        raise RuntimeError("Phasor counted KV blocks before a run started it")

    def _reset(self, cluster: ClusterSpec | None) -> None:
        workers = cluster.workers if cluster is not None else ()
        self._p_peak = np.array([w.cost.prefill.p_peak_flops for w in workers], dtype=np.float64)
        self._decode_models = [w.cost.decode for w in workers]
        # a worker that reserves KV at admission takes a migrated request's whole peak
        self._reserving = np.array(
            [w.kv_allocation == "reserve_output" for w in workers], dtype=bool
        )
        # context tokens -> KV blocks as the engines count them (the sliding window included);
        # read only during a run, which starts with a cluster
        self._kv_blocks = cluster.block_counter() if cluster is not None else self._no_blocks
        self._members = [i for i, w in enumerate(workers) if w.pool == "mixed"]
        self._home = {i: str(workers[i].role) for i in self._members}
        self._moved_at = dict.fromkeys(self._members, math.nan)
        self._draining: set[int] = set()  # moved decode → prefill, decode work not yet done
        self._kv_need: dict[int, int] = {}  # request → blocks it needs when admitted to decode
        self._inflight: dict[int, int] = {}  # migrating request → source worker
        self._next_act_s = 0.0 if self._run is None else self._run.delta_t_s

    def start(self, ctx: RunContext) -> None:
        check_a_decoder_remains(self.name, ctx.cluster)
        self._run = self.settings(ctx.slo, ctx.tick_s)
        self._reset(ctx.cluster)

    @property
    def _settings(self) -> PhasorSettings:
        if self._run is None:
            raise RuntimeError("phasor: used before start(ctx) (simulate starts it)")
        return self._run

    # -- the compiled engine's twin (pdopt.sim._compiled._phasor, _phasor_tick) -----------------
    def traits(self) -> PolicyTraits:
        twin = None
        if self._own_rules():
            prefill = "phasor" if self.phi_routing else "phasor_queue"
            twin = (prefill, f"phasor_{self.decode_routing}")
        return PolicyTraits(wants_ticks=True, compiled_routing=twin)

    def _own_rules(self) -> bool:
        """True when this policy runs Phasor's hooks and the rules they decide with."""
        rules = (
            "temporal_phi", "_drain_s", "_effective_free", "spatial_phi", "flow_actions",
            "evacuation_actions", "_forget_finished_migrations", "defrag_actions", "_fragmented",
            "_plan_source",
        )  # fmt: skip
        return routes_as(self, Phasor, rules)

    def compiled_tick(self) -> tuple[str, tuple[float, ...]] | None:
        """The compiled twin of :meth:`on_tick` and its settings (Δt, T_TTFT_SLO, θ_flow,
        T_cool, release_balanced, mixed_pool, defrag, evacuate, proactive, θ_frag,
        min_remaining_tokens, max_moves; zeros before :meth:`start` resolves them), or None
        where it has none: a subclass with its own hooks."""
        if not self._own_rules():
            return None
        run = self._run
        if run is None:
            return "phasor", (0.0,) * 12
        flags = (run.release_balanced, run.mixed_pool, self.defrag, self.evacuate, self.proactive)
        return "phasor", (
            run.delta_t_s, run.ttft_slo_s, run.theta_flow, run.cool_s,
            *(float(f) for f in flags), run.theta_frag,
            float(self.min_remaining_tokens), float(self.max_moves),
        )  # fmt: skip

    # -- micro: routing --------------------------------------------------------------------------
    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        idx = view.prefill_workers
        if not self.phi_routing:
            load = view.prefill_queue_len[idx] + view.running[idx]
            return int(idx[np.argmin(load)])
        return int(idx[np.argmax(self.temporal_phi(view, idx))])

    def temporal_phi(self, view: ClusterView, idx: IntArray) -> FloatArray:
        """Φ_T of workers ``idx``, counting a draining worker's remaining decode time as work.

        NOTE: the expression of :func:`pdopt.freeness.temporal_freeness` inlined without its
        input checks (the view's values are valid); it runs at every arrival and tick.
        """
        work = view.queued_prefill_flop[idx]
        if self._draining:
            work = work.copy()
            for k, w in enumerate(idx):
                if int(w) in self._draining:
                    work[k] += self._drain_s(view, int(w)) * self._p_peak[w]
        phi: FloatArray = 1.0 - work / (self._p_peak[idx] * self._settings.ttft_slo_s)
        return phi

    def _drain_s(self, view: ClusterView, w: int) -> float:
        """Seconds until worker ``w``'s running decode requests have all finished (estimate:
        the longest remaining output at the current iteration time)."""
        run = view.running_requests(w)
        if not len(run["request_id"]):
            self._draining.discard(w)
            return 0.0
        tau = float(
            self._decode_models[w].iteration_time_s(
                len(run["request_id"]), int(run["context_tokens"].sum())
            )
        )
        return float(run["remaining_tokens"].max()) * tau

    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        idx = _feasible_decode(request, view)
        free = self._effective_free(view, idx)
        self._kv_need[request.request_id] = request.kv_blocks
        if self.decode_routing == "free_kv":
            return int(idx[np.argmax(free)])
        cap = view.kv_capacity_blocks[idx]
        used = cap - np.maximum(free, 0)
        phi = spatial_freeness(used, stranded_blocks(np.maximum(free, 0), request.kv_blocks), cap)
        return int(idx[np.argmax(phi + free / cap * _EPS)])  # ties: more free KV

    def _effective_free(self, view: ClusterView, idx: IntArray) -> IntArray:
        """Free KV blocks of workers ``idx`` minus what their waiting requests will take."""
        free = np.array(view.kv_free_blocks[idx], dtype=np.int64)
        qlen = view.decode_queue_len
        need = self._kv_need
        for k, w in enumerate(idx):
            if qlen[w]:
                free[k] -= sum(need.get(int(r), 0) for r in view.waiting_requests(int(w)))
        return free

    # -- meso and macro: the Δt loop -------------------------------------------------------------
    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        now = view.now_s
        if now + _EPS < self._next_act_s:
            return ()
        delta_t_s = self._settings.delta_t_s
        self._next_act_s = (math.floor((now + _EPS) / delta_t_s) + 1) * delta_t_s
        actions: list[Action] = []
        if self.defrag:
            actions.extend(self.defrag_actions(view))
        if self.mixed_pool and self._members:
            actions.extend(self.flow_actions(view))
            if self.evacuate and self._draining:
                actions.extend(self.evacuation_actions(view, actions))
        return actions

    def defrag_actions(self, view: ClusterView) -> list[Migrate]:
        """Migrations for the fragmented decode workers (module docstring).

        A source is a decode worker with Φ_S < θ_frag and stranded blocks, judged against
        ``need`` = its head's blocks, else the reference request's; its deficit is what one more
        such request lacks, ``need − free mod need``. Sources are taken smallest deficit first.
        Destinations are the other decode workers. For a source whose head waits for KV
        (reactive): one whose head fits offers its free blocks net of its waiting requests; one
        whose head is blocked offers its free blocks (stranded anyway). For a proactive source,
        destinations offer only their stranded blocks (consolidation fills holes). Each keeps
        one free block per running request for their growth.
        """
        idx = view.decode_workers
        # a worker just moved to decode takes no decode work (nor migrations) until its prefill
        # batch ends
        idx = idx[view.queued_prefill_flop[idx] <= 0]
        if len(idx) < 2:
            return []
        self._forget_finished_migrations(view)
        head = view.head_kv_need_blocks
        free = view.kv_free_blocks
        need = np.where(head > 0, head, view.reference_need_blocks())
        sources = set(self._inflight.values())
        fragmented = self._fragmented(view, idx, need[idx])
        blocked = [
            int(w)
            for w, frag in zip(idx.tolist(), fragmented.tolist(), strict=True)
            if frag and (self.proactive or head[w] > free[w]) and w not in sources
        ]
        if not blocked:
            return []
        # what one more request of ``need`` lacks on each source (need − free mod need)
        deficit = need - stranded_blocks(free, need)
        dst_free = np.where(head[idx] > free[idx], free[idx], self._effective_free(view, idx))
        dst_free = dst_free - view.running[idx]
        # A proactive move (the source's head is not waiting) may only fill a destination's
        # stranded blocks: the destination then hosts as many whole requests as before and the
        # source one more, so the cluster's count of whole free slots rises with every move and
        # consolidation cannot ping-pong between workers.
        holes = stranded_blocks(free[idx], need[idx])
        dst_holes = np.minimum(dst_free, holes - view.running[idx])
        # a destination needs a free running-batch slot per incoming request (the engine
        # rejects a Migrate to a full batch)
        slots = np.where(view.accepting_decode, view.running_slots_free, 0)
        moves: list[Migrate] = []
        for src in sorted(blocked, key=lambda w: (int(deficit[w]), w)):
            ok = (idx != src) & ~np.isin(idx, list(sources)) & (slots[idx] >= 1)
            reactive = bool(head[src] > free[src])
            room = (dst_free if reactive else dst_holes)[ok]
            if int(np.maximum(room, 0).sum()) < int(deficit[src]):
                continue  # NOTE: cheap bound: all destinations together cannot take the deficit
            target = int(free[src] + deficit[src])  # free blocks that host one more request
            plan = self._plan_source(view, src, target, int(free[src]), idx[ok], room)
            taken = (dst_free if reactive else dst_holes)[ok] - room
            dst_free[ok] -= taken
            dst_holes[ok] -= taken
            for mv in plan:
                if slots[mv.dst_worker] < 1:
                    continue  # the plan put more requests there than its batch can take
                slots[mv.dst_worker] -= 1
                moves.append(Migrate(mv.request_id, mv.dst_worker))
                self._inflight[mv.request_id] = src
            if plan:
                sources.add(src)
        return moves

    def _fragmented(self, view: ClusterView, idx: IntArray, need: IntArray) -> BoolArray:
        """Alg. 1 line 8 for the workers ``idx``: Φ_S(w) < θ_frag and H_frag(w) > 0, stranded
        against each one's ``need``."""
        cap = view.kv_capacity_blocks[idx]
        free = view.kv_free_blocks[idx]
        stranded = stranded_blocks(free, need)
        phi = spatial_freeness(cap - free, stranded, cap)
        out: BoolArray = (phi < self.theta_frag) & (stranded > 0)
        return out

    def _plan_source(
        self,
        view: ClusterView,
        src: int,
        need: int,
        free: int,
        dsts: IntArray,
        dst_free: IntArray,
    ) -> tuple[DefragMove, ...]:
        run = view.running_requests(src)
        keep = (run["remaining_tokens"] >= self.min_remaining_tokens) & ~np.isin(
            run["request_id"], list(self._inflight)
        )
        ids = run["request_id"][keep]
        blocks = run["kv_blocks"][keep]
        # room for one more block of growth on the destination (at least what it holds: a
        # worker with kv_allocation="reserve_output" holds its whole reservation)
        held = [self._kv_blocks(int(c)) + 1 for c in run["context_tokens"][keep]]
        reserve = np.maximum(np.asarray(held, dtype=np.int64), blocks)
        peak = self._peak_blocks(run)[keep]
        plan = plan_defrag(
            need,
            free,
            ids,
            blocks,
            reserve,
            dsts,
            np.maximum(dst_free, 0),
            max_moves=self.max_moves,
            # a request moves only where it can grow to its end (workers of unequal KV), and
            # takes its whole peak on a worker that reserves
            peak_blocks=peak,
            dst_capacity_blocks=view.kv_capacity_blocks[dsts],
            dst_reserve_output=self._reserving[dsts],
        )
        needs = zip(reserve.tolist(), peak.tolist(), strict=True)
        by_id = dict(zip(ids.tolist(), needs, strict=True))
        for mv in plan:
            k = int(np.flatnonzero(dsts == mv.dst_worker)[0])
            request_reserve, request_peak = by_id[mv.request_id]
            dst_free[k] -= request_peak if self._reserving[mv.dst_worker] else request_reserve
        return plan

    def _peak_blocks(self, run: dict[str, np.ndarray]) -> IntArray:
        """KV blocks each of ``run``'s requests (``view.running_requests``) holds at its last
        decode iteration (``RequestInfo.peak_kv_blocks``: its context then, less one)."""
        final = run["context_tokens"] + run["remaining_tokens"] - 1
        return np.array([self._kv_blocks(int(t)) for t in final], dtype=np.int64)

    def _forget_finished_migrations(self, view: ClusterView) -> None:
        """Drop in-flight records whose request no longer runs on its source (moved or done)."""
        if not self._inflight:
            return
        running = {
            src: set(view.running_contexts(src)["request_id"].tolist())
            for src in set(self._inflight.values())
        }
        self._inflight = {r: s for r, s in self._inflight.items() if r in running[s]}

    @staticmethod
    def spatial_phi(view: ClusterView, idx: IntArray) -> FloatArray:
        """Φ_S of workers ``idx`` with stranded capacity judged against the view's reference
        request (:attr:`pdopt.sim.ClusterView.kv_stranded_blocks`).

        NOTE: :func:`pdopt.freeness.spatial_freeness` inlined, reading KV usage once.
        """
        cap = view.kv_capacity_blocks[idx]
        used = view.kv_used_blocks[idx]
        stranded = stranded_blocks(np.maximum(cap - used, 0), view.reference_need_blocks())
        phi: FloatArray = 1.0 - (used + stranded) / cap
        return phi

    def flow_actions(self, view: ClusterView) -> list[MoveWorker]:
        """At most one Mixed-pool move (:func:`pdopt.freeness.flow_control`)."""
        p_idx, d_idx = view.prefill_workers, view.decode_workers
        if not len(p_idx) or not len(d_idx):
            return []
        mean_p = float(self.temporal_phi(view, p_idx).mean())
        mean_d = float(self.spatial_phi(view, d_idx).mean())
        roles = view.roles
        members = self._members
        decision = flow_control(
            mean_p,
            mean_d,
            [str(roles[w]) for w in members],
            [self._home[w] for w in members],
            [self._moved_at[w] for w in members],
            view.now_s,
            n_prefill=len(p_idx),
            n_decode=len(d_idx),
            theta_flow=self.theta_flow,
            cool_s=self._settings.cool_s,
            release=self.release_balanced,
        )
        if not decision.moves:
            return []
        w = members[decision.member]
        self._moved_at[w] = view.now_s  # T_cool runs from every move
        if roles[w] is Role.DECODE and decision.to_role == Role.PREFILL:
            self._draining.add(w)
        elif decision.to_role != Role.PREFILL:
            self._draining.discard(w)
        return [MoveWorker(w, decision.to_pool, decision.to_role)]

    def evacuation_actions(self, view: ClusterView, planned: Sequence[Action]) -> list[Migrate]:
        """Migrations moving the running decodes of members promoted to prefill (``_draining``)
        to decode workers with room: largest first, each to the destination with the most room
        after its growth reserve (its whole peak on a worker that reserves KV), at most
        ``max_moves`` per member per Δt. ``planned`` are this
        tick's actions so far (their destinations take no evacuation this tick)."""
        idx = view.decode_workers
        idx = idx[(view.queued_prefill_flop[idx] <= 0) & view.accepting_decode[idx]]
        idx = idx[~np.isin(idx, list(self._draining))]
        if not len(idx):
            return []
        self._forget_finished_migrations(view)
        room = self._effective_free(view, idx) - view.running[idx]
        slots = np.array(view.running_slots_free[idx], dtype=np.int64)
        for action in planned:
            if isinstance(action, Migrate) and action.dst_worker in idx:
                # a destination of this tick's defragmentation is skipped until the next Δt:
                # the planned action does not say how many of its free blocks it takes
                slots[int(np.flatnonzero(idx == action.dst_worker)[0])] = 0
        capacity = view.kv_capacity_blocks[idx]
        reserving = self._reserving[idx]
        moves: list[Migrate] = []
        for src in sorted(self._draining):
            run = view.running_requests(src)
            peak = self._peak_blocks(run)
            order = np.argsort(-run["kv_blocks"], kind="stable")
            sent = 0
            for i in order[: self.max_moves * 4]:
                rid = int(run["request_id"][i])
                if rid in self._inflight or run["remaining_tokens"][i] < self.min_remaining_tokens:
                    continue
                holds = capacity >= peak[i]  # where it can grow to its end
                if not holds.any():
                    continue
                grown = self._kv_blocks(int(run["context_tokens"][i])) + 1
                # a destination that reserves takes the request's whole peak
                need = np.where(reserving, peak[i], max(grown, run["kv_blocks"][i]))
                ok = (room >= need) & (slots >= 1) & holds
                if not ok.any():
                    break
                k = int(np.argmax(np.where(ok, room - need, -1)))
                room[k] -= need[k]
                slots[k] -= 1
                moves.append(Migrate(rid, int(idx[k])))
                self._inflight[rid] = src
                sent += 1
                if sent >= self.max_moves:
                    break
        return moves
