"""``pdopt profile``: make, import and inspect profile files; list the GPU and model catalogues.

Sub-commands::

    pdopt profile import-vidur DIR --model NAME [--tp N] [--gpu NAME] [--all-reduce CSV]
                               --out FILE.csv [--json]
    pdopt profile roofline --gpu NAME (--model NAME[@W[/KV]] | --model-config CONFIG.json)
                           [--tp N] [--weight-dtype D] [--kv-dtype D] [--expert-parallel]
                           [--overhead-s S] [--all-reduce-latency-s S] [--elementwise-bytes B]
                           [--kernel-latency-s S] [--attention-head-latency-s S]
                           [--fp8-peak-fraction F] [--all-reduce-peer-latency-s S]
                           [--all-reduce-bandwidth-efficiency F] [--all-reduce-switch-min-gpus N]
                           [--all-reduce-switch-latency-s S] [--all-reduce-switch-efficiency F]
                           [--moe-reduction-overhead K0] [--moe-layer-latency-s S]
                           [--moe-ridge-exponent P] [--moe-fp8-peak-fraction F]
                           [--moe-dequant-reduction-overhead K] [--moe-dequant-weight-latency-s S]
                           [--compute-efficiency F | --calibrate-gemm PROFILE.csv ...]
                           [--bandwidth-efficiency F] [--ridge-exponent P] [--seed S]
                           --out FILE.csv [--json]
    pdopt profile import-aic --aic-dir PATH|auto --gpu SYSTEM --backend NAME
                             (--model NAME | --model-config CONFIG.json) [--version V] [--tp N]
                             [--precision P] [--kv-dtype D] --out FILE.csv [--json]
    pdopt profile show FILE.csv [--json]
    pdopt profile catalog [--json]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from pdopt.cli._args import FRACTION, NON_NEGATIVE_INT, POSITIVE_INT
from pdopt.cli._output import add_json_flag, print_json
from pdopt.errors import ParameterError
from pdopt.hardware import GPUS, get_gpu
from pdopt.model_spec import (
    MODELS,
    ModelSpec,
    active_param_count,
    from_hf_config,
    get_model,
    param_count,
    with_precision,
)
from pdopt.model_spec._params import check_expert_parallel
from pdopt.profile import (
    Profile,
    calibrate_compute_efficiency,
    import_aic,
    import_vidur,
    read_profile,
    roofline_profile,
    write_profile,
)

ROOFLINE_KNOB_FLAGS: dict[str, tuple[Callable[[str], float], str]] = {
    "compute_efficiency": (FRACTION, "fraction of the tensor peak"),
    "bandwidth_efficiency": (FRACTION, "fraction of the HBM bandwidth"),
    "overhead_s": (float, "time per step, s"),
    "all_reduce_latency_s": (float, "fixed time per all-reduce call, s"),
    "all_reduce_peer_latency_s": (float, "time an all-reduce call adds per peer GPU, s"),
    "all_reduce_bandwidth_efficiency": (
        FRACTION,
        "fraction of the link bandwidth an all-reduce sustains (NCCL vs a custom "
        "all-reduce: README 'The roofline prior's presets')",
    ),
    "all_reduce_switch_min_gpus": (
        float,
        "GPU count from which an all-reduce may reduce in the NVLink switch (NVLS; 'inf': never)",
    ),
    "all_reduce_switch_latency_s": (float, "fixed time per in-switch all-reduce call, s"),
    "all_reduce_switch_efficiency": (
        FRACTION,
        "fraction of the link bandwidth an in-switch all-reduce sustains",
    ),
    "kernel_latency_s": (float, "fixed time per kernel (8 per layer, MLA 11-13), s"),
    "fp8_peak_fraction": (
        FRACTION,
        "FP8 weights: fraction of the FP8 peak the weight GEMMs compute at",
    ),
    "fp8_bandwidth_fraction": (
        FRACTION,
        "FP8 weights: fraction of the bandwidth the weight GEMMs stream their weights at",
    ),
    "attention_head_latency_s": (
        float,
        "decode: fixed attention time per sequence x query head on one GPU x layer, s",
    ),
    "moe_reduction_overhead": (
        float,
        "MoE: multiply-adds per routed-expert GEMM output element",
    ),
    "moe_layer_latency_s": (float, "MoE: fixed time per MoE layer, s"),
    "moe_ridge_exponent": (float, "MoE: p of the routed experts' own roofline; inf: the hard max"),
    "moe_fp8_peak_fraction": (
        FRACTION,
        "MoE, FP8 experts: fraction of the FP8 peak the routed experts compute at",
    ),
    "moe_dequant_reduction_overhead": (
        float,
        "MoE, MXFP4 experts: multiply-adds per output element added to the above",
    ),
    "moe_dequant_weight_latency_s": (
        float,
        "MoE, MXFP4 experts: seconds per routed-expert weight element read",
    ),
    "elementwise_bytes": (float, "norm/residual/activation bytes per token x layer x hidden"),
    "ridge_exponent": (float, "p of the smooth roofline (t_c^p + t_m^p)^(1/p); inf: the hard max"),
}
"""``pdopt profile roofline``'s flag for each :class:`pdopt.profile.RooflineKnobs` field
(``--compute-efficiency`` for ``compute_efficiency``, ...): its parser and help; unset, the
GPU generation's preset holds."""


def register(subparsers: Any) -> None:
    """Add ``pdopt profile`` and its sub-commands."""
    parser = subparsers.add_parser("profile", help="make, import and inspect profile files")
    sub = parser.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda _args: _print_help(parser))

    vidur = sub.add_parser("import-vidur", help="convert Vidur mlp.csv/attention*.csv to a profile")
    vidur.add_argument("directory", help="a Vidur model folder holding mlp.csv")
    vidur.add_argument(
        "--model",
        required=True,
        help="catalogue model name (see 'catalog'), spec file or Hugging Face config.json",
    )
    vidur.add_argument(
        "--tp", type=POSITIVE_INT, default=1, help="tensor-parallel degree (default 1)"
    )
    vidur.add_argument(
        "--gpu", default=None, help="GPU (default: the parent folder, e.g. a100, if catalogued)"
    )
    vidur.add_argument(
        "--all-reduce", default=None, help="Vidur all_reduce.csv: add TP communication (tp > 1)"
    )
    vidur.add_argument("--out", required=True, help="profile CSV to write")
    add_json_flag(vidur)
    vidur.set_defaults(handler=_import_vidur)

    _register_aic(sub)

    roof = sub.add_parser("roofline", help="write a synthetic roofline profile")
    roof.add_argument("--gpu", required=True, help="catalogue GPU name (see 'catalog')")
    which = roof.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--model",
        help="catalogue model name (see 'catalog'), spec file or Hugging Face config.json, "
        "optionally followed by @WEIGHTS[/KV]",
    )
    which.add_argument(
        "--model-config", help="a Hugging Face config.json (or its folder) of any model"
    )
    roof.add_argument(
        "--tp", type=POSITIVE_INT, default=1, help="tensor-parallel degree (default 1)"
    )
    roof.add_argument(
        "--weight-dtype", help="store the weights as bf16, fp16, fp8, int8, int4 or mxfp4"
    )
    roof.add_argument("--kv-dtype", help="store the KV cache as bf16, fp16, fp8, int8 or int4")
    roof.add_argument(
        "--expert-parallel", action="store_true", help="MoE: spread experts over the TP GPUs"
    )
    preset = " (default: the GPU generation's preset, README 'The roofline prior's presets')"
    for knob, (kind, text) in ROOFLINE_KNOB_FLAGS.items():
        roof.add_argument("--" + knob.replace("_", "-"), type=kind, help=text + preset)
    roof.add_argument(
        "--calibrate-gemm",
        nargs="+",
        metavar="PROFILE.csv",
        help="measured profiles of this GPU with 16-bit gemm rows (import-vidur, import-aic): "
        "set --compute-efficiency to the preset's scaled by their GEMM speed over the preset's "
        "fit GEMMs (README 'Calibrating the prior on your GPU's GEMMs')",
    )
    roof.add_argument(
        "--seed", type=NON_NEGATIVE_INT, default=None, help="add seeded lognormal noise"
    )
    roof.add_argument("--out", required=True, help="profile CSV to write")
    add_json_flag(roof)
    roof.set_defaults(handler=_roofline)

    show = sub.add_parser("show", help="metadata and row counts of a profile file")
    show.add_argument("path", help="profile CSV")
    add_json_flag(show)
    show.set_defaults(handler=_show)

    catalog = sub.add_parser("catalog", help="list the catalogued GPUs and models")
    add_json_flag(catalog)
    catalog.set_defaults(handler=_catalog)


def _register_aic(sub: Any) -> None:
    aic = sub.add_parser(
        "import-aic", help="compose a profile from NVIDIA AIConfigurator's per-op latencies"
    )
    aic.add_argument(
        "--aic-dir",
        default="auto",
        help="AIConfigurator's data (its package or systems/data folder), or 'auto' for the "
        "installed package (pip install pdopt[aic]); default auto",
    )
    aic.add_argument("--gpu", required=True, help="AIConfigurator system, e.g. h200_sxm")
    aic.add_argument("--backend", default="vllm", help="vllm, trtllm or sglang (default vllm)")
    aic.add_argument("--version", default=None, help="backend version (default: the newest)")
    which = aic.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--model", help="catalogue model name (dense, MoE, DeepSeek-V3 MLA) or a spec file"
    )
    which.add_argument("--model-config", help="a Hugging Face config.json (or its folder)")
    aic.add_argument(
        "--tp", type=POSITIVE_INT, default=1, help="tensor-parallel degree (default 1)"
    )
    aic.add_argument(
        "--precision", default="bf16", help="GEMM precision: bf16, fp16, fp8, fp8_block"
    )
    aic.add_argument("--kv-dtype", default="bf16", help="KV-cache dtype: bf16, fp16, fp8")
    aic.add_argument(
        "--expert-parallel",
        action="store_true",
        help="MoE: place whole experts on the TP GPUs instead of splitting each",
    )
    aic.add_argument(
        "--moe-distribution",
        default=None,
        help="MoE routing skew of the rows read: balanced, power_law_1.01, power_law_1.2 "
        "(default: AIConfigurator's for the model family)",
    )
    for flag, kind, default, what in (
        ("--pp", POSITIVE_INT, 1, "pipeline-parallel stages"),
        ("--attention-dp", POSITIVE_INT, 1, "attention data-parallel ranks (wide EP)"),
        ("--mtp", NON_NEGATIVE_INT, 0, "MTP draft tokens per step"),
    ):
        aic.add_argument(
            flag,
            type=kind,
            default=default,
            help=f"{what}: not composed, refused with the reason (default {default})",
        )
    aic.add_argument("--out", required=True, help="profile CSV to write")
    add_json_flag(aic)
    aic.set_defaults(handler=_import_aic)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _import_vidur(args: argparse.Namespace) -> int:
    profile = import_vidur(
        args.directory, args.model, args.tp, gpu=args.gpu, all_reduce_csv=args.all_reduce
    )
    write_profile(profile, args.out)
    return _report(profile, str(args.out), args.json)


def _check_expert_parallel(args: argparse.Namespace, spec: ModelSpec, command: str) -> None:
    """Refuse ``--expert-parallel`` for a dense model, or at a ``--tp`` the experts cannot be
    placed whole on (:func:`pdopt.model_spec._params.check_expert_parallel`)."""
    if not args.expert_parallel:
        return
    if not spec.is_moe:
        raise ParameterError(
            f"pdopt profile {command}: {spec.name} is dense; --expert-parallel applies to MoE "
            "models (drop it)"
        )
    check_expert_parallel(spec, args.tp, f"pdopt profile {command}")


def _import_aic(args: argparse.Namespace) -> int:
    spec = from_hf_config(args.model_config) if args.model_config else get_model(args.model)
    _check_expert_parallel(args, spec, "import-aic")
    profile = import_aic(
        args.aic_dir,
        args.gpu,
        args.backend,
        spec,
        args.tp,
        version=args.version,
        precision=args.precision,
        kv_dtype=args.kv_dtype,
        expert_parallel=args.expert_parallel,
        moe_distribution=args.moe_distribution,
        pp=args.pp,
        attention_dp=args.attention_dp,
        mtp=args.mtp,
    )
    write_profile(profile, args.out)
    return _report(profile, str(args.out), args.json)


def _roofline(args: argparse.Namespace) -> int:
    spec = from_hf_config(args.model_config) if args.model_config else get_model(args.model)
    if args.weight_dtype or args.kv_dtype:
        spec = with_precision(spec, args.weight_dtype, args.kv_dtype)
    _check_expert_parallel(args, spec, "roofline")
    knobs = {knob: getattr(args, knob) for knob in ROOFLINE_KNOB_FLAGS}
    calibration = None
    if args.calibrate_gemm:
        if args.compute_efficiency is not None:
            raise ParameterError(
                "pdopt profile roofline: give --compute-efficiency or --calibrate-gemm, not "
                "both (the calibration sets the compute efficiency)."
            )
        calibration = calibrate_compute_efficiency(
            [read_profile(path) for path in args.calibrate_gemm], args.gpu
        )
        knobs["compute_efficiency"] = calibration.compute_efficiency
    profile = roofline_profile(
        args.gpu, spec, args.tp, seed=args.seed, expert_parallel=args.expert_parallel, **knobs
    )
    if calibration is not None:
        notes = f"{profile.meta.notes}\n{calibration.describe()}"
        profile = replace(profile, meta=replace(profile.meta, notes=notes))
    write_profile(profile, args.out)
    extra = {"calibration": asdict(calibration)} if calibration is not None else {}
    return _report(profile, str(args.out), args.json, extra)


def _show(args: argparse.Namespace) -> int:
    return _report(read_profile(args.path), str(args.path), args.json)


def summarize(profile: Profile, path: str) -> dict[str, Any]:
    """Metadata, row counts and value ranges of ``profile`` as a JSON-ready dict (``hybrid``
    counted only when the profile has such rows)."""
    rows = profile.rows
    ranges: dict[str, dict[str, float]] = {}
    for kind, columns in (
        ("gemm", ("m", "latency_s")),
        ("prefill", ("batch_size", "input_tokens", "latency_s")),
        ("decode", ("batch_size", "total_context_tokens", "latency_s")),
        ("hybrid", ("batch_size", "total_context_tokens", "input_tokens", "prefix_tokens",
                    "latency_s")),
    ):  # fmt: skip
        part = rows[rows["kind"] == kind]
        if len(part):
            ranges[kind] = {f"{c}_min": part[c].min() for c in columns}
            ranges[kind].update({f"{c}_max": part[c].max() for c in columns})
    counts = {kind: int((rows["kind"] == kind).sum()) for kind in ("gemm", "prefill", "decode")}
    if "hybrid" in ranges:
        counts["hybrid"] = len(profile.of_kind("hybrid"))
    return {"path": path, "meta": asdict(profile.meta), "rows": counts, "ranges": ranges}


def _report(profile: Profile, path: str, as_json: bool, extra: dict[str, Any] | None = None) -> int:
    summary = summarize(profile, path)
    if as_json:
        print_json({**summary, **(extra or {})})
        return 0
    meta = profile.meta
    print(f"{path}: {meta.gpu} × {meta.model}, tp={meta.tp}, {meta.dtype}, source {meta.source}")
    counts = summary["rows"]
    hybrid = f", {counts['hybrid']} hybrid" if "hybrid" in counts else ""
    print(
        f"  rows: {counts['gemm']} gemm, {counts['prefill']} prefill, {counts['decode']} decode"
        f"{hybrid}"
    )
    for note in meta.notes.splitlines():
        print(f"  note: {note}")
    return 0


def _model_row(model: ModelSpec) -> dict[str, Any]:
    return {
        **asdict(model),
        "param_count": param_count(model),
        "active_param_count": active_param_count(model),
        "kv_bytes_per_token": model.kv_bytes_per_token,
    }


def _window(model: ModelSpec) -> str:
    window = model.sliding_window
    return "" if window is None else f" swa {window.window_tokens}×{window.sliding_layers}"


def _catalog(args: argparse.Namespace) -> int:
    # each row as the name resolves: a $PDOPT_SPECS entry of a catalogued name replaces it
    gpu_specs = [get_gpu(name) for name in GPUS]
    model_specs = [get_model(name) for name in MODELS]
    gpus = [asdict(gpu) for gpu in gpu_specs]
    models = [_model_row(m) for m in model_specs]
    if args.json:
        print_json({"gpus": gpus, "models": models})
        return 0
    print("GPUs (dense BF16 and FP8 peak TFLOP/s, memory GiB, HBM TB/s, link GB/s, max W, USD/h):")
    for gpu in gpu_specs:
        fp8 = f"{gpu.fp8_peak_flops / 1e12:7.1f}" if gpu.fp8_peak_flops else "      -"
        print(
            f"  {gpu.name:<10} {gpu.peak_flops / 1e12:7.1f} {fp8} {gpu.memory_bytes / 2**30:5.0f} "
            f"{gpu.hbm_bw_bytes_per_s / 1e12:5.2f} {gpu.link_bw_bytes_per_s / 1e9:5.0f} "
            f"{gpu.max_power_w:5.0f} {gpu.cost_per_hour:6.2f}"
        )
    print(
        "Models (parameters total/active, layers, hidden, heads/kv heads, weight/KV dtype, "
        "KV bytes per token, context tokens, sliding window tokens × layers); any takes "
        "@WEIGHTS[/KV], e.g. NAME@fp8/fp8:"
    )
    for model in model_specs:
        attention = "MLA" if model.is_mla else f"{model.num_heads:3d}/{model.num_kv_heads:<3d}"
        weights = model.dtype
        if model.expert_dtype != model.dtype:
            weights = f"{model.dtype}+{model.expert_dtype}"
        print(
            f"  {model.name:<16} {param_count(model) / 1e9:7.2f}B/"
            f"{active_param_count(model) / 1e9:<7.2f} {model.num_layers:3d} "
            f"{model.hidden_size:5d} {attention:>7} {weights:>14}/{model.kv_dtype:<8} "
            f"{model.kv_bytes_per_token:8d} {model.max_context_tokens or 0:7d}{_window(model)}"
        )
    return 0
