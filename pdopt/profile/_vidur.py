"""Import Vidur-format profiling data (``mlp.csv``, ``attention*.csv``) as a pdopt profile.

Vidur (Agrawal et al., MLSys'24) times each op of ONE transformer layer on ONE GPU (a TP shard),
in milliseconds, over repeated runs; we use the ``median`` column. The layout and column meanings
are described in ``shared/data/vidur-profiling/README.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pdopt._validation import check_int_at_least
from pdopt.errors import InputError, ParameterError
from pdopt.hardware import get_gpu
from pdopt.model_spec import ModelSpec, get_model
from pdopt.model_spec._params import check_tp as _check_tp
from pdopt.profile._format import NO_ATTENTION_NOTE, Profile, ProfileMeta
from pdopt.profile._io import profile_from_records
from pdopt.profile._roofline import _gemm_shapes

LINEAR_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
"""The per-layer ops of ``mlp.csv`` summed into a layer's non-attention time (Vidur's
``ExecutionTime``; the embedding ``emb`` is left out, as Vidur does)."""

GEMM_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
_MLP_KEYS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens")
_ATTN_KEYS = (
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "num_tensor_parallel_workers",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
)
_TP = "num_tensor_parallel_workers"
_PREFILL_T = "time_stats.attn_prefill.median"
_DECODE_T = "time_stats.attn_decode.median"


def import_vidur(
    directory: str | Path,
    model: ModelSpec | str,
    tp: int = 1,
    *,
    gpu: str | None = None,
    max_decode_batch: int = 256,
    all_reduce_csv: str | Path | None = None,
) -> Profile:
    """A :class:`Profile` from one Vidur model folder (``<dir>/mlp.csv`` and any
    ``<dir>/attention*.csv``).

    Let ``lin(n)`` be the sum of the :data:`LINEAR_OPS` medians at ``num_tokens = n`` and
    tensor-parallel degree ``tp`` (ms, one layer, one GPU), and ``L`` the model's layers. Rows:

    * ``gemm``: one per :data:`GEMM_OPS` op per profiled ``num_tokens`` m: that op's median with
      ``(n, k)`` of the model's projection on one TP shard (QKV: k=hidden, n=(heads + 2·kv
      heads)·head_dim/tp; O: k=heads·head_dim/tp, n=hidden; gate+up: k=hidden, n=2·ffn/tp;
      down: k=ffn/tp, n=hidden), so FLOP = 2·m·n·k.
    * ``prefill`` (batch 1, input l): ``L · (lin(l) + attn_prefill(l, kv_cache_size=0))`` when an
      attention file matches the model's attention shape at ``tp``, at every l profiled in both
      files; otherwise ``L · lin(l)`` at every profiled l, attention NOT included.
    * ``decode`` (batch B): with matching attention data, ``L · (lin(B) + attn_decode(B, c))`` at
      every profiled (B, c) with B also profiled in ``mlp.csv`` and ``B <= max_decode_batch``,
      ``total_context_tokens = B·c`` (c = cached tokens per request); otherwise MLP-only rows
      ``L · lin(B)`` with ``total_context_tokens = B`` (the minimum; attention not included).

    With ``all_reduce_csv`` (Vidur's ``network/<node>/all_reduce.csv``) and ``tp > 1``, ``lin(n)``
    also holds two all-reduces per layer of ``n · hidden · 2`` bytes among ``tp`` GPUs on one
    node, interpolated linearly on message size (the one interpolation; points whose message
    lies outside the measured sizes are left out). No row includes the embedding, LM head,
    sampling or CPU overheads, nor Vidur's +10% GQA decode-attention adjustment. Duplicate
    measurements of one point are merged by their median. Nothing else is interpolated;
    ``meta.notes`` lists what was used and left out.

    Parameters
    ----------
    directory : str or Path
        A Vidur model folder, e.g. ``.../vidur-profiling/a100/Llama-2-7b-hf``.
    model : ModelSpec or str
        The model whose shape ``mlp.csv`` must match (heads, KV heads, hidden, ffn, gated MLP).
    tp : int
        The ``num_tensor_parallel_workers`` rows to use.
    all_reduce_csv : str or Path, optional
        Vidur all-reduce timings to add the TP communication (ignored at ``tp=1``).
    gpu : str, optional
        GPU name for the metadata. Vidur's files do not name their GPU; its layout does (the
        model folder sits in a folder per GPU, ``a100/``), so by default the parent folder's
        name, which must resolve to a catalogued GPU (``a100`` → ``A100-80GB``); else ``gpu``
        is required (an InputError says so).

    Raises
    ------
    InputError
        A missing file or column, a non-number, NaN, negative time (or a zero GEMM time), an
        ``mlp.csv`` whose shape does not match ``model``, or no rows at this ``tp``; the message
        names the file, row, line and column.
    """
    folder = Path(directory)
    spec = get_model(model) if isinstance(model, str) else model
    tp = _check_tp(spec, tp, "import_vidur")
    max_decode_batch = check_int_at_least(max_decode_batch, 1, "max_decode_batch", "import_vidur")
    linear = _read_mlp(folder / "mlp.csv", spec, tp)
    notes = [f"mlp.csv: {len(linear)} num_tokens points at tp={tp}"]
    per_layer_ms = _layer_ms(linear, spec, tp, all_reduce_csv, notes)
    prefill_attn, decode_attn = _read_attention(folder, spec, tp, notes)
    records = _gemm_records(linear, spec, tp)
    records += _prefill_records(per_layer_ms, prefill_attn, spec, notes)
    records += _decode_records(per_layer_ms, decode_attn, spec, max_decode_batch, notes)
    notes.append("not included: embedding, LM head, sampling, CPU overheads")
    meta = ProfileMeta(
        gpu=_gpu_name(folder, gpu),
        model=spec.name,
        dtype="float16",
        tp=tp,
        source=f"vidur:{folder}",
        notes="\n".join(notes),
    )
    return profile_from_records(meta, records)


def _gpu_name(folder: Path, gpu: str | None) -> str:
    if gpu is not None:
        return gpu
    parent = folder.resolve().parent.name
    try:
        return get_gpu(parent).name
    except ParameterError:
        raise InputError(
            f"{folder}: Vidur's files do not name their GPU and the parent folder {parent!r} is "
            "not a catalogued GPU (Vidur's layout: .../a100/MODEL/mlp.csv): give it with --gpu "
            "(a catalogue name or a GPU spec file)"
        ) from None


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise InputError(f"{path}: file not found (a Vidur model folder holds mlp.csv)")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path.name}: not a readable CSV file ({exc})") from exc


def _require_columns(frame: pd.DataFrame, columns: list[str], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(f"{name}: missing column(s) {missing}")


def _numeric(frame: pd.DataFrame, column: str, name: str, *, positive: bool = False) -> np.ndarray:
    """Column as float64; the first non-number, NaN, negative (or zero) value raises."""
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values <= 0 if positive else values < 0)
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        row = int(frame.index[index])
        rule = "a finite number > 0" if positive else "a finite number >= 0"
        raise InputError(
            f"{name} row {row + 1} (line {row + 2}): {column}={raw.iloc[index]} must be {rule}"
        )
    return values


def _check_equal(frame: pd.DataFrame, column: str, expected: float, name: str, what: str) -> None:
    values = _numeric(frame, column, name)
    bad = np.flatnonzero(values != expected)
    if bad.size:
        row = int(frame.index[bad[0]])
        raise InputError(
            f"{name} row {row + 1} (line {row + 2}): {column}={frame[column].iloc[bad[0]]} "
            f"does not match {what}={expected:g}"
        )


def _read_mlp(path: Path, model: ModelSpec, tp: int) -> pd.DataFrame:
    """Per ``num_tokens`` (index), the median over duplicates of each op's median, ms."""
    frame = _read_csv(path)
    times = [f"time_stats.{op}.median" for op in LINEAR_OPS]
    _require_columns(frame, [*_MLP_KEYS, _TP, "use_gated_mlp", *times], path.name)
    expected = {
        "n_head": (model.num_heads, "num_heads"),
        "n_kv_head": (model.num_kv_heads, "num_kv_heads"),
        "n_embd": (model.hidden_size, "hidden_size"),
        "n_expanded_embd": (model.intermediate_size, "intermediate_size"),
    }
    for column, (value, field) in expected.items():
        _check_equal(frame, column, value, path.name, f"{model.name} {field}")
    gated = frame["use_gated_mlp"].str.strip().str.lower().isin(("true", "1"))
    if not (gated == model.gated_mlp).all():
        row = int(np.flatnonzero((gated != model.gated_mlp).to_numpy())[0])
        raise InputError(
            f"{path.name} row {row + 1} (line {row + 2}): use_gated_mlp="
            f"{frame['use_gated_mlp'].iloc[row]} does not match {model.name} "
            f"gated_mlp={model.gated_mlp}"
        )
    tps = _numeric(frame, _TP, path.name)
    shard = frame[tps == tp]
    if shard.empty:
        raise InputError(
            f"{path.name}: no rows with {_TP}={tp} (available: {sorted({int(v) for v in tps})})"
        )
    data = {"num_tokens": _numeric(shard, "num_tokens", path.name, positive=True)}
    for op, column in zip(LINEAR_OPS, times, strict=True):
        data[op] = _numeric(shard, column, path.name, positive=op in GEMM_OPS)
    return pd.DataFrame(data).groupby("num_tokens").median().sort_index()


def _read_attention(
    folder: Path, model: ModelSpec, tp: int, notes: list[str]
) -> tuple[pd.Series | None, pd.Series | None]:
    """Prefill attention ms by chunk size and decode attention ms by (batch, kv_cache_size)."""
    prefill: list[pd.DataFrame] = []
    decode: list[pd.DataFrame] = []
    for path in sorted(folder.glob("attention*.csv")):
        frame = _read_csv(path)
        _require_columns(frame, [*_ATTN_KEYS, "is_prefill", _PREFILL_T, _DECODE_T], path.name)
        keys = {c: _numeric(frame, c, path.name) for c in _ATTN_KEYS}
        match = (
            (keys["n_embd"] == model.hidden_size)
            & (keys["n_q_head"] == model.num_heads)
            & (keys["n_kv_head"] == model.num_kv_heads)
            & (keys[_TP] == tp)
        )
        if not match.any():
            notes.append(
                f"{path.name}: attention shape does not match {model.name} tp={tp}; unused"
            )
            continue
        is_prefill = frame["is_prefill"].str.strip().str.lower() == "true"
        rows = frame[match & is_prefill.to_numpy()]
        pre = rows[_numeric(rows, "kv_cache_size", path.name) == 0]
        pre = pre[_numeric(pre, "batch_size", path.name) == 1]
        prefill.append(
            pd.DataFrame(
                {
                    "l": _numeric(pre, "prefill_chunk_size", path.name, positive=True),
                    "t": _numeric(pre, _PREFILL_T, path.name, positive=True),
                }
            )
        )
        dec = frame[match & ~is_prefill.to_numpy()]
        decode.append(
            pd.DataFrame(
                {
                    "b": _numeric(dec, "batch_size", path.name, positive=True),
                    "c": _numeric(dec, "kv_cache_size", path.name, positive=True),
                    "t": _numeric(dec, _DECODE_T, path.name, positive=True),
                }
            )
        )
        notes.append(f"{path.name}: {int(match.sum())} attention rows match {model.name} tp={tp}")
    if not prefill:
        notes.append(
            f"no attention file matches {model.name} at tp={tp}: {NO_ATTENTION_NOTE} "
            "and decode rows MLP-only at total_context_tokens=batch_size"
        )
        return None, None
    pre_all, dec_all = pd.concat(prefill), pd.concat(decode)
    pre_series = pre_all.groupby("l")["t"].median() if len(pre_all) else None
    dec_series = dec_all.groupby(["b", "c"])["t"].median() if len(dec_all) else None
    if pre_series is None:
        notes.append("matching attention rows hold no batch-1 prefill at kv_cache_size=0")
    if dec_series is None:
        notes.append("matching attention rows hold no decode points")
    return pre_series, dec_series


def _gemm_records(linear: pd.DataFrame, model: ModelSpec, tp: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for op, (n, k) in zip(GEMM_OPS, _gemm_shapes(model, tp), strict=True):
        for m, ms in linear[op].items():
            records.append({"kind": "gemm", "m": m, "n": n, "k": k, "latency_s": ms / 1e3})
    return records


def _layer_ms(
    linear: pd.DataFrame,
    model: ModelSpec,
    tp: int,
    all_reduce_csv: str | Path | None,
    notes: list[str],
) -> pd.Series:
    """lin(n): the LINEAR_OPS sum per num_tokens, plus two all-reduces when asked (ms/layer)."""
    per_layer_ms = linear[list(LINEAR_OPS)].sum(axis=1)
    if tp == 1 or all_reduce_csv is None:
        notes.append("TP all-reduce not included" if tp > 1 else "tp=1: no all-reduce")
        return per_layer_ms
    path = Path(all_reduce_csv)
    sizes, times = _read_all_reduce(path, tp)
    message = per_layer_ms.index.to_numpy(dtype=np.float64) * model.hidden_size * 2
    inside = (message >= sizes[0]) & (message <= sizes[-1])
    all_reduce_ms = 2 * np.interp(message[inside], sizes, times)
    kept = per_layer_ms[inside]
    per_layer_ms = pd.Series(kept.to_numpy() + all_reduce_ms, index=kept.index)
    notes.append(
        f"{path.name}: 2 all-reduces per layer among {tp} GPUs added; {int((~inside).sum())} "
        "num_tokens points outside the measured message sizes left out"
    )
    return per_layer_ms


def _read_all_reduce(path: Path, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """Message sizes (bytes, ascending) and median all-reduce times (ms) among ``tp`` GPUs of
    one node."""
    frame = _read_csv(path)
    median = "time_stats.all_reduce.median"
    _require_columns(frame, ["num_workers", "devices_per_node", "size", median], path.name)
    workers = _numeric(frame, "num_workers", path.name)
    per_node = _numeric(frame, "devices_per_node", path.name)
    rows = frame[(workers == tp) & (per_node == tp)]
    if rows.empty:
        raise InputError(f"{path.name}: no rows with num_workers={tp} and devices_per_node={tp}")
    table = pd.DataFrame(
        {
            "size": _numeric(rows, "size", path.name, positive=True),
            "t": _numeric(rows, median, path.name, positive=True),
        }
    )
    by_size = table.groupby("size")["t"].median().sort_index()
    return by_size.index.to_numpy(dtype=np.float64), by_size.to_numpy(dtype=np.float64)


def _prefill_records(
    per_layer_ms: pd.Series, attention: pd.Series | None, model: ModelSpec, notes: list[str]
) -> list[dict[str, Any]]:
    if attention is not None:
        common = per_layer_ms.index.intersection(attention.index)
        notes.append(
            f"prefill: {len(common)} input lengths in both files "
            f"({len(per_layer_ms) - len(common)} mlp-only and "
            f"{len(attention) - len(common)} attention-only lengths left out)"
        )
        per_layer_ms = per_layer_ms.loc[common] + attention.loc[common]
    return [
        {
            "kind": "prefill",
            "batch_size": 1,
            "input_tokens": length,
            "latency_s": model.num_layers * ms / 1e3,
        }
        for length, ms in per_layer_ms.items()
    ]


def _decode_records(
    per_layer_ms: pd.Series,
    attention: pd.Series | None,
    model: ModelSpec,
    max_batch: int,
    notes: list[str],
) -> list[dict[str, Any]]:
    per_layer_ms = per_layer_ms[per_layer_ms.index <= max_batch]
    if attention is None:
        return [
            {
                "kind": "decode",
                "batch_size": batch,
                "total_context_tokens": batch,
                "latency_s": model.num_layers * ms / 1e3,
            }
            for batch, ms in per_layer_ms.items()
        ]
    records: list[dict[str, Any]] = []
    left_out = 0
    batches = attention.index.get_level_values(0).to_numpy(dtype=np.float64)
    contexts = attention.index.get_level_values(1).to_numpy(dtype=np.float64)
    for batch, context, attn_ms in zip(batches, contexts, attention.to_numpy(), strict=True):
        if batch not in per_layer_ms.index:
            left_out += 1
            continue
        latency_ms = model.num_layers * (float(per_layer_ms.loc[batch]) + float(attn_ms))
        records.append(
            {
                "kind": "decode",
                "batch_size": batch,
                "total_context_tokens": batch * context,
                "latency_s": latency_ms / 1e3,
            }
        )
    notes.append(
        f"decode: {len(records)} (batch, context) points; {left_out} left out (batch not "
        f"profiled in mlp.csv or above max_decode_batch={max_batch})"
    )
    return records
