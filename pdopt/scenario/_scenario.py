"""``Scenario``: one simulation's inputs — workload (or closed-loop driver), cluster, policy, SLO
and run options — as one frozen value, read from and written to TOML and run by the CLI, the
capacity search, the tuner and the experiments (DESIGN.md, ``pdopt.scenario``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdopt._toml import TomlTable, dumps_toml, read_toml
from pdopt._validation import check_int_at_least, check_one_of, check_positive
from pdopt.cluster import ClusterSpec, Slo
from pdopt.errors import ConfigError
from pdopt.scenario._read import (
    TOP_KEYS,
    cluster_table,
    read_cluster,
    read_driver,
    read_policy,
    read_slo,
    workload_table,
)
from pdopt.sim import ClosedLoop, PolicyProtocol, SimResult, simulate
from pdopt.workload import Workload

_ENGINES = ("auto", "python", "compiled")


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything one simulation needs.

    Parameters
    ----------
    workload : Workload or ClosedLoop
        Open-loop requests, or a closed-loop driver.
    cluster : ClusterSpec
    policy : str or policy object
        A registered name (:func:`pdopt.policies.available_policies`), built afresh with
        ``policy_flags`` by every run (:func:`pdopt.policies.make_policy`); or a policy object,
        used as is (``policy_flags`` must then be empty). Policies take the run's SLO and tick
        from :class:`pdopt.sim.RunContext`; a flag such as ``ttft_slo_s`` overrides it.
    slo : Slo
    policy_flags : mapping
        Keyword flags of the named policy (ablations, thresholds).
    tick_s : float
        Control tick Δt and time-series period, seconds.
    seed : int
        Seed of the policy and of stochastic drivers.
    record_timeseries : bool
    engine : {"auto", "python", "compiled"}
        See :func:`pdopt.sim.simulate`.
    client_timeout_s : float or None
        Clients give up on a request not done this many seconds after it arrived, whatever
        its state (:func:`pdopt.sim.simulate`); None: they wait.

    Examples
    --------
    >>> from pdopt.scenario import Scenario
    >>> sc = Scenario.from_toml("sim.toml")  # doctest: +SKIP
    >>> sc.run(seed=1).metrics()["slo_attainment"]  # doctest: +SKIP
    """

    workload: Workload | ClosedLoop
    cluster: ClusterSpec
    policy: str | PolicyProtocol
    slo: Slo
    policy_flags: Mapping[str, Any] = field(default_factory=dict)
    tick_s: float = 0.05
    seed: int = 0
    record_timeseries: bool = True
    engine: str = "auto"
    client_timeout_s: float | None = None

    def __post_init__(self) -> None:
        owner = "Scenario"
        if not isinstance(self.workload, Workload | ClosedLoop):
            raise ConfigError(f"Scenario needs a Workload or a ClosedLoop; got {self.workload!r}")
        if not isinstance(self.cluster, ClusterSpec):
            raise ConfigError(f"Scenario needs a ClusterSpec; got {self.cluster!r}")
        if not isinstance(self.slo, Slo):
            raise ConfigError(f"Scenario needs an Slo; got {self.slo!r}")
        object.__setattr__(self, "policy_flags", dict(self.policy_flags))
        if not isinstance(self.policy, str) and self.policy_flags:
            raise ConfigError(
                "Scenario: policy_flags go with a policy name; build the policy object with "
                "its flags instead"
            )
        check_positive(self.tick_s, "tick_s", owner)
        check_int_at_least(self.seed, 0, "seed", owner)
        check_one_of(self.engine, _ENGINES, "engine", owner)
        if self.client_timeout_s is not None:
            check_positive(self.client_timeout_s, "client_timeout_s", owner)

    @property
    def policy_name(self) -> str:
        """The registered name, or the policy object's class name."""
        return self.policy if isinstance(self.policy, str) else type(self.policy).__name__

    def make_policy(self) -> PolicyProtocol:
        """A fresh policy from the name and flags (the object itself when one was given)."""
        if not isinstance(self.policy, str):
            return self.policy
        from pdopt.policies import make_policy

        return make_policy(self.policy, **self.policy_flags)

    def replace(self, **changes: Any) -> Scenario:
        """A copy with ``changes`` (field names) applied."""
        return dataclasses.replace(self, **changes)

    def run(self, **overrides: Any) -> SimResult:
        """Simulate this scenario (with ``overrides`` of its fields) with a fresh policy."""
        sc = self.replace(**overrides) if overrides else self
        return simulate(
            sc.workload,
            sc.cluster,
            sc.make_policy(),
            slo=sc.slo,
            tick_s=sc.tick_s,
            seed=sc.seed,
            record_timeseries=sc.record_timeseries,
            engine=sc.engine,
            client_timeout_s=sc.client_timeout_s,
        )

    @classmethod
    def from_toml(cls, path: str | Path) -> Scenario:
        """Read a scenario file (:data:`pdopt.scenario.EXAMPLE_CONFIG` shows every key)."""
        return scenario_from_table(read_toml(path), Path(path).parent)

    def to_toml(self, path: str | Path) -> Path:
        """Write this scenario to ``path`` in the explicit form (workload arrays, cluster
        workers), which :meth:`from_toml` reads back to an equal scenario. A policy object
        cannot be written: give a registered name and flags."""
        if not isinstance(self.policy, str):
            raise ConfigError(
                f"Scenario.to_toml: policy {self.policy_name} is an object; give a registered "
                "name and flags to write it"
            )
        data = {
            "seed": self.seed,
            "tick_s": self.tick_s,
            "record_timeseries": self.record_timeseries,
            "engine": self.engine,
            **_timeout_entry(self.client_timeout_s),
            "slo": {
                "ttft_s": self.slo.ttft_s,
                "tpot_s": self.slo.tpot_s,
                **({"timing": self.slo.timing} if self.slo.timing != "first_token" else {}),
            },
            "policy": {"name": self.policy, "flags": dict(self.policy_flags)},
            "cluster": cluster_table(self.cluster),
            "workload": workload_table(self.workload),
        }
        path = Path(path)
        path.write_text(dumps_toml(data))
        return path


def _timeout_entry(client_timeout_s: float | None) -> dict[str, float]:
    """``client_timeout_s`` for a scenario file: written only when set (files stay as before)."""
    return {} if client_timeout_s is None else {"client_timeout_s": client_timeout_s}


def scenario_from_table(
    top: TomlTable, base: Path = Path("."), *, other_tables: tuple[str, ...] = ()
) -> Scenario:
    """The scenario of a parsed file's top level; ``other_tables`` (e.g. ``("capacity",)``) are
    the command's own tables, allowed and left for it to read."""
    top.only((*TOP_KEYS, *other_tables))
    seed = top.integer("seed", 0, min_value=0)
    name, flags = read_policy(top)
    return Scenario(
        workload=read_driver(top, base, seed),
        cluster=read_cluster(top, base),
        policy=name,
        slo=read_slo(top),
        policy_flags=flags,
        tick_s=top.number("tick_s", 0.05, positive=True),
        seed=seed,
        record_timeseries=top.boolean("record_timeseries", True),
        engine=top.string("engine", "auto", choices=_ENGINES),
        client_timeout_s=(
            top.number("client_timeout_s", positive=True) if top.has("client_timeout_s") else None
        ),
    )
