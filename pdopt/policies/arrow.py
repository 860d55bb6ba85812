"""Arrow-style policy: stateless instances in four elastic pools with SLO-aware routing
(Wu et al., "Arrow: Adaptive Scheduling Mechanisms for Disaggregated LLM Inference
Architecture", 2025, §4; Alg. 1 prefill routing, Alg. 2 decode routing, §4.4 monitor).

Pools (the worker's ``pool`` in the simulator): ``P`` and ``D`` (steady), ``P->D`` (flipped to
decode, still finishing its prefill batch) and ``D->P`` (flipped to prefill, still draining its
running decodes). A flip is one :class:`pdopt.sim.MoveWorker`: the role changes at once and the
instance keeps its state (no restart); when the old work is done the monitor relabels the pool
``D`` / ``P``.

* Prefill routing (Alg. 1): the ``P`` worker with the least predicted queueing delay (outstanding
  prefill FLOP / P_peak) if its predicted TTFT (delay + the quadratic TTFT predictor) meets the
  TTFT SLO; else the ``D->P`` worker with the least predicted TTFT; else, when decode load is low,
  flip the decode worker holding the fewest running tokens to prefill; else the first choice.
* Decode routing (Alg. 2): the worker that prefilled the request if it now decodes (no KV
  transfer); else the ``D`` worker with the fewest running tokens if it stays under its Max
  Running Tokens (KV capacity and the largest context total meeting the TPOT SLO, from the
  decode model) and its recent token interval meets the TPOT SLO; else a ``P->D`` worker; else
  flip the least-loaded prefill worker to decode; else the decode worker with fewest running
  tokens.
* Monitor (every tick): observed token intervals per decode worker (Δt / Δcontext of requests
  seen at two ticks); a decode worker over the TPOT SLO for ``overload_patience_s`` flips a
  prefill worker to decode; a prefill worker idle for ``idle_patience_s`` while decode is loaded
  helps decode. Decode has priority under overload: when both sides are overloaded the monitor
  still flips toward decode (requests already admitted have consumed prefill work), and a
  ``D->P`` worker finishes its decodes before it prefills (the engine drains it).

Local scheduler: with ``colocated=True`` every instance becomes a mixed worker at the first
control tick, running Arrow's local schedule of hybrid iterations (all running decodes first,
plus prefill chunks of ``chunk_tokens``; the simulator's ``"hybrid"`` colocated schedule); the
pools are then labels that steer routing, and a flip only relabels the pool, so a ``P->D``
instance finishes its prefill chunks while it already decodes and a ``D->P`` instance prefills
while its last decodes finish. With ``colocated=False`` (default) instances are single-role
workers and a flip changes the role: the old role's running batch finishes first (the engine's
drain rules), which approximates Arrow's instance with separate batches.

Approximations (this simulator): a flip decided inside a routing call is applied at the next
control tick (routing hooks cannot return actions), so the request goes to the best current
choice; KV always moves over the cluster link from where it was prefilled.

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
    check_positive_or_none,
)
from pdopt.policies._baselines import _feasible_decode
from pdopt.policies._registry import register_policy
from pdopt.policies._slo_predict import WorkerModels, decode_load
from pdopt.sim import (
    Action,
    ClusterView,
    MoveWorker,
    Policy,
    PolicyTraits,
    RequestInfo,
    Role,
    RunContext,
)

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
        A worker flips at most once per this interval (damps oscillation).
    decode_low_frac : float
        Decode load is "low" when running tokens are below this fraction of the decode pool's
        Max Running Tokens and no decode worker is over the TPOT SLO.
    slo_aware, elastic : bool
        Ablations (see the module docstring).
    colocated : bool
        Run instances as mixed workers with chunked-prefill, decode-first hybrid iterations.
    chunk_tokens : int
        Prefill chunk budget per hybrid iteration when ``colocated`` (tokens).
    """

    name = "arrow"

    def __init__(
        self,
        ttft_slo_s: float | None = None,
        tpot_slo_s: float | None = None,
        *,
        overload_patience_s: float = 0.2,
        idle_patience_s: float = 0.5,
        min_flip_interval_s: float = 1.0,
        decode_low_frac: float = 0.3,
        slo_aware: bool = True,
        elastic: bool = True,
        colocated: bool = False,
        chunk_tokens: int = 512,
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
        self._models: WorkerModels | None = None
        self._reset(0)

    def _reset(self, n: int) -> None:
        self._pool: list[str] = []
        self._src: dict[int, int] = {}
        self._want_prefill: set[int] = set()
        self._want_decode: set[int] = set()
        self._interval_s = [0.0] * n
        self._snap: list[tuple[float, dict[int, int]]] = [(0.0, {}) for _ in range(n)]
        self._over_since = [-1.0] * n
        self._idle_since = [-1.0] * n
        self._flipped_at = [-np.inf] * n
        self._converted = False

    def traits(self) -> PolicyTraits:
        if not self.colocated:
            return PolicyTraits(wants_ticks=True)
        return PolicyTraits(
            wants_ticks=True, colocated_schedule="hybrid", chunk_tokens=self.chunk_tokens
        )

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

    def _choose_prefill(self, request: RequestInfo, view: ClusterView) -> int:
        tokens = request.prefill_tokens
        steady = self._in(P)
        if not len(steady):
            steady = self._in(P, D2P)
        ttft = self._m.predicted_ttft_s(view, steady, tokens)
        first = int(steady[int(np.argmin(ttft))])
        if not self.slo_aware or float(ttft.min()) <= self._ttft_slo_s:
            return first
        moving = self._in(D2P)
        if len(moving):
            return int(moving[int(np.argmin(self._m.predicted_ttft_s(view, moving, tokens)))])
        if self.elastic and self._decode_is_low(view):
            self._ask_flip_to_prefill(view)
        return first

    def _decode_is_low(self, view: ClusterView) -> bool:
        dec = self._in(D, P2D)
        if len(dec) < 2:
            return False
        batch, tokens = decode_load(view)
        limit = self._mrt_total(dec, batch)
        over = any(self._interval_s[w] > self._tpot_slo_s for w in dec)
        return not over and float(tokens[dec].sum()) < self.decode_low_frac * limit

    def _ask_flip_to_prefill(self, view: ClusterView) -> None:
        dec = [int(w) for w in self._in(D) if int(w) not in self._want_prefill]
        if len(dec) + len(self._in(P2D)) - len(self._want_prefill) < 2:
            return
        _, tokens = decode_load(view)
        self._want_prefill.add(min(dec, key=lambda w: (tokens[w], w)))

    # -- Alg. 2: decode routing -------------------------------------------------------------------
    def route_decode(self, request: RequestInfo, view: ClusterView) -> int:
        src = self._src.pop(request.request_id, -1)
        feasible = _feasible_decode(request, view)
        allowed = set(feasible.tolist())
        if src in allowed and self._pool[src] in (D, P2D) and view.roles[src] is not Role.PREFILL:
            return src
        batch, tokens = decode_load(view)
        steady = np.array([w for w in self._in(D) if int(w) in allowed], dtype=np.int64)
        if not self.slo_aware:
            pool = steady if len(steady) else feasible
            return int(pool[int(np.argmin(tokens[pool]))])
        ok = [int(w) for w in steady if self._decode_ok(int(w), request, view, batch, tokens)]
        if ok:
            return min(ok, key=lambda w: (tokens[w], w))
        moving = [int(w) for w in self._in(P2D) if int(w) in allowed]
        if moving:
            return min(moving, key=lambda w: (tokens[w], w))
        if self.elastic:
            self._ask_flip_to_decode(view)
        dec = [int(w) for w in self._in(D, P2D) if int(w) in allowed]
        pool = np.array(dec, dtype=np.int64) if dec else feasible
        return int(pool[int(np.argmin(tokens[pool]))])

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
        """Under Max Running Tokens with the request added, KV free for it, and the recent
        token interval within the TPOT SLO (Alg. 2 line 4)."""
        mrt = self._m.max_running_tokens(w, float(batch[w]) + 1.0, self._tpot_slo_s)
        return (
            tokens[w] + request.prefill_tokens <= mrt
            and view.kv_free_blocks[w] >= request.kv_blocks
            and self._interval_s[w] <= self._tpot_slo_s
        )

    def _ask_flip_to_decode(self, view: ClusterView) -> None:
        pre = [int(w) for w in self._in(P) if int(w) not in self._want_decode]
        if len(pre) + len(self._in(D2P)) - len(self._want_decode) < 2:
            return
        wait = self._m.prefill_wait_s(view)
        self._want_decode.add(min(pre, key=lambda w: (wait[w], w)))

    # -- monitor ----------------------------------------------------------------------------------
    def on_tick(self, view: ClusterView) -> Sequence[Action]:
        now = view.now_s
        self._observe_intervals(view)
        actions: list[Action] = self._finish_transitions(view)
        if self.colocated and not self._converted:
            self._converted = True
            actions += [
                MoveWorker(w, pool, Role.MIXED)
                for w, pool in enumerate(self._pool)
                if view.roles[w] is not Role.MIXED or view.pools[w] != pool
            ]
        if not self.elastic:
            self._want_prefill.clear()
            self._want_decode.clear()
            return actions
        self._monitor_decode(view)
        self._monitor_idle_prefill(view)
        for w in sorted(self._want_decode):
            actions += self._flip(w, to_decode=True, now=now)
        for w in sorted(self._want_prefill):
            actions += self._flip(w, to_decode=False, now=now)
        self._want_prefill.clear()
        self._want_decode.clear()
        return actions

    def _observe_intervals(self, view: ClusterView) -> None:
        """Recent token interval per decode worker: Δt / Δcontext of requests running at both
        this tick and the last (each iteration adds one token); the decode model's τ(B, C) when
        no request spans both ticks; 0 when idle."""
        now = view.now_s
        for w in view.decode_workers:
            w = int(w)
            run = view.running_requests(w)
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
                out.append(MoveWorker(w, D, self._role(Role.DECODE)))
            elif pool == D2P and not len(view.running_requests(w)["request_id"]):
                self._pool[w] = P
                out.append(MoveWorker(w, P, self._role(Role.PREFILL)))
        return out

    def _monitor_decode(self, view: ClusterView) -> None:
        now = view.now_s
        for w in self._in(D, P2D):
            w = int(w)
            if self._interval_s[w] <= self._tpot_slo_s:
                self._over_since[w] = -1.0
                continue
            if self._over_since[w] < 0:
                self._over_since[w] = now
            if now - self._over_since[w] >= self.overload_patience_s:
                # decode priority: flip toward decode even when prefill is loaded too
                self._ask_flip_to_decode(view)
                self._over_since[w] = now

    def _monitor_idle_prefill(self, view: ClusterView) -> None:
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
            if loaded and now - self._idle_since[w] >= self.idle_patience_s:
                self._want_decode.add(w)

    def _flip(self, w: int, *, to_decode: bool, now: float) -> list[Action]:
        """One flip, if the worker is still where it was asked from, its cool-down has passed and
        its side keeps at least one worker."""
        src, dst, role = (P, P2D, Role.DECODE) if to_decode else (D, D2P, Role.PREFILL)
        same_side = (P, D2P) if to_decode else (D, P2D)
        if self._pool[w] != src or now - self._flipped_at[w] < self.min_flip_interval_s:
            return []
        if len(self._in(*same_side)) < 2:
            return []
        self._pool[w] = dst
        self._flipped_at[w] = now
        self._idle_since[w] = -1.0
        self._over_since[w] = -1.0
        return [MoveWorker(w, dst, self._role(role))]

    def _role(self, role: Role) -> Role:
        """The simulator role of a pool: ``mixed`` for every pool once colocated."""
        return Role.MIXED if self.colocated and self._converted else role
