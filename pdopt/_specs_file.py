"""User-supplied GPU and model specs: a small TOML or JSON file accepted wherever a catalogue
name is (``get_gpu``, ``get_model``, so ``--gpu``, ``--model``, ``[cluster] gpu``, a profile's
``# gpu:`` header and ``pdopt plan --gpus``).

A spec file holds a ``[gpu]`` table, a ``[model]`` table, or both (SI units; the keys are the
fields of :class:`pdopt.hardware.GpuSpec` and :class:`pdopt.model_spec.ModelSpec`)::

    [gpu]                           # e.g. mi300x.toml
    name = "MI300X"                 # default: the file's stem
    peak_flops = 1.307e15           # dense FP16/BF16, FLOP/s
    memory_bytes = 192e9
    hbm_bw_bytes_per_s = 5.3e12
    link_bw_bytes_per_s = 448e9     # GPU-GPU, one direction
    idle_power_w = 140.0
    max_power_w = 750.0
    cost_per_hour = 4.0             # optional (default 1); fp8_peak_flops also optional
    generation = "cdna3"            # optional: picks the roofline preset (default "unknown")
    gpus_per_node = 8               # optional: the widest TP group (default 8)

    [model]
    name = "MyModel-8B"
    num_layers = 32
    hidden_size = 4096
    num_heads = 32
    num_kv_heads = 8
    intermediate_size = 14336
    vocab_size = 128256
    # optional: any other field of ModelSpec (dtype = "bfloat16", head_dim, MoE fields, ...)

A name is found as a path to such a file (``.toml`` or ``.json``), or as the ``name`` of a spec
in the files listed in the ``PDOPT_SPECS`` environment variable (separated by ``os.pathsep``),
so a measured profile whose header names ``MI300X`` plans once ``PDOPT_SPECS=mi300x.toml`` is
set. A ``PDOPT_SPECS`` entry comes before the catalogue: one named as a catalogued GPU or model
replaces that row everywhere the name is resolved (:func:`env_spec`). A catalogue may read
files of another format too (its ``foreign`` reader): the model catalogue reads a Hugging Face
``config.json`` or its folder, as a path or as a ``PDOPT_SPECS`` entry. Errors use the config
reader's format (``mi300x.toml [gpu] peak_flops: expected a number > 0, got "fast"``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pdopt._toml import TomlTable, read_toml
from pdopt.errors import ConfigError, ParameterError, PdoptError

_Spec = TypeVar("_Spec")

SPECS_ENV = "PDOPT_SPECS"
_SUFFIXES = (".toml", ".json")


def user_spec(
    kind: str,
    name: str,
    cls: type[_Spec],
    catalogue: list[str],
    foreign: Callable[[Path], _Spec | None] | None = None,
    foreign_hint: str = "",
) -> _Spec:
    """The ``kind`` (``"gpu"`` or ``"model"``) spec ``name`` points to (module docstring), built
    as ``cls`` (``GpuSpec`` or ``ModelSpec``, given by the catalogue that asks, which this
    module does not import) or by ``foreign``, the catalogue's reader of another format (the
    spec a path holds, or None when the path is not such a file), named by ``foreign_hint`` in
    the error; ``ParameterError`` naming the catalogue and the ways to
    add a spec when there is none."""
    spec = _find(name, kind, cls, foreign)
    if spec is None:
        raise _unknown("GPU" if kind == "gpu" else kind, name, catalogue, foreign_hint)
    return spec


def _unknown(kind: str, name: str, catalogue: list[str], foreign_hint: str) -> ParameterError:
    suffix = " (optionally followed by @WEIGHTS[/KV], e.g. @fp8/fp8)" if kind == "model" else ""
    also = f", {foreign_hint}" if foreign_hint else ""
    return ParameterError(
        f"unknown {kind} {name!r}: expected one of {catalogue}{suffix}, a {kind} spec file "
        f"(.toml or .json with a [{kind.lower()}] table){also} or a name from the files in "
        f"${SPECS_ENV}"
    )


def _find(
    name: str, kind: str, cls: type[_Spec], foreign: Callable[[Path], _Spec | None] | None
) -> _Spec | None:
    """The spec in the file ``name``, or the first in the ``$PDOPT_SPECS`` files whose name
    matches (case-insensitive); None when there is none."""
    wanted = str(name).strip()
    if foreign is not None:
        spec = foreign(Path(wanted))
        if spec is not None:
            return spec
    if wanted.lower().endswith(_SUFFIXES):
        return _build(read_spec_file(wanted).table(kind, _keys(cls)), cls)
    return env_spec(kind, (wanted,), cls, foreign)


def env_spec(
    kind: str,
    names: tuple[str, ...],
    cls: type[_Spec],
    foreign: Callable[[Path], _Spec | None] | None = None,
) -> _Spec | None:
    """The first ``kind`` spec in the ``$PDOPT_SPECS`` files named one of ``names``
    (case-insensitive), or None (also when the variable is unset).

    The catalogues ask this before their own rows, so an entry named as a catalogued GPU or
    model (``name = "MI300X"``) replaces that row wherever the name is resolved: ``--gpu``,
    ``--gpus``, a profile's ``# gpu:`` header, ``pdopt profile catalog``. ``names`` holds the
    name asked for and, for an alias, the catalogue's own name.
    """
    wanted = {str(n).strip().lower() for n in names}
    for entry in os.environ.get(SPECS_ENV, "").split(os.pathsep):
        if not entry.strip():
            continue
        spec = foreign(Path(entry)) if foreign is not None else None
        if spec is not None:
            if str(getattr(spec, "name", "")).lower() in wanted:
                return spec
            continue
        if _foreign_file(Path(entry)):
            continue  # another catalogue's file (a Hugging Face config): no spec of this kind
        top = read_spec_file(entry)
        if not top.has(kind):
            continue
        table = top.table(kind, _keys(cls))
        if _name(table).lower() in wanted:
            return _build(table, cls)
    return None


HF_CONFIG_KEYS = ("architectures", "model_type", "num_hidden_layers")
"""Keys that mark a JSON file as a Hugging Face ``config.json`` rather than a spec file."""


def _foreign_file(path: Path) -> bool:
    """Whether a ``$PDOPT_SPECS`` entry is a file only another catalogue reads: a folder or a
    JSON object without a ``gpu`` or ``model`` table that looks like a Hugging Face config
    (so ``PDOPT_SPECS=config.json`` does not break GPU lookups, e.g. ``pdopt profile
    catalog``). A broken spec file is not foreign: :func:`read_spec_file` says what is wrong."""
    if path.is_dir():
        return True
    if path.suffix.lower() != ".json":
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and "gpu" not in data
        and "model" not in data
        and any(k in data for k in HF_CONFIG_KEYS)
    )


def read_spec_file(path: str | Path) -> TomlTable:
    """The top table of a TOML or JSON spec file (``ConfigError`` when unreadable)."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        top = read_toml(path)
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the spec file ({exc.strerror})") from exc
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object with a gpu or model table")
        top = TomlTable(data, str(path))
    top.only(("gpu", "model"))
    return top


def _keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _name(table: TomlTable) -> str:
    return table.string("name", Path(table.file).stem)


def _build(table: TomlTable, cls: type[_Spec]) -> _Spec:
    """The spec of ``table``: each field read by its declared type (a field without a default
    is required), then the spec's own checks (a ConfigError naming the file and table)."""
    values: dict[str, Any] = {"name": _name(table)}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == "name" or (not table.has(f.name) and f.default is not dataclasses.MISSING):
            continue
        kind_of = str(f.type).replace(" | None", "")
        if kind_of == "float":
            values[f.name] = table.number(f.name)
        elif kind_of == "int":
            values[f.name] = table.integer(f.name, min_value=0)
        elif kind_of == "bool":
            values[f.name] = table.boolean(f.name)
        else:
            values[f.name] = table.string(f.name)
    try:
        return cls(**values)
    except PdoptError as exc:
        where = f"{table.file} [{table.name}]"
        raise ConfigError(f"{where}: {exc}") from exc
