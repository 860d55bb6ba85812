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
    cost_per_hour = 4.0             # optional (default 1)

    [model]
    name = "MyModel-8B"
    num_layers = 32
    hidden_size = 4096
    num_heads = 32
    num_kv_heads = 8
    intermediate_size = 14336
    vocab_size = 128256
    # dtype = "bfloat16", head_dim, gated_mlp = true, tied_embeddings, qkv_bias: optional

A name is found (after the catalogue) as a path to such a file (``.toml`` or ``.json``), or as
the ``name`` of a spec in the files listed in the ``PDOPT_SPECS`` environment variable
(separated by ``os.pathsep``), so a measured profile whose header names ``MI300X`` plans once
``PDOPT_SPECS=mi300x.toml`` is set. Errors use the config reader's format
(``mi300x.toml [gpu] peak_flops: expected a number > 0, got "fast"``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdopt.errors import ConfigError, ParameterError

if TYPE_CHECKING:
    from pdopt.hardware import GpuSpec
    from pdopt.model_spec import ModelSpec
    from pdopt.scenario import TomlTable

SPECS_ENV = "PDOPT_SPECS"
_SUFFIXES = (".toml", ".json")
_GPU_NUMBERS = (
    "peak_flops", "memory_bytes", "hbm_bw_bytes_per_s", "link_bw_bytes_per_s", "idle_power_w",
    "max_power_w",
)  # fmt: skip
_MODEL_INTS = (
    "num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
)  # fmt: skip
_MODEL_FLAGS = ("gated_mlp", "tied_embeddings", "qkv_bias")


def user_gpu(name: str, catalogue: list[str]) -> GpuSpec:
    """The GPU spec ``name`` points to (module docstring); ``ParameterError`` naming the
    catalogue and the two ways to add a GPU when there is none."""
    table = _find(name, "gpu")
    if table is None:
        raise _unknown("GPU", name, catalogue)
    return _gpu(table)


def user_model(name: str, catalogue: list[str]) -> ModelSpec:
    """The model spec ``name`` points to (module docstring); ``ParameterError`` when none."""
    table = _find(name, "model")
    if table is None:
        raise _unknown("model", name, catalogue)
    return _model(table)


def _unknown(kind: str, name: str, catalogue: list[str]) -> ParameterError:
    return ParameterError(
        f"unknown {kind} {name!r}: expected one of {catalogue}, a {kind} spec file (.toml or "
        f".json with a [{kind.lower()}] table) or a name from the files in ${SPECS_ENV}"
    )


def _find(name: str, kind: str) -> TomlTable | None:
    """The ``[kind]`` table of the file ``name``, or of the first ``$PDOPT_SPECS`` file whose
    ``[kind] name`` matches (case-insensitive)."""
    if str(name).lower().endswith(_SUFFIXES):
        return read_spec_file(name).table(kind, _keys(kind))
    for entry in os.environ.get(SPECS_ENV, "").split(os.pathsep):
        if not entry.strip():
            continue
        top = read_spec_file(entry)
        if not top.has(kind):
            continue
        table = top.table(kind, _keys(kind))
        if _name(table).lower() == str(name).strip().lower():
            return table
    return None


def read_spec_file(path: str | Path) -> TomlTable:
    """The top table of a TOML or JSON spec file (``ConfigError`` when unreadable)."""
    from pdopt.scenario import TomlTable, read_toml

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


def _keys(kind: str) -> tuple[str, ...]:
    if kind == "gpu":
        return ("name", *_GPU_NUMBERS, "cost_per_hour")
    return ("name", *_MODEL_INTS, "dtype", "head_dim", *_MODEL_FLAGS)


def _name(table: TomlTable) -> str:
    return table.string("name", Path(table.file).stem)


def _gpu(table: TomlTable) -> GpuSpec:
    from pdopt.hardware import GpuSpec

    numbers: dict[str, Any] = {k: table.number(k, positive=True) for k in _GPU_NUMBERS}
    numbers["idle_power_w"] = table.number("idle_power_w")
    if numbers["idle_power_w"] < 0:
        raise table.error("idle_power_w", "a number >= 0", numbers["idle_power_w"])
    cost = table.number("cost_per_hour", 1.0, positive=True)
    return GpuSpec(_name(table), cost_per_hour=cost, **numbers)


def _model(table: TomlTable) -> ModelSpec:
    from pdopt.model_spec import DTYPE_BYTES, ModelSpec

    ints: dict[str, Any] = {k: table.integer(k, min_value=1) for k in _MODEL_INTS}
    flags = {k: table.boolean(k, k == "gated_mlp") for k in _MODEL_FLAGS}
    dtype = table.string("dtype", "float16", choices=tuple(DTYPE_BYTES))
    head_dim = table.integer("head_dim", 0, min_value=0)
    if ints["num_heads"] % ints["num_kv_heads"]:
        raise table.error(
            "num_kv_heads", f"a divisor of num_heads={ints['num_heads']}", ints["num_kv_heads"]
        )
    return ModelSpec(_name(table), dtype=dtype, head_dim=head_dim, **ints, **flags)
