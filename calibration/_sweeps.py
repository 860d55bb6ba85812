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

CUDA graphs (``Bench.graphs``). Each prefill, decode or mixed point's forward pass is run once
eagerly on a side stream, captured into a ``torch.cuda.CUDAGraph`` on that stream, replayed once
and checked against the eager result, then timed as graph replays (the same warm-up, repeats and
CUDA events). The inputs, the KV cache and the rotary tables are allocated before capture, and
the forward pass branches only on Python integers (shapes and positions), never on tensor
values, so one capture replays the same work. A point whose capture fails (any exception) is
timed eagerly instead and listed in ``Bench.fallbacks`` (the profile's notes); the run goes on.

Mixed batches (``SweepGrid.mixed_points``). One forward pass carries ``B`` decodes (context
``C`` each) and one first prefill chunk of ``P`` tokens, as a chunked-prefill engine (vLLM V1,
Sarathi) runs them (:meth:`calibration._model.Decoder.forward_mixed`); the decode-only step
``(B, C)`` and the prefill of the chunk alone ``(1, P)`` are timed beside it, so that
``fused / (decode + prefill)`` can be read off.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from tqdm import tqdm

from calibration._layout import layer_weight_shapes
from calibration._model import Decoder, KvArena, decoder_weight_bytes
from pdopt.errors import ConfigError
from pdopt.model_spec import ModelSpec

Point = tuple[int, int]
Shape = tuple[int, int, int]
MixedPoint = tuple[int, int, int]
"""(decode batch B, context tokens C per decode, prefill chunk tokens P) of one fused pass."""

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

FULL_MIXED_BATCHES: tuple[int, ...] = (8, 32, 128)
FULL_MIXED_CONTEXTS: tuple[int, ...] = (1024,)
FULL_MIXED_CHUNKS: tuple[int, ...] = (256, 1024, 2048)
TINY_MIXED_BATCHES: tuple[int, ...] = (2, 4)
TINY_MIXED_CONTEXTS: tuple[int, ...] = (16,)
TINY_MIXED_CHUNKS: tuple[int, ...] = (8, 16)

GRAPH_WARMUP_RUNS: int = 1
"""Eager runs on the capture stream before a CUDA graph is captured (lazy initialisation)."""

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
    mixed_points: tuple[MixedPoint, ...] = ()

    @property
    def max_positions(self) -> int:
        """The longest sequence any point runs (sizes the rotary tables)."""
        mixed = (max(c, p) for _, c, p in self.mixed_points)
        return max((*(p[1] for p in (*self.prefill_points, *self.decode_points)), *mixed))

    @property
    def max_kv_tokens(self) -> int:
        """The most KV tokens (summed over a batch) one point holds in a layer's cache."""
        mixed = (b * c + p for b, c, p in self.mixed_points)
        return max((*(b * t for b, t in (*self.prefill_points, *self.decode_points)), *mixed))


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """How many layers to build, how many KV tokens per layer to allocate, what to skip."""

    built_layers: int
    arena_tokens: int
    skipped_decode: tuple[Point, ...]
    skipped_mixed: tuple[MixedPoint, ...] = ()


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
    """The built decoder and KV arena, the layer count to scale to, and the timing.

    With ``graphs`` each forward pass is timed as CUDA graph replays (module doc); a capture
    that fails is timed eagerly and described in ``fallbacks``.
    """

    model: Decoder
    arena: KvArena
    total_layers: int
    timing: Timing
    seed: int = 0
    graphs: bool = False
    fallbacks: list[str] = field(default_factory=list)

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
    mixed: bool = False,
) -> SweepGrid:
    """The sweep grid: full (input 128…8192, prefill batch 1…8, decode batch 1…256 × context
    128…8192) or tiny; ``max_input`` caps input and context lengths, ``max_batch`` batch sizes.
    With ``mixed``, fused passes of B ∈ {8, 32, 128} decodes × context 1024 × a chunk of
    P ∈ {256, 1024, 2048} tokens (tiny: B ∈ {2, 4} × 16 × P ∈ {8, 16}), under the same caps.

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
    mixed_points: tuple[MixedPoint, ...] = ()
    if mixed:
        mixed_b = _capped(
            TINY_MIXED_BATCHES if tiny else FULL_MIXED_BATCHES,
            max_batch,
            "--max-batch",
            "mixed batch sizes",
        )
        mixed_c = _capped(
            TINY_MIXED_CONTEXTS if tiny else FULL_MIXED_CONTEXTS,
            max_input,
            "--max-input",
            "mixed context lengths",
        )
        mixed_p = _capped(
            TINY_MIXED_CHUNKS if tiny else FULL_MIXED_CHUNKS,
            max_input,
            "--max-input",
            "mixed chunk lengths",
        )
        mixed_points = tuple((b, c, p) for c in mixed_c for p in mixed_p for b in mixed_b)
    return SweepGrid(
        gemm_shapes=gemms,
        prefill_points=tuple((b, t) for t in inputs for b in prefill_b),
        decode_points=tuple((b, c) for c in contexts for b in decode_b),
        warmup=warmup,
        repeats=repeats,
        mixed_points=mixed_points,
    )


def model_gemm_shapes(spec: ModelSpec, token_counts: Iterable[int]) -> tuple[Shape, ...]:
    """The layer's weight GEMMs ``(m tokens, n outputs, k inputs)``: QKV, output, gate/up, down."""
    return tuple((m, n, k) for m in token_counts for n, k in layer_weight_shapes(spec))


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
    tokens = max(
        (*(b * t for b, t in grid.prefill_points), *(b + p for b, _, p in grid.mixed_points))
    )
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
    need = grid.max_kv_tokens
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
    skipped_mixed = tuple(m for m in grid.mixed_points if m[0] * m[1] + m[2] > arena)
    return MemoryPlan(built, arena, skipped, skipped_mixed)


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


class Timed(NamedTuple):
    """A point's median seconds, and whether every pass behind it ran as a CUDA graph."""

    seconds: float
    graph: bool


def measure_prefill(point: Point, bench: Bench) -> Timed:
    """Seconds of one prefill of ``batch`` prompts of ``input_tokens``, KV written to the arena."""
    batch, tokens = point
    ids = _token_ids(bench, batch, tokens)
    caches = bench.arena.views(batch, tokens)
    return _scaled(
        bench, lambda run: bench.model(ids, 0, caches, run_layers=run), f"prefill {batch}x{tokens}"
    )


def measure_decode(point: Point, bench: Bench) -> Timed:
    """Seconds of one decode step of ``batch`` requests, each attending over ``context`` tokens.

    Each request's cache holds ``context − 1`` earlier tokens; the new token is written at
    position ``context − 1`` and attends over all ``context`` positions.
    """
    batch, context = point
    ids = _token_ids(bench, batch, 1)
    caches = bench.arena.views(batch, context)
    return _scaled(
        bench,
        lambda run: bench.model(ids, context - 1, caches, run_layers=run),
        f"decode {batch}x{context}",
    )


def measure_mixed(point: MixedPoint, bench: Bench) -> Timed:
    """Seconds of one fused pass: ``batch`` decodes at ``context`` (the caches of
    :func:`measure_decode`) plus a first prefill chunk of ``chunk`` tokens (its cache right
    after theirs in the arena)."""
    batch, context, chunk = point
    decode_ids = _token_ids(bench, batch, 1)
    chunk_ids = _token_ids(bench, 1, chunk)
    decode_caches = bench.arena.views(batch, context)
    chunk_caches = bench.arena.views(1, chunk, offset_tokens=batch * context)
    return _scaled(
        bench,
        lambda run: bench.model.forward_mixed(
            decode_ids, context, decode_caches, chunk_ids, chunk_caches, run_layers=run
        ),
        f"mixed {batch}x{context}+{chunk}",
    )


def _token_ids(bench: Bench, batch: int, tokens: int) -> torch.Tensor:
    device = bench.timing.device
    gen = torch.Generator(device=device).manual_seed(bench.seed)
    vocab = bench.model.embed.shape[0]
    return torch.randint(0, vocab, (batch, tokens), generator=gen, device=device)


def _scaled(bench: Bench, forward: Callable[[bool], Any], label: str) -> Timed:
    full = _median(bench, lambda: forward(True), label)
    if bench.built_layers == bench.total_layers:
        return full
    head = _median(bench, lambda: forward(False), f"{label} (head only)")
    # Noise can make t_K < t_0 for tiny shapes; the layers then count as taking no time.
    layers_s = max(full.seconds - head.seconds, 0.0)
    seconds = head.seconds + layers_s * bench.total_layers / bench.built_layers
    return Timed(seconds, full.graph and head.graph)


def _median(bench: Bench, fn: Callable[[], Any], label: str) -> Timed:
    """``fn`` timed as CUDA graph replays when ``bench.graphs`` (eager if its capture fails,
    noted in ``bench.fallbacks``), else eagerly."""
    if not bench.graphs:
        return Timed(bench.timing.median_s(fn), False)
    try:
        replay = capture_graph(fn, bench.timing.device)
    except Exception as exc:
        # NOTE: any capture failure (an op that cannot be captured, memory) costs this point its
        # graph, never the run: it is timed eagerly and reported.
        reason = f"{label}: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        bench.fallbacks.append(reason[:200])
        print(f"CUDA graph capture failed, timing eagerly: {reason}", file=sys.stderr)
        replay = None
    if replay is None:
        return Timed(bench.timing.median_s(fn), False)
    seconds = bench.timing.median_s(replay)
    del replay  # the graph and its memory pool go with it
    return Timed(seconds, True)


def capture_graph(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """Capture ``fn`` (a forward pass over static inputs) in a CUDA graph; return its replay.

    As PyTorch documents: ``GRAPH_WARMUP_RUNS`` eager runs on a side stream, then the capture
    on that stream (``torch.cuda.graph`` synchronizes and empties the allocator's cache first,
    so the graph's private pool gets the memory). The graph is replayed once and its outputs
    compared with the eager run's (:func:`same_outputs`); a difference raises RuntimeError.
    """
    current = torch.cuda.current_stream(device)
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    try:
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            for _ in range(GRAPH_WARMUP_RUNS):
                expected = fn()
        current.wait_stream(stream)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = fn()
        graph.replay()
        torch.cuda.synchronize(device)
    except BaseException:
        # torch.cuda.graph leaves its capture stream current when ending the capture raises;
        # the eager fallback and the later points run on the stream that was current before.
        torch.cuda.set_stream(current)
        raise
    if not same_outputs(static_out, expected):
        raise RuntimeError("the graph's replay does not reproduce the eager outputs")
    del expected

    def replay() -> Any:
        graph.replay()
        return static_out

    return replay


def same_outputs(got: Any, expected: Any, tolerance: float = 0.05) -> bool:
    """Whether two forward outputs (a tensor or a tuple of tensors) agree: same shapes, NaN and
    infinities in the same places, and the rest within ``tolerance`` relative error in the
    Euclidean norm (``‖got − expected‖ ≤ tolerance·‖expected‖``), so that rounding differences
    in a few of many 16-bit logits pass while a replay that computed nothing (stale or
    uninitialised outputs) does not."""
    got_t = got if isinstance(got, tuple) else (got,)
    expected_t = expected if isinstance(expected, tuple) else (expected,)
    if len(got_t) != len(expected_t):
        return False
    for a, b in zip(got_t, expected_t, strict=True):
        if a.shape != b.shape:
            return False
        fa, fb = a.float(), b.float()
        finite = torch.isfinite(fb)
        if not torch.equal(torch.isfinite(fa), finite):
            return False
        # the same non-finite values: NaN for NaN (nan_to_num: 0), +inf for +inf, -inf for -inf
        if not torch.equal(fa[~finite].nan_to_num(0.0), fb[~finite].nan_to_num(0.0)):
            return False
        error = torch.linalg.vector_norm(fa[finite] - fb[finite])
        scale = torch.linalg.vector_norm(fb[finite])
        if bool(error > tolerance * scale):
            return False
    return True


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
                latency_s = measure_prefill((batch, tokens), bench).seconds
                fields: dict[str, float | str] = {"input_tokens": tokens}
            else:
                latency_s = measure_decode((batch, tokens), bench).seconds
                fields = {"total_context_tokens": batch * tokens}
            records.append({"kind": kind, "batch_size": batch, **fields, "latency_s": latency_s})
    return records


def run_mixed_sweep(
    points: Iterable[MixedPoint],
    bench: Bench,
    skip: Iterable[MixedPoint] = (),
    quiet: bool = False,
) -> list[dict[str, float | int | str]]:
    """Time each mixed point's fused pass, its decode-only step and its chunk's prefill alone
    (rows of :data:`MIXED_COLUMNS`); points in ``skip`` (the arena cannot hold them) are left
    out."""
    skipped = set(skip)
    todo = [p for p in points if p not in skipped]
    rows: list[dict[str, float | int | str]] = []
    with torch.inference_mode():
        for batch, context, chunk in tqdm(todo, desc="mixed", unit="point", disable=quiet):
            fused = measure_mixed((batch, context, chunk), bench)
            decode = measure_decode((batch, context), bench)
            prefill = measure_prefill((1, chunk), bench)
            modes = "/".join("graph" if t.graph else "eager" for t in (fused, decode, prefill))
            rows.append(
                {
                    "batch_size": batch,
                    "context_tokens": context,
                    "chunk_tokens": chunk,
                    "latency_s": fused.seconds,
                    "decode_only_s": decode.seconds,
                    "prefill_only_s": prefill.seconds,
                    "ratio": fused.seconds / (decode.seconds + prefill.seconds),
                    "modes": modes,
                }
            )
    return rows
