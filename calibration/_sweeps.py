"""Timing and sweeps: GEMM peak, prefill (batch × input length), decode (batch × context).

Timing. Each measured callable runs ``warmup`` times, then ``repeats`` times; the profile gets
the median. On CUDA each repeat is bracketed by two ``torch.cuda.Event(enable_timing=True)``
recorded on the stream, and the host synchronizes once after the last repeat before reading
``elapsed_time``: the numbers are GPU time, and no host clock ever times asynchronous work. On
the CPU, ``time.perf_counter`` brackets each (synchronous) call.

Scaling. When the whole model does not fit next to the largest KV cache, the harness builds
``K < L`` layers. Each prefill or decode point is then timed twice, with the layers (``t_K``) and
without them (``t_0``: embedding, final norm, LM head), and reported as
``t_0 + (t_K − t_0) · L / K``: the layers are identical in shape, so their time scales with
their count, while the embedding and LM head run once per forward pass.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from calibration._model import Decoder, KvArena, decoder_weight_bytes
from pdopt.errors import ConfigError
from pdopt.model_spec import ModelSpec

Point = tuple[int, int]
Shape = tuple[int, int, int]

FULL_INPUT_TOKENS: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
FULL_PREFILL_BATCHES: tuple[int, ...] = (1, 2, 4, 8)
FULL_DECODE_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FULL_CONTEXT_TOKENS: tuple[int, ...] = FULL_INPUT_TOKENS
FULL_SQUARE_GEMMS: tuple[int, ...] = (1024, 2048, 4096, 8192)
FULL_GEMM_TOKENS: tuple[int, ...] = (512, 2048, 8192)

TINY_INPUT_TOKENS: tuple[int, ...] = (8, 16, 32)
TINY_CONTEXT_TOKENS: tuple[int, ...] = TINY_INPUT_TOKENS
TINY_PREFILL_BATCHES: tuple[int, ...] = (1, 2)
TINY_DECODE_BATCHES: tuple[int, ...] = (1, 2, 4)
TINY_SQUARE_GEMMS: tuple[int, ...] = (16, 32, 64)
TINY_GEMM_TOKENS: tuple[int, ...] = (8, 32)

MEMORY_HEADROOM: float = 0.9
"""Fraction of the free device memory the harness plans to use (the rest: allocator slack)."""


@dataclass(frozen=True, slots=True)
class SweepGrid:
    """What to measure: GEMM shapes ``(m, n, k)``, prefill ``(batch, input_tokens)`` points,
    decode ``(batch, context_tokens per request)`` points, and the warm-up and repeat counts."""

    gemm_shapes: tuple[Shape, ...]
    prefill_points: tuple[Point, ...]
    decode_points: tuple[Point, ...]
    warmup: int
    repeats: int

    @property
    def max_positions(self) -> int:
        """The longest sequence any point runs (sizes the rotary tables)."""
        return max(p[1] for p in (*self.prefill_points, *self.decode_points))


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """How many layers to build, how many KV tokens per layer to allocate, what to skip."""

    built_layers: int
    arena_tokens: int
    skipped_decode: tuple[Point, ...]


@dataclass(frozen=True, slots=True)
class Timing:
    """Where to time and how: the device, warm-up runs and timed repeats (median reported)."""

    device: torch.device
    warmup: int
    repeats: int

    def median_s(self, fn: Callable[[], Any]) -> float:
        """Median seconds of ``fn()`` (see :func:`time_callable`)."""
        return time_callable(fn, self.device, self.warmup, self.repeats)


@dataclass(frozen=True, slots=True)
class Bench:
    """The built decoder and KV arena, the layer count to scale to, and the timing."""

    model: Decoder
    arena: KvArena
    total_layers: int
    timing: Timing
    seed: int = 0

    @property
    def built_layers(self) -> int:
        return len(self.model.layers)


def make_grid(
    spec: ModelSpec,
    *,
    tiny: bool,
    max_input: int | None,
    max_batch: int | None,
    warmup: int,
    repeats: int,
) -> SweepGrid:
    """The sweep grid: full (input 128…8192, prefill batch 1…8, decode batch 1…256 × context
    128…8192) or tiny; ``max_input`` caps input and context lengths, ``max_batch`` batch sizes.

    Raises
    ------
    ConfigError
        When a cap leaves a sweep empty.
    """
    inputs = TINY_INPUT_TOKENS if tiny else FULL_INPUT_TOKENS
    contexts = TINY_CONTEXT_TOKENS if tiny else FULL_CONTEXT_TOKENS
    prefill_b = TINY_PREFILL_BATCHES if tiny else FULL_PREFILL_BATCHES
    decode_b = TINY_DECODE_BATCHES if tiny else FULL_DECODE_BATCHES
    inputs = _capped(inputs, max_input, "--max-input", "input lengths")
    contexts = _capped(contexts, max_input, "--max-input", "context lengths")
    prefill_b = _capped(prefill_b, max_batch, "--max-batch", "prefill batch sizes")
    decode_b = _capped(decode_b, max_batch, "--max-batch", "decode batch sizes")
    squares = TINY_SQUARE_GEMMS if tiny else FULL_SQUARE_GEMMS
    gemm_tokens = TINY_GEMM_TOKENS if tiny else FULL_GEMM_TOKENS
    gemms = tuple((s, s, s) for s in squares) + model_gemm_shapes(spec, gemm_tokens)
    return SweepGrid(
        gemm_shapes=gemms,
        prefill_points=tuple((b, t) for t in inputs for b in prefill_b),
        decode_points=tuple((b, c) for c in contexts for b in decode_b),
        warmup=warmup,
        repeats=repeats,
    )


def model_gemm_shapes(spec: ModelSpec, token_counts: Iterable[int]) -> tuple[Shape, ...]:
    """The layer's weight GEMMs ``(m tokens, n outputs, k inputs)``: QKV, output, gate/up, down."""
    hidden, hd = spec.hidden_size, spec.head_dim
    per_layer = (
        ((spec.num_heads + 2 * spec.num_kv_heads) * hd, hidden),
        (hidden, spec.num_heads * hd),
        (2 * spec.intermediate_size, hidden),
        (hidden, spec.intermediate_size),
    )
    return tuple((m, n, k) for m in token_counts for n, k in per_layer)


def _capped(values: tuple[int, ...], cap: int | None, flag: str, what: str) -> tuple[int, ...]:
    if cap is None:
        return values
    kept = tuple(v for v in values if v <= cap)
    if not kept:
        raise ConfigError(f"{flag} {cap} leaves no {what} to measure (smallest is {values[0]})")
    return kept


def free_memory_bytes(device: torch.device) -> int:
    """Free memory where the model will live: CUDA free bytes, or available host RAM."""
    if device.type == "cuda":
        # The GEMM sweep's operands sit in the caching allocator; hand them back first, or
        # mem_get_info would count them as used.
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info(device)[0])
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def activation_bytes(spec: ModelSpec, grid: SweepGrid, dtype_bytes: int) -> int:
    """A generous bound on the live activations of the largest forward pass (bytes).

    The largest prefill batch holds, per token, the residual stream and norms (float32 inside
    RMSNorm), QKV and the rotated copies, the attention output, gate/up and the SiLU product;
    attention itself runs in SDPA's fused kernels (no score matrix on CUDA in 16-bit types).
    """
    tokens = max(b * t for b, t in grid.prefill_points)
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    per_token = (4 * spec.hidden_size + 2 * qkv + 4 * spec.intermediate_size) * dtype_bytes
    per_token += 2 * spec.hidden_size * 4
    logits = max(b for b, _ in grid.decode_points) * spec.vocab_size * 4
    return int(1.25 * (tokens * per_token + logits)) + 2**29


def plan_memory(
    spec: ModelSpec,
    grid: SweepGrid,
    dtype_bytes: int,
    free_bytes: int,
    layers: int | None = None,
) -> MemoryPlan:
    """Choose the layers to build and the KV arena size so that weights, cache and activations fit.

    As many layers as fit next to a cache holding the largest point (batch × tokens) are built
    (at most ``spec.num_layers``; ``layers`` forces a count). When even one layer and that cache do
    not fit, the cache shrinks and the decode points it cannot hold are skipped (reported).

    Raises
    ------
    ConfigError
        When one layer and the largest prefill batch's cache do not fit.
    """
    base_w, layer_w = decoder_weight_bytes(spec, dtype_bytes)
    kv_per_token = 2 * spec.num_kv_heads * spec.head_dim * dtype_bytes
    need = max(b * t for b, t in (*grid.prefill_points, *grid.decode_points))
    budget = MEMORY_HEADROOM * free_bytes - base_w - activation_bytes(spec, grid, dtype_bytes)
    fit = int(budget // (layer_w + need * kv_per_token))
    built = min(spec.num_layers, max(1, layers if layers is not None else fit))
    arena = min(need, int((budget / built - layer_w) // kv_per_token))
    prefill_need = max(b * t for b, t in grid.prefill_points)
    if arena < prefill_need:
        raise ConfigError(
            f"{spec.name}: {built} layer(s) and a KV cache of {prefill_need} tokens need more than "
            f"the {free_bytes / 2**30:.1f} GiB free; lower --max-input/--max-batch or --layers"
        )
    skipped = tuple(p for p in grid.decode_points if p[0] * p[1] > arena)
    return MemoryPlan(built, arena, skipped)


def time_callable(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs (see module doc)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        return _median_cuda_s(fn, device, repeats)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _median_cuda_s(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    torch.cuda.synchronize(device)
    starts = [_timing_event() for _ in range(repeats)]
    ends = [_timing_event() for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    elapsed_ms = [float(s.elapsed_time(e)) for s, e in zip(starts, ends, strict=True)]
    return statistics.median(elapsed_ms) / 1e3


def _timing_event() -> torch.cuda.Event:
    # torch's stubs leave Event.__init__ untyped; this is the one place that builds events.
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def measure_gemm(shape: Shape, timing: Timing, dtype: torch.dtype, seed: int = 0) -> float:
    """Median seconds of one ``m×k @ k×n`` product into a preallocated output."""
    m, n, k = shape
    gen = torch.Generator(device=timing.device).manual_seed(seed)
    a = torch.randn((m, k), generator=gen, device=timing.device, dtype=dtype)
    b = torch.randn((k, n), generator=gen, device=timing.device, dtype=dtype)
    out = torch.empty((m, n), device=timing.device, dtype=dtype)
    return timing.median_s(lambda: torch.matmul(a, b, out=out))


def measure_prefill(point: Point, bench: Bench) -> float:
    """Seconds of one prefill of ``batch`` prompts of ``input_tokens``, KV written to the arena."""
    batch, tokens = point
    ids = _token_ids(bench, batch, tokens)
    caches = bench.arena.views(batch, tokens)
    return _scaled(bench, lambda run: bench.model(ids, 0, caches, run_layers=run))


def measure_decode(point: Point, bench: Bench) -> float:
    """Seconds of one decode step of ``batch`` requests, each attending over ``context`` tokens.

    Each request's cache holds ``context − 1`` earlier tokens; the new token is written at
    position ``context − 1`` and attends over all ``context`` positions.
    """
    batch, context = point
    ids = _token_ids(bench, batch, 1)
    caches = bench.arena.views(batch, context)
    return _scaled(bench, lambda run: bench.model(ids, context - 1, caches, run_layers=run))


def _token_ids(bench: Bench, batch: int, tokens: int) -> torch.Tensor:
    device = bench.timing.device
    gen = torch.Generator(device=device).manual_seed(bench.seed)
    vocab = bench.model.embed.shape[0]
    return torch.randint(0, vocab, (batch, tokens), generator=gen, device=device)


def _scaled(bench: Bench, forward: Callable[[bool], torch.Tensor]) -> float:
    full_s = bench.timing.median_s(lambda: forward(True))
    if bench.built_layers == bench.total_layers:
        return full_s
    head_s = bench.timing.median_s(lambda: forward(False))
    # Noise can make t_K < t_0 for tiny shapes; the layers then count as taking no time.
    layers_s = max(full_s - head_s, 0.0)
    return head_s + layers_s * bench.total_layers / bench.built_layers


def run_gemm_sweep(
    shapes: Iterable[Shape], timing: Timing, dtype: torch.dtype, quiet: bool = False
) -> list[dict[str, float | str]]:
    """Measure each GEMM ``(m, n, k)``; ``gemm`` profile records. Run it before the model is
    built, so the operands have the device's memory to themselves."""
    records: list[dict[str, float | str]] = []
    with torch.inference_mode():
        for m, n, k in tqdm(list(shapes), desc="gemm", unit="shape", disable=quiet):
            latency_s = measure_gemm((m, n, k), timing, dtype)
            records.append({"kind": "gemm", "m": m, "n": n, "k": k, "latency_s": latency_s})
    return records


def run_model_sweeps(
    grid: SweepGrid, bench: Bench, skip_decode: Iterable[Point] = (), quiet: bool = False
) -> list[dict[str, float | str]]:
    """Measure the prefill and decode points of ``grid``; profile records (``pdopt.profile``).

    Decode points in ``skip_decode`` (those the KV arena cannot hold) are left out.
    """
    skipped = set(skip_decode)
    tasks = [("prefill", p) for p in grid.prefill_points]
    tasks += [("decode", p) for p in grid.decode_points if p not in skipped]
    records: list[dict[str, float | str]] = []
    with torch.inference_mode():
        for kind, (batch, tokens) in tqdm(tasks, desc="model", unit="point", disable=quiet):
            if kind == "prefill":
                latency_s = measure_prefill((batch, tokens), bench)
                fields: dict[str, float | str] = {"input_tokens": tokens}
            else:
                latency_s = measure_decode((batch, tokens), bench)
                fields = {"total_context_tokens": batch * tokens}
            records.append({"kind": kind, "batch_size": batch, **fields, "latency_s": latency_s})
    return records
