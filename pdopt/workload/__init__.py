"""Workloads: the columnar request table, generators, archetypes and trace readers.

A :class:`Workload` holds equal-length columns ``arrival_s``, ``input_tokens`` and
``output_tokens``. Build one from a generator (:func:`poisson_arrivals`, :func:`gamma_arrivals`,
:func:`piecewise_rate_arrivals` with :func:`generate_workload`), a named archetype
(:func:`archetype_workload`), or a trace file (:func:`read_trace`; any column names with a
column map). Prompts may carry prefix-cache block identities (:class:`PrefixBlocks`, read from a
trace's block hashes or built by :func:`shared_prefix_workload` and :func:`session_workload`).
"""

from pdopt.workload._archetypes import (
    ARCHETYPES,
    LONGBENCH_MAX_INPUT_TOKENS,
    Archetype,
    archetype_workload,
    get_archetype,
)
from pdopt.workload._block_columns import BLOCK_COLUMNS
from pdopt.workload._generators import (
    ConstantLengths,
    EmpiricalLengths,
    LengthDistribution,
    LognormalLengths,
    RateSchedule,
    gamma_arrivals,
    generate_workload,
    piecewise_rate_arrivals,
    poisson_arrivals,
    shock_recovery_schedule,
)
from pdopt.workload._prefix import PrefixBlocks
from pdopt.workload._readers import (
    COLUMN_MAP_KEYS,
    CSV_COLUMNS,
    MOONCAKE_BLOCK_TOKENS,
    TRACE_FORMATS,
    detect_trace_format,
    read_azure_trace,
    read_burstgpt_trace,
    read_csv_trace,
    read_jsonl_trace,
    read_mooncake_trace,
    read_splitwise_sim_trace,
    read_trace,
    read_vidur_trace,
    write_csv_trace,
)
from pdopt.workload._reuse import ReuseStats, reuse_stats, stack_distances
from pdopt.workload._reuse_generators import session_workload, shared_prefix_workload
from pdopt.workload._tables import ARRIVAL_KINDS, TIME_UNITS
from pdopt.workload._workload import MAX_TOKENS, Workload

__all__ = [
    "ARCHETYPES",
    "ARRIVAL_KINDS",
    "BLOCK_COLUMNS",
    "COLUMN_MAP_KEYS",
    "CSV_COLUMNS",
    "LONGBENCH_MAX_INPUT_TOKENS",
    "MAX_TOKENS",
    "MOONCAKE_BLOCK_TOKENS",
    "TIME_UNITS",
    "TRACE_FORMATS",
    "Archetype",
    "ConstantLengths",
    "EmpiricalLengths",
    "LengthDistribution",
    "LognormalLengths",
    "PrefixBlocks",
    "RateSchedule",
    "ReuseStats",
    "Workload",
    "archetype_workload",
    "detect_trace_format",
    "gamma_arrivals",
    "generate_workload",
    "get_archetype",
    "piecewise_rate_arrivals",
    "poisson_arrivals",
    "read_azure_trace",
    "read_burstgpt_trace",
    "read_csv_trace",
    "read_jsonl_trace",
    "read_mooncake_trace",
    "read_splitwise_sim_trace",
    "read_trace",
    "read_vidur_trace",
    "reuse_stats",
    "session_workload",
    "shared_prefix_workload",
    "shock_recovery_schedule",
    "stack_distances",
    "write_csv_trace",
]
