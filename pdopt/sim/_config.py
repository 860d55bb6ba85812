"""Simulation config files (TOML): what ``pdopt simulate CONFIG.toml`` runs.

The format is :data:`EXAMPLE_CONFIG` (every key documented there). Relative paths are relative
to the config file's folder. Unknown keys are errors, so a typo never goes unnoticed.
"""

from __future__ import annotations

import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdopt.errors import ConfigError
from pdopt.sim._drivers import ClosedLoop
from pdopt.sim._spec import LINK_PRESETS, ClusterSpec, Slo
from pdopt.workload import Workload

EXAMPLE_CONFIG = """\
# pdopt simulate: one request-level simulation (pdopt simulate CONFIG.toml [--json]).
seed = 0                    # seeds the workload generator and the policy
tick_s = 0.05               # control tick Δt and time-series period, seconds
record_timeseries = true
engine = "auto"             # "python", "compiled" (numba; P/D workers, built-in routing
                            # policies) or "auto" (compiled when it runs, >= 20k requests)

[workload]
archetype = "production_mix"  # short_short, long_short, short_long, medium_medium, long_long,
                              # production_mix, alpaca, sharegpt, longbench
rate_per_s = 20.0             # open-loop mean arrival rate
n_requests = 2000
cv = 1.0                      # inter-arrival CV: 1 = Poisson, 3 = bursty
# trace = "traces/azure_code.csv"   # instead of an archetype: a trace file (format detected)
# [workload.closed_loop]            # instead of open loop: N clients with think time
# clients = 32
# think_time_s = 1.0

[cluster]
gpu = "A100-80GB"             # pdopt profile catalog lists GPUs and models
model = "Llama-2-7B"
tp = 1
profile = "roofline"          # "roofline" (synthetic prior) or a profile CSV path
n_prefill = 4
n_decode = 4
n_mixed = 0                   # spare Mixed-pool workers ...
mixed_pool_role = "decode"    # ... serving as "prefill" or "decode" until a policy moves them,
                              # or "mixed": colocated (vllm, sarathi, ecoserve: n_prefill =
                              # n_decode = 0, n_mixed = N, mixed_pool_role = "mixed")
link = "nvlink"               # nvlink, pcie4, 10gbe, 25gbe, 100gbe, kvpool
memory_utilization = 0.9
max_batch_tokens = 8192
max_batch_size = 64
max_running = 256

[policy]
name = "least_loaded"         # pdopt.policies.available_policies()
[policy.flags]                # keyword flags of the policy (ablations)

[slo]
ttft_s = 2.0
tpot_s = 0.1
"""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """A parsed config: everything :func:`pdopt.sim.simulate` needs."""

    driver: Workload | ClosedLoop
    cluster: ClusterSpec
    policy: str
    policy_flags: dict[str, Any] = field(default_factory=dict)
    slo: Slo = field(default_factory=lambda: Slo(2.0, 0.1))
    tick_s: float = 0.05
    seed: int = 0
    record_timeseries: bool = True
    engine: str = "auto"


_TOP = {"seed", "tick_s", "record_timeseries", "engine", "workload", "cluster", "policy", "slo"}
_WORKLOAD = {"archetype", "rate_per_s", "n_requests", "cv", "trace", "closed_loop"}
_CLUSTER = {
    "gpu",
    "model",
    "tp",
    "profile",
    "n_prefill",
    "n_decode",
    "n_mixed",
    "mixed_pool_role",
    "link",
    "memory_utilization",
    "max_batch_tokens",
    "max_batch_size",
    "max_running",
}


def _section(data: dict[str, Any], name: str, allowed: set[str], where: str) -> dict[str, Any]:
    part = data.get(name, {})
    if not isinstance(part, dict):
        raise ConfigError(f"{where}: [{name}] must be a table")
    unknown = sorted(set(part) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown} in [{name}]; allowed: {sorted(allowed)}"
        )
    return part


def load_config(path: str | Path) -> SimConfig:
    """Read and check a simulation config file (see :data:`EXAMPLE_CONFIG`)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such config file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(data, base=path.parent, where=str(path))


def parse_config(
    data: dict[str, Any], *, base: Path = Path("."), where: str = "config"
) -> SimConfig:
    """Build a :class:`SimConfig` from parsed TOML ``data``."""
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise ConfigError(f"{where}: unknown top-level key(s) {unknown}; allowed: {sorted(_TOP)}")
    seed = int(data.get("seed", 0))
    slo_part = _section(data, "slo", {"ttft_s", "tpot_s"}, where)
    policy_part = _section(data, "policy", {"name", "flags"}, where)
    try:
        slo = Slo(float(slo_part["ttft_s"]), float(slo_part["tpot_s"]))
        policy = str(policy_part["name"])
    except KeyError as exc:
        raise ConfigError(
            f"{where}: missing required key {exc.args[0]!r} ([slo] ttft_s and "
            "tpot_s, [policy] name)"
        ) from exc
    return SimConfig(
        driver=_driver(_section(data, "workload", _WORKLOAD, where), base, seed, where),
        cluster=_cluster(_section(data, "cluster", _CLUSTER, where), base, where),
        policy=policy,
        policy_flags=dict(policy_part.get("flags", {})),
        slo=slo,
        tick_s=float(data.get("tick_s", 0.05)),
        seed=seed,
        record_timeseries=bool(data.get("record_timeseries", True)),
        engine=_engine(data.get("engine", "auto"), where),
    )


def _engine(value: Any, where: str) -> str:
    from pdopt.sim._simulate import ENGINES

    if value not in ENGINES:
        raise ConfigError(f"{where}: engine = {value!r} is not one of {list(ENGINES)}")
    return str(value)


def _driver(part: dict[str, Any], base: Path, seed: int, where: str) -> Workload | ClosedLoop:
    from pdopt.workload import archetype_workload, read_trace

    if ("trace" in part) == ("archetype" in part):
        raise ConfigError(f"{where}: [workload] needs exactly one of 'archetype' or 'trace'")
    closed = part.get("closed_loop")
    n = int(part.get("n_requests", 1000))
    if "trace" in part:
        wl = read_trace(base / str(part["trace"]))
    elif closed is not None:
        wl = archetype_workload(str(part["archetype"]), 1.0, n_requests=n, seed=seed)
    else:
        if "rate_per_s" not in part:
            raise ConfigError(f"{where}: [workload] with an archetype needs 'rate_per_s'")
        wl = archetype_workload(
            str(part["archetype"]),
            float(part["rate_per_s"]),
            n_requests=n,
            cv=float(part.get("cv", 1.0)),
            seed=seed,
        )
    if closed is None:
        return wl
    if not isinstance(closed, dict) or set(closed) - {"clients", "think_time_s", "think"}:
        raise ConfigError(f"{where}: [workload.closed_loop] takes clients, think_time_s, think")
    return ClosedLoop(
        int(closed["clients"]),
        float(closed.get("think_time_s", 0.0)),
        wl,
        n,
        str(closed.get("think", "constant")),
    )


def _cluster(part: dict[str, Any], base: Path, where: str) -> ClusterSpec:
    from pdopt.costmodel import fit_cost_model, roofline_cost_model
    from pdopt.errors import FitQualityWarning
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import get_model
    from pdopt.profile import read_profile

    for key in ("gpu", "model", "n_prefill", "n_decode"):
        if key not in part:
            raise ConfigError(f"{where}: [cluster] needs {key!r}")
    gpu, model, tp = (
        get_gpu(str(part["gpu"])),
        get_model(str(part["model"])),
        int(part.get("tp", 1)),
    )
    source = str(part.get("profile", "roofline"))
    if source == "roofline":
        cost = roofline_cost_model(gpu, model, tp)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FitQualityWarning)  # `pdopt calibrate` reports it
            cost, _ = fit_cost_model(read_profile(base / source))
    link_name = str(part.get("link", "nvlink"))
    if link_name not in LINK_PRESETS:
        raise ConfigError(
            f"{where}: [cluster] link {link_name!r} is not one of {sorted(LINK_PRESETS)}"
        )
    extra = {
        k: part[k]
        for k in ("max_batch_tokens", "max_batch_size", "max_running", "mixed_pool_role")
        if k in part
    }
    return ClusterSpec.from_hardware(
        gpu,
        model,
        cost,
        int(part["n_prefill"]),
        int(part["n_decode"]),
        int(part.get("n_mixed", 0)),
        tp=tp,
        memory_utilization=float(part.get("memory_utilization", 0.9)),
        link=LINK_PRESETS[link_name],
        **extra,
    )
