"""``pdopt profile``: make, import and inspect profile files; list the GPU and model catalogues.

Sub-commands::

    pdopt profile import-vidur DIR --model NAME [--tp N] [--gpu NAME] [--all-reduce CSV]
                               --out FILE.csv [--json]
    pdopt profile roofline --gpu NAME --model NAME [--tp N] [--seed S] --out FILE.csv [--json]
    pdopt profile show FILE.csv [--json]
    pdopt profile catalog [--json]
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from pdopt.cli._args import FRACTION, NON_NEGATIVE_INT, POSITIVE_INT
from pdopt.cli._output import add_json_flag, print_json
from pdopt.hardware import GPUS
from pdopt.model_spec import MODELS, param_count
from pdopt.profile import (
    DEFAULT_BANDWIDTH_EFFICIENCY,
    DEFAULT_COMPUTE_EFFICIENCY,
    Profile,
    import_vidur,
    read_profile,
    roofline_profile,
    write_profile,
)


def register(subparsers: Any) -> None:
    """Add ``pdopt profile`` and its sub-commands."""
    parser = subparsers.add_parser("profile", help="make, import and inspect profile files")
    sub = parser.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda _args: _print_help(parser))

    vidur = sub.add_parser("import-vidur", help="convert Vidur mlp.csv/attention*.csv to a profile")
    vidur.add_argument("directory", help="a Vidur model folder holding mlp.csv")
    vidur.add_argument("--model", required=True, help="catalogue model name (see 'catalog')")
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

    roof = sub.add_parser("roofline", help="write a synthetic roofline profile")
    roof.add_argument("--gpu", required=True, help="catalogue GPU name (see 'catalog')")
    roof.add_argument("--model", required=True, help="catalogue model name (see 'catalog')")
    roof.add_argument(
        "--tp", type=POSITIVE_INT, default=1, help="tensor-parallel degree (default 1)"
    )
    roof.add_argument("--compute-efficiency", type=FRACTION, default=DEFAULT_COMPUTE_EFFICIENCY)
    roof.add_argument("--bandwidth-efficiency", type=FRACTION, default=DEFAULT_BANDWIDTH_EFFICIENCY)
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


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _import_vidur(args: argparse.Namespace) -> int:
    profile = import_vidur(
        args.directory, args.model, args.tp, gpu=args.gpu, all_reduce_csv=args.all_reduce
    )
    write_profile(profile, args.out)
    return _report(profile, str(args.out), args.json)


def _roofline(args: argparse.Namespace) -> int:
    profile = roofline_profile(
        args.gpu,
        args.model,
        args.tp,
        compute_efficiency=args.compute_efficiency,
        bandwidth_efficiency=args.bandwidth_efficiency,
        seed=args.seed,
    )
    write_profile(profile, args.out)
    return _report(profile, str(args.out), args.json)


def _show(args: argparse.Namespace) -> int:
    return _report(read_profile(args.path), str(args.path), args.json)


def summarize(profile: Profile, path: str) -> dict[str, Any]:
    """Metadata, row counts and value ranges of ``profile`` as a JSON-ready dict."""
    rows = profile.rows
    ranges: dict[str, dict[str, float]] = {}
    for kind, columns in (
        ("gemm", ("m", "latency_s")),
        ("prefill", ("batch_size", "input_tokens", "latency_s")),
        ("decode", ("batch_size", "total_context_tokens", "latency_s")),
    ):
        part = rows[rows["kind"] == kind]
        if len(part):
            ranges[kind] = {f"{c}_min": part[c].min() for c in columns}
            ranges[kind].update({f"{c}_max": part[c].max() for c in columns})
    counts = {kind: int((rows["kind"] == kind).sum()) for kind in ("gemm", "prefill", "decode")}
    return {"path": path, "meta": asdict(profile.meta), "rows": counts, "ranges": ranges}


def _report(profile: Profile, path: str, as_json: bool) -> int:
    summary = summarize(profile, path)
    if as_json:
        print_json(summary)
        return 0
    meta = profile.meta
    print(f"{path}: {meta.gpu} × {meta.model}, tp={meta.tp}, {meta.dtype}, source {meta.source}")
    counts = summary["rows"]
    print(f"  rows: {counts['gemm']} gemm, {counts['prefill']} prefill, {counts['decode']} decode")
    for note in meta.notes.splitlines():
        print(f"  note: {note}")
    return 0


def _catalog(args: argparse.Namespace) -> int:
    gpus = [asdict(gpu) for gpu in GPUS.values()]
    models = [
        {**asdict(m), "param_count": param_count(m), "kv_bytes_per_token": m.kv_bytes_per_token}
        for m in MODELS.values()
    ]
    if args.json:
        print_json({"gpus": gpus, "models": models})
        return 0
    print("GPUs (dense FP16 peak TFLOP/s, memory GiB, HBM TB/s, link GB/s, max W):")
    for gpu in GPUS.values():
        print(
            f"  {gpu.name:<10} {gpu.peak_flops / 1e12:7.1f} {gpu.memory_bytes / 2**30:5.0f} "
            f"{gpu.hbm_bw_bytes_per_s / 1e12:5.2f} {gpu.link_bw_bytes_per_s / 1e9:5.0f} "
            f"{gpu.max_power_w:5.0f}"
        )
    print("Models (parameters, layers, hidden, heads/kv heads, KV bytes per token):")
    for model in MODELS.values():
        print(
            f"  {model.name:<14} {param_count(model) / 1e9:6.2f}B {model.num_layers:3d} "
            f"{model.hidden_size:5d} {model.num_heads:3d}/{model.num_kv_heads:<3d} "
            f"{model.kv_bytes_per_token:8d}"
        )
    return 0
