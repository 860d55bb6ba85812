"""What a simulation returns (its frames and their column names), and the metrics computed from
it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from pdopt.cluster._spec import Slo
from pdopt.freeness import fragmentation_pct, fragmentation_pct_of_totals

EVENT_COLUMNS = ("t_s", "kind", "worker", "request_id", "detail")
"""Columns of ``SimResult.events``."""
EventRows = list[tuple[float, str, str, int, str]] | dict[str, np.ndarray]
"""An engine's event log before it becomes ``SimResult.events``: rows, or columns by name."""

TIMESERIES_COLUMNS = (
    "t_s",
    "worker",
    "pool",
    "role",
    "queue_len",
    "queued_prefill_flop",
    "running",
    "kv_used_blocks",
    "kv_free_blocks",
    "kv_stranded_blocks",
    "busy_frac",
    "power_w",
)
"""Columns of :attr:`SimResult.timeseries`, one row per worker per control tick (the fluid
model's pool rows reuse them). With rows, ``worker``, ``pool`` and ``role`` have pandas'
default string dtype (``str``), the counts int64 and the rest float64."""


def label_column(
    labels: Sequence[str], index: npt.NDArray[np.int64]
) -> pd.api.extensions.ExtensionArray:
    """``labels[index]`` as a time-series string column (pandas' default ``str`` dtype, the one
    a frame infers from strings), for both engines.

    NOTE: the few labels become a string array once and the rows are taken from it, so pandas
    does not validate every row's string (about half a 10^6-row frame's build; issue 38).
    """
    return pd.array(np.asarray(labels, dtype=object), dtype="str").take(index)


@dataclass(frozen=True, slots=True)
class SimResult:
    """The outcome of one run.

    Attributes
    ----------
    requests : DataFrame
        One row per request: request_id, arrival_s, input_tokens, output_tokens, prefill_worker,
        decode_worker, prefill_start_s, prefill_end_s, transfer_start_s, transfer_end_s,
        decode_start_s, first_token_s, finish_s, ttft_s, tpot_s (NaN when output_tokens == 1),
        e2e_s, queue_wait_s (arrival → prefill start), preemptions, migrations (completed KV
        migrations), migration_downtime_s (total stop-and-copy downtime), migrated_bytes, status
        ("finished" or "rejected"), reason (why rejected). Timestamps and workers are those of
        the first pass (a preempted request is prefilled again; see :mod:`pdopt.sim._engine`);
        a request that skips a stage has NaN there (no transfer or decode when
        output_tokens == 1).
    timeseries : DataFrame
        Every ``tick_s``, one row per worker (see :data:`pdopt.sim.TIMESERIES_COLUMNS`);
        ``busy_frac`` is the busy share of the interval ending at ``t_s``.
    events : DataFrame
        t_s, kind (migration_start, migration_end, migration_cancel, pool_move, preemption,
        false_oom, rejection), worker, request_id (-1 when none), detail (for migration_end:
        src, bytes, stages including the stop-and-copy, downtime_s; :mod:`pdopt.sim._migration`).
    workers : DataFrame
        Per worker: worker, pool and role at the end, busy_s, energy_j over [0, makespan_s],
        colocated_schedule (what a mixed worker ran: its own, or the policy's forced one).
    slo : Slo
    makespan_s : float
        Time the last request ended.
    """

    requests: pd.DataFrame
    timeseries: pd.DataFrame
    events: pd.DataFrame
    workers: pd.DataFrame
    slo: Slo
    tick_s: float
    seed: int
    makespan_s: float

    def metrics(self, slo: Slo | None = None) -> pd.Series:
        """Summary metrics (see :func:`compute_metrics`)."""
        return compute_metrics(self, slo or self.slo)


def rejections_by_reason(requests: pd.DataFrame) -> dict[str, int]:
    """Rejected requests of a run's request table counted by their ``reason``, most frequent
    first (empty when none is rejected)."""
    rejected = requests[requests["status"] == "rejected"]
    if not len(rejected):
        return {}
    counts = rejected["reason"].fillna("unknown").value_counts(sort=True)
    return {str(k): int(v) for k, v in counts.items()}


def _fragmentation(ts: pd.DataFrame) -> dict[str, float]:
    """``fragmentation_pct`` (ratio of the run's sums), ``fragmentation_mean_pct`` and
    ``fragmentation_peak_pct`` (over ticks); NaN without a time series."""
    nan = float("nan")
    if not len(ts):
        return dict.fromkeys(_FRAGMENTATION_KEYS, nan)
    dec = ts[ts["role"] != "prefill"]
    per_tick = fragmentation_by_tick(ts).to_numpy()
    return {
        "fragmentation_pct": fragmentation_pct(
            dec["kv_free_blocks"].to_numpy(), dec["kv_stranded_blocks"].to_numpy()
        ),
        "fragmentation_mean_pct": float(per_tick.mean()) if len(per_tick) else nan,
        "fragmentation_peak_pct": float(per_tick.max()) if len(per_tick) else nan,
    }


_FRAGMENTATION_KEYS = ("fragmentation_pct", "fragmentation_mean_pct", "fragmentation_peak_pct")


def _strings(column: pd.Series) -> np.ndarray:
    """``column`` as a numpy object array, a missing value as None (compares unequal to every
    string). NOTE: numpy compares 10^5 strings several times faster than pandas' str dtype."""
    values = column.to_numpy(dtype=object, copy=True)
    values[pd.isna(values)] = None
    return values


def _pcts(values: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """The ``qs`` percentiles of ``values`` (NaN when empty) with one partial sort: the same
    order statistics and interpolation as ``np.percentile`` one q at a time."""
    if not len(values):
        return [float("nan")] * len(qs)
    return [float(x) for x in np.percentile(values, qs)]


def fragmentation_by_tick(timeseries: pd.DataFrame) -> pd.Series:
    """Cluster fragmentation % at each control tick: ``100 · Σ stranded / Σ free`` over the decode
    workers (role ``decode`` or ``mixed``) of that tick, 0 at a tick with nothing free
    (:func:`pdopt.freeness.fragmentation_pct_of_totals`; Phasor Fig. 6 plots this series).

    Returns a Series indexed by every tick ``t_s`` of the time series, ascending (empty without
    one).
    """
    ticks = np.unique(timeseries["t_s"].to_numpy(dtype=np.float64))
    dec = timeseries[timeseries["role"] != "prefill"]
    columns = ["kv_free_blocks", "kv_stranded_blocks"]
    totals = dec.groupby("t_s")[columns].sum().reindex(ticks, fill_value=0)
    pct = fragmentation_pct_of_totals(
        totals["kv_free_blocks"].to_numpy(), totals["kv_stranded_blocks"].to_numpy()
    )
    return pd.Series(pct, index=pd.Index(ticks, name="t_s"), name="fragmentation_pct")


def decode_begin_s(requests: pd.DataFrame, workers: pd.DataFrame) -> np.ndarray:
    """When each request's decoding begins, seconds (EcoServe §4.4, Fig. 6: the end of the
    "phase-switching waiting time"): its decode admission (``decode_start_s``), except that a
    request admitted on the mixed worker that prefilled it, under the ``prefill_first``
    schedule, waits for every prefill batch that worker starts back to back from that instant
    (the schedule runs no decode iteration between them; :mod:`pdopt.sim._mixed`). Read from
    the request table: a batch on worker ``w`` starts at its members' ``prefill_start_s`` and
    ends at their ``prefill_end_s``. NaN where ``decode_start_s`` is (one output token).
    Under ``hybrid`` (chunked) schedules decodes ride in every iteration, so no wait is added.
    """
    needed = ("decode_start_s", "prefill_worker", "decode_worker", "prefill_start_s")
    if any(col not in requests for col in needed):  # a hand-built table without the stamps
        return np.full(len(requests), np.nan)
    begin = requests["decode_start_s"].to_numpy(dtype=np.float64).copy()
    sched = dict(zip(workers["worker"], workers.get("colocated_schedule", []), strict=False))
    pw = _strings(requests["prefill_worker"])
    home = (pw == _strings(requests["decode_worker"])) & ~np.isnan(begin)
    if not home.any():
        return begin  # no request decodes where it was prefilled (P/D workers only)
    starts = requests["prefill_start_s"].to_numpy(dtype=np.float64)
    ends = requests["prefill_end_s"].to_numpy(dtype=np.float64)
    for w in {x for x, k in sched.items() if k == "prefill_first"}:
        mine = pw == w
        waiting = np.flatnonzero(mine & home)
        if not len(waiting):
            continue  # no request decodes where it was prefilled (a P/D worker)
        # the worker's batches: each start, and the latest end of the batches starting then
        both = mine & ~np.isnan(starts) & ~np.isnan(ends)
        batch_start, first = np.unique(starts[both], return_inverse=True)
        if not len(batch_start):
            continue
        batch_end = np.full(len(batch_start), -np.inf)
        np.maximum.at(batch_end, first, ends[both])
        # follow the back-to-back batches from each admission, all requests at once
        t = begin[waiting]
        active = np.arange(len(t))
        while len(active):
            at = np.minimum(np.searchsorted(batch_start, t[active]), len(batch_start) - 1)
            later = (batch_start[at] == t[active]) & (batch_end[at] > t[active])
            active, at = active[later], at[later]
            t[active] = batch_end[at]
        begin[waiting] = t
    return begin


def latency_by_timing(requests: pd.DataFrame, workers: pd.DataFrame) -> dict[str, np.ndarray]:
    """``{timing: (ttft_s, tpot_s)}`` arrays over ``requests`` for each :data:`SLO_TIMINGS`:
    ``first_token`` as recorded; ``decode_start`` (EcoServe §4.4) TTFT = decoding begins
    (:func:`decode_begin_s`) − arrival, TPOT = (finish − that) / (output_tokens − 1)."""
    ttft = requests["ttft_s"].to_numpy(dtype=np.float64)
    tpot = requests["tpot_s"].to_numpy(dtype=np.float64)
    if any(col not in requests for col in ("finish_s", "arrival_s", "output_tokens")):
        return {"first_token": np.stack([ttft, tpot]), "decode_start": np.stack([ttft, tpot])}
    begin = decode_begin_s(requests, workers)
    n = requests["output_tokens"].to_numpy(dtype=np.float64)
    has = ~np.isnan(begin) & (n > 1)
    ttft2 = np.where(has, begin - requests["arrival_s"].to_numpy(dtype=np.float64), ttft)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot2 = np.where(
            has, (requests["finish_s"].to_numpy(dtype=np.float64) - begin) / (n - 1), tpot
        )
    return {"first_token": np.stack([ttft, tpot]), "decode_start": np.stack([ttft2, tpot2])}


def fits_nowhere(events: pd.DataFrame) -> float:
    """Requests that waited for decode KV when no decode worker had room for them although the
    cluster's free blocks together would have held them: false OOMs (DESIGN.md "Fragmentation")
    whose need exceeded the largest single worker's free space (``most_free`` in the event's
    detail). Fragmentation across workers, in requests, which a reader can compare across
    systems (the Phasor paper's fragmentation % has no definition to compare with). NaN when a
    false OOM was logged without ``most_free`` (the compiled engine)."""
    rows = events[events["kind"] == "false_oom"]["detail"]
    count = 0
    for detail in rows:
        fields = dict(part.split("=", 1) for part in str(detail).split() if "=" in part)
        if "most_free" not in fields:
            return float("nan")
        count += int(fields["need"]) > int(fields["most_free"])
    return float(count)


def compute_metrics(result: SimResult, slo: Slo) -> pd.Series:
    """P50/P90/P99 and mean of TTFT, TPOT and E2E over finished requests, SLO attainment, goodput,
    throughput, fragmentation % (the ratio over the run, and the mean and peak of the per-tick
    figure), false OOMs, preemptions, migrations (completed and cancelled, bytes moved, total
    downtime in seconds) and energy per output token.

    * ``slo_attainment``: share of all requests (rejected ones fail) whose TTFT <= ttft_s and TPOT
      <= tpot_s, under ``slo.timing``; a request with one output token has no TPOT and meets
      it trivially. ``slo_attainment_first_token`` / ``slo_attainment_decode_start``: the same
      under each timing (:func:`latency_by_timing`), with ``ttft_decode_start_p90_s``,
      ``tpot_decode_start_p90_s`` (and P99) beside pdopt's percentiles.
    * ``goodput_rps`` / ``throughput_rps``: requests meeting the SLO / finished, divided by the
      span from the first arrival to ``makespan_s``.
    * ``fragmentation_pct``: 100 · Σ stranded / Σ free over the decode workers' time-series rows
      (:func:`pdopt.freeness.fragmentation_pct`; NaN without a time series) (DESIGN.md
      "Fragmentation"). Every tick weighs by its free blocks, so a run whose free space is
      mostly unstranded dilutes short bursts of fragmentation.
    * ``fragmentation_mean_pct`` / ``fragmentation_peak_pct``: mean and maximum over control
      ticks of the per-tick cluster fragmentation :func:`fragmentation_by_tick` (100 · Σ
      stranded / Σ free over that tick's decode workers, 0 when nothing is free), the figures
      the Phasor paper reports (Fig. 6: 49.65% peak for its baselines, 6.20% mean for Phasor);
      NaN without a time series.
    * ``kv_fits_nowhere`` / ``kv_fits_nowhere_pct``: requests (count, % of all) that waited for
      KV fitting on no decode worker although the cluster's free sum held them
      (:func:`fits_nowhere`), the request-level fragmentation reported beside the per-tick %.
    * ``prefix_hit_rate_tokens`` / ``prefix_hit_rate_requests`` (runs with prefix caching only):
      the share of prompt tokens the workers' prefix caches served, and of requests with a hit.
    * ``energy_per_output_token_j``: Σ_w [P_idle·makespan + (P_max − P_idle)·busy_s] / output
      tokens of finished requests.
    """
    req = result.requests
    status = _strings(req["status"])
    done = req[status == "finished"]
    ttft = done["ttft_s"].to_numpy()
    tpot = done["tpot_s"].to_numpy()
    tpot_known = tpot[~np.isnan(tpot)]
    e2e = done["e2e_s"].to_numpy()
    both = latency_by_timing(done, result.workers)
    met = {
        k: (v[0] <= slo.ttft_s) & (np.isnan(v[1]) | (v[1] <= slo.tpot_s)) for k, v in both.items()
    }
    meets = met[slo.timing]
    start = float(req["arrival_s"].min()) if len(req) else 0.0
    span = result.makespan_s - start
    out: dict[str, float] = {"requests": float(len(req)), "finished": float(len(done))}
    out["rejected"] = float(len(req) - len(done))
    out["aborted"] = float((status == "aborted").sum())
    if "cached_tokens" in req:  # a run with prefix caching
        cached = req["cached_tokens"].to_numpy()
        total = float(req["input_tokens"].sum())
        out["prefix_hit_rate_tokens"] = float(cached.sum()) / total if total else float("nan")
        out["prefix_hit_rate_requests"] = float((cached > 0).mean()) if len(req) else float("nan")
    for name, values in (("ttft", ttft), ("tpot", tpot_known), ("e2e", e2e)):
        for q, value in zip((50, 90, 99), _pcts(values, (50, 90, 99)), strict=True):
            out[f"{name}_p{q}_s"] = value
        out[f"{name}_mean_s"] = float(values.mean()) if len(values) else float("nan")
    out["slo_attainment"] = float(meets.sum() / len(req)) if len(req) else float("nan")
    for k, m in met.items():
        out[f"slo_attainment_{k}"] = float(m.sum() / len(req)) if len(req) else float("nan")
    paper = both["decode_start"]
    ttft_p = _pcts(paper[0], (90, 99))
    tpot_p = _pcts(paper[1][~np.isnan(paper[1])], (90, 99))
    for q, ttft_q, tpot_q in zip((90, 99), ttft_p, tpot_p, strict=True):
        out[f"ttft_decode_start_p{q}_s"] = ttft_q
        out[f"tpot_decode_start_p{q}_s"] = tpot_q
    out["goodput_rps"] = float(meets.sum() / span) if span > 0 else float("nan")
    out["throughput_rps"] = float(len(done) / span) if span > 0 else float("nan")
    tokens = float(done["output_tokens"].sum())
    out["output_tokens_per_s"] = tokens / span if span > 0 else float("nan")
    out.update(_fragmentation(result.timeseries))
    kinds = _strings(result.events["kind"])
    out["false_oom"] = float((kinds == "false_oom").sum())
    out["kv_fits_nowhere"] = fits_nowhere(result.events)
    out["kv_fits_nowhere_pct"] = 100.0 * out["kv_fits_nowhere"] / len(req) if len(req) else 0.0
    out["preemptions"] = float(req["preemptions"].sum())
    out["migrations"] = float(req["migrations"].sum())
    out["migrations_cancelled"] = float((kinds == "migration_cancel").sum())
    out["migrated_bytes"] = float(req["migrated_bytes"].sum())
    out["migration_downtime_s"] = float(req["migration_downtime_s"].sum())
    energy = float(result.workers["energy_j"].sum())
    out["energy_j"] = energy
    out["energy_per_output_token_j"] = energy / tokens if tokens > 0 else float("nan")
    out["makespan_s"] = result.makespan_s
    return pd.Series(out, name="metrics")
