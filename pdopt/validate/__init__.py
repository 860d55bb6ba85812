"""Validation of pdopt against real serving measurements (issue 34)."""

from pdopt.validate._realgpu import (
    INFERENCE_PERF_TIMEOUT_S,
    METRICS,
    RUN_COLUMNS,
    fit_server_overhead,
    read_runs,
    replay_run,
    replay_runs,
    roofline_cost,
    run_workload,
    summarize,
)

__all__ = [
    "INFERENCE_PERF_TIMEOUT_S",
    "METRICS",
    "RUN_COLUMNS",
    "fit_server_overhead",
    "read_runs",
    "replay_run",
    "replay_runs",
    "roofline_cost",
    "run_workload",
    "summarize",
]
