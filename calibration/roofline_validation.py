"""Fit the roofline prior's per-generation presets on one measured source each, check them on
the others (issue 20), and write the table (CSV + markdown).

Run from the repository root (the AIConfigurator data needs ``pip install -e ".[aic]"`` or an
unpacked ``aiconfigurator_core``; the Vidur data is ``../shared/data/vidur-profiling``)::

    python -m calibration.roofline_validation --aic-dir auto --vidur-dir PATH --out-dir DIR
    python -m calibration.roofline_validation --aic-dir auto --fit   # re-derive the presets

Error of one point: ``roofline / measured − 1`` on the prefill (batch × input) and decode
(batch × context) grid points both profiles hold; a source's row reports the median and the
maximum of ``|error|`` per kind, for the shipped presets (:data:`pdopt.profile.ROOFLINE_PRESETS`)
and, for comparison, the knobs before the presets (0.65, 0.70, 1 ms, no all-reduce latency,
no elementwise bytes, hard max). ``--fit`` minimises the squared ``log(roofline / measured)``
over the ``fit`` sources of each generation (scipy ``least_squares``; their decode points whose
reference attention reads the KV faster than HBM left out, :func:`hbm_bound`),
``elementwise_bytes`` held at :data:`pdopt.profile._knobs.ELEMENTWISE_BYTES`, the kernel
latency and the all-reduce law held at their own fits on separate measurements
(:func:`kernel_latency`, :func:`all_reduce_law`).

The all-reduce law's ``α, β, η`` (:func:`pdopt.profile._roofline.all_reduce_s`) come from a
collective micro-benchmark, not from the end-to-end sums: the fit system's AIConfigurator
``custom_allreduce_perf`` table (the CUDA-graph kernel the fit sources compose) at the fit
sources' GPU counts and 2 (:func:`all_reduce_counts`), so the TP8 checks are out of sample in
the GPU count too. The Vidur source measured with NCCL, not the custom kernel the Ampere preset
fits: its row uses the A100 preset with the law refitted on Vidur's own
``network/a100_dgx/all_reduce.csv`` at the GPU counts the Ampere law is fitted at (2 and 4; the
``all_reduce`` column says so). Hopper and Blackwell add an in-switch branch fitted on the fit
system's 8-GPU table (:func:`switch_law`, :data:`SWITCH_REDUCTION`); the H200 TP8 row is then
the out-of-sample check of it (another GPU).

MoE models (:data:`MOE_SOURCES`) have their own table (``roofline_validation_moe.md/.csv``): the
shipped presets against the same presets without their MoE terms ("before":
:func:`without_moe_terms`, the expert GEMMs priced as dense ones). ``--fit`` then fits
``moe_reduction_overhead``, ``moe_layer_latency_s`` and ``moe_ridge_exponent`` on each
generation's BF16-expert MoE ``fit`` row (its prefill grid and the decode points whose cost does
not depend on the routing law, :func:`routing_insensitive`), the dense knobs held at the
generation's fitted ones (:func:`fit_moe`), and the dequantised-expert knobs
(``moe_dequant_*``) on its MXFP4-expert ``fit`` row with all the others held
(:func:`fit_dequant`). Its decode rows are also set against each source measured under
AIConfigurator's balanced routing (:func:`routing_bracket`): the default power-law rows and the
balanced ones bracket the uniform routing the roofline assumes.

Dense FP8 models (:data:`FP8_SOURCES`, checks only) have a third table
(``roofline_validation_fp8.md/.csv``): the shipped presets against the same presets without the
FP8 weight GEMMs' streaming rate and quantisation kernels ("before": :func:`without_fp8_terms`),
and the engines' spread. ``--fit`` takes ``fp8_peak_fraction`` and ``fp8_bandwidth_fraction``
from the fit system's GEMM kernel table (:func:`gemm_fp8_peak_fraction`,
:func:`gemm_fp8_bandwidth_fraction`), not from composed profiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pdopt.errors import InputError
from pdopt.hardware import get_gpu
from pdopt.model_spec import ModelSpec, expert_coverage, get_model, kv_bytes_per_token
from pdopt.profile import (
    ROOFLINE_PRESETS,
    Profile,
    RooflineKnobs,
    calibrate_compute_efficiency,
    gemm_compute_efficiency,
    import_aic,
    import_vidur,
    roofline_profile,
)
from pdopt.profile._aic import KV_DTYPES, PRECISIONS, _choice, _Ops, _resolve
from pdopt.profile._aic_data import (
    TableSource,
    find_database,
    load_table,
    pick_kernel,
    select,
    versions,
)
from pdopt.profile._knobs import (
    DEQUANTISED_EXPERT_DTYPES,
    ELEMENTWISE_BYTES,
    FP8_GEMM_EXTRA_KERNELS,
)
from pdopt.profile._roofline import _weight_gemms_per_pass, all_reduce_s
from pdopt.profile._vidur import _read_all_reduce

OLD_DEFAULTS = RooflineKnobs(0.65, 0.70, 1e-3, 0.0, 0.0, math.inf)
"""The knobs every GPU used before the presets (for the comparison column)."""

_KEYS = {
    "prefill": ["batch_size", "input_tokens"],
    "decode": ["batch_size", "total_context_tokens"],
}


@dataclass(frozen=True)
class Source:
    """One measured profile: where from, and whether its generation's preset is fitted on it."""

    generation: str
    gpu: str
    model: str
    tp: int
    kind: str  # "aic:<system>:<backend>" or "vidur"
    role: str  # "fit" or "check"
    precision: str | None = None  # import_aic's GEMM/MoE table precision (None: BF16)


SOURCES: tuple[Source, ...] = (
    Source("hopper", "H100-SXM", "Llama-3.1-8B", 1, "aic:h100_sxm:vllm", "fit"),
    Source("hopper", "H100-SXM", "Llama-3.1-70B", 4, "aic:h100_sxm:vllm", "fit"),
    Source("hopper", "H100-SXM", "Llama-3.1-70B", 8, "aic:h100_sxm:vllm", "check"),
    Source("hopper", "H200", "Llama-3.1-8B", 1, "aic:h200_sxm:vllm", "check"),
    Source("hopper", "H200", "Llama-3.1-70B", 4, "aic:h200_sxm:vllm", "check"),
    Source("hopper", "H200", "Llama-3.1-70B", 8, "aic:h200_sxm:vllm", "check"),
    # AIC's A100 vLLM/SGLang attention tables lack the window_size column import_aic needs.
    Source("ampere", "A100-80GB", "Llama-3.1-8B", 1, "aic:a100_sxm:trtllm", "fit"),
    Source("ampere", "A100-80GB", "Llama-3.1-70B", 4, "aic:a100_sxm:trtllm", "fit"),
    Source("ampere", "A100-80GB", "Llama-3.1-70B", 8, "aic:a100_sxm:trtllm", "check"),
    Source("ampere", "A100-80GB", "Llama-2-70B", 2, "vidur", "check"),
    Source("blackwell", "B200", "Llama-3.1-8B", 1, "aic:b200_sxm:vllm", "fit"),
    Source("blackwell", "B200", "Llama-3.1-70B", 4, "aic:b200_sxm:vllm", "fit"),
    Source("blackwell", "B200", "Llama-3.1-70B", 8, "aic:b200_sxm:vllm", "check"),
    Source("ada", "L40S", "Llama-3.1-8B", 1, "aic:l40s:vllm", "fit"),
    Source("ada", "L40S", "Llama-3.1-8B", 2, "aic:l40s:vllm", "fit"),
    Source("ada", "L40S", "Llama-3.1-70B", 4, "aic:l40s:vllm", "check"),
)

MOE_SOURCES: tuple[Source, ...] = (
    Source("hopper", "H100-SXM", "Qwen3-30B-A3B", 1, "aic:h100_sxm:vllm", "fit"),
    Source("hopper", "H100-SXM", "Qwen3-30B-A3B", 2, "aic:h100_sxm:vllm", "check"),
    Source("hopper", "H100-SXM", "Qwen3-30B-A3B", 4, "aic:h100_sxm:vllm", "check"),
    Source("hopper", "H100-SXM", "Qwen3-235B-A22B", 8, "aic:h100_sxm:vllm", "check"),
    Source("hopper", "H100-SXM", "Mixtral-8x7B", 2, "aic:h100_sxm:vllm", "check"),
    Source("hopper", "H100-SXM", "Mixtral-8x7B", 4, "aic:h100_sxm:vllm", "check"),
    Source("hopper", "H100-SXM", "gpt-oss-20b", 1, "aic:h100_sxm:vllm", "fit"),
    Source("hopper", "H100-SXM", "gpt-oss-120b", 1, "aic:h100_sxm:vllm", "check"),
    Source("hopper", "H100-SXM", "gpt-oss-120b", 2, "aic:h100_sxm:vllm", "check"),
    Source("hopper", "H100-SXM", "Qwen3-30B-A3B", 1, "aic:h100_sxm:trtllm", "check"),
    Source("hopper", "H100-SXM", "Qwen3-30B-A3B", 1, "aic:h100_sxm:sglang", "check"),
    Source("hopper", "H200", "Qwen3-30B-A3B", 1, "aic:h200_sxm:vllm", "check"),
    Source("hopper", "H200", "Qwen3-235B-A22B", 4, "aic:h200_sxm:vllm", "check"),
    Source("hopper", "H200", "Mixtral-8x7B", 2, "aic:h200_sxm:vllm", "check"),
    Source("hopper", "H200", "gpt-oss-120b", 1, "aic:h200_sxm:vllm", "check"),
    # AIC's A100 MoE tables hold Mixtral's shape only (TRT-LLM; vLLM lacks window_size).
    Source("ampere", "A100-80GB", "Mixtral-8x7B", 2, "aic:a100_sxm:trtllm", "fit"),
    Source("ampere", "A100-80GB", "Mixtral-8x7B", 4, "aic:a100_sxm:trtllm", "check"),
    Source("blackwell", "B200", "Qwen3-30B-A3B", 1, "aic:b200_sxm:vllm", "fit"),
    Source("blackwell", "B200", "Qwen3-30B-A3B", 2, "aic:b200_sxm:vllm", "check"),
    Source("blackwell", "B200", "Qwen3-235B-A22B", 4, "aic:b200_sxm:vllm", "check"),
    Source("blackwell", "B200", "Mixtral-8x7B", 2, "aic:b200_sxm:vllm", "check"),
    Source("blackwell", "B200", "gpt-oss-20b", 1, "aic:b200_sxm:vllm", "fit"),
    Source("blackwell", "B200", "gpt-oss-120b", 1, "aic:b200_sxm:vllm", "check"),
    Source("blackwell", "B200", "gpt-oss-120b", 2, "aic:b200_sxm:vllm", "check"),
    Source("ada", "L40S", "Qwen3-30B-A3B", 2, "aic:l40s:vllm", "fit"),
    Source("ada", "L40S", "Qwen3-30B-A3B", 4, "aic:l40s:vllm", "check"),
    Source("ada", "L40S", "Mixtral-8x7B", 4, "aic:l40s:vllm", "check"),
    Source("ada", "L40S", "gpt-oss-20b", 1, "aic:l40s:vllm", "check"),
    Source("ada", "L40S", "gpt-oss-120b", 2, "aic:l40s:vllm", "check"),
    Source("hopper", "H200", "DeepSeek-V3", 8, "aic:h200_sxm:vllm", "check", "fp8_block"),
    Source("hopper", "H200", "DeepSeek-V3", 8, "aic:h200_sxm:sglang", "check", "fp8_block"),
    Source("blackwell", "B200", "DeepSeek-V3", 8, "aic:b200_sxm:sglang", "check", "fp8_block"),
)
"""MoE sources (experts split ``tp`` ways, AIConfigurator's default routing skew): the MoE knobs
of each generation are fitted on its BF16-expert ``fit`` row with the dense knobs held, the
dequantised-expert knobs on its MXFP4 (gpt-oss) ``fit`` row with all others held, and checked on
the others (other TP degrees, models, backends and GPUs of the generation). Ampere has no
MXFP4 measurements (AIC's A100 MoE tables hold Mixtral's shape only); Ada's MXFP4 rows are
checks only (vLLM's Marlin kernel: its per-op ``moe_perf`` rows sit within 0.86–1.12× of the
BF16-expert terms from 16 tokens up, so no dequantisation term is fitted)."""


FP8_SOURCES: tuple[Source, ...] = tuple(
    Source(generation, gpu, f"{model}@fp8/bfloat16", tp, f"aic:{system}:vllm", "check", "fp8")
    for generation, gpu, system, model, tp in (
        ("hopper", "H100-SXM", "h100_sxm", "Llama-3.1-8B", 1),
        ("hopper", "H100-SXM", "h100_sxm", "Llama-3.1-70B", 4),
        ("hopper", "H200", "h200_sxm", "Llama-3.1-8B", 1),
        ("hopper", "H200", "h200_sxm", "Llama-3.1-70B", 4),
        ("hopper", "H200", "h200_sxm", "Llama-3.1-70B", 8),
        ("blackwell", "B200", "b200_sxm", "Llama-3.1-8B", 1),
        ("blackwell", "B200", "b200_sxm", "Llama-3.1-70B", 4),
        ("ada", "L40S", "l40s", "Llama-3.1-8B", 1),
        ("ada", "L40S", "l40s", "Llama-3.1-8B", 2),
    )
)
"""Dense FP8 (W8A8, per-tensor scales) sources: checks only, as no step-level knob is fitted
on them (``fp8_peak_fraction`` and ``fp8_bandwidth_fraction`` come from the fit systems' GEMM
kernel tables, the quantisation kernels are counted). Ampere has no FP8 tensor cores."""


def measured(
    source: Source,
    aic_dir: str,
    vidur_dir: Path,
    moe_distribution: str | None = None,
    version: str | None = None,
) -> Profile:
    """The measured profile of ``source`` (an MoE source's routed experts at
    ``moe_distribution``; None: AIConfigurator's default skew; at the backend's ``version``,
    None: the newest)."""
    if source.kind == "vidur":
        folder = vidur_dir / "a100" / "Llama-2-70b-hf"
        all_reduce = vidur_dir / "network" / "a100_dgx" / "all_reduce.csv"
        return import_vidur(folder, source.model, source.tp, all_reduce_csv=all_reduce)
    _, system, backend = source.kind.split(":")
    return import_aic(
        aic_dir,
        system,
        backend,
        source.model,
        source.tp,
        precision=source.precision or "bf16",
        moe_distribution=moe_distribution,
        version=version,
    )


def faster_than_hbm(source: Source, aic_dir: str, truth: pd.DataFrame) -> pd.Series:
    """Per row of ``truth`` (``source``'s measured profile, a dense AIConfigurator source):
    whether it is a decode row whose attention, in AIConfigurator's table, reads one layer's
    KV cache faster than the GPU's HBM peak, ``B·C·kv_bytes_per_layer / t_attention >
    hbm_bw``. No serving step can: it reads each layer's KV once per iteration, after the other
    layers' weights and KV have passed through the cache. So such a time measured a
    cache-resident KV (the L40S tables run at about 2× the HBM peak while one layer's KV fits
    its 96 MB L2, and at 0.7× from 134 MB on) or is faulty (A100 Llama-3.1-8B: 1.2–1.6× at
    0.5–1 GB); the roofline, which streams from HBM, cannot and should not follow it."""
    _, system, backend = source.kind.split(":")
    model = get_model(source.model)
    db = find_database(aic_dir)
    gemm_dtype = _choice(source.precision or "bf16", PRECISIONS, "precision")[0]
    kv_dtype = _choice("bf16", KV_DTYPES, "kv_dtype")
    version = _resolve(db, system, backend, None)
    ops = _Ops(db, system, backend, version, model, source.tp, gemm_dtype, kv_dtype, None)
    per_layer = kv_bytes_per_token(model, source.tp) / model.num_layers
    hbm = get_gpu(source.gpu).hbm_bw_bytes_per_s

    def hot(row: pd.Series) -> bool:
        if row["kind"] != "decode":
            return False
        batch = int(row["batch_size"])
        context = int(row["total_context_tokens"]) // batch
        attention_s = ops._attention_ms(True, batch, context) / 1e3
        return bool(batch * context * per_layer / attention_s > hbm)

    return truth.apply(hot, axis=1).astype(bool)


def hbm_bound(source: Source, aic_dir: str, truth: pd.DataFrame) -> pd.DataFrame:
    """``truth`` without the decode points :func:`faster_than_hbm` flags (an AIConfigurator
    source; a Vidur source is returned whole): what ``--fit`` fits the dense knobs on, since a
    serving step cannot do what those points measured. The tables keep every point."""
    if source.kind == "vidur":
        return truth
    return truth[~faster_than_hbm(source, aic_dir, truth)]


def balanced(source: Source, aic_dir: str) -> pd.DataFrame | None:
    """The MoE ``source`` measured with AIConfigurator's ``balanced`` routing (every expert the
    same load), or None where its tables have no such rows."""
    try:
        return measured(source, aic_dir, Path(), moe_distribution="balanced").rows
    except InputError:
        return None


def routing_bracket(
    prior: pd.DataFrame, power_law: pd.DataFrame, even: pd.DataFrame
) -> dict[str, float]:
    """The roofline's decode rows (``prior``) against one source measured under both of
    AIConfigurator's routings: its errors against the ``balanced`` rows, and how far it falls
    outside the interval the two measurements span at each point (0 inside; below it
    ``1 − roofline / low``, above ``roofline / high − 1``), in percent.

    pdopt prices decode under uniform random routing (each token's ``k`` experts drawn
    independently), which at ``B·k ≲ E`` touches more experts than AIConfigurator's power-law
    loads (most experts sampled near zero, rounded to none) and fewer than its balanced ones
    (each expert in turn): neither measurement is the roofline's routing, but it should lie
    between them, or near."""
    both = _aligned({"roofline": prior, "power": power_law, "balanced": even}, "decode")
    roofline = both["roofline"].to_numpy()
    power, even_s = both["power"].to_numpy(), both["balanced"].to_numpy()
    outside = _outside(roofline, np.minimum(power, even_s), np.maximum(power, even_s))
    versus = 100 * np.abs(roofline / even_s - 1)
    return {
        "balanced_decode_median_pct": round(float(np.median(versus)), 1),
        "balanced_decode_max_pct": round(float(np.max(versus)), 1),
        "outside_routing_decode_max_pct": round(float(100 * np.max(outside)), 1),
    }


def _aligned(profiles: dict[str, pd.DataFrame], kind: str) -> pd.DataFrame:
    """The ``kind`` grid points every one of ``profiles`` (rows by name) holds: the grid keys
    and one latency column per profile, named by it, in the first profile's row order."""
    keys = _KEYS[kind]
    frames = [
        rows.loc[rows["kind"] == kind, [*keys, "latency_s"]].rename(columns={"latency_s": name})
        for name, rows in profiles.items()
    ]
    both = frames[0]
    for frame in frames[1:]:
        both = both.merge(frame, on=keys)
    return both


def _prior(source: Source, knobs: RooflineKnobs) -> pd.DataFrame:
    """The roofline profile's rows of ``source``'s GPU, model and TP at ``knobs``."""
    # RooflineKnobs' fields are roofline_profile's keyword arguments of the same names
    return roofline_profile(source.gpu, source.model, source.tp, **asdict(knobs)).rows


def _outside(values: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """How far each of ``values`` lies outside ``[low, high]``, relative: 0 inside, below it
    ``1 − value / low``, above it ``value / high − 1``."""
    below = 1 - values / low
    above: np.ndarray = np.maximum(values / high - 1, 0.0)
    return np.where(values < low, below, above)


ENGINES = ("vllm", "sglang", "trtllm")
"""The AIConfigurator backends a source is set against (:func:`engine_spread`)."""


def other_engines(source: Source, aic_dir: str, vidur_dir: Path) -> dict[str, pd.DataFrame]:
    """``source``'s GPU, model, TP and precision measured by AIConfigurator under each engine
    of :data:`ENGINES` other than its own (the Vidur source: under all of them, on the A100
    system), by engine, at the newest version whose tables hold the model's shapes; engines
    with none are left out."""
    system, own = ("a100_sxm", "") if source.kind == "vidur" else source.kind.split(":")[1:]
    db = find_database(aic_dir)
    out = {}
    for engine in ENGINES:
        if engine == own:
            continue
        other = dataclasses.replace(source, kind=f"aic:{system}:{engine}")
        for version in reversed(versions(db, system, "gemm", engine)):
            try:
                out[engine] = measured(other, aic_dir, vidur_dir, version=version).rows
            except InputError:
                continue
            break
    return out


def engine_spread(
    source: Source, truth: pd.DataFrame, others: dict[str, pd.DataFrame], knobs: RooflineKnobs
) -> dict[str, object]:
    """How far the same GPU, model, TP and precision measured under other engines
    (``others``, :func:`other_engines`) lie from ``source``'s measurement (``truth``), and how
    far the roofline at ``knobs`` lies outside the span of all of them, per kind, in percent,
    over the points every measurement holds.

    One prior serves every engine, so where the engines disagree by more than 10% no prior
    is within 10% of each; the roofline's error against the engines' span is the part of its
    error a per-engine knob could not explain away."""
    if not others:
        return {"engines": ""}
    prior = _prior(source, knobs)
    row: dict[str, object] = {"engines": ",".join(others)}
    for kind in _KEYS:
        both = _aligned({"own": truth, "roofline": prior, **others}, kind)
        if both.empty:
            continue
        times = both[["own", *others]].to_numpy()
        spread = np.abs(times[:, 1:] / times[:, :1] - 1).max(axis=1)
        outside = _outside(both["roofline"].to_numpy(), times.min(axis=1), times.max(axis=1))
        row[f"engine_spread_{kind}_max_pct"] = round(float(100 * spread.max()), 1)
        row[f"outside_engines_{kind}_max_pct"] = round(float(100 * outside.max()), 1)
        row[f"engine_{kind}_points"] = len(both)
    return row


def log_errors(source: Source, truth: pd.DataFrame, knobs: RooflineKnobs) -> dict[str, np.ndarray]:
    """``log(roofline / measured)`` per kind over the grid points both hold."""
    return _log_errors(truth, _prior(source, knobs))


def _log_errors(truth: pd.DataFrame, prior: pd.DataFrame) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for kind in _KEYS:
        both = _aligned({"measured": truth, "roofline": prior}, kind)
        out[kind] = np.log(both["roofline"] / both["measured"]).to_numpy()
    return out


def kernel_latency(sources: list[tuple[Source, pd.DataFrame]]) -> float:
    """Hockney's ``α`` of the measured memory-bound GEMMs: the intercept of the least-squares
    line ``t = α + bytes / bw`` through the ``gemm`` rows at each source's smallest ``m``
    (16 tokens: far below every GPU's ridge point), ``bytes = (mk + mn)·2 + kn·dtype``."""
    bytes_, seconds = [], []
    for source, truth in sources:
        gemm = truth[truth["kind"] == "gemm"]
        small = gemm[gemm["m"] == gemm["m"].min()]
        weight = get_model(source.model).dtype_bytes
        bytes_ += list(
            small["m"] * (small["k"] + small["n"]) * 2 + small["k"] * small["n"] * weight
        )
        seconds += list(small["latency_s"])
    design = np.column_stack([np.ones(len(bytes_)), np.asarray(bytes_, dtype=float)])
    (alpha, _), *_ = np.linalg.lstsq(design, np.asarray(seconds, dtype=float), rcond=None)
    return max(float(alpha), 0.0)


def all_reduce_counts(sources: list[Source]) -> tuple[int, ...]:
    """GPU counts whose all-reduce rows fit a generation's law: its fit sources' TP degrees
    above 1, and 2 (two counts let the per-peer latency be told from the fixed one)."""
    return tuple(sorted({2} | {s.tp for s in sources if s.role == "fit" and s.tp > 1}))


def _fit_system_table(aic_dir: str, source: Source, family: str, name: str) -> TableSource:
    """AIConfigurator's ``family``/``name`` table of ``source``'s system and backend, at the
    version :func:`pdopt.profile.import_aic` composes (the newest with GEMM data)."""
    _, system, backend = source.kind.split(":")
    db = find_database(aic_dir)
    return load_table(db, system, family, backend, _resolve(db, system, backend, None), name)


def aic_all_reduce(aic_dir: str, source: Source, counts: tuple[int, ...]) -> pd.DataFrame:
    """AIConfigurator's measured all-reduce of ``source``'s system and backend (the version
    :func:`pdopt.profile.import_aic` composes, CUDA-graph kernel) at ``counts`` GPUs: columns
    ``gpus``, ``bytes`` (``message_size`` elements × 2 B of BF16) and ``seconds``."""
    table = _fit_system_table(aic_dir, source, "comm", "custom_allreduce_perf")
    parts = []
    for gpus in counts:
        rows, _ = pick_kernel(select(table.frame, table.path, num_gpus=gpus), "graph")
        by_size = rows.groupby("message_size")["latency"].mean()
        parts.append(
            pd.DataFrame(
                {"gpus": gpus, "bytes": by_size.index * 2.0, "seconds": by_size.to_numpy() / 1e3}
            )
        )
    return pd.concat(parts, ignore_index=True)


def vidur_all_reduce(vidur_dir: Path, counts: tuple[int, ...]) -> pd.DataFrame:
    """Vidur's measured NCCL all-reduce (median per message size, one node) at ``counts``
    GPUs, in :func:`aic_all_reduce`'s columns."""
    path = vidur_dir / "network" / "a100_dgx" / "all_reduce.csv"
    parts = []
    for gpus in counts:
        sizes, times_ms = _read_all_reduce(path, gpus)
        parts.append(pd.DataFrame({"gpus": gpus, "bytes": sizes, "seconds": times_ms / 1e3}))
    return pd.concat(parts, ignore_index=True)


def all_reduce_law(measured_ar: pd.DataFrame, link_bytes_per_s: float) -> dict[str, float]:
    """``α, β, η`` of :func:`pdopt.profile._roofline.all_reduce_s` by least squares on
    ``log(law / measured)`` over the rows of ``measured_ar`` (:func:`aic_all_reduce`'s columns)
    from 8 KiB (one token of a 4096-wide hidden state) up; ``β`` held at 0 when the rows hold one
    GPU count. Returned as the :class:`RooflineKnobs` fields they set."""
    from scipy.optimize import least_squares

    rows = measured_ar[measured_ar["bytes"] >= 8192]
    gpus, size = rows["gpus"].to_numpy(dtype=float), rows["bytes"].to_numpy(dtype=float)
    seconds = rows["seconds"].to_numpy(dtype=float)
    peer_bound = 1e-3 if rows["gpus"].nunique() > 1 else 1e-12

    def residuals(x: np.ndarray) -> np.ndarray:
        law = all_reduce_s(size, gpus, link_bytes_per_s, x[0], x[1], x[2])
        return np.log(np.asarray(law) / seconds)

    result = least_squares(
        residuals,
        x0=[5e-6, 0.0, 0.5],
        bounds=([0.0, 0.0, 0.01], [1e-3, peer_bound, 1.0]),
        x_scale=[1e-6, 1e-6, 0.1],
    )
    alpha, beta, eta = (float(v) for v in result.x)
    return {
        "all_reduce_latency_s": alpha,
        "all_reduce_peer_latency_s": beta if peer_bound > 1e-9 else 0.0,
        "all_reduce_bandwidth_efficiency": eta,
    }


SWITCH_REDUCTION: dict[str, int] = {"hopper": 8, "blackwell": 8}
"""Generations whose NVLink switch can reduce (NVLink SHARP, NVSwitch's third generation on;
NCCL's NVLS algorithm), and the GPU count from which the law's in-switch branch is fitted and
used: 8, where the measured tables show it (H100: the law fitted at 2 and 4 GPUs is 13.7%
off the 8-GPU table at the median, 5.2% with the branch, and 3.4% off the 4-GPU one). A100's
switch, PCIe (Ada) and MI300X's Infinity Fabric do not reduce."""


def switch_law(
    measured_ar: pd.DataFrame, law: dict[str, float], gpus: int, link_bytes_per_s: float
) -> dict[str, float]:
    """``α_s, η_s`` of the in-switch branch of :func:`pdopt.profile._roofline.all_reduce_s`,
    by least squares on ``log(law / measured)`` over the rows of ``measured_ar`` at ``gpus``
    GPUs from 8 KiB up, with the link law ``law`` (:func:`all_reduce_law`) held; returned with
    ``all_reduce_switch_min_gpus = gpus`` as the :class:`RooflineKnobs` fields they set."""
    from scipy.optimize import least_squares

    rows = measured_ar[(measured_ar["gpus"] == gpus) & (measured_ar["bytes"] >= 8192)]
    size, seconds = rows["bytes"].to_numpy(dtype=float), rows["seconds"].to_numpy(dtype=float)
    link_law = (
        law["all_reduce_latency_s"],
        law["all_reduce_peer_latency_s"],
        law["all_reduce_bandwidth_efficiency"],
    )

    def residuals(x: np.ndarray) -> np.ndarray:
        predicted = all_reduce_s(
            size,
            gpus,
            link_bytes_per_s,
            *link_law,
            switch_min_gpus=gpus,
            switch_latency_s=x[0],
            switch_efficiency=x[1],
        )
        return np.log(np.asarray(predicted) / seconds)

    result = least_squares(
        residuals,
        x0=[20e-6, 0.5],
        bounds=([0.0, 0.01], [1e-3, 1.0]),
        x_scale=[1e-6, 0.1],
    )
    return {
        "all_reduce_switch_min_gpus": float(gpus),
        "all_reduce_switch_latency_s": float(result.x[0]),
        "all_reduce_switch_efficiency": float(result.x[1]),
    }


def fit(sources: list[tuple[Source, pd.DataFrame]], law: dict[str, float]) -> RooflineKnobs:
    """The kernel latency from the memory-bound GEMMs (:func:`kernel_latency`: the whole-pass
    grid cannot tell it from the bandwidth efficiency when the fit sources hold one TP > 1
    degree) and the all-reduce ``law`` (:func:`all_reduce_law`) held, then least squares of
    the log errors over ``sources`` in compute and bandwidth efficiency, overhead, ridge
    exponent and decode attention's time per sequence and head (``attention_head_latency_s``:
    the decode grid's batch × context points tell it from the bandwidth, unlike the kernel
    latency)."""
    from scipy.optimize import least_squares

    kappa = kernel_latency(sources)
    latency = law["all_reduce_latency_s"]
    rest = {k: v for k, v in law.items() if k != "all_reduce_latency_s"}

    def knobs_of(x: np.ndarray) -> RooflineKnobs:
        return RooflineKnobs(
            x[0],
            x[1],
            x[2],
            latency,
            ELEMENTWISE_BYTES,
            x[3],
            kappa,
            attention_head_latency_s=x[4],
            **rest,
        )

    def residuals(x: np.ndarray) -> np.ndarray:
        knobs = knobs_of(x)
        parts = [e for s, t in sources for e in log_errors(s, t, knobs).values()]
        return np.concatenate(parts)

    result = least_squares(
        residuals,
        x0=[0.75, 0.8, 2e-4, 3.0, 3e-9],
        bounds=([0.2, 0.2, 0.0, 1.0, 0.0], [1.0, 1.0, 5e-3, 20.0, 1e-7]),
        x_scale=[0.1, 0.1, 1e-4, 1.0, 3e-9],
        diff_step=1e-3,
    )
    return knobs_of(result.x)


ROUTING_INSENSITIVE_COVERAGE = 0.95
"""Fraction of a layer's routed experts from which a decode batch counts as touching all of them
(:func:`routing_insensitive`): uniform routing's expected coverage at or above it."""


def routing_insensitive(source: Source, truth: pd.DataFrame) -> pd.DataFrame:
    """``truth`` without the decode points whose measured cost depends on the routing law: batches
    of 2 or more tokens whose expected coverage under uniform routing
    (:func:`pdopt.model_spec.expert_coverage`) is below
    :data:`ROUTING_INSENSITIVE_COVERAGE` of the experts. One token touches exactly ``k``
    experts and large batches all of them under any routing, but in between AIConfigurator's
    power-law loads touch fewer experts than uniform routing and its balanced ones more
    (:func:`routing_bracket`: Qwen3-30B-A3B at 16 tokens about 49, 82 and 128 of 128). Fitted on
    those points, the MoE knobs would absorb the routing gap instead of the kernels' costs: on
    the H100 fit row the fixed time per MoE layer came out at 12.5 µs, where one token measures
    about 26 µs more than its experts' bytes. Prefill rows touch every expert and are kept."""
    model = get_model(source.model)
    decode = truth["kind"] == "decode"
    batch = truth["batch_size"]
    tokens = batch.to_numpy(dtype=float)
    coverage = expert_coverage(tokens, model.num_experts, model.experts_per_token)
    sensitive = decode & (batch > 1) & (coverage < ROUTING_INSENSITIVE_COVERAGE * model.num_experts)
    return truth[~sensitive]


def fit_moe(sources: list[tuple[Source, pd.DataFrame]], dense: RooflineKnobs) -> RooflineKnobs:
    """``dense`` with its MoE knobs (``moe_reduction_overhead``, ``moe_layer_latency_s``,
    ``moe_ridge_exponent``) fitted by least squares of the log errors over the MoE ``sources``
    (prefill and decode grids; the caller passes :func:`routing_insensitive` rows); the dense
    knobs are held, so dense models keep their fit."""
    return _fit_knobs(
        sources,
        dense,
        {
            "moe_reduction_overhead": (1000.0, 0.0, 2e4, 500.0),
            "moe_layer_latency_s": (10e-6, 0.0, 2e-4, 1e-5),
            "moe_ridge_exponent": (2.0, 1.0, 20.0, 1.0),
        },
    )


def fit_dequant(sources: list[tuple[Source, pd.DataFrame]], knobs: RooflineKnobs) -> RooflineKnobs:
    """``knobs`` with the dequantised-expert knobs (``moe_dequant_reduction_overhead``,
    ``moe_dequant_weight_latency_s``) fitted by least squares of the log errors over the
    MXFP4-expert ``sources``; every other knob is held, so BF16-expert MoE and dense models
    keep their fit."""
    return _fit_knobs(
        sources,
        knobs,
        {
            "moe_dequant_reduction_overhead": (500.0, 0.0, 2e4, 500.0),
            "moe_dequant_weight_latency_s": (1e-13, 0.0, 2e-12, 1e-13),
        },
    )


def _fit_knobs(
    sources: list[tuple[Source, pd.DataFrame]],
    knobs: RooflineKnobs,
    start: dict[str, tuple[float, float, float, float]],
) -> RooflineKnobs:
    """``knobs`` with the knobs named in ``start`` (each ``(x0, lower, upper, scale)``) fitted
    by bounded least squares of the log errors over ``sources``, every other knob held."""
    from scipy.optimize import least_squares

    names = list(start)

    def knobs_of(x: np.ndarray) -> RooflineKnobs:
        return dataclasses.replace(knobs, **dict(zip(names, map(float, x), strict=True)))

    def residuals(x: np.ndarray) -> np.ndarray:
        fitted = knobs_of(x)
        return np.concatenate([e for s, t in sources for e in log_errors(s, t, fitted).values()])

    x0, lower, upper, scale = (list(column) for column in zip(*start.values(), strict=True))
    result = least_squares(residuals, x0=x0, bounds=(lower, upper), x_scale=scale, diff_step=1e-3)
    return knobs_of(result.x)


FP8_MOE_TOKENS = 8192
"""Tokens from which :func:`moe_fp8_peak_fraction` compares the fused-MoE kernels: compute-bound
for every measured shape (at least 32 tokens per expert)."""


def moe_fp8_peak_fraction(aic_dir: str, source: Source) -> float:
    """``moe_fp8_peak_fraction`` of ``source``'s GPU from the kernel tables, not the composed
    profiles: the median over every shape, routing and token count from
    :data:`FP8_MOE_TOKENS` up that AIConfigurator's ``moe_perf`` table of ``source``'s system
    and backend measures in both ``bfloat16`` and ``fp8_block`` (experts not expert-parallel)
    of ``t_bf16 / t_fp8``, the FP8 kernel's speed relative to the BF16 one, times
    ``peak_bf16 / peak_fp8``. The expert shapes of the FP8 check sources (DeepSeek-V3's) are
    left out, so those checks stay out of sample."""
    table = _fit_system_table(aic_dir, source, "moe", "moe_perf").frame
    rows = table[(table["moe_ep_size"] == 1) & (table["num_tokens"] >= FP8_MOE_TOKENS)]
    keys = ["hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size"]
    keys += ["distribution", "num_tokens"]
    both = rows.pivot_table(index=keys, columns="moe_dtype", values="latency", aggfunc="min")
    held_out = {_expert_shape(get_model(s.model)) for s in MOE_SOURCES if fp8_experts(s)}
    shapes = both.index.droplevel(["moe_tp_size", "distribution", "num_tokens"])
    both = both[[shape not in held_out for shape in shapes]]
    return _fp8_peak_fraction((both["bfloat16"] / both["fp8_block"]).dropna(), source)


FP8_GEMM_MIN_FLOPS = 1e12
"""FLOPs from which :func:`gemm_fp8_peak_fraction` compares the GEMM kernels: compute-bound, and
far above the fixed floors some ``fp8_block`` tables carry at small shapes (vLLM 0.24's
55–460 µs, README "MoE models")."""


def gemm_fp8_peak_fraction(aic_dir: str, source: Source) -> float:
    """``fp8_peak_fraction`` of ``source``'s GPU from the kernel tables, not the composed
    profiles: the median over every ``(m, n, k)`` of at least :data:`FP8_GEMM_MIN_FLOPS` that
    AIConfigurator's ``gemm_perf`` table of ``source``'s system and backend measures in both
    ``bfloat16`` and ``fp8_block`` of ``t_bf16 / t_fp8``, the FP8 kernel's speed relative to
    the BF16 one, times ``peak_bf16 / peak_fp8``. The table's shapes are a grid, not a model's,
    so the FP8 DeepSeek-V3 rows (:data:`MOE_SOURCES`) stay out-of-sample checks."""
    table = _fit_system_table(aic_dir, source, "gemm", "gemm_perf").frame
    both = table.pivot_table(
        index=["m", "n", "k"], columns="gemm_dtype", values="latency", aggfunc="min"
    )
    m, n, k = (both.index.get_level_values(axis).to_numpy(float) for axis in ("m", "n", "k"))
    speed = (both["bfloat16"] / both["fp8_block"])[2.0 * m * n * k >= FP8_GEMM_MIN_FLOPS]
    return _fp8_peak_fraction(speed.dropna(), source)


FP8_BANDWIDTH_MAX_TOKENS = 16
"""``m`` up to which :func:`gemm_fp8_bandwidth_fraction` compares the GEMM kernels: every
shape streams its weights (decode's GEMMs)."""

FP8_BANDWIDTH_MIN_WEIGHTS = 1e6
"""Weights (``n·k``) from which :func:`gemm_fp8_bandwidth_fraction` compares the GEMM kernels:
smaller ones take little more than their fixed time."""


def gemm_fp8_bandwidth_fraction(aic_dir: str, source: Source) -> tuple[float, float]:
    """``fp8_bandwidth_fraction`` of ``source``'s GPU from the kernel tables, not the composed
    profiles, and the FP8 GEMM's fixed time above the BF16 one's (seconds, for the record:
    :data:`pdopt.profile._knobs.FP8_GEMM_EXTRA_KERNELS` counts it as a kernel). Over the rows
    of AIConfigurator's ``gemm_perf`` table of ``source``'s system and backend with ``m`` up to
    :data:`FP8_BANDWIDTH_MAX_TOKENS` and ``n·k`` from :data:`FP8_BANDWIDTH_MIN_WEIGHTS`, per
    dtype the least-squares line ``t = t0 + bytes / rate`` (relative residuals; weights at
    their dtype's bytes, activations at 2), ``bfloat16`` and ``fp8`` (per-tensor scales: vLLM
    0.24's ``fp8_block`` tables carry a 55–460 µs floor at these shapes). The fraction is the
    FP8 line's rate over the BF16 one's, at most 1. The table's shapes are a grid, not a
    model's, so the FP8 checks (:data:`FP8_SOURCES`) stay out of sample."""
    table = _fit_system_table(aic_dir, source, "gemm", "gemm_perf").frame
    rows = table[
        (table["m"] <= FP8_BANDWIDTH_MAX_TOKENS)
        & (table["n"] * table["k"] >= FP8_BANDWIDTH_MIN_WEIGHTS)
    ]
    lines = {
        dtype: _byte_line(rows[rows["gemm_dtype"] == dtype], size)
        for dtype, size in (("bfloat16", 2), ("fp8", 1))
    }
    (fixed_16, rate_16), (fixed_8, rate_8) = lines["bfloat16"], lines["fp8"]
    return min(1.0, rate_8 / rate_16), fixed_8 - fixed_16


def _byte_line(rows: pd.DataFrame, weight_bytes: int) -> tuple[float, float]:
    """``(t0, rate)`` of the least-squares line ``t = t0 + bytes / rate`` through GEMM kernel
    ``rows`` (fastest kernel per shape; ``latency`` in ms), residuals relative to ``t``."""
    fastest = rows.groupby(["m", "n", "k"])["latency"].min().reset_index()
    m, n, k = (fastest[axis].to_numpy(float) for axis in ("m", "n", "k"))
    moved = n * k * weight_bytes + 2.0 * m * (n + k)
    seconds = fastest["latency"].to_numpy(float) / 1e3
    design = np.column_stack([np.ones_like(moved), moved]) / seconds[:, None]
    (fixed, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    return float(fixed), float(1.0 / per_byte)


def _fp8_peak_fraction(speed: pd.Series, source: Source) -> float:
    """The fraction of ``source``'s GPU's FP8 peak that FP8 kernels running at ``speed`` times
    their BF16 counterparts reach: ``median(speed) · peak_bf16 / peak_fp8``."""
    gpu = get_gpu(source.gpu)
    return float(np.median(speed)) * gpu.peak_flops / gpu.fp8_peak_flops


def _expert_shape(model: ModelSpec) -> tuple[int, int, int, int]:
    """``moe_perf``'s shape columns of ``model``'s experts (hidden, inter, experts, top-k)."""
    return (
        model.hidden_size,
        model.moe_intermediate_size,
        model.num_experts,
        model.experts_per_token,
    )


def fp8_experts(source: Source) -> bool:
    """Whether ``source``'s model stores its routed experts in FP8."""
    return get_model(source.model).expert_dtype == "fp8"


def dequantised(source: Source) -> bool:
    """Whether ``source``'s model stores its routed experts in a dequantised dtype (MXFP4)."""
    return get_model(source.model).expert_dtype in DEQUANTISED_EXPERT_DTYPES


def without_moe_terms(knobs: RooflineKnobs) -> RooflineKnobs:
    """``knobs`` with the MoE terms off: routed-expert GEMMs priced as dense ones (their own
    roofline at the dense ridge exponent)."""
    return dataclasses.replace(
        knobs,
        moe_reduction_overhead=0.0,
        moe_layer_latency_s=0.0,
        moe_dequant_reduction_overhead=0.0,
        moe_dequant_weight_latency_s=0.0,
        moe_ridge_exponent=knobs.ridge_exponent,
    )


def _summary(errors: dict[str, np.ndarray]) -> dict[str, float]:
    row: dict[str, float] = {}
    for kind, values in errors.items():
        pct = 100 * np.abs(np.expm1(values))
        row[f"{kind}_median_pct"] = round(float(np.median(pct)), 1)
        row[f"{kind}_max_pct"] = round(float(np.max(pct)), 1)
        row[f"{kind}_points"] = len(values)
    return row


def source_knobs(source: Source, vidur_dir: Path) -> tuple[RooflineKnobs, str]:
    """The knobs ``source`` is checked with and how its all-reduce is set: the generation's
    preset, for the Vidur source with the all-reduce law fitted on Vidur's NCCL table."""
    gpu = get_gpu(source.gpu)
    preset = ROOFLINE_PRESETS[gpu.generation]
    if source.kind != "vidur" or source.tp == 1:
        return preset, "preset"
    # the rule every preset's law is fitted by: 2 GPUs and the generation's fit counts
    counts = all_reduce_counts([s for s in SOURCES if s.generation == source.generation])
    law = all_reduce_law(vidur_all_reduce(vidur_dir, counts), gpu.link_bw_bytes_per_s)
    return dataclasses.replace(preset, **law), f"vidur nccl fit ({'+'.join(map(str, counts))} GPUs)"


VIDUR_CALIBRATION_MODELS: tuple[tuple[str, str], ...] = (
    ("Llama-2-7b-hf", "Llama-2-7B"),
    ("Meta-Llama-3-8B", "Llama-3-8B"),
)
"""Vidur's A100 folders (folder, catalogue model) whose GEMMs, at every profiled TP degree,
calibrate the Vidur check row: the same machine, other models than the one checked."""


def preset_gemm_efficiency(truths: dict[Source, pd.DataFrame], generation: str) -> float:
    """The reference of :func:`pdopt.profile.calibrate_compute_efficiency`: the compute-bound
    GEMM efficiency of ``generation``'s fit sources' ``gemm`` rows, pooled."""
    fit_sources = [s for s in truths if s.generation == generation and s.role == "fit"]
    gemm = pd.concat([truths[s][truths[s]["kind"] == "gemm"] for s in fit_sources])
    return gemm_compute_efficiency(gemm, get_gpu(fit_sources[0].gpu))[0]


def calibration_profiles(
    source: Source, profiles: dict[Source, Profile], vidur_dir: Path
) -> tuple[list[Profile], str]:
    """The measured profiles ``source``'s compute efficiency is calibrated on, and a label:
    the same machine's GEMMs of other models (module docstring)."""
    if source.kind == "vidur":
        folders = [
            import_vidur(vidur_dir / "a100" / folder, model, tp)
            for folder, model in VIDUR_CALIBRATION_MODELS
            for tp in (1, 2, 4, 8)
        ]
        names = "+".join(model for _, model in VIDUR_CALIBRATION_MODELS)
        return folders, f"vidur {names} TP1-8"
    same = [s for s in profiles if s.kind == source.kind and s != source]
    label = "+".join(f"{s.model.removeprefix('Llama-3.1-')} TP{s.tp}" for s in same)
    return [profiles[s] for s in same], label


def calibrated_table(profiles: dict[Source, Profile], vidur_dir: Path) -> pd.DataFrame:
    """One row per dense source: its errors with the preset (:func:`source_knobs`) and with the
    preset's ``compute_efficiency`` calibrated on :func:`calibration_profiles`."""
    rows = []
    for source, profile in profiles.items():
        knobs, _ = source_knobs(source, vidur_dir)
        others, label = calibration_profiles(source, profiles, vidur_dir)
        result = calibrate_compute_efficiency(others)
        calibrated = dataclasses.replace(knobs, compute_efficiency=result.compute_efficiency)
        row = {**_labels(source), "calibrated_on": label, "gemm_points": result.gemm_points}
        row["gemm_efficiency"] = round(result.gemm_efficiency, 3)
        row["reference_gemm_efficiency"] = round(result.reference_gemm_efficiency, 3)
        row["preset_compute_efficiency"] = knobs.compute_efficiency
        row["compute_efficiency"] = round(result.compute_efficiency, 3)
        before = _summary(log_errors(source, profile.rows, knobs))
        after = _summary(log_errors(source, profile.rows, calibrated))
        for kind in _KEYS:
            for stat in ("median", "max"):
                row[f"preset_{kind}_{stat}_pct"] = before[f"{kind}_{stat}_pct"]
                row[f"{kind}_{stat}_pct"] = after[f"{kind}_{stat}_pct"]
        rows.append(row)
    return pd.DataFrame(rows)


def _labels(source: Source) -> dict[str, object]:
    """A table row's first columns: which source it is."""
    return {
        "generation": source.generation,
        "gpu": source.gpu,
        "model": source.model,
        "tp": source.tp,
        "measured": source.kind,
        "role": source.role,
    }


def table(
    truths: dict[Source, pd.DataFrame],
    vidur_dir: Path,
    hot: dict[Source, pd.Series] | None = None,
    others: dict[Source, dict[str, pd.DataFrame]] | None = None,
) -> pd.DataFrame:
    """One row per source: its knobs' errors (:func:`source_knobs`) and the old defaults'; for
    the sources of ``hot`` (:func:`faster_than_hbm` of their rows) how many decode points the
    reference measured faster than HBM and the decode errors over the others (empty for the
    other sources); for those of ``others`` (:func:`other_engines`) the engines' spread and
    the roofline's error outside it (:func:`engine_spread`)."""
    rows = []
    for source, truth in truths.items():
        knobs, all_reduce = source_knobs(source, vidur_dir)
        row = {**_labels(source), "all_reduce": all_reduce}
        row.update(_summary(log_errors(source, truth, knobs)))
        old = _summary(log_errors(source, truth, OLD_DEFAULTS))
        row["old_prefill_max_pct"] = old["prefill_max_pct"]
        row["old_decode_max_pct"] = old["decode_max_pct"]
        flags = (hot or {}).get(source)
        if flags is not None:
            row["decode_faster_than_hbm_points"] = int(flags.sum())
            streamed = _summary(log_errors(source, truth[~flags], knobs))
            row["hbm_bound_decode_median_pct"] = streamed["decode_median_pct"]
            row["hbm_bound_decode_max_pct"] = streamed["decode_max_pct"]
        if others is not None and source in others:
            row.update(engine_spread(source, truth, others[source], knobs))
        rows.append(row)
    frame = pd.DataFrame(rows)
    if "decode_faster_than_hbm_points" in frame:
        frame["decode_faster_than_hbm_points"] = frame["decode_faster_than_hbm_points"].astype(
            "Int64"
        )
    return frame


def moe_table(
    truths: dict[Source, pd.DataFrame],
    evens: dict[Source, pd.DataFrame | None],
    others: dict[Source, dict[str, pd.DataFrame]] | None = None,
) -> pd.DataFrame:
    """One row per MoE source: the shipped preset's errors, its errors without the MoE
    terms (:func:`without_moe_terms`, the "before" columns), its decode against the source
    measured under balanced routing too (:func:`routing_bracket`; empty where not measured),
    and for the sources of ``others`` the engines' spread (:func:`engine_spread`)."""
    rows = []
    for source, truth in truths.items():
        preset = ROOFLINE_PRESETS[get_gpu(source.gpu).generation]
        row = _labels(source)
        row.update(_summary(log_errors(source, truth, preset)))
        before = _summary(log_errors(source, truth, without_moe_terms(preset)))
        for kind in _KEYS:
            row[f"before_{kind}_median_pct"] = before[f"{kind}_median_pct"]
            row[f"before_{kind}_max_pct"] = before[f"{kind}_max_pct"]
        even = evens.get(source)
        if even is not None:
            row.update(routing_bracket(_prior(source, preset), truth, even))
        if others is not None and source in others:
            row.update(engine_spread(source, truth, others[source], preset))
        rows.append(row)
    return pd.DataFrame(rows)


def without_fp8_terms(source: Source, knobs: RooflineKnobs) -> pd.DataFrame:
    """The roofline rows of ``source`` (an FP8 model) at ``knobs`` without the FP8 weight
    terms, as before them: weights streamed at the 16-bit rate, no quantisation kernels."""
    rows = _prior(source, dataclasses.replace(knobs, fp8_bandwidth_fraction=1.0)).copy()
    model = get_model(source.model)
    for kind, decode in (("prefill", False), ("decode", True)):
        kernels = FP8_GEMM_EXTRA_KERNELS * _weight_gemms_per_pass(model, decode)
        rows.loc[rows["kind"] == kind, "latency_s"] -= kernels * knobs.kernel_latency_s
    return rows


def fp8_table(
    truths: dict[Source, pd.DataFrame], others: dict[Source, dict[str, pd.DataFrame]]
) -> pd.DataFrame:
    """One row per FP8 source: the shipped preset's errors, its errors without the FP8 weight
    terms (:func:`without_fp8_terms`, the "before" columns) and the engines' spread
    (:func:`engine_spread`)."""
    rows = []
    for source, truth in truths.items():
        preset = ROOFLINE_PRESETS[get_gpu(source.gpu).generation]
        row = _labels(source)
        row.update(_summary(log_errors(source, truth, preset)))
        before = _summary(_log_errors(truth, without_fp8_terms(source, preset)))
        for kind in _KEYS:
            row[f"before_{kind}_median_pct"] = before[f"{kind}_median_pct"]
            row[f"before_{kind}_max_pct"] = before[f"{kind}_max_pct"]
        row.update(engine_spread(source, truth, others.get(source, {}), preset))
        rows.append(row)
    return pd.DataFrame(rows)


def _markdown(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of ``frame`` (no tabulate dependency)."""
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += [
        "| " + " | ".join("" if pd.isna(v) else str(v) for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aic-dir", default="auto", help="AIConfigurator data or 'auto'")
    parser.add_argument("--vidur-dir", type=Path, default=Path("../shared/data/vidur-profiling"))
    parser.add_argument("--out-dir", type=Path, default=Path("calibration/results"))
    parser.add_argument("--fit", action="store_true", help="re-fit each generation's preset")
    args = parser.parse_args(argv)
    profiles = {s: measured(s, args.aic_dir, args.vidur_dir) for s in SOURCES}
    truths = {s: p.rows for s, p in profiles.items()}
    moe_truths = {s: measured(s, args.aic_dir, args.vidur_dir).rows for s in MOE_SOURCES}
    fp8_truths = {s: measured(s, args.aic_dir, args.vidur_dir).rows for s in FP8_SOURCES}
    if args.fit:
        for generation in dict.fromkeys(s.generation for s in SOURCES):
            train = [
                (s, hbm_bound(s, args.aic_dir, t))
                for s, t in truths.items()
                if s.generation == generation and s.role == "fit"
            ]
            counts = all_reduce_counts([s for s, _ in train])
            link = get_gpu(train[0][0].gpu).link_bw_bytes_per_s
            law = all_reduce_law(aic_all_reduce(args.aic_dir, train[0][0], counts), link)
            switch = SWITCH_REDUCTION.get(generation)
            if switch is not None:
                at_switch = aic_all_reduce(args.aic_dir, train[0][0], (switch,))
                law |= switch_law(at_switch, law, switch, link)
            knobs = fit(train, law)
            moe_fit = [
                (s, t)
                for s, t in moe_truths.items()
                if s.generation == generation and s.role == "fit"
            ]
            moe_train = [
                (s, routing_insensitive(s, t))
                for s, t in moe_fit
                if not (dequantised(s) or fp8_experts(s))
            ]
            if moe_train:
                knobs = fit_moe(moe_train, knobs)
            dequant_train = [(s, t) for s, t in moe_fit if dequantised(s)]
            if dequant_train:
                knobs = fit_dequant(dequant_train, knobs)
            if get_gpu(train[0][0].gpu).fp8_peak_flops > 0:
                knobs = dataclasses.replace(
                    knobs,
                    moe_fp8_peak_fraction=moe_fp8_peak_fraction(args.aic_dir, train[0][0]),
                    fp8_peak_fraction=gemm_fp8_peak_fraction(args.aic_dir, train[0][0]),
                )
                fraction, extra_s = gemm_fp8_bandwidth_fraction(args.aic_dir, train[0][0])
                knobs = dataclasses.replace(knobs, fp8_bandwidth_fraction=fraction)
                print(generation, f"FP8 GEMM fixed time above BF16: {extra_s * 1e6:.2f} us")
            at = f"{counts}" + (f", in-switch at {switch}" if switch is not None else "")
            print(generation, f"(all-reduce at {at} GPUs)", knobs.describe(), flush=True)
            reference = preset_gemm_efficiency(truths, generation)
            print(generation, f"preset_gemm_efficiency={reference:.3f}", flush=True)
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    evens = {s: balanced(s, args.aic_dir) for s in MOE_SOURCES}
    hot = {s: faster_than_hbm(s, args.aic_dir, t) for s, t in truths.items() if s.kind != "vidur"}
    others = {
        s: other_engines(s, args.aic_dir, args.vidur_dir)
        for s in (*truths, *moe_truths, *fp8_truths)
    }
    for name, result in (
        ("roofline_validation", table(truths, args.vidur_dir, hot, others)),
        ("roofline_validation_moe", moe_table(moe_truths, evens, others)),
        ("roofline_validation_calibrated", calibrated_table(profiles, args.vidur_dir)),
        ("roofline_validation_fp8", fp8_table(fp8_truths, others)),
    ):
        result.to_csv(args.out_dir / f"{name}.csv", index=False)
        text = _markdown(result)
        (args.out_dir / f"{name}.md").write_text(text)
        print(text, end="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
