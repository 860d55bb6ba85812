"""The Python engine's time series: snapshots at control ticks, their rows evaluated in batches.

Between two events the engine's state changes only through closed forms of time: a running decode
batch gains KV blocks at its iteration boundaries (:mod:`pdopt.sim._closed_form`), a prefill
step's outstanding work and every busy time are linear in time, and nothing else moves. So a
control tick (:mod:`pdopt.sim._control`) does not compute its rows: it records a *snapshot* of
each worker's parameters (a few numbers), and a snapshot stands for every tick of the stretch up
to the next event (the control tick then skips to the first tick at or after that event when no
policy needs the ticks between). The rows of a batch of snapshots are evaluated at once,
vectorised, as the run goes (a snapshot's ticks are final once the next one is taken), into
blocks of the frame's numeric columns; :meth:`Telemetry.frame` evaluates the last batch and joins
the blocks. An idle stretch of any length costs one snapshot, and a row a few numpy element
operations.

Memory (issue 38): a run holds its rows as the frame's machine numbers (72 bytes a row before
the string columns) and one batch of snapshots (:data:`_BATCH_ROWS`), never every snapshot
(168 bytes per worker and snapshot, plus the KV phase counts) beside the frame; evaluation works
in chunks (:data:`_CHUNK_ROWS`), so its temporaries do not grow with the run either.

Exactness: the array forms below evaluate the scalar owners' expressions in the same
floating-point order (:meth:`pdopt.sim._decode.DecodeSide.used_blocks` through
:func:`pdopt.sim._closed_form.used_blocks`, :meth:`pdopt.sim._prefill.PrefillSide.outstanding_flop`
and ``busy_until``, :meth:`pdopt.sim._decode.DecodeSide.busy_until`, the busy fraction and power
of ``Control``), so every value equals the one a per-tick sample gives
(tests/sim/test_sim_timeseries.py checks both the forms and whole frames against per-tick oracles).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from pdopt.cluster._spec import Role, WorkerSpec
from pdopt.freeness import stranded_blocks
from pdopt.sim._closed_form import boundary_time, kv_blocks
from pdopt.sim._result import TIMESERIES_COLUMNS, label_column

if TYPE_CHECKING:
    from pdopt.sim._core import Core

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Numbers of one worker's snapshot, in order (see Telemetry.snapshot); frame() holds them as
# float64, exact for the ints and bools (all below 2**53).
_FIELDS = (
    "queue_len", "running", "held", "cap", "b", "n_seg", "u_seg", "t_seg", "a_seg", "half_d2b",
    "grows", "d_busy_s", "d_busy_since", "p_busy_s", "p_counting", "p_start", "p_stall_since",
    "p_inflight", "p_end", "queued_flop", "batch_flop",
)  # fmt: skip
_F = {name: i for i, name in enumerate(_FIELDS)}

# boundary_time is plain arithmetic, so it evaluates elementwise on arrays as it is.
_boundary_times: Callable[..., FloatArray] = boundary_time  # type: ignore[assignment]


def boundaries_before_array(
    t_seg: FloatArray, a_seg: FloatArray, half_d2b: FloatArray, t: FloatArray
) -> IntArray:
    """:func:`pdopt.sim._closed_form.boundaries_before` elementwise: the same root estimate and
    the same exact fix-up against :func:`~pdopt.sim._closed_form.boundary_time`, so each
    element equals the scalar function's result."""
    dt = t - t_seg
    k = np.zeros(len(t), dtype=np.int64)
    pos = dt > 0
    quad = pos & (half_d2b > 0)
    lin_rows = pos & ~(half_d2b > 0)
    h, dq = half_d2b[quad], dt[quad]
    lin = a_seg[quad] - h
    k[quad] = ((-lin + np.sqrt(lin * lin + 4.0 * h * dq)) / (2.0 * h)).astype(np.int64)
    k[lin_rows] = (dt[lin_rows] / a_seg[lin_rows]).astype(np.int64)
    while True:  # the scalar's two fix-up loops, row by row
        over = pos & (k > 0) & (_boundary_times(t_seg, a_seg, half_d2b, k) > t)
        if not over.any():
            break
        k[over] -= 1
    while True:
        under = pos & (_boundary_times(t_seg, a_seg, half_d2b, k + 1) <= t)
        if not under.any():
            break
        k[under] += 1
    return k


def growth_array(
    cnt: IntArray, which: IntArray, b: IntArray, bt: int, m1: IntArray, length: IntArray
) -> IntArray:
    """:func:`pdopt.sim._closed_form.growth` elementwise over boundaries ``m1 .. m1 + length −
    1``: ``b`` per full period of ``bt``, plus the remainder's phases (element ``i``'s phase
    counts are row ``which[i]`` of ``cnt``), summed through prefix sums of the row repeated."""
    full, rem = np.divmod(length, bt)
    prefix = np.zeros((len(cnt), 2 * bt + 1), dtype=np.int64)
    np.cumsum(np.concatenate([cnt, cnt], axis=1), axis=1, out=prefix[:, 1:])
    start = m1 % bt
    result: IntArray = full * b + prefix[which, start + rem] - prefix[which, start]
    return result


# Pending snapshot rows (snapshots × workers) evaluated at once, while the run goes on: the
# snapshots never accumulate (issue 38: they took ~1.5 KB per request of a 1M-request run).
_BATCH_ROWS = 1 << 15
# Time-series rows evaluated at once: bounds the evaluation's temporaries (an idle stretch of
# many ticks is one snapshot but many rows).
_CHUNK_ROWS = 1 << 16
# Rows per block of an output column: 32 MiB of float64/int64, above glibc's largest mmap
# threshold, so each block is its own mapping (pages resident only once written) and returns
# to the OS when freed, rather than leaving holes in the heap that keep the RSS up.
_BLOCK_ROWS = 1 << 22

# The numeric time-series columns, evaluated batch by batch into blocks (the string columns
# are built at the end from each snapshot's layout and tick count).
_NUMERIC = (
    ("t_s", np.float64), ("queue_len", np.int64), ("queued_prefill_flop", np.float64),
    ("running", np.int64), ("kv_used_blocks", np.int64), ("kv_free_blocks", np.int64),
    ("kv_stranded_blocks", np.int64), ("busy_frac", np.float64), ("power_w", np.float64),
)  # fmt: skip


class Telemetry:
    """Snapshots of one run's workers at control ticks, and the time-series frame they give.

    Snapshots wait in flat buffers until :data:`_BATCH_ROWS` of their rows are pending; then
    their ticks' rows are evaluated (a snapshot's ticks are final once the next one is taken)
    and written into blocks of output columns, and the buffers start again. So a run holds its
    time series as machine numbers (the frame's numeric columns) and a bounded batch of
    snapshots, not every snapshot until the end. :meth:`frame` evaluates what is left and joins
    the blocks, once.
    """

    def __init__(
        self,
        core: Core,
        specs: tuple[WorkerSpec, ...],
        tick_s: float,
        window: tuple[int, int, int] = (0, 0, 1),
    ) -> None:
        """``window``: ``(W, S, N)`` of :func:`pdopt.sim._closed_form.kv_blocks`."""
        self._core = core
        self._window = window
        self._specs = specs
        self._tick_s = tick_s
        self._n_w = len(specs)
        self._idle = np.array([s.idle_power_w for s in specs], dtype=np.float64)
        self._peak = np.array([s.max_power_w for s in specs], dtype=np.float64)
        # the layouts (the workers' roles and pools, which change only on pool moves), and per
        # layout and worker whether the role takes decodes (the stranded-block rows)
        self._layouts: list[tuple[tuple[Role, ...], tuple[str, ...]]] = []
        self._not_prefill = array("b")
        self._start_batch()
        # every evaluated snapshot's layout and tick count (the string columns' rows)
        self._all_layout = array("q")
        self._all_count = array("q")
        # evaluation state carried from batch to batch: the last tick's busy seconds per worker
        # (busy_frac's previous tick) and kv_blocks tabulated over contexts (sliding window)
        self._last_busy = np.zeros(self._n_w, dtype=np.float64)
        self._kv_table = np.zeros(0, dtype=np.int64)
        # output blocks per numeric column; rows written in the last block; rows in all
        self._blocks: dict[str, list[npt.NDArray[Any]]] = {name: [] for name, _ in _NUMERIC}
        self._fill = _BLOCK_ROWS
        self._n_rows = 0
        self._taken = False

    def _start_batch(self) -> None:
        """Empty pending buffers (new arrays: the last batch's may still be exported to numpy)."""
        # per snapshot: its first tick, the ticks it stands for, the reference need and its
        # layout (an index into self._layouts)
        self._first = array("q")
        self._count = array("q")
        self._need = array("q")
        self._layout = array("q")
        # per snapshot and worker: _FIELDS, flat (as float64: one machine number each, where a
        # list of tuples held a Python object per number, ~4x the memory; issue 38)
        self._rows = array("d")
        # per row whose KV grows: its phase counts, or with a sliding window its offsets, flat;
        # row i's are _cnt[_cnt_start[i] : _cnt_start[i + 1]]
        self._cnt = array("q")
        self._cnt_start = array("q", [0])

    def snapshot(self, k: int, need: int) -> None:
        """Record every worker's parameters at tick ``k`` (standing for that tick alone until
        :meth:`stretch`). ``need``: the stranded-block reference
        (:meth:`pdopt.sim.ClusterView.reference_need_blocks`).

        NOTE: one tuple per worker, copied into a flat float64 array, is the whole per-tick cost;
        the rows are evaluated a batch of snapshots at a time (:meth:`_flush`).
        """
        if len(self._first) * self._n_w >= _BATCH_ROWS:
            self._flush()  # the pending snapshots' ticks are final: this one follows them
        core = self._core
        roles = core.roles
        layouts = self._layouts
        if not layouts or layouts[-1][0] != tuple(roles) or layouts[-1][1] != tuple(core.pools):
            layouts.append((tuple(roles), tuple(core.pools)))
            self._not_prefill.extend(r is not Role.PREFILL for r in roles)
        self._layout.append(len(layouts) - 1)
        self._first.append(k)
        self._count.append(1)
        self._need.append(need)
        tokens = core.table.prefill_tokens
        extend = self._rows.extend
        for p, d, role in zip(core.prefill, core.decode, roles, strict=True):
            batch = p.batch
            b = d.b
            inflight = p.inflight
            grows = b > 0 and not d.reserve_output
            if grows:
                self._cnt.extend(d.running.values() if d.windowed else d.cnt)
                self._cnt_start.append(len(self._cnt))
            extend(
                (
                    len(d.queue) if role is Role.DECODE else len(p.queue), len(batch) + b,
                    d.reserved + (p.reserved_blocks(tokens) if batch else 0), d.cap,
                    b, d.n_seg, d.u_seg, d.t_seg, d.a_seg, d.half_d2b,
                    grows, d.busy_s, d.busy_since,
                    p.busy_s, inflight and p.counted, p.batch_start_s, p.stall_since, inflight,
                    p.batch_end_s, p.queued_flop, p.batch_flop,
                )
            )  # fmt: skip

    def stretch(self, end: int) -> None:
        """Let the last snapshot stand for every tick before tick ``end`` (no event between)."""
        self._count[-1] = end - self._first[-1]

    def frame(self) -> pd.DataFrame:
        """Every tick's rows (one per worker, by tick then worker) as a frame of
        :data:`pdopt.sim.TIMESERIES_COLUMNS`. Once per run: it hands over the evaluated rows
        (a second call raises)."""
        if self._taken:
            raise RuntimeError("Telemetry.frame() was called already (it hands its rows over)")
        self._flush()
        self._taken = True
        if not self._all_count:
            return pd.DataFrame.from_records([], columns=list(TIMESERIES_COLUMNS))
        n_w = self._n_w
        count = np.frombuffer(self._all_count, dtype=np.int64)
        worker = np.tile(np.arange(n_w, dtype=np.int64), int(count.sum()))
        columns: dict[str, Any] = {"worker": label_column(self._core.names, worker)}
        del worker
        layout_of_tick = np.repeat(np.frombuffer(self._all_layout, dtype=np.int64), count)
        layout = (layout_of_tick[:, None] * n_w + np.arange(n_w)[None, :]).ravel()
        del layout_of_tick, count
        roles = [r for roles, _ in self._layouts for r in roles]
        columns["pool"] = label_column([p for _, pools in self._layouts for p in pools], layout)
        columns["role"] = label_column([str(r) for r in roles], layout)
        del layout
        self._all_layout, self._all_count = array("q"), array("q")
        for name, dtype in _NUMERIC:  # one column at a time: its blocks go as it is joined
            blocks = self._blocks[name]
            if blocks:
                blocks[-1] = blocks[-1][: self._fill]
            columns[name] = np.concatenate(blocks) if blocks else np.zeros(0, dtype=dtype)
            blocks.clear()
        # NOTE: copy=False keeps each column as its own block (the arrays are this frame's).
        return pd.DataFrame({name: columns[name] for name in TIMESERIES_COLUMNS}, copy=False)

    def _flush(self) -> None:
        """Evaluate the pending snapshots' rows into the output blocks and empty the buffers."""
        if not self._first:
            return
        n_w = self._n_w
        count = np.frombuffer(self._count, dtype=np.int64)
        starts = np.cumsum(count)
        ends = starts.copy()
        starts -= count  # each snapshot's first row of ticks in this batch
        first = np.frombuffer(self._first, dtype=np.int64)
        data = np.frombuffer(self._rows, dtype=np.float64).reshape(-1, len(_FIELDS))  # no copy
        total = int(ends[-1])
        step = max(1, _CHUNK_ROWS // n_w)  # ticks per chunk
        for a in range(0, total, step):
            t = np.arange(a, min(total, a + step), dtype=np.int64)
            snap = np.searchsorted(ends, t, side="right")  # the snapshot of each tick
            tick = first[snap] + (t - starts[snap])
            self._write(self._evaluate(data, snap, tick))
        self._all_layout.extend(self._layout)
        self._all_count.extend(self._count)
        del count, first, data  # the buffers' numpy views
        self._start_batch()

    def _write(self, values: dict[str, npt.NDArray[Any]]) -> None:
        """Append one chunk's rows to the output blocks (a new block per column when full)."""
        n = len(values["t_s"])
        done = 0
        while done < n:
            if self._fill == _BLOCK_ROWS:
                for name, dtype in _NUMERIC:
                    self._blocks[name].append(np.empty(_BLOCK_ROWS, dtype=dtype))
                self._fill = 0
            take = min(n - done, _BLOCK_ROWS - self._fill)
            for name, _ in _NUMERIC:
                self._blocks[name][-1][self._fill : self._fill + take] = values[name][
                    done : done + take
                ]
            self._fill += take
            done += take
        self._n_rows += n

    def _evaluate(
        self, data: FloatArray, snap: IntArray, tick: IntArray
    ) -> dict[str, npt.NDArray[Any]]:
        """The numeric columns of ticks ``tick`` (their pending snapshots ``snap``), one row per
        worker, by tick then worker."""
        n_w = self._n_w
        rec = (snap[:, None] * n_w + np.arange(n_w)[None, :]).ravel()  # row -> snapshot row
        snap_of_row = np.repeat(snap, n_w)
        worker = rec % n_w
        now = cast(FloatArray, np.repeat(tick, n_w) * self._tick_s)  # Control.on_tick's k·tick_s

        def col(name: str, dtype: type = np.float64) -> npt.NDArray[Any]:
            values: npt.NDArray[Any] = data[rec, _F[name]].astype(dtype)
            return values

        used = col("u_seg", np.int64) + col("held", np.int64) + self._growth(data, rec, now)
        cap = col("cap", np.int64)  # DecodeSide.cap: a mixed worker's changes (_mixed)
        free = np.where(used < cap, cap - used, 0)
        busy = self._busy(col, now).reshape(-1, n_w)
        last = np.vstack([self._last_busy[None, :], busy[:-1]])  # the previous tick's
        self._last_busy = busy[-1].copy()
        frac = np.minimum(1.0, np.maximum(0.0, (busy - last) / self._tick_s)).ravel()
        idle = self._idle[worker]
        peak = self._peak[worker]
        layout = np.frombuffer(self._layout, dtype=np.int64)[snap_of_row] * n_w + worker
        need = np.frombuffer(self._need, dtype=np.int64)[snap_of_row]
        not_prefill = np.frombuffer(self._not_prefill, dtype=np.int8)[layout] != 0
        need = np.where(not_prefill, need, 0)
        return {
            "t_s": now,
            "queue_len": col("queue_len", np.int64),
            "queued_prefill_flop": self._outstanding(col, now),
            "running": col("running", np.int64),
            "kv_used_blocks": used,
            "kv_free_blocks": free,
            "kv_stranded_blocks": stranded_blocks(free, need),
            "busy_frac": frac,
            "power_w": idle + (peak - idle) * frac,
        }

    def _growth(self, data: FloatArray, rec: IntArray, now: FloatArray) -> IntArray:
        """Blocks the running decodes gained since their segment's start, per row
        (DecodeSide.used_blocks less ``u_seg``; 0 where the KV does not grow)."""
        out = np.zeros(len(rec), dtype=np.int64)
        rows = np.flatnonzero(data[rec, _F["grows"]] > 0)
        if not len(rows):
            return out
        src = rec[rows]

        def col(name: str) -> FloatArray:
            values: FloatArray = data[src, _F[name]]
            return values

        k = boundaries_before_array(col("t_seg"), col("a_seg"), col("half_d2b"), now[rows])
        bt = self._specs[0].block_tokens  # one for all workers (ClusterSpec)
        which = (np.cumsum(data[:, _F["grows"]] > 0) - 1)[src]  # its row of self._cnt
        n_seg = col("n_seg").astype(np.int64)
        if self._window[1] > 0:
            out[rows] = self._window_growth(which, n_seg, k, bt)
            return out
        cnt = np.frombuffer(self._cnt, dtype=np.int64).reshape(-1, bt)
        b = col("b").astype(np.int64)
        out[rows] = growth_array(cnt, which, b, bt, n_seg + 1, k)
        return out

    def _window_growth(self, which: IntArray, n_seg: IntArray, k: IntArray, bt: int) -> IntArray:
        """:func:`pdopt.sim._closed_form.window_growth` per row over boundaries ``n_seg + 1 ..
        n_seg + k``: ``Σ kv_blocks(o + n_seg + k) − kv_blocks(o + n_seg)`` over the row's
        offsets ``o`` (row ``which`` of ``self._cnt``).

        NOTE: ``kv_blocks`` is tabulated over every context the rows reach (scalar calls of the
        one owner, kept from batch to batch and extended as longer contexts come), then the rows
        index the table by snapshot, vectorised over their ticks.
        """
        out = np.zeros(len(which), dtype=np.int64)
        flat, bounds = np.frombuffer(self._cnt, dtype=np.int64), self._cnt_start
        rows_of = np.unique(which)
        offsets = {int(i): flat[bounds[i] : bounds[i + 1]] for i in rows_of}
        highest = np.array([offsets[int(i)].max() for i in rows_of], dtype=np.int64)
        reach = highest[np.searchsorted(rows_of, which)] + n_seg + k
        top = int(reach.max(initial=0))  # the longest context reached
        have = len(self._kv_table)
        if top >= have:
            more = np.fromiter(
                (kv_blocks(c, bt, *self._window) for c in range(have, top + 1)),
                np.int64,
                count=top + 1 - have,
            )
            self._kv_table = np.concatenate([self._kv_table, more])
        table = self._kv_table
        for i in rows_of:
            rows = np.flatnonzero(which == i)
            o = offsets[int(i)]
            start = int(table[o + n_seg[rows[0]]].sum())
            ends = table[o[None, :] + (n_seg[rows] + k[rows])[:, None]].sum(axis=1)
            out[rows] = ends - start
        return out

    @staticmethod
    def _busy(col: Any, now: FloatArray) -> FloatArray:
        """``PrefillSide.busy_until(now) + DecodeSide.busy_until(now)`` per row, seconds."""
        prefill = col("p_busy_s", np.float64) + np.where(
            col("p_counting", bool), now - col("p_start", np.float64), 0.0
        )
        stall = col("p_stall_since", np.float64)
        prefill = prefill - np.where(stall >= 0.0, now - stall, 0.0)
        decode = col("d_busy_s", np.float64) + np.where(
            col("b", np.int64) > 0, now - col("d_busy_since", np.float64), 0.0
        )
        result: FloatArray = prefill + decode
        return result

    @staticmethod
    def _outstanding(col: Any, now: FloatArray) -> FloatArray:
        """``PrefillSide.outstanding_flop(now)`` per row, FLOP."""
        queued = col("queued_flop", np.float64)
        start, end = col("p_start", np.float64), col("p_end", np.float64)
        span = end - start
        with np.errstate(divide="ignore", invalid="ignore"):
            left = np.where(span > 0, (end - now) / span, 0.0)
        running = queued + col("batch_flop", np.float64) * np.minimum(1.0, np.maximum(0.0, left))
        result: FloatArray = np.where(col("p_inflight", bool), running, queued)
        return result
