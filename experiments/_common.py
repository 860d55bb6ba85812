"""Shared scenario builders for the experiment scripts (issue 8).

Every script in ``experiments/`` reproduces one figure or table of a seed paper on the same
simulated testbed, so the comparisons are like for like:

* **Cluster**: 8 GPUs, V100-32GB serving Qwen2.5-7B (Phasor's testbed), cost model fitted from the
  shipped roofline profile ``profiles/v100-32gb_qwen2.5-7b_roofline.csv`` with
  :func:`pdopt.costmodel.fit_cost_model`, workers from :meth:`pdopt.sim.ClusterSpec.from_hardware`
  (KV capacity from memory × 0.9 − weights − activation peak; power from the GPU data sheet).
* **Workloads**: the EcoServe data-set-like archetypes (lognormal), from
  :func:`pdopt.workload.archetype_workload`; the Phasor scripts use the paper's Table 1
  workloads, SLOs and models through :mod:`_phasor`.
* **SLOs**: :data:`SLOS` (EcoServe's, *our assumption*, stated in RESULTS.md: TPOT 100 ms ≈ 4×
  the V100's unloaded decode step of 23 ms, and a TTFT SLO of about 5–8× the unloaded prefill
  time of the data set's inputs); Phasor's are its Table 3 (:func:`_phasor.slo`).
* **Systems**: :data:`SYSTEMS` maps a system name (as the papers use it) to the registered
  policy that models it, its flags and the cluster layout it runs on; a :class:`Testbed` says
  which hardware. :func:`system_scenario` makes the :class:`pdopt.scenario.Scenario` of a system
  on a testbed serving a workload under an SLO; policies take that SLO from the run.

Scripts run as ``python experiments/<name>.py [--out results/] [--quick] [--seed 0]
[--dask [ADDRESS]]``; each writes CSV tables and PNG figures into ``--out`` and a
one-line-per-quantity ``<name>_summary.csv`` that ``run_all.py`` turns into RESULTS.md.

**Scale out** (issue 38, item 3): a script's grid of independent simulations goes through
:func:`map_runs`, serially or, with ``--dask``, on a Dask cluster (a scheduler address, or no
address for a LocalCluster of ``--dask-workers`` processes here): each run carries its own seed
and the results come back in the grid's order, so the CSVs are byte-identical to a serial run's.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from pdopt import parallel
from pdopt.cluster import ClusterSpec, LinkSpec, Role, Slo
from pdopt.costmodel import CostModel, roofline_cost_model
from pdopt.errors import ConfigError
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model
from pdopt.scenario import Scenario
from pdopt.sim import ClosedLoop, SimResult, fragmentation_by_tick, load_compiled_engine
from pdopt.workload import Workload, archetype_workload

T = TypeVar("T")
R = TypeVar("R")

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv"
GPU_NAME = "V100-32GB"
MODEL_NAME = "Qwen2.5-7B"
N_GPUS = 8

ECOSERVE_WORKLOADS: tuple[str, ...] = ("alpaca", "sharegpt", "longbench")
"""EcoServe's data sets, as lognormal archetypes fitted to their published means and medians."""

SLOS: dict[str, Slo] = {
    "alpaca": Slo(ttft_s=0.25, tpot_s=0.1),
    "sharegpt": Slo(ttft_s=1.0, tpot_s=0.1),
    "longbench": Slo(ttft_s=3.0, tpot_s=0.1),
}
"""Assumed SLOs of the EcoServe workloads (EcoServe's were not found; see module doc)."""


@dataclass(frozen=True, slots=True)
class System:
    """A seed-paper system as pdopt models it: a registered policy on a cluster layout.

    ``n_prefill + n_decode + n_mixed`` is the GPU count. Mixed-pool workers start with role
    ``mixed_role``: ``"mixed"`` for colocated serving, ``"prefill"``/``"decode"`` for a spare pool a
    policy promotes from. ``link`` names a :data:`pdopt.sim.LINK_PRESETS` entry, or ``None`` for
    the GPU's own link.
    """

    label: str
    policy: str
    n_prefill: int
    n_decode: int
    n_mixed: int = 0
    mixed_role: str = "mixed"
    flags: dict[str, Any] = field(default_factory=dict)
    link: str | None = None


ECOSERVE_PDOPT_FLAGS: tuple[tuple[str, object], ...] = (
    ("scan", True),
    ("saved_tpot", "min"),
    ("saved_tpot_margin", True),
    ("check", "request"),
    ("phases", "ticks"),
    ("refill", "missing"),
)
"""pdopt's earlier EcoServe (before issue 36): scan InterSchedule, min saved TPOT less the coming
iteration, per-request CheckConstraints, tick-bounded phases and one standby instance per macro
instance that missed (not Fig. 7's refill order); each a named flag."""

SYSTEMS: dict[str, System] = {
    s.label: s
    for s in (
        # Head-to-head (issue 15): every Phasor-paper system starts from 4 prefill + 4 decode
        # GPUs; Phasor and Splitwise hold 2 of the decode GPUs as a Mixed pool at home on decode.
        System("phasor", "phasor", 4, 2, 2, mixed_role="decode"),
        # Phasor's ablations (Table 2) are flags of the same policy on the same layout.
        System("phasor_no_phi", "phasor", 4, 2, 2, "decode", {"phi_routing": False}),
        System("phasor_no_defrag", "phasor", 4, 2, 2, "decode", {"defrag": False}),
        System("phasor_no_mixed", "phasor", 4, 2, 2, "decode", {"mixed_pool": False}),
        System("distserve", "distserve", 4, 4),
        System("splitwise", "splitwise", 4, 2, 2, mixed_role="decode"),
        System("memory_centric", "memory_centric", 4, 4),
        System("round_robin", "round_robin", 4, 4),
        System("least_loaded", "least_loaded", 4, 4),
        System("vllm", "vllm", 0, 0, 8),
        System("sarathi", "sarathi", 0, 0, 8),
        System("ecoserve", "ecoserve", 0, 0, 8),
        # EcoServe's C2 with the minimum saved TPOT instead of the paper's mean (issue 36).
        System("ecoserve_min", "ecoserve", 0, 0, 8, flags={"saved_tpot": "min"}),
        # EcoServe with every earlier pdopt departure from the paper (issues 16 and 36).
        System("ecoserve_pdopt", "ecoserve", 0, 0, 8, flags=dict(ECOSERVE_PDOPT_FLAGS)),
        System("mooncake", "mooncake", 4, 4, link="kvpool"),
        System("arrow", "arrow", 4, 4),
    )
}
"""Systems by name; layouts are our choice for 8 GPUs (the papers' own clusters differ)."""


@dataclass(frozen=True, slots=True)
class Testbed:
    """The hardware a script simulates: ``gpu`` × ``tp`` instances serving ``model``.

    ``profile`` is the roofline profile the cost model is fitted from. ``network_link`` names a
    :data:`pdopt.sim.LINK_PRESETS` entry carrying KV between instances (``None``: the GPU's own
    link, as on :data:`V100`); a system whose own ``link`` is ``"kvpool"`` then goes through a
    KV pool over that network (two hops, :meth:`pdopt.sim.LinkSpec.kv_pool`).
    """

    label: str
    gpu: str
    model: str
    tp: int
    profile: Path
    network_link: str | None = None

    def link(self, system_link: str | None) -> LinkSpec | None:
        """The KV link of a system whose layout names ``system_link``."""
        from pdopt.cluster import LINK_PRESETS

        if self.network_link is None:
            return LINK_PRESETS[system_link] if system_link else None
        network = LINK_PRESETS[self.network_link]
        if system_link == "kvpool":
            return LinkSpec.kv_pool(network)
        return LINK_PRESETS[system_link] if system_link else network


V100 = Testbed(f"{GPU_NAME} {MODEL_NAME} TP1", GPU_NAME, MODEL_NAME, 1, PROFILE)
"""The default testbed of every script (module doc)."""


def testbed_cost_model(testbed: Testbed) -> CostModel:
    """The roofline cost model of ``testbed`` (:func:`pdopt.costmodel.roofline_cost_model`; the
    shipped ``testbed.profile`` is that roofline profile, so fitting it gives the same model)."""
    return roofline_cost_model(testbed.gpu, testbed.model, testbed.tp)


def v100_cost_model() -> CostModel:
    """The cost model fitted from the shipped V100 + Qwen2.5-7B roofline profile."""
    return testbed_cost_model(V100)


def build_cluster(
    cost: CostModel,
    n_prefill: int,
    n_decode: int,
    n_mixed: int = 0,
    *,
    mixed_role: str = "mixed",
    link: str | None = None,
    testbed: Testbed = V100,
) -> ClusterSpec:
    """A cluster of ``testbed`` instances (default V100-32GB / Qwen2.5-7B, TP 1) with the given
    layout."""
    return ClusterSpec.from_hardware(
        get_gpu(testbed.gpu),
        get_model(testbed.model),
        cost,
        n_prefill,
        n_decode,
        n_mixed,
        tp=testbed.tp,
        link=testbed.link(link),
        mixed_pool_role=Role(mixed_role),
    )


def system_cluster(system: System, cost: CostModel, testbed: Testbed = V100) -> ClusterSpec:
    """The cluster ``system`` runs on (on ``testbed``)."""
    return build_cluster(
        cost,
        system.n_prefill,
        system.n_decode,
        system.n_mixed,
        mixed_role=system.mixed_role,
        link=system.link,
        testbed=testbed,
    )


def system_scenario(
    system: System,
    driver: Workload | ClosedLoop,
    slo: Slo,
    *,
    cost: CostModel | None = None,
    testbed: Testbed = V100,
    cluster: ClusterSpec | None = None,
    seed: int = 0,
    record_timeseries: bool = False,
    **extra_flags: Any,
) -> Scenario:
    """``system`` on ``testbed`` (cost model ``cost``, default the testbed's roofline; or on
    ``cluster``) serving ``driver`` under ``slo`` (a fresh policy per run, fixed seed)."""
    if cluster is None:
        cluster = system_cluster(system, cost or testbed_cost_model(testbed), testbed)
    return Scenario(
        driver,
        cluster,
        system.policy,
        slo,
        policy_flags={**system.flags, **extra_flags},
        seed=seed,
        record_timeseries=record_timeseries,
    )


def run_system(
    system: System,
    driver: Workload | ClosedLoop,
    cost: CostModel,
    slo: Slo,
    *,
    seed: int = 0,
    record_timeseries: bool = False,
    cluster: ClusterSpec | None = None,
    **extra_flags: Any,
) -> SimResult:
    """Simulate ``system`` serving ``driver`` on the V100 testbed (:func:`system_scenario`)."""
    return system_scenario(
        system, driver, slo, cost=cost, cluster=cluster, seed=seed,
        record_timeseries=record_timeseries, **extra_flags,
    ).run()  # fmt: skip


def metrics_of(scenario: Scenario) -> pd.Series:
    """The metrics of one run of ``scenario`` (a grid point of :func:`map_runs`)."""
    return scenario.run().metrics()


def map_runs(fn: Callable[[T], R], items: Sequence[T], args: argparse.Namespace) -> list[R]:
    """``[fn(x) for x in items]``: serially, or on the Dask cluster ``args.dask`` names
    (:func:`pdopt.parallel.map_runs`; same results, in ``items``' order). ``fn`` may live in an
    experiment script or helper module: those are shipped to the workers by value, since a
    worker cannot import them. Each process that runs items loads the compiled engine first
    (:func:`pdopt.parallel.with_compiled_engine`)."""
    dask = getattr(args, "dask", None)
    if dask is not None:
        _ship_experiment_modules()
    workers = getattr(args, "dask_workers", None)
    return parallel.map_runs(fn, items, dask=dask, n_workers=workers)


def _ship_experiment_modules() -> None:
    """Pickle the functions of the experiment helper modules loaded here by value (a script's
    own ``__main__`` functions already are)."""
    import sys

    import cloudpickle

    here = Path(__file__).resolve().parent
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().parent == here and module.__name__ != "__main__":
            cloudpickle.register_pickle_by_value(module)


def workload(name: str, rate_per_s: float, n_requests: int, seed: int, cv: float = 1.0) -> Workload:
    """An archetype workload (Poisson arrivals unless ``cv`` != 1)."""
    return archetype_workload(name, rate_per_s, n_requests=n_requests, cv=cv, seed=seed)


def nominal_rate_per_s(
    name: str, cost: CostModel, n_prefill: int = 4, n_decode: int = 4, batch: int = 128
) -> float:
    """A back-of-envelope service rate (req/s) of ``n_prefill`` P + ``n_decode`` D workers.

    ``min(n_prefill / E[T_prefill(l_in)], n_decode · B / τ(B, B·E[l_in + l_out/2]) / E[l_out])``
    with a decode batch of ``batch`` requests. Used only to place the rate grids of the sweeps
    around each workload's knee; every number reported is simulated.
    """
    wl = archetype_workload(name, 1.0, n_requests=4000, seed=12345)
    inputs = wl.input_tokens.astype(float)
    outputs = wl.output_tokens.astype(float)
    prefill_cap = n_prefill / float(np.mean(cost.prefill.request_time_s(inputs)))
    ctx = float(np.mean(inputs + outputs / 2.0))
    tau = float(cost.decode.iteration_time_s(batch, batch * ctx))
    decode_cap = n_decode * batch / tau / float(np.mean(outputs))
    return min(prefill_cap, decode_cap)


def requests_for(name: str, cost: CostModel, rate_per_s: float, floor: int, cap: int) -> int:
    """Enough requests for the arrivals to span ~4 unloaded request lifetimes (clipped)."""
    wl = archetype_workload(name, 1.0, n_requests=2000, seed=12345)
    life_s = float(np.mean(cost.prefill.request_time_s(wl.input_tokens))) + float(
        np.mean(wl.output_tokens)
    ) * float(cost.decode.iteration_time_s(64, 64 * 1024))
    return int(min(cap, max(floor, np.ceil(4.0 * life_s * rate_per_s))))


def cluster_fragmentation_series(result: SimResult) -> pd.DataFrame:
    """Cluster fragmentation % per tick: 100 · Σ stranded / Σ free over decode-capable workers.

    Returns columns ``t_s``, ``fragmentation_pct``, ``kv_used_pct``.
    """
    ts = result.timeseries
    dec = ts[ts["role"] != "prefill"]
    g = dec.groupby("t_s")[["kv_stranded_blocks", "kv_free_blocks", "kv_used_blocks"]].sum()
    free = g["kv_free_blocks"].to_numpy(dtype=float)
    used = g["kv_used_blocks"].to_numpy(dtype=float)
    frag = fragmentation_by_tick(ts).reindex(g.index).to_numpy()
    total = free + used
    return pd.DataFrame(
        {
            "t_s": g.index.to_numpy(),
            "fragmentation_pct": frag,
            "kv_used_pct": np.where(total > 0, 100.0 * used / total, 0.0),
        }
    )


# ---------------------------------------------------------------------------------------------
# Command line and output
# ---------------------------------------------------------------------------------------------


def parse_args(
    description: str,
    systems: Sequence[str] = (),
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """``--out DIR`` (default results/), ``--quick`` (small sizes, for tests), ``--seed N`` and,
    when the script compares ``systems``, ``--systems a,b,c`` to compare others (names of
    :data:`SYSTEMS`); ``extra`` adds a script family's own options. Loads the compiled engine
    (:func:`pdopt.sim.load_compiled_engine`) for the script's runs in this process."""
    parser = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(parser)
    parser.add_argument("--out", type=Path, default=ROOT / "results", help="output folder")
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds), for tests")
    parser.add_argument("--seed", type=int, default=0, help="seed of workloads and simulations")
    add_dask_arguments(parser)
    if systems:
        parser.add_argument(
            "--systems",
            default=",".join(systems),
            help=f"comma-separated systems from {sorted(SYSTEMS)} (default: %(default)s)",
        )
    args = check_dask_arguments(parser, parser.parse_args(argv))
    if systems:
        args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
        unknown = sorted(set(args.systems) - set(SYSTEMS))
        if unknown:
            parser.error(f"unknown systems {unknown}; choose from {sorted(SYSTEMS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    # the script's own runs outside map_runs, and all of them with --dask (whose workers load
    # it themselves), run compiled too: most are below engine="auto"'s size
    load_compiled_engine()
    return args


def add_dask_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dask [ADDRESS]`` and ``--dask-workers N`` (:func:`map_runs`)."""
    parser.add_argument(
        "--dask",
        nargs="?",
        const=parallel.LOCAL,
        default=None,
        metavar="ADDRESS",
        help="run the independent simulations on a Dask cluster (tcp://HOST:8786), or with no "
        "address on a LocalCluster here; the same CSVs as serial",
    )
    parser.add_argument(
        "--dask-workers", type=int, default=None, help="LocalCluster processes (default: CPUs)"
    )


def check_dask_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.Namespace:
    """``args`` with ``--dask`` checked: a malformed address stops the script, naming it."""
    try:
        args.dask = parallel.check_dask(args.dask)
    except ConfigError as exc:
        parser.error(str(exc))
    return args


def save_csv(frame: pd.DataFrame, out: Path, name: str) -> Path:
    """Write ``frame`` to ``out/name.csv`` (floats with 6 significant digits)."""
    path = out / f"{name}.csv"
    frame.to_csv(path, index=False, float_format="%.6g")
    return path


def new_figure(n_panels: int, *, width_in: float = 4.0, height_in: float = 3.2) -> Any:
    """A row of ``n_panels`` axes on the non-interactive Agg backend: ``(fig, axes)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n_panels, figsize=(width_in * n_panels, height_in), squeeze=False)
    return fig, axes[0]


def save_figure(fig: Any, out: Path, name: str) -> Path:
    """Write ``fig`` to ``out/name.png`` (small: 80 dpi) and close it."""
    import matplotlib.pyplot as plt

    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


SUMMARY_COLUMNS = ("experiment", "quantity", "pdopt_value", "unit", "detail")


def save_summary(rows: list[dict[str, Any]], out: Path, name: str) -> Path:
    """The quantities RESULTS.md compares with the paper: one row each (see SUMMARY_COLUMNS)."""
    frame = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    return save_csv(frame, out, f"{name}_summary")


class Timer:
    """Wall-clock seconds since construction (printed at the end of each script)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0
