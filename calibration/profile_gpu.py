"""Profile a model's shape on this machine's GPU (or CPU) and write a pdopt profile CSV.

Usage::

    python -m calibration.profile_gpu --model Qwen2.5-7B --out profiles/h100_qwen2.5-7b.csv
    python -m calibration.profile_gpu --model path/to/config.json --out profiles/mine.csv
    python -m calibration.profile_gpu --device cpu --tiny --out /tmp/tiny.csv
    python -m calibration.profile_gpu --model Llama-3-8B --cuda-graphs --mixed --out p.csv

``--mixed`` also writes ``p_mixed.csv`` beside ``p.csv`` (:func:`mixed_path`).

See ``calibration/README.md`` for what is measured and how long it takes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from calibration._config import load_model_spec, shard_for_tp, tiny_model_spec
from calibration._layout import MIXED_COLUMNS
from calibration._model import Decoder, allocate_kv_arena
from calibration._sweeps import (
    Bench,
    MemoryPlan,
    SweepGrid,
    Timing,
    free_memory_bytes,
    make_grid,
    plan_memory,
    run_gemm_sweep,
    run_mixed_sweep,
    run_model_sweeps,
)
from pdopt._validation import check_int_at_least
from pdopt.errors import ConfigError, PdoptError
from pdopt.model_spec import DTYPE_BYTES, ModelSpec
from pdopt.profile import Profile, ProfileMeta, profile_from_records, write_profile

SOURCE = "measured:calibration.profile_gpu"
_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


@dataclass(frozen=True, slots=True)
class HarnessOptions:
    """What to profile and how (the command-line flags, validated)."""

    model: str | None
    device: str
    tiny: bool = False
    dtype: str | None = None
    tp: int = 1
    warmup: int = 3
    repeats: int = 10
    max_input: int | None = None
    max_batch: int | None = None
    layers: int | None = None
    quiet: bool = False
    cuda_graphs: bool = False
    mixed: bool = False

    def __post_init__(self) -> None:
        owner = "profile_gpu"
        check_int_at_least(self.tp, 1, "tp", owner)
        check_int_at_least(self.warmup, 0, "warmup", owner)
        check_int_at_least(self.repeats, 1, "repeats", owner)
        for name in ("max_input", "max_batch", "layers"):
            if getattr(self, name) is not None:
                check_int_at_least(getattr(self, name), 1, name, owner)
        if self.model is None and not self.tiny:
            raise ConfigError("--model is required (a catalogue name or a config.json path)")


@dataclass(frozen=True, slots=True)
class HarnessResult:
    """The measured profile and, with ``--mixed``, the mixed-batch rows (:data:`MIXED_COLUMNS`)."""

    profile: Profile
    mixed: pd.DataFrame | None = None


def profile_model(options: HarnessOptions) -> HarnessResult:
    """Build the random-weight decoder, run the sweeps and return the measured profile."""
    device = _device(options.device)
    if options.cuda_graphs and device.type != "cuda":
        raise ConfigError(
            f"--cuda-graphs needs a CUDA device, and this run is on {device.type} "
            "(CUDA graphs do not exist there); drop --cuda-graphs or use --device cuda"
        )
    full = tiny_model_spec() if options.tiny else load_model_spec(str(options.model))
    spec = shard_for_tp(full, options.tp)
    dtype_name = _dtype_name(options, full, device)
    dtype = _TORCH_DTYPES[dtype_name]
    grid = make_grid(
        spec,
        tiny=options.tiny,
        max_input=options.max_input,
        max_batch=options.max_batch,
        warmup=options.warmup,
        repeats=options.repeats,
        mixed=options.mixed,
    )
    timing = Timing(device, grid.warmup, grid.repeats)
    records = run_gemm_sweep(grid.gemm_shapes, timing, dtype, options.quiet)
    plan = plan_memory(
        spec, grid, int(DTYPE_BYTES[dtype_name]), free_memory_bytes(device), options.layers
    )
    model = Decoder(spec, plan.built_layers, grid.max_positions, device, dtype)
    arena = allocate_kv_arena(spec, plan.built_layers, plan.arena_tokens, device, dtype)
    bench = Bench(model, arena, spec.num_layers, timing, graphs=options.cuda_graphs)
    records += run_model_sweeps(grid, bench, plan.skipped_decode, options.quiet)
    mixed = None
    if options.mixed:
        rows = run_mixed_sweep(grid.mixed_points, bench, plan.skipped_mixed, options.quiet)
        mixed = pd.DataFrame(rows, columns=list(MIXED_COLUMNS))
    meta = ProfileMeta(
        gpu=_device_name(device),
        model=full.name,
        dtype=dtype_name,
        tp=options.tp,
        source=SOURCE,
        notes=_notes(options, spec, grid, plan, bench.fallbacks),
    )
    return HarnessResult(profile_from_records(meta, records), mixed)


def mixed_path(out: Path) -> Path:
    """Where ``--mixed`` writes its rows: ``<out stem>_mixed.csv`` beside ``out``."""
    return out.with_name(f"{out.stem}_mixed.csv")


def write_mixed(rows: pd.DataFrame, meta: ProfileMeta, path: Path) -> Path:
    """Write the mixed-batch rows as CSV after ``# key: value`` lines (the profile's gpu,
    model, dtype, tp, source and notes); read it with ``pandas.read_csv(path, comment="#")``."""
    header = [f"# {key}: {getattr(meta, key)}" for key in ("gpu", "model", "dtype", "tp", "source")]
    header += [f"# notes: {line}" for line in meta.notes.splitlines()]
    text = "\n".join(header) + "\n" + rows.to_csv(index=False, float_format="%.6g")
    path.write_text(text, encoding="utf-8")
    return path


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    if name not in ("cuda", "cpu"):
        raise ConfigError(f"--device {name}: must be cuda or cpu")
    if name == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _dtype_name(options: HarnessOptions, spec: ModelSpec, device: torch.device) -> str:
    if options.dtype is not None:
        return options.dtype
    if device.type == "cpu":
        return "float32"  # CPU kernels for 16-bit types are slow or missing
    return spec.dtype if spec.dtype in ("float16", "bfloat16") else "float16"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _notes(
    options: HarnessOptions,
    spec: ModelSpec,
    grid: SweepGrid,
    plan: MemoryPlan,
    fallbacks: Sequence[str] = (),
) -> str:
    lines = [
        f"random-weight decoder (torch {torch.__version__}, SDPA attention), shape {_shape(spec)}",
        f"median of {grid.repeats} repeats after {grid.warmup} warm-up runs",
        "prefill: LM head on the last position; KV written to a preallocated cache",
        "decode: total_context_tokens = batch_size x per-request context; the new token "
        "attends over its whole context in a preallocated KV cache",
    ]
    if options.cuda_graphs:
        lines.append(
            "CUDA graphs: every prefill, decode and mixed forward pass captured in a "
            "torch.cuda.CUDAGraph after an eager warm-up run and timed as graph replays (the "
            "gemm rows are single kernels, timed eagerly)"
        )
        if fallbacks:
            shown = "; ".join(fallbacks[:3]) + ("; ..." if len(fallbacks) > 3 else "")
            lines.append(
                f"CUDA graph capture failed for {len(fallbacks)} pass(es), timed eagerly "
                f"instead: {shown}"
            )
    else:
        lines.append("eager PyTorch (no CUDA graphs): small steps include kernel-launch time")
    if grid.mixed_points:
        lines.append(
            "mixed batches (B decodes + one prefill chunk in one forward pass) in the "
            "<out stem>_mixed.csv file beside this profile"
        )
    if options.tiny:
        lines.append("tiny shape and tiny sweeps (a test of the harness, not a real model)")
    if plan.built_layers < spec.num_layers:
        lines.append(
            f"built {plan.built_layers} of {spec.num_layers} layers (memory); latency = "
            f"t_head + (t_{plan.built_layers}layers - t_head) x {spec.num_layers}/"
            f"{plan.built_layers}"
        )
    if options.tp > 1:
        lines.append(
            f"tp={options.tp}: one GPU's shard of the shape; all-reduce communication NOT measured"
        )
    if plan.skipped_decode:
        skipped = " ".join(f"{b}x{c}" for b, c in plan.skipped_decode)
        lines.append(f"decode points skipped (KV cache does not fit; batch x context): {skipped}")
    if plan.skipped_mixed:
        skipped = " ".join(f"{b}x{c}+{p}" for b, c, p in plan.skipped_mixed)
        lines.append(f"mixed points skipped (KV cache does not fit; B x C + P): {skipped}")
    return "\n".join(lines)


def _shape(spec: ModelSpec) -> str:
    return (
        f"layers={spec.num_layers} hidden={spec.hidden_size} heads={spec.num_heads} "
        f"kv_heads={spec.num_kv_heads} head_dim={spec.head_dim} "
        f"intermediate={spec.intermediate_size} vocab={spec.vocab_size}"
    )


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser of ``python -m calibration.profile_gpu``."""
    parser = argparse.ArgumentParser(
        prog="python -m calibration.profile_gpu",
        description="Measure GEMM, prefill and decode latencies of a model's shape (random "
        "weights) and write a pdopt profile CSV.",
    )
    parser.add_argument("--model", help="catalogue name (e.g. Qwen2.5-7B) or config.json path")
    parser.add_argument("--out", required=True, type=Path, help="profile CSV to write")
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cuda", "cpu"), default=default_device)
    parser.add_argument("--tiny", action="store_true", help="tiny shape and sweeps (tests)")
    parser.add_argument("--dtype", choices=tuple(_TORCH_DTYPES), default=None)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (shard shape)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up runs (default 3; tiny 1)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs (default 10; tiny 3)")
    parser.add_argument("--max-input", type=int, default=None, help="cap on input/context tokens")
    parser.add_argument("--max-batch", type=int, default=None, help="cap on batch sizes")
    parser.add_argument("--layers", type=int, default=None, help="layers to build (default: fit)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="time prefill, decode and mixed passes as CUDA graph replays (CUDA only)",
    )
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="also time fused decode + prefill-chunk passes into <out stem>_mixed.csv",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the harness; 0 on success, 2 on bad input or configuration (message on stderr)."""
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    try:
        options = HarnessOptions(
            model=args.model,
            device=args.device,
            tiny=args.tiny,
            dtype=args.dtype,
            tp=args.tp,
            warmup=args.warmup if args.warmup is not None else (1 if args.tiny else 3),
            repeats=args.repeats if args.repeats is not None else (3 if args.tiny else 10),
            max_input=args.max_input,
            max_batch=args.max_batch,
            layers=args.layers,
            quiet=args.quiet,
            cuda_graphs=args.cuda_graphs,
            mixed=args.mixed,
        )
        result = profile_model(options)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        profile = result.profile
        path = write_profile(profile, args.out)
        if result.mixed is not None:
            mixed_file = write_mixed(result.mixed, profile.meta, mixed_path(args.out))
    except PdoptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    elapsed_s = time.perf_counter() - started
    counts = profile.rows["kind"].value_counts().to_dict()
    print(f"wrote {path} ({counts}) on {profile.meta.gpu} in {elapsed_s:.2f} s")
    if result.mixed is not None:
        print(f"wrote {mixed_file} ({len(result.mixed)} mixed points)")
        print(result.mixed.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
