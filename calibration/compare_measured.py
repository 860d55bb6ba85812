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
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pdopt.costmodel import fit_cost_model, gemm_peak_flops
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

_KEYS = {
    "prefill": ["batch_size", "input_tokens"],
    "decode": ["batch_size", "total_context_tokens"],
}
_LAYERS = re.compile(r"built (\d+) of (\d+) layers")


def measured_paths(directory: Path = MEASURED_DIR) -> list[Path]:
    """The measured profile CSVs, sorted by name."""
    return sorted(directory.glob("*_measured.csv"))


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
    hd, hidden = spec.head_dim, spec.hidden_size
    shapes = (
        ((spec.num_heads + 2 * spec.num_kv_heads) * hd, hidden),
        (hidden, spec.num_heads * hd),
        (2 * spec.intermediate_size, hidden),
        (hidden, spec.intermediate_size),
    )
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


def _fit(profile: Profile) -> dict[str, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost, reports = fit_cost_model(profile)
    prefill, decode = cost.prefill, cost.decode
    return {
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
    for source, profile in (("measured", measured), ("roofline", prior)):
        for key, value in _fit(profile).items():
            row[f"{source}_{key}"] = value
    return row


def compare(directory: Path = MEASURED_DIR) -> pd.DataFrame:
    """One row per measured profile: ratios roofline / measured (median, min, max; by regime),
    GEMM peak against the data sheet, and the cost model fitted to each of the two profiles."""
    return pd.DataFrame([compare_one(path) for path in measured_paths(directory)])


def gemm_calibration(directory: Path = MEASURED_DIR) -> pd.DataFrame:
    """Per GPU, :func:`pdopt.profile.calibrate_compute_efficiency` over the ``gemm`` rows of all
    its measured profiles, against the roofline preset."""
    by_gpu: dict[str, list[Profile]] = {}
    for path in measured_paths(directory):
        by_gpu.setdefault(catalogue_gpu(path), []).append(read_profile(path))
    rows = []
    for gpu, profiles in by_gpu.items():
        calibration = calibrate_compute_efficiency(profiles, gpu)
        rows.append(
            {
                "gpu": gpu,
                "gemm_points": calibration.gemm_points,
                "gemm_efficiency": calibration.gemm_efficiency,
                "reference_gemm_efficiency": calibration.reference_gemm_efficiency,
                "preset_compute_efficiency": calibration.preset_compute_efficiency,
                "compute_efficiency": calibration.compute_efficiency,
                "preset_bandwidth_efficiency": roofline_knobs(get_gpu(gpu)).bandwidth_efficiency,
            }
        )
    return pd.DataFrame(rows)


def _g(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}"


def _label(row: pd.Series) -> str:
    return f"{row['gpu']} {row['model']}"


def markdown(table: pd.DataFrame, calibration: pd.DataFrame) -> str:
    """The README's tables (between the markers) from :func:`compare`'s and
    :func:`gemm_calibration`'s DataFrames."""
    ratio_lines = [
        "Latency ratio roofline / measured on the shared grid points (median [min–max]; "
        f"short prefill: input ≤ {SHORT_PREFILL} tokens, long: ≥ {LONG_PREFILL}; small decode: "
        f"batch ≤ {SMALL_DECODE_BATCH}, large: ≥ {LARGE_DECODE_BATCH}). Decode floor: the "
        "smallest decode step of each profile. GEMM share: the layer weight GEMMs' part of the "
        "measured batch-1 prefill at 2048 and 8192 tokens (`layer_gemm_share`).",
        "",
        "| GPU | model | layers built | prefill (pts) | short | long | GEMM share 2k, 8k "
        "| decode (pts) | small B | large B | decode floor ms (meas. / roof.) |",
        "|---|---|---:|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for _, r in table.iterrows():
        ratio_lines.append(
            f"| {r['gpu']} | {r['model']} | {int(r['layers_built'])} of {int(r['layers'])} "
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
    fit_lines = [
        "Sustained GEMM peak (`pdopt.costmodel.gemm_peak_flops`: median of the 3 fastest `gemm` "
        "rows) against the data-sheet dense 16-bit peak, and the cost model "
        "`pdopt.costmodel.fit_cost_model` fits to the measured profile (m) and to the roofline "
        "prior (r). Prefill T = t0 + Σ(α·l² + β·l)/P_peak; decode τ(B, C) = d0 + d1·B + d2·C; "
        "fit MAPE: the fit's own error on its profile.",
        "",
        "| GPU | model | GEMM peak TFLOP/s (of data sheet) | P_peak m / r | α m / r (FLOP/tok²) "
        "| β m / r (GFLOP/tok) | t0 ms m / r | d0 ms m / r | d1 µs m / r | d2 ns m / r "
        "| fit MAPE % prefill, decode (m) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():

        def pair(key: str, digits: int = 3, r: pd.Series = r) -> str:
            return f"{_g(r['measured_' + key], digits)} / {_g(r['roofline_' + key], digits)}"

        fit_lines.append(
            f"| {r['gpu']} | {r['model']} "
            f"| {r['gemm_peak_tflops']:.0f} of {r['datasheet_peak_tflops']:.0f} "
            f"({r['gemm_peak_fraction']:.2f}) "
            f"| {pair('p_peak_tflops')} | {pair('alpha_flop_per_token2')} "
            f"| {pair('beta_gflop_per_token')} | {pair('t0_ms', 2)} | {pair('d0_ms')} "
            f"| {pair('d1_us_per_request', 2)} | {pair('d2_ns_per_token')} "
            f"| {r['measured_prefill_fit_mape_pct']:.1f}, {r['measured_decode_fit_mape_pct']:.1f} |"
        )
    calibration_lines = [
        "`pdopt.profile.calibrate_compute_efficiency` over each GPU's measured `gemm` rows (all "
        "four models pooled): the compute-bound GEMMs' efficiency against the preset's reference "
        "GEMM efficiency, and the roofline compute efficiency it implies against the preset's.",
        "",
        "| GPU | gemm rows | GEMM efficiency (measured / preset reference) "
        "| compute efficiency (calibrated / preset) |",
        "|---|---:|---|---|",
    ]
    for _, c in calibration.iterrows():
        calibration_lines.append(
            f"| {c['gpu']} | {int(c['gemm_points'])} "
            f"| {c['gemm_efficiency']:.3f} / {c['reference_gemm_efficiency']:.3f} "
            f"| {c['compute_efficiency']:.3f} / {c['preset_compute_efficiency']:.3f} |"
        )
    return "\n".join([*ratio_lines, "", *fit_lines, "", *calibration_lines]) + "\n"


def render_readme(current: str, table: pd.DataFrame, calibration: pd.DataFrame) -> str:
    """``current`` with the text between the markers replaced by :func:`markdown`."""
    start, stop = current.find(BEGIN), current.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"{README}: markers {BEGIN!r} … {END!r} not found")
    return current[: start + len(BEGIN)] + "\n" + markdown(table, calibration) + current[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a change")
    args = parser.parse_args(argv)
    current = README.read_text(encoding="utf-8")
    text = render_readme(current, compare(), gemm_calibration())
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
