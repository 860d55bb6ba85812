"""Compare the measured profiles in ``profiles/measured/`` with pdopt's roofline prior.

Run from the repository root: ``python -m calibration.compare_measured`` rewrites the tables
between the markers in ``profiles/measured/README.md``; ``--check`` only compares (exit 1 when the
README differs), like ``profiles/generate.py``. In a notebook, :func:`compare` returns one row per
measured profile as a DataFrame and :func:`matched_points` the per-point latencies and ratios.

For each measured profile the prior is ``roofline_profile(gpu, model, tp, noise_sigma=0.0)`` for
the catalogue GPU named by the file name's prefix (``h100-sxm_...`` → ``H100-SXM``: the files'
``# gpu:`` lines hold the torch device name, which is not a catalogue name) and the profile's own
model and TP. Points are matched on the grid both share: prefill on (batch, input tokens), decode
on (batch, total context tokens); the roofline leaves out decode points whose KV exceeds the
instance's capacity, so fewer decode points match than were measured. A ratio is
roofline / measured latency (below 1: the roofline is faster).

Two harness runs are compared: the eager one (``*_measured.csv``, every kernel launched from
Python) and the CUDA-graph one (``*_graphs.csv``, every prefill and decode pass replayed as a
graph; ``harness`` column "eager" or "CUDA graphs"). :func:`gap_closed` sets the two side by side
per model and regime. The graph run also timed fused decode + prefill-chunk passes
(``*_graphs_mixed.csv``); :func:`mixed_check` prices each with pdopt's fused-iteration form
(:meth:`pdopt.costmodel.CostModel.hybrid_iteration_time_s`) under the roofline cost model and
under the cost model fitted to the graph profile, and compares fused times and the ratio
fused / (decode-only + prefill-only).
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration._layout import MIXED_COLUMNS, layer_weight_shapes
from pdopt.costmodel import (
    CostModel,
    fit_cost_model,
    fused_iteration_s,
    gemm_peak_flops,
    roofline_cost_model,
)
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model
from pdopt.profile import (
    Profile,
    calibrate_compute_efficiency,
    read_profile,
    roofline_knobs,
    roofline_profile,
)

ROOT = Path(__file__).resolve().parents[1]
MEASURED_DIR = ROOT / "profiles" / "measured"
README = MEASURED_DIR / "README.md"
BEGIN = "<!-- compare_measured: begin (python -m calibration.compare_measured) -->"
END = "<!-- compare_measured: end -->"

SMALL_DECODE_BATCH = 8
LARGE_DECODE_BATCH = 64
SHORT_PREFILL = 512
LONG_PREFILL = 2048

EAGER = "eager"
GRAPHS = "CUDA graphs"
_SUFFIXES = {EAGER: "_measured.csv", GRAPHS: "_graphs.csv"}
MIXED_SUFFIX = "_graphs_mixed.csv"
_KEYS = {
    "prefill": ["batch_size", "input_tokens"],
    "decode": ["batch_size", "total_context_tokens"],
}
_LAYERS = re.compile(r"built (\d+) of (\d+) layers")


def measured_paths(directory: Path = MEASURED_DIR) -> list[Path]:
    """The eager harness's profile CSVs (``*_measured.csv``), sorted by name."""
    return sorted(directory.glob("*" + _SUFFIXES[EAGER]))


def graphs_paths(directory: Path = MEASURED_DIR) -> list[Path]:
    """The CUDA-graph harness's profile CSVs (``*_graphs.csv``; not the ``*_graphs_mixed.csv``
    files beside them), sorted by name."""
    return sorted(directory.glob("*" + _SUFFIXES[GRAPHS]))


def harness(path: Path) -> str:
    """:data:`EAGER` or :data:`GRAPHS`, from the file name's suffix."""
    for name, suffix in _SUFFIXES.items():
        if path.name.endswith(suffix):
            return name
    raise ValueError(f"{path.name}: neither an eager (*_measured.csv) nor a graphs profile")


def profile_paths(directory: Path = MEASURED_DIR) -> list[Path]:
    """Every measured profile, eager and CUDA graphs, ordered by GPU and model with each model's
    eager file before its graphs file (``<gpu>_<model>_...``)."""
    order = list(_SUFFIXES)
    paths = measured_paths(directory) + graphs_paths(directory)
    return sorted(paths, key=lambda p: (p.name.split("_")[:2], order.index(harness(p))))


def catalogue_gpu(path: Path) -> str:
    """The catalogue GPU (``pdopt.hardware.GPUS``) a measured file's ``# gpu:`` line (the torch
    device name) resolves to; :func:`pdopt.hardware.get_gpu` raises for a board it does not hold."""
    return get_gpu(read_profile(path).meta.gpu).name


def prior_profile(path: Path, measured: Profile | None = None) -> Profile:
    """The roofline prior (no noise) for the measured profile's GPU, model and TP."""
    meta = (measured or read_profile(path)).meta
    return roofline_profile(catalogue_gpu(path), meta.model, meta.tp, noise_sigma=0.0)


def matched_points(path: Path, kind: str) -> pd.DataFrame:
    """Per grid point of ``kind`` (``prefill`` or ``decode``) shared by the measured profile and
    its prior: ``measured_s``, ``roofline_s`` and ``ratio`` = roofline / measured."""
    measured = read_profile(path)
    prior = prior_profile(path, measured)
    keys = _KEYS[kind]
    left = measured.of_kind(kind)[[*keys, "latency_s"]].rename(columns={"latency_s": "measured_s"})
    right = prior.of_kind(kind)[[*keys, "latency_s"]].rename(columns={"latency_s": "roofline_s"})
    joined = left.merge(right, on=keys, how="inner").sort_values(keys, ignore_index=True)
    joined[keys] = joined[keys].astype(np.int64)
    joined["ratio"] = joined["roofline_s"] / joined["measured_s"]
    return joined


def layer_gemm_share(measured: Profile, input_tokens: int) -> float:
    """Share of the measured batch-1 prefill of ``input_tokens`` tokens that the layer's own
    weight GEMMs (QKV, output, gate/up, down, measured alone at ``m = input_tokens`` in the
    ``gemm`` rows) take: ``layers × Σ gemm latency / prefill latency``. NaN when a row is
    missing. The rest is attention, the eager element-wise kernels, the KV-cache writes and the
    embedding and LM head."""
    spec = get_model(measured.meta.model)
    shapes = layer_weight_shapes(spec)
    gemm = measured.of_kind("gemm")
    total = 0.0
    for n, k in shapes:
        hit = gemm[(gemm["m"] == input_tokens) & (gemm["n"] == n) & (gemm["k"] == k)]
        if hit.empty:
            return float("nan")
        total += float(hit["latency_s"].iloc[0])
    prefill = measured.of_kind("prefill")
    one = prefill[(prefill["batch_size"] == 1) & (prefill["input_tokens"] == input_tokens)]
    if one.empty:
        return float("nan")
    return spec.num_layers * total / float(one["latency_s"].iloc[0])


def _fit(profile: Profile) -> tuple[CostModel, dict[str, float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost, reports = fit_cost_model(profile)
    prefill, decode = cost.prefill, cost.decode
    return cost, {
        "p_peak_tflops": prefill.p_peak_flops / 1e12,
        "alpha_flop_per_token2": prefill.alpha_flop_per_token2,
        "beta_gflop_per_token": prefill.beta_flop_per_token / 1e9,
        "t0_ms": prefill.intercept_s * 1e3,
        "d0_ms": decode.d0_s * 1e3,
        "d1_us_per_request": decode.d1_s_per_request * 1e6,
        "d2_ns_per_token": decode.d2_s_per_token * 1e9,
        "prefill_fit_mape_pct": reports["prefill"].mape,
        "decode_fit_mape_pct": reports["decode"].mape,
    }


@cache
def _fitted(path: Path, source: str) -> tuple[CostModel, dict[str, float]]:
    """The cost model fitted to the measured profile at ``path`` (``source`` "measured") or to
    its roofline prior ("roofline"), and its summary; cached per file (the files do not change
    while the script runs)."""
    profile = read_profile(path)
    return _fit(profile if source == "measured" else prior_profile(path, profile))


def fitted_cost_model(path: Path) -> CostModel:
    """:func:`pdopt.costmodel.fit_cost_model` on the measured profile at ``path`` (its fit
    warnings silenced; ``compare`` reports the fit MAPEs)."""
    return _fitted(Path(path), "measured")[0]


def _stats(ratio: pd.Series, prefix: str) -> dict[str, float]:
    return {
        f"{prefix}_median": float(ratio.median()),
        f"{prefix}_min": float(ratio.min()),
        f"{prefix}_max": float(ratio.max()),
    }


def compare_one(path: Path) -> dict[str, Any]:
    """One row of :func:`compare` for one measured profile."""
    measured = read_profile(path)
    prior = prior_profile(path, measured)
    gpu = catalogue_gpu(path)
    layers = _LAYERS.search(measured.meta.notes)
    prefill = matched_points(path, "prefill")
    decode = matched_points(path, "decode")
    row: dict[str, Any] = {
        "file": path.name,
        "harness": harness(path),
        "gpu": gpu,
        "device_name": measured.meta.gpu,
        "model": measured.meta.model,
        "tp": measured.meta.tp,
        "layers_built": int(layers.group(1)) if layers else np.nan,
        "layers": int(layers.group(2)) if layers else np.nan,
        "prefill_points": len(prefill),
        "decode_points": len(decode),
        "decode_points_measured": len(measured.of_kind("decode")),
    }
    row.update(_stats(prefill["ratio"], "prefill_ratio"))
    short = prefill["input_tokens"] <= SHORT_PREFILL
    long = prefill["input_tokens"] >= LONG_PREFILL
    row["prefill_ratio_short_median"] = float(prefill.loc[short, "ratio"].median())
    row["prefill_ratio_long_median"] = float(prefill.loc[long, "ratio"].median())
    row.update(_stats(decode["ratio"], "decode_ratio"))
    small = decode["batch_size"] <= SMALL_DECODE_BATCH
    large = decode["batch_size"] >= LARGE_DECODE_BATCH
    row["decode_ratio_small_median"] = float(decode.loc[small, "ratio"].median())
    row["decode_ratio_large_median"] = float(decode.loc[large, "ratio"].median())
    row["gemm_share_prefill_2048"] = layer_gemm_share(measured, 2048)
    row["gemm_share_prefill_8192"] = layer_gemm_share(measured, 8192)
    row["decode_floor_measured_ms"] = float(measured.of_kind("decode")["latency_s"].min() * 1e3)
    row["decode_floor_roofline_ms"] = float(prior.of_kind("decode")["latency_s"].min() * 1e3)
    peak = gemm_peak_flops(measured)
    datasheet = get_gpu(gpu).peak_flops
    row["gemm_peak_tflops"] = peak / 1e12
    row["datasheet_peak_tflops"] = datasheet / 1e12
    row["gemm_peak_fraction"] = peak / datasheet
    for source in ("measured", "roofline"):
        for key, value in _fitted(path, source)[1].items():
            row[f"{source}_{key}"] = value
    return row


def compare(directory: Path = MEASURED_DIR) -> pd.DataFrame:
    """One row per measured profile, eager and CUDA graphs (:func:`profile_paths`' order):
    ratios roofline / measured (median, min, max; by regime), GEMM peak against the data sheet,
    and the cost model fitted to each of the two profiles."""
    return pd.DataFrame([compare_one(path) for path in profile_paths(directory)])


GAP_REGIMES: tuple[tuple[str, str], ...] = (
    ("prefill_ratio_short_median", "short prefill"),
    ("prefill_ratio_long_median", "long prefill"),
    ("decode_ratio_small_median", "small-B decode"),
    ("decode_ratio_large_median", "large-B decode"),
)
"""The regimes of :func:`gap_closed`: a :func:`compare` column and its label."""


def gap_closed(table: pd.DataFrame) -> pd.DataFrame:
    """Per GPU × model with both an eager and a CUDA-graph profile (``table``: :func:`compare`),
    per regime: the median ratio roofline / measured of each, and the share of the eager gap to
    the roofline that the graphs close, ``(r_graphs − r_eager) / (1 − r_eager)`` (1: the graphs
    reach the roofline; above 1: they overtake it); and the smallest decode step of each."""
    rows = []
    for (gpu, model), group in table.groupby(["gpu", "model"], sort=True):
        by = {h: g.iloc[0] for h, g in group.groupby("harness")}
        if EAGER not in by or GRAPHS not in by:
            continue
        eager, graphs = by[EAGER], by[GRAPHS]
        row: dict[str, Any] = {"gpu": gpu, "model": model}
        for column, _ in GAP_REGIMES:
            r_e, r_g = float(eager[column]), float(graphs[column])
            row[f"{column}_eager"] = r_e
            row[f"{column}_graphs"] = r_g
            row[f"{column}_gap_closed"] = (r_g - r_e) / (1.0 - r_e)
        row["decode_floor_eager_ms"] = float(eager["decode_floor_measured_ms"])
        row["decode_floor_graphs_ms"] = float(graphs["decode_floor_measured_ms"])
        row["decode_floor_roofline_ms"] = float(graphs["decode_floor_roofline_ms"])
        rows.append(row)
    return pd.DataFrame(rows)


def gemm_calibration(directory: Path = MEASURED_DIR) -> pd.DataFrame:
    """Per harness run and GPU, :func:`pdopt.profile.calibrate_compute_efficiency` over the
    ``gemm`` rows of all its measured profiles, against the roofline preset (the ``gemm`` rows
    are single kernels timed eagerly in both runs)."""
    groups: dict[tuple[str, str], list[Profile]] = {}
    for run, paths in ((EAGER, measured_paths(directory)), (GRAPHS, graphs_paths(directory))):
        for path in paths:
            groups.setdefault((run, catalogue_gpu(path)), []).append(read_profile(path))
    rows = []
    for (run, gpu), profiles in groups.items():
        calibration = calibrate_compute_efficiency(profiles, gpu)
        rows.append(
            {
                "harness": run,
                "gpu": gpu,
                "profiles": len(profiles),
                "gemm_points": calibration.gemm_points,
                "gemm_efficiency": calibration.gemm_efficiency,
                "reference_gemm_efficiency": calibration.reference_gemm_efficiency,
                "preset_compute_efficiency": calibration.preset_compute_efficiency,
                "compute_efficiency": calibration.compute_efficiency,
                "preset_bandwidth_efficiency": roofline_knobs(get_gpu(gpu)).bandwidth_efficiency,
            }
        )
    return pd.DataFrame(rows)


def mixed_paths(directory: Path = MEASURED_DIR) -> list[Path]:
    """The mixed-batch CSVs of the CUDA-graph run (``*_graphs_mixed.csv``), sorted by name."""
    return sorted(directory.glob("*" + MIXED_SUFFIX))


def read_mixed(path: Path) -> tuple[dict[str, str], pd.DataFrame]:
    """A ``*_mixed.csv`` file: its ``# key: value`` header (``notes`` lines joined by newlines)
    and its rows (:data:`MIXED_COLUMNS`)."""
    header: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.startswith("#"):
                break
            key, _, value = line[1:].strip().partition(":")
            key, value = key.strip(), value.strip()
            header[key] = f"{header[key]}\n{value}" if key == "notes" and key in header else value
    rows = pd.read_csv(path, comment="#")
    if tuple(rows.columns) != MIXED_COLUMNS:
        raise ValueError(f"{path.name}: columns {list(rows.columns)}, expected {MIXED_COLUMNS}")
    return header, rows


def mixed_profile_path(path: Path) -> Path:
    """The profile beside a mixed file: ``<stem>_mixed.csv`` → ``<stem>.csv``."""
    return path.with_name(path.name.removesuffix("_mixed.csv") + ".csv")


def _predict(cost: CostModel, batch: int, context: int, chunk: int) -> dict[str, float]:
    """pdopt's fused pass of ``batch`` decodes (``context`` tokens each) and one first chunk of
    ``chunk`` tokens, its decode-only step and the chunk's prefill alone, seconds, all three
    through :meth:`CostModel.hybrid_iteration_time_s` (no chunk: τ(B, C); no decode: the prefill
    batch time), and the ratio fused / (decode-only + prefill-only)."""
    total = batch * context
    fused = cost.hybrid_iteration_time_s([chunk], batch, total, [0])
    decode = cost.hybrid_iteration_time_s([], batch, total)
    prefill = cost.hybrid_iteration_time_s([chunk], 0, 0)
    return {"fused_s": fused, "decode_s": decode, "prefill_s": prefill}


def _form_on_measured(cost: CostModel, row: pd.Series) -> float:
    """:func:`pdopt.costmodel.fused_iteration_s` with the *measured* decode-only and prefill-only
    times as the two passes' totals, split into pass and attention with ``cost``'s terms
    (``Da = d2·C``, ``Pa = alpha·P²/P_peak``, per-token linear cost ``k = beta·P_m/P_peak``):
    ``Dp = decode − Da``, ``Pp = prefill − Pa + k·B`` (the chunk pass's GEMMs also carry the B
    decode tokens). The fused form's own error, with the endpoints exact."""
    batch, chunk = int(row["batch_size"]), int(row["chunk_tokens"])
    prefill, decode = cost.prefill, cost.decode
    decode_attention = decode.d2_s_per_token * batch * int(row["context_tokens"])
    chunk_attention = prefill.alpha_flop_per_token2 * chunk * chunk / prefill.p_peak_flops
    per_token = prefill.beta_flop_per_token * prefill.p_m / prefill.p_peak_flops
    decode_only, prefill_only = float(row["decode_only_s"]), float(row["prefill_only_s"])
    return fused_iteration_s(
        decode_pass_s=decode_only - decode_attention,
        chunk_pass_s=prefill_only - chunk_attention + per_token * batch,
        decode_attention_s=decode_attention,
        chunk_attention_s=chunk_attention,
        separate_s=decode_only + prefill_only,
    )


def mixed_check(path: Path) -> pd.DataFrame:
    """Per measured mixed point of ``path`` (a ``*_graphs_mixed.csv``): the measured fused,
    decode-only and prefill-only times and ratio; ``overlap_ratio`` = max(decode, prefill) /
    (decode + prefill), the ratio of a perfect overlap of the two measured passes; pdopt's
    predictions (:func:`_predict`) with the roofline cost model (``roofline_*``, the default
    prior, :func:`pdopt.costmodel.roofline_cost_model`) and with the cost model fitted to the
    graph profile beside the file (``fit_*``), each with ``*_ratio`` and ``*_fused_err_pct``
    (predicted / measured fused time − 1, %); and ``form_ratio``, the fused form on the
    measured endpoints (:func:`_form_on_measured`, the graph fit's terms)."""
    header, rows = read_mixed(path)
    gpu = get_gpu(header["gpu"]).name
    tp = int(header.get("tp", "1"))
    models = {
        "roofline": roofline_cost_model(gpu, header["model"], tp),
        "fit": fitted_cost_model(mixed_profile_path(path)),
    }
    out = []
    for _, row in rows.iterrows():
        batch, context, chunk = (int(row[k]) for k in MIXED_COLUMNS[:3])
        decode_only, prefill_only = float(row["decode_only_s"]), float(row["prefill_only_s"])
        record: dict[str, Any] = {
            "gpu": gpu,
            "model": header["model"],
            "batch_size": batch,
            "context_tokens": context,
            "chunk_tokens": chunk,
            "measured_fused_s": float(row["latency_s"]),
            "measured_decode_s": decode_only,
            "measured_prefill_s": prefill_only,
            "measured_ratio": float(row["ratio"]),
            "overlap_ratio": max(decode_only, prefill_only) / (decode_only + prefill_only),
        }
        for name, cost in models.items():
            predicted = _predict(cost, batch, context, chunk)
            for key, value in predicted.items():
                record[f"{name}_{key}"] = value
            record[f"{name}_ratio"] = predicted["fused_s"] / (
                predicted["decode_s"] + predicted["prefill_s"]
            )
            record[f"{name}_fused_err_pct"] = 100 * (
                predicted["fused_s"] / float(row["latency_s"]) - 1
            )
        form = _form_on_measured(models["fit"], row)
        record["form_fused_s"] = form
        record["form_ratio"] = form / (decode_only + prefill_only)
        out.append(record)
    return pd.DataFrame(out)


def mixed_table(directory: Path = MEASURED_DIR) -> pd.DataFrame:
    """:func:`mixed_check` of every mixed file, one row per point."""
    frames = [mixed_check(path) for path in mixed_paths(directory)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _g(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}"


def _ratio_lines(table: pd.DataFrame) -> list[str]:
    lines = [
        "Latency ratio roofline / measured on the shared grid points (median [min–max]; "
        f"short prefill: input ≤ {SHORT_PREFILL} tokens, long: ≥ {LONG_PREFILL}; small decode: "
        f"batch ≤ {SMALL_DECODE_BATCH}, large: ≥ {LARGE_DECODE_BATCH}). Harness: the eager run "
        "(`*_measured.csv`) or the CUDA-graph run (`*_graphs.csv`). Decode floor: the "
        "smallest decode step of each profile. GEMM share: the layer weight GEMMs' part of the "
        "measured batch-1 prefill at 2048 and 8192 tokens (`layer_gemm_share`).",
        "",
        "| GPU | model | harness | layers built | prefill (pts) | short | long | GEMM share 2k, 8k "
        "| decode (pts) | small B | large B | decode floor ms (meas. / roof.) |",
        "|---|---|---|---:|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['gpu']} | {r['model']} | {r['harness']} "
            f"| {int(r['layers_built'])} of {int(r['layers'])} "
            f"| {r['prefill_ratio_median']:.2f} [{r['prefill_ratio_min']:.2f}–"
            f"{r['prefill_ratio_max']:.2f}] ({int(r['prefill_points'])}) "
            f"| {r['prefill_ratio_short_median']:.2f} | {r['prefill_ratio_long_median']:.2f} "
            f"| {r['gemm_share_prefill_2048']:.2f}, {r['gemm_share_prefill_8192']:.2f} "
            f"| {r['decode_ratio_median']:.2f} [{r['decode_ratio_min']:.2f}–"
            f"{r['decode_ratio_max']:.2f}] ({int(r['decode_points'])} of "
            f"{int(r['decode_points_measured'])}) "
            f"| {r['decode_ratio_small_median']:.2f} | {r['decode_ratio_large_median']:.2f} "
            f"| {r['decode_floor_measured_ms']:.1f} / {r['decode_floor_roofline_ms']:.1f} |"
        )
    return lines


def _gap_lines(gap: pd.DataFrame) -> list[str]:
    head = " | ".join(label for _, label in GAP_REGIMES)
    lines = [
        "Eager against CUDA graphs, same GPU and model: median ratio roofline / measured per "
        "regime, eager → graphs (share of the eager gap to the roofline closed, "
        "`(r_graphs − r_eager) / (1 − r_eager)`), and the smallest decode step of each run and "
        "of the roofline (`gap_closed`).",
        "",
        f"| GPU | model | {head} | decode floor ms (eager / graphs / roofline) |",
        "|---|---|" + "---|" * len(GAP_REGIMES) + "---|",
    ]
    for _, r in gap.iterrows():
        cells = [
            f"{r[c + '_eager']:.2f} → {r[c + '_graphs']:.2f} ({r[c + '_gap_closed']:.0%})"
            for c, _ in GAP_REGIMES
        ]
        lines.append(
            f"| {r['gpu']} | {r['model']} | {' | '.join(cells)} "
            f"| {r['decode_floor_eager_ms']:.1f} / {r['decode_floor_graphs_ms']:.1f} / "
            f"{r['decode_floor_roofline_ms']:.1f} |"
        )
    return lines


def _fit_lines(table: pd.DataFrame) -> list[str]:
    lines = [
        "Sustained GEMM peak (`pdopt.costmodel.gemm_peak_flops`: median of the 3 fastest `gemm` "
        "rows) against the data-sheet dense 16-bit peak, and the cost model "
        "`pdopt.costmodel.fit_cost_model` fits to the measured profile (m) and to the roofline "
        "prior (r). Prefill T = t0 + Σ(α·l² + β·l)/P_peak; decode τ(B, C) = d0 + d1·B + d2·C; "
        "fit MAPE: the fit's own error on its profile.",
        "",
        "| GPU | model | harness | GEMM peak TFLOP/s (of data sheet) | P_peak m / r "
        "| α m / r (FLOP/tok²) | β m / r (GFLOP/tok) | t0 ms m / r | d0 ms m / r | d1 µs m / r "
        "| d2 ns m / r | fit MAPE % prefill, decode (m) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():

        def pair(key: str, digits: int = 3, r: pd.Series = r) -> str:
            return f"{_g(r['measured_' + key], digits)} / {_g(r['roofline_' + key], digits)}"

        lines.append(
            f"| {r['gpu']} | {r['model']} | {r['harness']} "
            f"| {r['gemm_peak_tflops']:.0f} of {r['datasheet_peak_tflops']:.0f} "
            f"({r['gemm_peak_fraction']:.2f}) "
            f"| {pair('p_peak_tflops')} | {pair('alpha_flop_per_token2')} "
            f"| {pair('beta_gflop_per_token')} | {pair('t0_ms', 2)} | {pair('d0_ms')} "
            f"| {pair('d1_us_per_request', 2)} | {pair('d2_ns_per_token')} "
            f"| {r['measured_prefill_fit_mape_pct']:.1f}, {r['measured_decode_fit_mape_pct']:.1f} |"
        )
    return lines


def _calibration_lines(calibration: pd.DataFrame) -> list[str]:
    lines = [
        "`pdopt.profile.calibrate_compute_efficiency` over the measured `gemm` rows of each run "
        "and GPU (its models pooled; the `gemm` rows are single kernels, timed eagerly in both "
        "runs): the compute-bound GEMMs' efficiency against the preset's reference GEMM "
        "efficiency, and the roofline compute efficiency it implies against the preset's.",
        "",
        "| harness | GPU | profiles | gemm rows | GEMM efficiency (measured / preset reference) "
        "| compute efficiency (calibrated / preset) |",
        "|---|---|---:|---:|---|---|",
    ]
    for _, c in calibration.iterrows():
        lines.append(
            f"| {c['harness']} | {c['gpu']} | {int(c['profiles'])} | {int(c['gemm_points'])} "
            f"| {c['gemm_efficiency']:.3f} / {c['reference_gemm_efficiency']:.3f} "
            f"| {c['compute_efficiency']:.3f} / {c['preset_compute_efficiency']:.3f} |"
        )
    return lines


def _mixed_lines(mixed: pd.DataFrame) -> list[str]:
    if mixed.empty:
        return []
    lines = [
        "Mixed batches (`*_graphs_mixed.csv`, CUDA graphs): one forward pass of B decodes at "
        "context C = 1024 each plus a first prefill chunk of P tokens, against pdopt's fused "
        "iteration `CostModel.hybrid_iteration_time_s` = min(max(Dp, Pp) + Da + Pa, decode + "
        "prefill) (`mixed_check`). Ratio: fused / (decode-only + prefill-only), each of the "
        "three measured or predicted by the same model. Overlap: max(decode, prefill) / (decode "
        "+ prefill) of the measured passes, a perfect overlap with no attention. Form: "
        "`fused_iteration_s` on the measured decode-only and prefill-only times, split into "
        "pass and attention with the graph fit's terms (the form's own error, endpoints exact). "
        "Roofline: `roofline_cost_model(gpu, model)` for the file's own GPU; fit: "
        "`fit_cost_model` on the graph profile beside it. Err: predicted / measured fused time "
        "− 1.",
        "",
        "| GPU | model | B | P | measured ms: fused (decode + prefill) | ratio: measured "
        "| overlap | form | roofline | fit | fused ms: roofline (err) | fit (err) |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for _, m in mixed.iterrows():
        lines.append(
            f"| {m['gpu']} | {m['model']} | {m['batch_size']} | {m['chunk_tokens']} "
            f"| {m['measured_fused_s'] * 1e3:.1f} ({m['measured_decode_s'] * 1e3:.1f} + "
            f"{m['measured_prefill_s'] * 1e3:.1f}) "
            f"| {m['measured_ratio']:.2f} | {m['overlap_ratio']:.2f} | {m['form_ratio']:.2f} "
            f"| {m['roofline_ratio']:.2f} | {m['fit_ratio']:.2f} "
            f"| {m['roofline_fused_s'] * 1e3:.1f} ({m['roofline_fused_err_pct']:+.0f}%) "
            f"| {m['fit_fused_s'] * 1e3:.1f} ({m['fit_fused_err_pct']:+.0f}%) |"
        )
    lines += [
        "",
        "Per GPU, model and chunk size: mean ratio (measured; predicted − measured for the form, "
        "the roofline and the fit) and mean absolute error of the predicted fused time.",
        "",
        "| GPU | model | P | ratio measured | Δ form | Δ roofline | Δ fit "
        "| fused |err| roofline | fused |err| fit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (gpu, model, chunk), g in mixed.groupby(["gpu", "model", "chunk_tokens"], sort=True):
        measured = g["measured_ratio"]
        lines.append(
            f"| {gpu} | {model} | {chunk} | {measured.mean():.2f} "
            f"| {(g['form_ratio'] - measured).mean():+.2f} "
            f"| {(g['roofline_ratio'] - measured).mean():+.2f} "
            f"| {(g['fit_ratio'] - measured).mean():+.2f} "
            f"| {g['roofline_fused_err_pct'].abs().mean():.0f}% "
            f"| {g['fit_fused_err_pct'].abs().mean():.0f}% |"
        )
    return lines


def markdown(
    table: pd.DataFrame, calibration: pd.DataFrame, mixed: pd.DataFrame | None = None
) -> str:
    """The README's tables (between the markers) from :func:`compare`'s,
    :func:`gemm_calibration`'s and :func:`mixed_table`'s DataFrames (the eager-vs-graphs table,
    :func:`gap_closed`, is derived from ``table``)."""
    sections = [_ratio_lines(table)]
    gap = gap_closed(table)
    if not gap.empty:
        sections.append(_gap_lines(gap))
    sections += [_fit_lines(table), _calibration_lines(calibration)]
    if mixed is not None and not mixed.empty:
        sections.append(_mixed_lines(mixed))
    lines: list[str] = []
    for section in sections:
        lines += [*([""] if lines else []), *section]
    return "\n".join(lines) + "\n"


def render_readme(
    current: str,
    table: pd.DataFrame,
    calibration: pd.DataFrame,
    mixed: pd.DataFrame | None = None,
) -> str:
    """``current`` with the text between the markers replaced by :func:`markdown`."""
    start, stop = current.find(BEGIN), current.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"{README}: markers {BEGIN!r} … {END!r} not found")
    body = markdown(table, calibration, mixed)
    return current[: start + len(BEGIN)] + "\n" + body + current[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a change")
    args = parser.parse_args(argv)
    current = README.read_text(encoding="utf-8")
    text = render_readme(current, compare(), gemm_calibration(), mixed_table())
    if text == current:
        print(f"{README.relative_to(ROOT)}: up to date")
        return 0
    if args.check:
        print(f"{README.relative_to(ROOT)}: differs (run python -m calibration.compare_measured)")
        return 1
    README.write_text(text, encoding="utf-8")
    print(f"{README.relative_to(ROOT)}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
