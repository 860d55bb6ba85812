"""NVIDIA AIConfigurator's per-operation latency database: finding it, reading its tables,
interpolating them.

AIConfigurator (``pip install aiconfigurator-core``, which ``pip install pdopt[aic]`` pulls in)
ships measured latencies of single operations under ``aiconfigurator_core/systems/data``::

    <system>/<family>/<backend>/<version>/<table>.parquet

e.g. ``h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet``. ``<system>`` is a GPU (``h100_sxm``,
``h200_sxm``, ``b200_sxm``, ``a100_sxm``, ``l40s``, ...), ``<family>`` an operation family
(``gemm``, ``attention``, ``comm``, ...), ``<backend>`` ``vllm``, ``trtllm`` or ``sglang``. Every
table has a ``latency`` column in milliseconds and a ``kernel_source`` column naming the kernel
measured; the keys (``m, n, k``; ``batch_size, isl, step, num_heads, ...``; ``num_gpus,
message_size``) are listed where each table is read (:mod:`pdopt.profile._aic`). A version that
lacks a family is served from the newest older version of the same backend that has it, as
AIConfigurator's own loader does ("backward fill, never forward", its ``query_versions.yaml``).
Tables may also be CSV files with the same columns (``<table>.csv``; the tests write those).

The package is found through :mod:`importlib.metadata` without importing it (its Python API
pulls in heavy dependencies); only the data files are read.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pdopt.errors import InputError

AIC_DISTRIBUTIONS: tuple[str, ...] = ("aiconfigurator-core", "aiconfigurator")
"""The PyPI distributions that ship the database (the data moved to ``aiconfigurator-core``
in 0.12; older releases kept it in ``aiconfigurator``)."""

INSTALL_HINT = "install it with `pip install pdopt[aic]` (AIConfigurator, about 82 MB)"

_DATA_SUFFIXES: tuple[str, ...] = (".parquet", ".csv")
_PACKAGE_DATA: tuple[str, ...] = (
    "aiconfigurator_core/systems/data",
    "aiconfigurator/systems/data",
)


@dataclass(frozen=True, slots=True)
class AicDatabase:
    """An AIConfigurator data folder (holding ``<system>/<family>/...``) and its release."""

    root: Path
    release: str


def find_database(aic_dir: str | Path) -> AicDatabase:
    """The database under ``aic_dir``, or of the installed package when ``aic_dir == "auto"``.

    ``aic_dir`` may name the data folder itself, the ``systems`` folder above it, the package
    folder (``aiconfigurator_core``) or the folder holding that (site-packages or an unpacked
    wheel). The release is read from a ``aiconfigurator*-<version>.dist-info`` folder beside the
    package when there is one ("unknown" otherwise).

    Raises
    ------
    InputError
        No package installed (``auto``; the message says how to install the extra), or no data
        folder under ``aic_dir``.
    """
    if str(aic_dir) == "auto":
        return _installed_database()
    path = Path(aic_dir)
    for candidate in (
        path,
        path / "data",
        path / "systems" / "data",
        *(path / sub for sub in _PACKAGE_DATA),
    ):
        if candidate.is_dir() and _has_systems(candidate):
            return AicDatabase(candidate, _release_near(candidate))
    raise InputError(
        f"--aic-dir {path}: no AIConfigurator data folder (<system>/gemm/<backend>/<version>/) "
        f"found there or in its data/, systems/data/ or aiconfigurator_core/systems/data/; "
        f"give the package's folder, or 'auto' to use the installed package ({INSTALL_HINT})"
    )


def _installed_database() -> AicDatabase:
    for name in AIC_DISTRIBUTIONS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for sub in _PACKAGE_DATA:
            root = Path(str(dist.locate_file(sub)))
            if root.is_dir():
                return AicDatabase(root, f"{name} {dist.version}")
    raise InputError(
        f"--aic-dir auto: AIConfigurator is not installed (no {' or '.join(AIC_DISTRIBUTIONS)} "
        f"distribution); {INSTALL_HINT}, or pass --aic-dir PATH to an unpacked copy"
    )


def _has_systems(root: Path) -> bool:
    return any((system / "gemm").is_dir() for system in root.iterdir() if system.is_dir())


def _release_near(root: Path) -> str:
    for parent in root.parents[:4]:
        for info in sorted(parent.glob("aiconfigurator*-*.dist-info")):
            name, _, version = info.name.removesuffix(".dist-info").rpartition("-")
            return f"{name.replace('_', '-')} {version}"
    return "unknown"


def version_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """Sort key of a release string: ``1.3.0rc20 < 1.3.0 < 1.3.0.post1``; names that are no
    version (``0.1.dev19262`` counts as one) sort first."""
    match = re.fullmatch(r"v?(\d+(?:\.\d+)*)\.?(a|b|rc|dev|post)?(\d*)", version)
    if match is None:
        return ((), 0, 0)
    release = tuple(int(part) for part in match.group(1).split("."))
    rank = {"dev": 0, "a": 1, "b": 2, "rc": 3, None: 4, "post": 5}[match.group(2)]
    return (release, rank, int(match.group(3) or 0))


def systems(db: AicDatabase) -> list[str]:
    """The GPU systems of the database."""
    return sorted(p.name for p in db.root.iterdir() if (p / "gemm").is_dir())


def versions(db: AicDatabase, system: str, family: str, backend: str) -> list[str]:
    """The versions of ``backend`` that hold ``family`` tables on ``system``, oldest first."""
    folder = db.root / system / family / backend
    if not folder.is_dir():
        return []
    return sorted((p.name for p in folder.iterdir() if p.is_dir()), key=version_key)


def availability(db: AicDatabase) -> str:
    """One line per system: its backends and their GEMM versions (for error messages)."""
    lines = []
    for system in systems(db):
        backends = sorted(p.name for p in (db.root / system / "gemm").iterdir() if p.is_dir())
        listed = "; ".join(f"{b} {', '.join(versions(db, system, 'gemm', b))}" for b in backends)
        lines.append(f"  {system}: {listed}")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class TableSource:
    """A loaded table and where it came from (for the profile's provenance notes)."""

    frame: pd.DataFrame
    path: Path
    version: str


LoadTable = Callable[[str, str], TableSource]
"""``load(family, table)`` on an import's system × backend × version (:func:`load_table`)."""


def load_table(
    db: AicDatabase, system: str, family: str, backend: str, version: str, table: str
) -> TableSource:
    """``<system>/<family>/<backend>/<v>/<table>.{parquet,csv}`` for the newest ``v`` not newer
    than ``version`` that has it (AIConfigurator's backward fill).

    Raises
    ------
    InputError
        No version up to ``version`` has the table (the message lists those that do), or the
        file cannot be read.
    """
    wanted = version_key(version)
    have: list[str] = []
    for candidate in reversed(versions(db, system, family, backend)):
        for suffix in _DATA_SUFFIXES:
            path = db.root / system / family / backend / candidate / f"{table}{suffix}"
            if not path.is_file():
                continue
            have.append(candidate)
            if version_key(candidate) <= wanted:
                return TableSource(_read(path), path, candidate)
    where = db.root / system / family / backend
    raise InputError(
        f"{where}: no {table} table at version {version} or older "
        f"(versions that have one: {', '.join(sorted(set(have), key=version_key)) or 'none'}; "
        f"on {system}: {_holders(db, system, family, table) or 'no backend'})"
    )


def other_versions(source: TableSource) -> list[TableSource]:
    """The same table at the other versions of its system × family × backend that have it and
    can be read (oldest first), for an error to say where a shape the loaded version lacks is
    measured."""
    folder = source.path.parent.parent
    found = []
    for candidate in sorted((p.name for p in folder.iterdir() if p.is_dir()), key=version_key):
        path = folder / candidate / source.path.name
        if candidate == source.version or not path.is_file():
            continue
        try:
            found.append(TableSource(_read(path), path, candidate))
        except InputError:
            continue  # an unreadable table measures nothing to point at
    return found


def _holders(db: AicDatabase, system: str, family: str, table: str) -> str:
    """``backend version, ...`` of every version on ``system`` holding ``table``."""
    found = []
    folder = db.root / system / family
    for backend in (
        sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    ):
        for candidate in versions(db, system, family, backend):
            if any(
                (folder / backend / candidate / f"{table}{s}").is_file() for s in _DATA_SUFFIXES
            ):
                found.append(f"{backend} {candidate}")
    return ", ".join(found)


def _read(path: Path) -> pd.DataFrame:
    if path.suffix == ".csv":
        frame = pd.read_csv(path)
    else:
        try:
            frame = pd.read_parquet(path)
        except ImportError as exc:
            raise InputError(
                f"{path}: reading Parquet needs pyarrow ({exc}); {INSTALL_HINT}"
            ) from exc
    if "latency" not in frame.columns:
        raise InputError(f"{path}: no 'latency' column (columns: {', '.join(frame.columns)})")
    return frame


def select(frame: pd.DataFrame, path: Path, **equal: Any) -> pd.DataFrame:
    """The rows whose columns equal the given values.

    Raises
    ------
    InputError
        A column is missing, or no row matches (the message lists the values present).
    """
    rows = frame
    for column, value in equal.items():
        if column not in rows.columns:
            raise InputError(f"{path}: no {column!r} column (columns: {', '.join(frame.columns)})")
        matched = rows[rows[column] == value]
        if matched.empty:
            present = ", ".join(map(str, sorted(rows[column].unique().tolist())))
            fixed = ", ".join(f"{c}={v!r}" for c, v in equal.items())
            raise InputError(
                f"{path}: no row with {fixed}: {column} takes {present} among the rows "
                f"matching so far"
            )
        rows = matched
    return rows


def pick_kernel(rows: pd.DataFrame, prefer: str = "") -> tuple[pd.DataFrame, str]:
    """The rows of one ``kernel_source``: the first whose name contains ``prefer`` (if given
    and present), else the one measured at the most points (ties: alphabetical)."""
    if "kernel_source" not in rows.columns:
        return rows, "-"
    counts = rows["kernel_source"].value_counts()
    names = sorted(counts.index, key=lambda k: (-int(counts[k]), str(k)))
    preferred = [k for k in names if prefer and prefer in str(k)]
    kernel = (preferred or names)[0]
    return rows[rows["kernel_source"] == kernel], str(kernel)


def fastest_per_point(rows: pd.DataFrame, keys: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """At each measured point (``keys``), the fastest kernel's (mean) latency, and the kernels
    so merged: for tables where the engine picks a kernel per shape (vLLM's FP8 block-scaled
    GEMMs: DeepGEMM from ``m = 32``, CUTLASS/FlashInfer below), so that no kernel's partial
    grid is extrapolated beyond where it runs."""
    if "kernel_source" not in rows.columns or rows["kernel_source"].nunique() == 1:
        return pick_kernel(rows)
    means = rows.groupby([*keys, "kernel_source"], as_index=False)["latency"].mean()
    fastest = means.groupby(list(keys), as_index=False)["latency"].min()
    kernels = sorted(map(str, rows["kernel_source"].unique()))
    return fastest, f"fastest per point of {', '.join(kernels)}"


class Grid:
    """Latencies measured on a (possibly ragged) grid of keys, interpolated multilinearly.

    Like AIConfigurator's own lookups: between measured points linear in each key in turn
    (outer keys first, the last key innermost), beyond the measured range linear extrapolation
    from the two nearest points (GEMM and attention times grow linearly in tokens once the GPU
    is full). Several rows at one key (repeats) are averaged.
    """

    def __init__(self, rows: pd.DataFrame, keys: Sequence[str], path: Path) -> None:
        self.path = path
        self.keys = tuple(keys)
        mean = rows.groupby(list(keys))["latency"].mean()
        self._tree = _nest(mean, len(keys))
        self.extrapolated = 0

    def __call__(self, *point: float) -> float:
        """The latency (ms) at ``point`` (one value per key)."""
        value, outside = _interp(self._tree, point)
        self.extrapolated += outside
        return value


def _nest(series: pd.Series, depth: int) -> Any:
    if depth == 1:
        xs = series.index.get_level_values(0).to_numpy(dtype=np.float64)
        order = np.argsort(xs)
        return xs[order], series.to_numpy(dtype=np.float64)[order]
    return {
        float(key): _nest(series.xs(key, level=0), depth - 1)
        for key in series.index.get_level_values(0).unique().to_numpy(dtype=np.float64)
    }


def _bracket(xs: np.ndarray, x: float) -> tuple[int, int, float, bool]:
    """Indices ``i ≤ j`` of ``xs`` around ``x``, the weight of ``j``, and whether ``x`` lies
    outside ``xs`` (then the two end points, extrapolating)."""
    if len(xs) == 1:
        return 0, 0, 0.0, x != xs[0]
    j = int(np.clip(np.searchsorted(xs, x), 1, len(xs) - 1))
    i = j - 1
    weight = (x - xs[i]) / (xs[j] - xs[i])
    return i, j, float(weight), bool(x < xs[0] or x > xs[-1])


def _interp(tree: Any, point: Sequence[float]) -> tuple[float, int]:
    x = float(point[0])
    if isinstance(tree, tuple):
        xs, ys = tree
        i, j, w, outside = _bracket(xs, x)
        return float(ys[i] + w * (ys[j] - ys[i])), int(outside)
    keys = np.array(sorted(tree))
    i, j, w, outside = _bracket(keys, x)
    low, out_low = _interp(tree[float(keys[i])], point[1:])
    if i == j or w == 0.0:
        return low, out_low + int(outside)
    high, out_high = _interp(tree[float(keys[j])], point[1:])
    return low + w * (high - low), out_low + out_high + int(outside)


_MEMORY_KEYS: tuple[str, ...] = (
    "mem_bw",
    "mem_bw_empirical_scaling_factor",
    "mem_empirical_constant_latency",
)


def memory_constants(db: AicDatabase, system: str) -> tuple[float, float, float]:
    """``mem_bw`` (B/s), its empirical scaling factor and the constant latency (s) of memory
    ops from ``systems/<system>.yaml`` (flat ``key: number`` lines, read without a YAML
    parser)."""
    path = db.root.parent / f"{system}.yaml"
    if not path.is_file():
        raise InputError(f"{path}: the system file with {', '.join(_MEMORY_KEYS)} is missing")
    text = path.read_text()
    values = []
    for key in _MEMORY_KEYS:
        match = re.search(rf"^\s*{key}:\s*([0-9.eE+-]+)", text, flags=re.MULTILINE)
        if match is None:
            raise InputError(f"{path}: no '{key}: NUMBER' line")
        values.append(float(match.group(1)))
    return values[0], values[1], values[2]


MakeGrid = Callable[..., Grid]
"""``grid(source, keys, prefer, **equal)``: an import's selected rows as a :class:`Grid`
(noted in its provenance)."""
