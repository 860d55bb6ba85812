"""Arrow-style policy: stateless instances in four elastic pools with SLO-aware routing
(Wu et al., "Arrow: Adaptive Scheduling Mechanisms for Disaggregated LLM Inference
Architecture", 2025, §4; Alg. 1 prefill routing, Alg. 2 decode routing, §4.4 monitor).

Pools (the worker's ``pool`` in the simulator): ``P`` and ``D`` (steady), ``P->D`` (flipped to
decode, still finishing its prefill batch) and ``D->P`` (flipped to prefill, still draining its
running decodes). A flip is one :class:`pdopt.sim.MoveWorker`: the role changes at once and the
instance keeps its state (no restart); when the old work is done the monitor relabels the pool
``D`` / ``P``.

* Prefill routing (Alg. 1): t1, the ``P`` worker with the least predicted queueing delay
  (outstanding prefill FLOP / P_peak), if its predicted TTFT (delay + the quadratic TTFT
  predictor) meets the TTFT SLO; else t2, the ``D->P`` worker with the least delay, if *it*
  meets the TTFT SLO (lines 5-6); else, when decode load is low (§5.5's overload rule), t3 from
  Alg. 3, and the request goes to t3 at once (lines 7-9); else t1.
* Decode routing (Alg. 2): the worker that prefilled the request if it is in ``D`` or ``P->D``
  (no KV transfer); else t1, the ``D`` worker with the fewest running tokens, if its running
  tokens are within its Max Running Tokens (KV capacity and the largest context total meeting
  the TPOT SLO, from the decode model) and its recent token interval meets the TPOT SLO; else
  t2, the ``P->D`` worker with the fewest running tokens, under the same checks (lines 7-8);
  else t3 from Alg. 4, at once (lines 10-11); else whichever of t1, t2 holds fewer tokens.
* Instance moves (Alg. 3 / 4): toward prefill, if ``D ∪ P->D`` keeps another instance, the
  ``P->D`` instance with the fewest running tokens, else the ``D`` one; toward decode, if
  ``P ∪ D->P`` keeps another instance, the ``D->P`` instance with the least prefill delay,
  else the ``P`` one. By Fig. 5's transition diagram an instance with old work left goes to
  ``D->P`` / ``P->D``, one without straight to ``P`` / ``D``.
* Monitor (every tick, §5.5): observed token intervals per decode worker (Δt / Δcontext of
  requests seen at two ticks); a decode worker over the TPOT SLO for ``overload_patience_s``
  triggers Alg. 4; a prefill worker idle for ``idle_patience_s`` while decode is loaded joins
  decode. Decode has priority under overload: the monitor flips toward decode even when
  prefill is loaded too, and a ``D->P`` worker finishes its decodes before it prefills.
  ``min_flip_interval_s`` (0: off, the paper has none) damps repeated flips of one worker.

Local scheduler: with ``colocated=True`` every instance becomes a mixed worker at the first
control tick, running Arrow's local schedule of hybrid iterations (all running decodes first,
plus prefill chunks of ``chunk_tokens``; the simulator's ``"hybrid"`` colocated schedule); the
pools are then labels that steer routing, and a flip only relabels the pool, so a ``P->D``
instance finishes its prefill chunks while it already decodes and a ``D->P`` instance prefills
while its last decodes finish, and the request that triggered a flip goes to the flipped
instance at once; this is the paper's stateless instance (§5.2, §5.4) and the default. With
``colocated=False`` (a deviation, ablated in ``experiments/arrow_max_rate.py``) instances are
single-role workers and a flip changes the role: the old role's running batch finishes first
(the engine's drain rules), which approximates Arrow's instance with separate batches.

Approximations (this simulator): routing hooks cannot return actions, so every move decided
inside a routing call reaches the engine at the next control tick; the policy's pools change
at once. With ``colocated=False`` the engine role changes only then, so Alg. 1 line 9 and
Alg. 2 line 11 cannot route to t3 at once: the request goes to the fallback (t1, resp. the
lesser of t1, t2) and t3 serves the requests after the tick (an engine feature, an action
returned with a routing decision, is missing for this). KV always moves over the cluster link
from where it was prefilled.

Ablations: ``slo_aware=False`` routes prefill by least delay and decode by fewest running tokens
(no SLO checks); ``elastic=False`` never flips (static pools).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pdopt._validation import (
    check_fraction,
    check_int_at_least,
    check_non_negative,
    check_one_of,
    check_positive_or_none,
)
from pdopt.cluster import CHUNK_BUDGETS, ClusterSpec, Role
from pdopt.policies._baselines import _feasible_decode, routes_as
from pdopt.policies._registry import register_policy
from pdopt.policies._slo_predict import WorkerModels, decode_load
from pdopt.sim import Action, ClusterView, MoveWorker, Policy, PolicyTraits, RequestInfo, RunContext

IntArray = npt.NDArray[np.int64]
P, D, P2D, D2P = "P", "D", "P->D", "D->P"


@register_policy("arrow")
class Arrow(Policy):
    """SLO-aware routing over elastic P / D / P→D / D→P pools (see the module docstring).

    Parameters
    ----------
    ttft_slo_s, tpot_slo_s : float or None
        The SLOs routing and flips protect, seconds. None: the run's (``RunContext.slo``); a
        value overrides it.
    overload_patience_s : float
        How long a decode worker's token interval stays over the TPOT SLO before a flip.
    idle_patience_s : float
        How long a prefill worker stays idle before it helps decode.
    min_flip_interval_s : float
        A worker flips at most once per this interval (0: no damping, as in the paper; pdopt
        used 1 s before issue 16).
    decode_low_frac : float
        Decode load is "low" when running tokens are below this fraction of the decode pool's
        Max Running Tokens and no decode worker is over the TPOT SLO.
    slo_aware, elastic : bool
        Ablations (see the module docstring).
    colocated : bool
        Run instances as mixed workers with chunked-prefill, decode-first hybrid iterations
        (the paper's stateless instances; False: single-role workers).
    chunk_tokens : int
        Token budget of one hybrid iteration when ``colocated`` (tokens).
    chunk_budget : {"iteration", "prefill"}
        What ``chunk_tokens`` bounds (:attr:`pdopt.sim.WorkerSpec.chunk_budget`): the whole
        iteration, decode tokens included (Sarathi-Serve's chunk size, the default), or the
        prefill chunks alone on top of all decodes (pdopt before issue 18).
    """

    name = "arrow"

    def __init__(
        self,
        ttft_slo_s: float | None = None,
        tpot_slo_s: float | None = None,
        *,
        overload_patience_s: float = 0.2,
        idle_patience_s: float = 0.5,
        min_flip_interval_s: float = 0.0,
        decode_low_frac: float = 0.3,
        slo_aware: bool = True,
        elastic: bool = True,
        colocated: bool = True,
        chunk_tokens: int = 512,
        chunk_budget: str = "iteration",
    ) -> None:
        owner = "arrow"
        self.ttft_slo_s = check_positive_or_none(ttft_slo_s, "ttft_slo_s", owner)
        self.tpot_slo_s = check_positive_or_none(tpot_slo_s, "tpot_slo_s", owner)
        self._ttft_slo_s = self._tpot_slo_s = math.nan  # the run's, set by start
        self.overload_patience_s = check_non_negative(
            overload_patience_s, "overload_patience_s", owner
        )
        self.idle_patience_s = check_non_negative(idle_patience_s, "idle_patience_s", owner)
        self.min_flip_interval_s = check_non_negative(
            min_flip_interval_s, "min_flip_interval_s", owner
        )
        self.decode_low_frac = check_fraction(decode_low_frac, "decode_low_frac", owner)
        self.slo_aware = bool(slo_aware)
        self.elastic = bool(elastic)
        self.colocated = bool(colocated)
        self.chunk_tokens = check_int_at_least(chunk_tokens, 1, "chunk_tokens", owner)
        self.chunk_budget = check_one_of(chunk_budget, CHUNK_BUDGETS, "chunk_budget", owner)
        self._models: WorkerModels | None = None
        self._reset(0)

    def _reset(self, n: int) -> None:
        self._pool: list[str] = []
        self._src: dict[int, int] = {}
        self._dirty: set[int] = set()  # relabelled since the last tick
        self._interval_s = [0.0] * n
        self._snap: list[tuple[float, dict[int, int]]] = [(0.0, {}) for _ in range(n)]
        self._over_since = [-1.0] * n
        self._idle_since = [-1.0] * n
        self._flipped_at = [-np.inf] * n
        self._converted = False

    # -- the compiled engine's twin (pdopt.sim._compiled._arrow) ---------------------------------
    def traits(self) -> PolicyTraits:
        twin = ("arrow", "arrow") if self._own_rules() else None
        if not self.colocated:
            return PolicyTraits(wants_ticks=True, compiled_routing=twin)
        return PolicyTraits(
            wants_ticks=True,
            colocated_schedule="hybrid",
            chunk_tokens=self.chunk_tokens,
            chunk_budget=self.chunk_budget,
            compiled_routing=twin,
        )

    def _own_rules(self) -> bool:
        """True when this policy runs Arrow's hooks and the rules they decide with."""
        rules = (
            "_choose_prefill", "_takes_prefill", "_decode_is_low", "_mrt_total", "_decode_ok",
            "_move_decode_to_prefill", "_move_prefill_to_decode", "_may_flip", "_move",
            "_observe_intervals", "_finish_transitions", "_monitor_decode",
            "_monitor_idle_prefill", "_role", "_in",
        )  # fmt: skip
        return routes_as(self, Arrow, rules)

    def compiled_unsupported(self, cluster: ClusterSpec) -> str | None:
        """What of this run the compiled twin does not run (the Python engine does), in words;
        None when it runs it. With ``colocated=False`` on instances mixed from the start, a
        flip moves a busy instance out of the mixed role (MoveWorker to prefill or decode),
        which the compiled engine does not run; with ``colocated=True`` every move is a
        relabel within the mixed role (:meth:`_role`)."""
        if not self.colocated and any(w.role is Role.MIXED for w in cluster.workers):
            return (
                "colocated=False on instances mixed from the start (a flip would move a busy "
                "instance out of the mixed role)"
            )
        return None

    def compiled_tick(self) -> tuple[str, tuple[float, ...]] | None:
        """The compiled twin of :meth:`on_tick` and its settings (the TTFT and TPOT SLOs,
        overload_patience_s, idle_patience_s, min_flip_interval_s, decode_low_frac, and the
        flags slo_aware, elastic, colocated), then each worker's TTFT predictor ``a, b, c``
        (none before :meth:`start`), or None where it has none: a subclass with its own hooks."""
        if not self._own_rules():
            return None
        flags = (self.slo_aware, self.elastic, self.colocated)
        settings = (
            self._ttft_slo_s, self._tpot_slo_s, self.overload_patience_s, self.idle_patience_s,
            self.min_flip_interval_s, self.decode_low_frac, *(float(f) for f in flags),
        )  # fmt: skip
        predictors = () if self._models is None else self._models.ttft
        coefficients = [(p.a_s_per_token2, p.b_s_per_token, p.c_s) for p in predictors]
        return "arrow", tuple(float(x) for x in settings + tuple(np.ravel(coefficients)))

    def start(self, ctx: RunContext) -> None:
        cluster = ctx.cluster
        self._ttft_slo_s = ctx.slo.ttft_s if self.ttft_slo_s is None else self.ttft_slo_s
        self._tpot_slo_s = ctx.slo.tpot_s if self.tpot_slo_s is None else self.tpot_slo_s
        self._models = WorkerModels.of(cluster)
        self._reset(len(cluster.workers))
        self._pool = [D if w.role is Role.DECODE else P for w in cluster.workers]

    @property
    def _m(self) -> WorkerModels:
        if self._models is None:
            raise RuntimeError("arrow: route called before start(ctx)")
        return self._models

    def _in(self, *pools: str) -> IntArray:
        return np.array([w for w, p in enumerate(self._pool) if p in pools], dtype=np.int64)

    # -- Alg. 1: prefill routing ------------------------------------------------------------------
    def route_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        w = self._choose_prefill(request, view)
        self._src[request.request_id] = w
        return w

    def _takes_prefill(self, *pools: str, view: ClusterView) -> IntArray:
        """Workers of ``pools`` the engine lets prefill now (a split-role flip decided since
        the last tick has not changed the engine role yet)."""
        eligible = set(view.prefill_workers.tolist())
        return np.array([w for w in self._in(*pools) if int(w) in eligible], dtype=np.int64)

    def _choose_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        """Alg. 1: t1 (P, least queueing delay) if it meets the TTFT SLO; else t2 (D→P, least
        delay) if it does; else, when decode load is low, Alg. 3's t3 at once; else t1."""
        tokens = request.prefill_tokens
        steady = self._takes_prefill(P, view=view)
        if not len(steady):
            steady = self._takes_prefill(P, D2P, view=view)
        if not len(steady):
            steady = view.prefill_workers
        ttft = self._m.predicted_ttft_s(view, steady, tokens)
        first = int(steady[int(np.argmin(ttft))])
        if not self.slo_aware or float(ttft.min()) <= self._ttft_slo_s:
            return first
        moving = self._takes_prefill(D2P, view=view)
        if len(moving):
            t2 = self._m.predicted_ttft_s(view, moving, tokens)
            if float(t2.min()) <= self._ttft_slo_s:
                return int(moving[int(np.argmin(t2))])
        if self.elastic and self._decode_is_low(view):
            t3 = self._move_decode_to_prefill(view)
            if (
                t3 is not None
                and view.roles[t3] is Role.MIXED
                and t3 in view.prefill_workers.tolist()  # it holds the prompt
            ):
                return t3  # stateless instance: it takes the prefill at once
        return first

    def _decode_is_low(self, view: ClusterView) -> bool:
        dec = self._in(D, P2D)
        if len(dec) < 2:
            return False
        batch, tokens = decode_load(view)
        limit = self._mrt_total(dec, batch)
        over = any(self._interval_s[w] > self._tpot_slo_s for w in dec)
        return not over and float(tokens[dec].sum()) < self.decode_low_frac * limit

    # -- Alg. 2: decode routing -------------------------------------------------------------------
    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        """Alg. 2: the prefill instance if it is in D ∪ P→D; else t1 (D, fewest running tokens)
        if it is under Max Running Tokens and its token interval meets the TPOT SLO; else t2
        (P→D, likewise) under the same checks; else Alg. 4's t3 at once; else the one of t1, t2
        with fewer running tokens."""
        src = self._src.pop(request.request_id, -1)
        feasible = _feasible_decode(request, view)
        allowed = set(feasible.tolist())
        if src in allowed and self._pool[src] in (D, P2D):
            return src
        batch, tokens = decode_load(view)
        steady = [int(w) for w in self._in(D) if int(w) in allowed]
        if not self.slo_aware:
            pool = np.array(steady, dtype=np.int64) if steady else feasible
            return int(pool[int(np.argmin(tokens[pool]))])
        moving = [int(w) for w in self._in(P2D) if int(w) in allowed]
        t1 = min(steady, key=lambda w: (tokens[w], w)) if steady else -1
        t2 = min(moving, key=lambda w: (tokens[w], w)) if moving else -1
        for t in (t1, t2):
            if t >= 0 and self._decode_ok(t, request, view, batch, tokens):
                return t
        if self.elastic:
            t3 = self._move_prefill_to_decode(view)
            if t3 is not None and t3 in allowed:
                return t3
        dec = [t for t in (t1, t2) if t >= 0]
        if dec:
            return min(dec, key=lambda w: (tokens[w], w))
        return int(feasible[int(np.argmin(tokens[feasible]))])

    def _mrt_total(self, workers: IntArray, batch: npt.NDArray[np.float64]) -> float:
        """Σ Max Running Tokens over ``workers`` at their current batch sizes plus one."""
        m, slo = self._m, self._tpot_slo_s
        return sum(m.max_running_tokens(int(w), float(batch[w]) + 1.0, slo) for w in workers)

    def _decode_ok(
        self,
        w: int,
        request: RequestInfo,
        view: ClusterView,
        batch: npt.NDArray[np.float64],
        tokens: npt.NDArray[np.float64],
    ) -> bool:
        """Alg. 2 lines 5-6 / 8-9: running tokens within Max Running Tokens and the recent
        token interval within the TPOT SLO; plus KV free for the request (the engine's
        admission would otherwise queue it)."""
        mrt = self._m.max_running_tokens(w, float(batch[w]) + 1.0, self._tpot_slo_s)
        return (
            tokens[w] <= mrt
            and view.kv_free_blocks[w] >= request.kv_blocks
            and self._interval_s[w] <= self._tpot_slo_s
        )

    # -- Alg. 3 / 4: instance moves ---------------------------------------------------------------
    def _move_decode_to_prefill(self, view: ClusterView) -> int | None:
        """Alg. 3: if D ∪ P→D keeps another instance, the P→D instance with the fewest running
        tokens, else the D one, moves toward prefill (to D→P while it still decodes, else P)."""
        if len(self._in(D, P2D)) <= 1:
            return None
        _, tokens = decode_load(view)
        pool = [w for w in self._in(P2D) if self._may_flip(int(w), view.now_s)]
        pool = pool or [w for w in self._in(D) if self._may_flip(int(w), view.now_s)]
        if not pool:
            return None
        w = int(min(pool, key=lambda v: (tokens[v], v)))
        busy = bool(len(view.running_contexts(w)["request_id"]) or view.decode_queue_len[w])
        self._move(w, D2P if busy else P, view.now_s)
        return w

    def _move_prefill_to_decode(self, view: ClusterView) -> int | None:
        """Alg. 4: if P ∪ D→P keeps another instance, the D→P instance with the least prefill
        delay, else the P one, moves toward decode (to P→D while it still prefills, else D)."""
        if len(self._in(P, D2P)) <= 1:
            return None
        wait = self._m.prefill_wait_s(view)
        pool = [w for w in self._in(D2P) if self._may_flip(int(w), view.now_s)]
        pool = pool or [w for w in self._in(P) if self._may_flip(int(w), view.now_s)]
        if not pool:
            return None
        w = int(min(pool, key=lambda v: (wait[v], v)))
        self._move(w, P2D if view.queued_prefill_flop[w] > 0.0 else D, view.now_s)
        return w

    def _may_flip(self, w: int, now: float) -> bool:
        """``min_flip_interval_s`` since the worker's last flip (0 by default: the paper has no
        such damping)."""
        return now - self._flipped_at[w] >= self.min_flip_interval_s

    def _move(self, w: int, pool: str, now: float) -> None:
        """Relabel ``w`` now; the engine gets the :class:`MoveWorker` at the next tick (routing
        hooks cannot return actions). Colocated instances stay mixed, so only the label moves
        and routing may use the new role at once."""
        self._pool[w] = pool
        self._flipped_at[w] = now
        self._idle_since[w] = -1.0
        self._over_since[w] = -1.0
        self._dirty.add(w)

    # -- monitor ----------------------------------------------------------------------------------
    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        self._observe_intervals(view)
        actions: list[Action] = self._finish_transitions(view)
        if self.colocated and not self._converted:
            self._converted = True
            actions += [
                MoveWorker(w, pool, Role.MIXED)
                for w, pool in enumerate(self._pool)
                if view.roles[w] is not Role.MIXED or view.pools[w] != pool
            ]
        if self.elastic:
            self._monitor_decode(view)
            self._monitor_idle_prefill(view)
        for w in sorted(self._dirty):
            role = Role.PREFILL if self._pool[w] in (P, D2P) else Role.DECODE
            actions.append(MoveWorker(w, self._pool[w], self._role(role, view.roles[w])))
        self._dirty.clear()
        return actions

    def _observe_intervals(self, view: ClusterView) -> None:
        """Recent token interval per decode worker: Δt / Δcontext of requests running at both
        this tick and the last (each iteration adds one token); the decode model's τ(B, C) when
        no request spans both ticks; 0 when idle."""
        now = view.now_s
        for w in view.decode_workers:
            w = int(w)
            run = view.running_contexts(w)
            ids, ctx = run["request_id"].tolist(), run["context_tokens"].tolist()
            cur = dict(zip(ids, ctx, strict=True))
            then, prev = self._snap[w]
            steps = [cur[r] - prev[r] for r in cur if r in prev]
            if steps and now > then:
                self._interval_s[w] = (now - then) / max(max(steps), 1)
            elif ids:
                self._interval_s[w] = self._m.decode_iteration_s(w, len(ids), float(sum(ctx)))
            else:
                self._interval_s[w] = 0.0
            self._snap[w] = (now, cur)

    def _finish_transitions(self, view: ClusterView) -> list[Action]:
        """Relabel P→D workers whose prefill work is done as D, D→P workers with no running
        decode as P."""
        out: list[Action] = []
        flop = view.queued_prefill_flop
        for w, pool in enumerate(self._pool):
            if pool == P2D and flop[w] <= 0.0:
                self._pool[w] = D
                out.append(MoveWorker(w, D, self._role(Role.DECODE, view.roles[w])))
            elif pool == D2P and not len(view.running_contexts(w)["request_id"]):
                self._pool[w] = P
                out.append(MoveWorker(w, P, self._role(Role.PREFILL, view.roles[w])))
        return out

    def _monitor_decode(self, view: ClusterView) -> None:
        """§5.5 (2): a decode instance over the TPOT SLO for ``overload_patience_s`` triggers
        Alg. 4 (decode priority: even when prefill is loaded too)."""
        now = view.now_s
        for w in self._in(D, P2D):
            w = int(w)
            if self._interval_s[w] <= self._tpot_slo_s:
                self._over_since[w] = -1.0
                continue
            if self._over_since[w] < 0:
                self._over_since[w] = now
            if now - self._over_since[w] >= self.overload_patience_s:
                self._move_prefill_to_decode(view)
                self._over_since[w] = now

    def _monitor_idle_prefill(self, view: ClusterView) -> None:
        """§5.5 (3): a prefill instance idle for ``idle_patience_s`` while decode is loaded
        joins decode."""
        now = view.now_s
        flop = view.queued_prefill_flop
        batch, tokens = decode_load(view)
        dec = self._in(D, P2D)
        limit = self._mrt_total(dec, batch)
        loaded = float(tokens[dec].sum()) >= (1.0 - self.decode_low_frac) * limit
        for w in self._in(P):
            w = int(w)
            if flop[w] > 0.0:
                self._idle_since[w] = -1.0
                continue
            if self._idle_since[w] < 0:
                self._idle_since[w] = now
            idle = now - self._idle_since[w] >= self.idle_patience_s
            if loaded and idle and len(self._in(P, D2P)) > 1 and self._may_flip(w, now):
                self._move(w, D, now)

    def _role(self, role: Role, now: Role) -> Role:
        """The simulator role of a pool for a worker in role ``now``: ``mixed`` for every pool
        once colocated, and before that for an instance mixed already (a colocated instance
        never leaves the mixed role, even for the first tick's flips)."""
        mixed = self._converted or now is Role.MIXED
        return Role.MIXED if self.colocated and mixed else role
