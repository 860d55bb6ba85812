"""One simulation scenario: workload + cluster + policy + SLO + run options (DESIGN.md).

:class:`Scenario` is what ``pdopt simulate`` runs from a TOML file, what the capacity search
(:mod:`pdopt.capacity`) and the tuner (:mod:`pdopt.tune`) evaluate, and what the experiments
build. :func:`read_toml` and :class:`TomlTable` are the one TOML reader of the CLI's files, with
one error format (``sim.toml [cluster] n_prefill: expected an int >= 0, got "four"``).
"""

from pdopt._toml import TomlTable, dumps_toml, read_toml
from pdopt.scenario._example import EXAMPLE_CONFIG
from pdopt.scenario._read import SERVER_OVERHEADS, with_server_overhead
from pdopt.scenario._scenario import Scenario, scenario_from_table

__all__ = [
    "EXAMPLE_CONFIG",
    "SERVER_OVERHEADS",
    "Scenario",
    "TomlTable",
    "dumps_toml",
    "read_toml",
    "scenario_from_table",
    "with_server_overhead",
]
