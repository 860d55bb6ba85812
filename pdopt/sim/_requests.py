"""Per-request state of one run: preallocated columns indexed by request id.

NOTE: columns are ``array.array`` rather than numpy arrays or objects: scalar reads and writes
return plain Python numbers (numpy scalar indexing is several times slower in the event loop), and
memory stays at 8 bytes per value (1M requests × 20 columns ≈ 160 MB).
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from pdopt.sim._enums import STATUS_NAMES

_FLOAT_COLUMNS = (
    "arrival_s",
    "prefill_start_s",
    "prefill_end_s",
    "transfer_start_s",
    "transfer_end_s",
    "decode_start_s",
    "first_token_s",
    "finish_s",
    "prefill_flop",
    "ready_s",
    "migration_downtime_s",
    "migrated_bytes",
)
_INT_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "generated",
    "prefill_worker",
    "decode_worker",
    "preemptions",
    "status",
    "kv_offset",
    "finish_counter",
    "admit_seq",
    "prefill_tokens",
    "decode_target",
    "migrations",
)


class RequestTable:
    """Columns of ``n`` requests; timestamps NaN until set, workers -1 until chosen.

    ``generated`` counts tokens produced so far (the first comes from prefill). On decode worker
    ``w`` a running request's context at iteration counter ``m`` is ``kv_offset + m`` and it
    leaves at counter ``finish_counter`` (see :mod:`pdopt.sim._decode`).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        nan = array("d", [float("nan")]) * n
        for name in _FLOAT_COLUMNS:
            setattr(self, name, array("d", nan))
        self.migration_downtime_s = array("d", [0.0]) * n
        self.migrated_bytes = array("d", [0.0]) * n
        zeros = array("q", [0]) * n
        for name in _INT_COLUMNS:
            setattr(self, name, array("q", zeros))
        minus = array("q", [-1]) * n
        self.prefill_worker = array("q", minus)
        self.decode_worker = array("q", minus)
        self.decode_target = array("q", minus)
        self.reason: dict[int, str] = {}
        self.next_admit_seq = 0
        # Prefix caching (pdopt.sim._prefix_cache): request i's chained block keys are
        # prefix_keys[prefix_offsets[i]:prefix_offsets[i + 1]], prefix_block_tokens tokens each;
        # None without prefix blocks. cached_tokens: prompt tokens its last prefill skipped.
        self.prefix_offsets: np.ndarray | None = None
        self.prefix_keys: np.ndarray | None = None
        self.prefix_block_tokens = 0
        self.cached_tokens = array("q", zeros)

    # Typed attribute declarations for mypy (set dynamically above).
    arrival_s: array[float]
    prefill_start_s: array[float]
    prefill_end_s: array[float]
    transfer_start_s: array[float]
    transfer_end_s: array[float]
    decode_start_s: array[float]
    first_token_s: array[float]
    finish_s: array[float]
    prefill_flop: array[float]
    ready_s: array[float]
    migration_downtime_s: array[float]
    migrated_bytes: array[float]
    migrations: array[int]
    prefill_tokens: array[int]
    decode_target: array[int]
    input_tokens: array[int]
    output_tokens: array[int]
    generated: array[int]
    prefill_worker: array[int]
    decode_worker: array[int]
    preemptions: array[int]
    status: array[int]
    kv_offset: array[int]
    finish_counter: array[int]
    admit_seq: array[int]

    def prefix_keys_of(self, rid: int) -> np.ndarray:
        """Chained keys of ``rid``'s full prompt blocks (empty without prefix blocks)."""
        offsets, keys = self.prefix_offsets, self.prefix_keys
        assert offsets is not None and keys is not None
        return keys[offsets[rid] : offsets[rid + 1]]

    def to_frame(
        self, count: int, worker_names: tuple[str, ...], *, cached: bool = False
    ) -> pd.DataFrame:
        """The public per-request table of the first ``count`` requests (see SimResult);
        with ``cached`` (a run with a prefix cache), also ``cached_tokens``."""

        def col(name: str, dtype: type) -> np.ndarray:
            # NOTE: a view of the column, not a copy: the frame's constructor copies it into its
            # blocks anyway, so a copy here only raised the peak (by ~140 MB at 1M requests).
            return np.frombuffer(getattr(self, name), dtype=dtype)[:count]

        arrival = col("arrival_s", np.float64)
        first = col("first_token_s", np.float64)
        finish = col("finish_s", np.float64)
        outputs = col("output_tokens", np.int64)
        names = np.array((*worker_names, ""), dtype=object)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(outputs > 1, (finish - first) / (outputs - 1), np.nan)
        status = np.array(STATUS_NAMES, dtype=object)[col("status", np.int64)]
        frame = pd.DataFrame(
            {
                "request_id": np.arange(count, dtype=np.int64),
                "arrival_s": arrival,
                "input_tokens": col("input_tokens", np.int64),
                "output_tokens": outputs,
                "prefill_worker": names[col("prefill_worker", np.int64)],
                "decode_worker": names[col("decode_worker", np.int64)],
                "prefill_start_s": col("prefill_start_s", np.float64),
                "prefill_end_s": col("prefill_end_s", np.float64),
                "transfer_start_s": col("transfer_start_s", np.float64),
                "transfer_end_s": col("transfer_end_s", np.float64),
                "decode_start_s": col("decode_start_s", np.float64),
                "first_token_s": first,
                "finish_s": finish,
                "ttft_s": first - arrival,
                "tpot_s": tpot,
                "e2e_s": finish - arrival,
                "queue_wait_s": col("prefill_start_s", np.float64) - arrival,
                "preemptions": col("preemptions", np.int64),
                "migrations": col("migrations", np.int64),
                "migration_downtime_s": col("migration_downtime_s", np.float64),
                "migrated_bytes": col("migrated_bytes", np.float64),
                "status": status,
            }
        )
        reasons = np.full(count, "", dtype=object)
        for rid, text in self.reason.items():
            if rid < count:
                reasons[rid] = text
        frame["reason"] = reasons
        if cached:
            frame["cached_tokens"] = col("cached_tokens", np.int64)
        return frame
