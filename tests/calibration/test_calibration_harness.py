"""Tests of the GPU profiling harness (run here on the CPU, tiny shape)."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from calibration import _sweeps  # noqa: E402
from calibration._config import (  # noqa: E402
    load_model_spec,
    parse_hf_config,
    shard_for_tp,
    tiny_model_spec,
)
from calibration._layout import MIXED_COLUMNS  # noqa: E402
from calibration._model import Decoder, allocate_kv_arena, attend  # noqa: E402
from calibration._sweeps import (  # noqa: E402
    Bench,
    SweepGrid,
    Timing,
    make_grid,
    measure_decode,
    plan_memory,
    run_mixed_sweep,
    same_outputs,
    time_callable,
)
from calibration.profile_gpu import (  # noqa: E402
    SOURCE,
    HarnessOptions,
    _notes,
    main,
    mixed_path,
)
from pdopt.errors import ConfigError, FitQualityWarning, InputError, ParameterError  # noqa: E402
from pdopt.model_spec import ModelSpec, get_model  # noqa: E402
from pdopt.profile import ROW_KINDS, read_profile  # noqa: E402

CPU = torch.device("cpu")

QWEN_CONFIG: dict[str, Any] = {
    "_name_or_path": "Qwen/Qwen2.5-7B",
    "model_type": "qwen2",
    "num_hidden_layers": 28,
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rope_theta": 1000000.0,
}


def _tiny_decoder(max_positions: int = 64) -> Decoder:
    return Decoder(tiny_model_spec(), 2, max_positions, CPU, torch.float32, seed=0)


def _grid(
    spec: ModelSpec, tiny: bool = False, max_input: int | None = None, mixed: bool = False
) -> SweepGrid:
    return make_grid(
        spec, tiny=tiny, max_input=max_input, max_batch=None, warmup=1, repeats=3, mixed=mixed
    )


def _write_config(tmp_path: Path, config: dict[str, Any] | str) -> Path:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config), encoding="utf-8")
    return path


# --- end to end ----------------------------------------------------------------------------


def test_tiny_cpu_run_writes_a_valid_profile_with_all_row_kinds(tmp_path: Path) -> None:
    out = tmp_path / "profiles" / "tiny.csv"
    assert main(["--device", "cpu", "--tiny", "--quiet", "--out", str(out)]) == 0
    profile = read_profile(out)
    assert profile.meta.gpu == "cpu"
    assert profile.meta.source == SOURCE
    assert (profile.meta.model, profile.meta.dtype, profile.meta.tp) == ("tiny", "float32", 1)
    grid = _grid(tiny_model_spec(), tiny=True)
    counts = profile.rows["kind"].value_counts().to_dict()
    assert counts == {
        "gemm": len(grid.gemm_shapes),
        "prefill": len(grid.prefill_points),
        "decode": len(grid.decode_points),
    }
    assert set(counts) == set(ROW_KINDS) - {"hybrid"}  # mixed batches are not measured (yet)
    assert (profile.rows["latency_s"] > 0).all()
    decode = profile.of_kind("decode")
    expected = sorted(b * c for b, c in grid.decode_points)
    assert sorted(decode["total_context_tokens"].astype(int)) == expected


def test_tiny_cpu_profile_loads_and_fits(tmp_path: Path) -> None:
    try:
        from pdopt.costmodel import fit_decode, fit_prefill
    except ImportError:  # the fitting functions arrive with pdopt.costmodel._fit
        pytest.skip("pdopt.costmodel has no fit_prefill/fit_decode yet")
    out = tmp_path / "tiny.csv"
    assert main(["--device", "cpu", "--tiny", "--quiet", "--out", str(out)]) == 0
    profile = read_profile(out)
    with warnings.catch_warnings():
        # A tiny CPU run is dominated by Python overhead, so R² is low: a quality warning,
        # not an error, is the expected outcome here.
        warnings.simplefilter("ignore", FitQualityWarning)
        prefill, prefill_report = fit_prefill(profile)
        decode, decode_report = fit_decode(profile)
    assert prefill_report.n_points == len(profile.of_kind("prefill"))
    assert decode_report.n_points == len(profile.of_kind("decode"))
    assert prefill.p_peak_flops > 0 and prefill.batch_time_s([8, 32]) > 0
    assert decode.iteration_time_s(4, 128) > 0


def test_fewer_built_layers_are_scaled_and_noted(tmp_path: Path) -> None:
    out = tmp_path / "scaled.csv"
    argv = ["--device", "cpu", "--tiny", "--quiet", "--layers", "1", "--repeats", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    profile = read_profile(out)
    assert "built 1 of 2 layers" in profile.meta.notes
    assert (profile.rows["latency_s"] > 0).all()


def test_caps_shrink_the_sweeps(tmp_path: Path) -> None:
    out = tmp_path / "capped.csv"
    argv = ["--device", "cpu", "--tiny", "--quiet", "--max-input", "16", "--max-batch", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    rows = read_profile(out).rows
    assert rows["input_tokens"].max() == 16
    assert rows["batch_size"].max() == 2


def test_bad_config_file_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write_config(tmp_path, {k: v for k, v in QWEN_CONFIG.items() if k != "hidden_size"})
    out = tmp_path / "never.csv"
    assert main(["--device", "cpu", "--quiet", "--model", str(config), "--out", str(out)]) == 2
    assert "config.json: hidden_size is missing" in capsys.readouterr().err
    assert not out.exists()


def test_model_is_required_without_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cpu", "--out", str(tmp_path / "x.csv")]) == 2
    assert "--model is required" in capsys.readouterr().err


# --- the decoder ---------------------------------------------------------------------------


def test_decoder_forward_shapes() -> None:
    model = _tiny_decoder()
    tokens = torch.randint(0, 256, (3, 10), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert model(tokens).shape == (3, 256)
        assert model(tokens, all_logits=True).shape == (3, 10, 256)
        assert model(tokens, run_layers=False).shape == (3, 256)
    assert len(model.layers) == 2


def test_prefill_is_causal() -> None:
    model = _tiny_decoder()
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 256
    with torch.inference_mode():
        before = model(tokens, all_logits=True)
        after = model(changed, all_logits=True)
    torch.testing.assert_close(after[:, :7], before[:, :7], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after[:, 7:], before[:, 7:], atol=1e-3)


def test_an_earlier_token_changes_later_logits() -> None:
    model = _tiny_decoder()
    tokens = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(2))
    changed = tokens.clone()
    changed[0, 0] = (changed[0, 0] + 1) % 256
    with torch.inference_mode():
        assert not torch.allclose(model(tokens), model(changed), atol=1e-3)


def test_decode_step_over_the_kv_cache_matches_a_longer_prefill() -> None:
    spec = tiny_model_spec()
    model = _tiny_decoder()
    arena = allocate_kv_arena(spec, 2, capacity_tokens=2 * 16, device=CPU, dtype=torch.float32)
    tokens = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(3))
    caches = arena.views(2, 11)
    with torch.inference_mode():
        model(tokens[:, :10], 0, caches)  # fills positions 0..9
        decoded = model(tokens[:, 10:], 10, caches)  # writes position 10, attends over 0..10
        reference = model(tokens)
    torch.testing.assert_close(decoded, reference, rtol=1e-4, atol=1e-4)


def test_gqa_attention_equals_repeated_kv_heads() -> None:
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 5, 8, generator=gen)
    k, v = torch.randn(2, 2, 5, 8, generator=gen), torch.randn(2, 2, 5, 8, generator=gen)
    repeated = attend(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), causal=True)
    torch.testing.assert_close(attend(q, k, v, causal=True), repeated)


def test_same_seed_builds_the_same_weights() -> None:
    one, two = _tiny_decoder(), _tiny_decoder()
    for a, b in zip(one.parameters(), two.parameters(), strict=True):
        assert torch.equal(a, b)


def test_arena_refuses_more_tokens_than_it_holds() -> None:
    arena = allocate_kv_arena(tiny_model_spec(), 1, 8, CPU, torch.float32)
    assert arena.views(2, 4)[0][0].shape == (2, 2, 4, 16)
    with pytest.raises(ValueError, match="exceeds"):
        arena.views(3, 4)


# --- Hugging Face config parser ------------------------------------------------------------


def test_hf_config_parses_to_the_catalogue_shape(tmp_path: Path) -> None:
    spec = parse_hf_config(_write_config(tmp_path, QWEN_CONFIG))
    catalogue = get_model("Qwen2.5-7B")
    assert spec.name == "Qwen/Qwen2.5-7B"
    fields = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim")
    fields += ("intermediate_size", "vocab_size", "dtype", "qkv_bias", "tied_embeddings")
    for field in fields:
        assert getattr(spec, field) == getattr(catalogue, field), field


def test_hf_config_defaults_mha_head_dim_and_dtype(tmp_path: Path) -> None:
    dropped = ("num_key_value_heads", "torch_dtype", "model_type")
    config = {k: v for k, v in QWEN_CONFIG.items() if k not in dropped}
    config["head_dim"] = 64
    spec = parse_hf_config(_write_config(tmp_path, config))
    assert (spec.num_kv_heads, spec.head_dim, spec.dtype, spec.qkv_bias) == (
        28,
        64,
        "float16",
        False,
    )


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(1, 200),
    kv_heads=st.integers(1, 16),
    group=st.integers(1, 8),
    head_dim=st.sampled_from([32, 64, 128, 256]),
    intermediate=st.integers(1, 50_000),
    vocab=st.integers(1, 300_000),
    dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
)
def test_hf_config_round_trips_any_valid_shape(
    layers: int, kv_heads: int, group: int, head_dim: int, intermediate: int, vocab: int, dtype: str
) -> None:
    heads = kv_heads * group
    config = {
        "num_hidden_layers": layers,
        "hidden_size": heads * head_dim,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "torch_dtype": dtype,
    }
    with tempfile.TemporaryDirectory() as folder:
        spec = parse_hf_config(_write_config(Path(folder), config))
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads) == (layers, heads, kv_heads)
    assert (spec.head_dim, spec.intermediate_size) == (head_dim, intermediate)
    assert (spec.vocab_size, spec.dtype) == (vocab, dtype)


def test_load_model_spec_takes_a_path_a_folder_or_a_name(tmp_path: Path) -> None:
    path = _write_config(tmp_path, QWEN_CONFIG)
    assert load_model_spec(str(path)).num_layers == 28
    assert load_model_spec(tmp_path).hidden_size == 3584
    assert load_model_spec("Llama-3.1-8B") == get_model("Llama-3.1-8B")
    with pytest.raises(ParameterError, match="unknown model"):
        load_model_spec("no-such-model")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": None}, "config.json: hidden_size is missing"),
        ({"num_hidden_layers": -2}, "config.json: num_hidden_layers=-2 must be an integer >= 1"),
        ({"vocab_size": 3.5}, "vocab_size=3.5 must be an integer >= 1"),
        ({"num_key_value_heads": 5}, "num_key_value_heads=5 must divide num_attention_heads=28"),
        ({"torch_dtype": "float64"}, "torch_dtype='float64' must be one of"),
    ],
)
def test_bad_hf_config_raises_input_error(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    config = {k: v for k, v in {**QWEN_CONFIG, **change}.items() if v is not None}
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_hf_config(_write_config(tmp_path, config))


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", r"config.json line 1: not valid JSON"), ("[1, 2]", "must hold a JSON object")],
)
def test_unreadable_hf_config_raises_input_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_hf_config(_write_config(tmp_path, text))


def test_missing_config_file_raises_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read model config"):
        load_model_spec(tmp_path / "absent.json")


# --- sharding, grids, memory planning, timing ----------------------------------------------


def test_tp_shard_splits_heads_and_replicates_kv_heads() -> None:
    spec = get_model("Qwen2.5-7B")  # 28 heads, 4 KV heads
    assert shard_for_tp(spec, 1) is spec
    two = shard_for_tp(spec, 2)
    assert (two.num_heads, two.num_kv_heads, two.intermediate_size) == (14, 2, 9472)
    assert shard_for_tp(get_model("Llama-3-70B"), 8).num_kv_heads == 1
    with pytest.raises(InputError, match="not divisible by tp=3"):
        shard_for_tp(spec, 3)


def test_full_grid_covers_the_issue_ranges() -> None:
    grid = _grid(get_model("Qwen2.5-7B"))
    assert {t for _, t in grid.prefill_points} == {128, 256, 512, 1024, 2048, 4096, 8192}
    assert {b for b, _ in grid.prefill_points} == {1, 2, 4, 8}
    assert {b for b, _ in grid.decode_points} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert (3584, 3584, 3584) not in grid.gemm_shapes  # square shapes are powers of two
    assert (8192, 2 * 18944, 3584) in grid.gemm_shapes  # gate/up at 8192 tokens
    with pytest.raises(ConfigError, match="--max-input 64 leaves no input lengths"):
        _grid(get_model("Qwen2.5-7B"), max_input=64)


def test_memory_plan_builds_few_layers_for_a_big_cache() -> None:
    spec = get_model("Qwen2.5-7B")
    grid = _grid(spec)
    plan = plan_memory(spec, grid, 2, free_bytes=79 * 2**30)
    # 256 × 8192 tokens of KV is 4.3 GB per layer: 28 layers (120 GB) cannot fit in 79 GiB.
    assert 1 <= plan.built_layers < spec.num_layers
    assert plan.arena_tokens == 256 * 8192 and plan.skipped_decode == ()
    roomy = plan_memory(spec, grid, 2, free_bytes=10**15)
    assert roomy.built_layers == spec.num_layers


def test_memory_plan_skips_decode_points_that_cannot_fit() -> None:
    spec = get_model("Llama-30B")  # MHA: 52 KV heads, 56 GB of KV per layer at 256 × 8192
    grid = _grid(spec)
    plan = plan_memory(spec, grid, 2, free_bytes=40 * 2**30)
    assert plan.built_layers == 1
    assert (256, 8192) in plan.skipped_decode and (1, 128) not in plan.skipped_decode
    assert all(b * c > plan.arena_tokens for b, c in plan.skipped_decode)
    with pytest.raises(ConfigError, match="GiB free"):
        plan_memory(spec, grid, 2, free_bytes=2 * 2**30)


def test_time_callable_on_cpu_is_the_median_of_positive_samples() -> None:
    calls: list[int] = []
    seconds = time_callable(lambda: calls.append(1), CPU, warmup=2, repeats=5)
    assert len(calls) == 7 and seconds > 0


def test_cuda_timing_reads_events_only_after_synchronizing(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            log.append("record")

        def elapsed_time(self, end: FakeEvent) -> float:
            assert log[-1] == "sync", "elapsed_time read before torch.cuda.synchronize()"
            return 2.0  # milliseconds

    monkeypatch.setattr(_sweeps.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(_sweeps.torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    monkeypatch.setattr(_sweeps.time, "perf_counter", lambda: pytest.fail("host clock used"))
    seconds = time_callable(lambda: log.append("run"), torch.device("cuda", 0), 1, 3)
    assert seconds == pytest.approx(2e-3)
    assert log == ["run", "sync"] + ["record", "run", "record"] * 3 + ["sync"]


def test_tiny_shape_is_a_valid_model_spec() -> None:
    spec = tiny_model_spec()
    assert isinstance(spec, ModelSpec)
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads) == (2, 64, 4, 2)


# --- CUDA graphs (refused on the CPU; capture and fallback plumbing) and mixed batches ------


def _tiny_bench(graphs: bool, layers: int = 2) -> Bench:
    spec = tiny_model_spec()
    model = Decoder(spec, layers, 64, CPU, torch.float32, seed=0)
    arena = allocate_kv_arena(spec, layers, 256, CPU, torch.float32)
    return Bench(model, arena, spec.num_layers, Timing(CPU, 0, 1), graphs=graphs)


def test_cuda_graphs_on_the_cpu_are_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never.csv"
    argv = ["--device", "cpu", "--tiny", "--quiet", "--cuda-graphs", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--cuda-graphs needs a CUDA device" in err and "cpu" in err
    assert not out.exists()


def test_mixed_run_writes_the_mixed_csv_beside_the_profile(tmp_path: Path) -> None:
    out = tmp_path / "tiny.csv"
    assert main(["--device", "cpu", "--tiny", "--quiet", "--mixed", "--out", str(out)]) == 0
    assert mixed_path(out) == tmp_path / "tiny_mixed.csv"
    profile = read_profile(out)  # the profile itself keeps its row kinds (no hybrid rows)
    assert set(profile.rows["kind"]) == {"gemm", "prefill", "decode"}
    assert "mixed batches" in profile.meta.notes and "no CUDA graphs" in profile.meta.notes
    text = mixed_path(out).read_text(encoding="utf-8")
    assert text.startswith("# gpu: cpu\n# model: tiny\n")
    rows = pd.read_csv(mixed_path(out), comment="#")
    assert tuple(rows.columns) == MIXED_COLUMNS
    grid = _grid(tiny_model_spec(), tiny=True, mixed=True)
    shapes = list(
        zip(rows["batch_size"], rows["context_tokens"], rows["chunk_tokens"], strict=True)
    )
    assert shapes == list(grid.mixed_points) and len(shapes) == 4
    for column in ("latency_s", "decode_only_s", "prefill_only_s", "ratio"):
        assert (rows[column] > 0).all(), column
    ratio = rows["latency_s"] / (rows["decode_only_s"] + rows["prefill_only_s"])
    assert (abs(rows["ratio"] / ratio - 1) < 1e-4).all()
    assert (rows["modes"] == "eager/eager/eager").all()


def test_without_mixed_no_mixed_csv_is_written(tmp_path: Path) -> None:
    out = tmp_path / "tiny.csv"
    assert main(["--device", "cpu", "--tiny", "--quiet", "--out", str(out)]) == 0
    assert not mixed_path(out).exists()


def test_fused_pass_equals_a_decode_step_and_a_chunk_prefill() -> None:
    spec = tiny_model_spec()
    model = _tiny_decoder()
    batch, context, chunk = 3, 12, 9
    arena = allocate_kv_arena(spec, 2, batch * context + chunk, CPU, torch.float32)
    gen = torch.Generator().manual_seed(5)
    decode_ids = torch.randint(0, 256, (batch, 1), generator=gen)
    chunk_ids = torch.randint(0, 256, (1, chunk), generator=gen)
    decode_caches = arena.views(batch, context)
    chunk_caches = arena.views(1, chunk, offset_tokens=batch * context)
    with torch.inference_mode():
        decoded = model(decode_ids, context - 1, decode_caches)
        prefilled = model(chunk_ids, 0, chunk_caches)
        written = (arena.keys.clone(), arena.values.clone())
        arena.keys.normal_(generator=gen)  # the fused pass must write the new entries itself,
        arena.values.normal_(generator=gen)  # so the chunk's and the new decode tokens' differ
        arena.keys[:, : batch * context * 2 * 16] = written[0][:, : batch * context * 2 * 16]
        arena.values[:, : batch * context * 2 * 16] = written[1][:, : batch * context * 2 * 16]
        fused_decode, fused_chunk = model.forward_mixed(
            decode_ids, context, decode_caches, chunk_ids, chunk_caches
        )
        head_only = model.forward_mixed(
            decode_ids, context, decode_caches, chunk_ids, chunk_caches, run_layers=False
        )
    assert fused_decode.shape == (batch, 256) and fused_chunk.shape == (1, 256)
    torch.testing.assert_close(fused_decode, decoded, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused_chunk, prefilled, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(arena.keys, written[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(arena.values, written[1], rtol=1e-5, atol=1e-5)
    assert head_only[0].shape == (batch, 256) and head_only[1].shape == (1, 256)


def test_fused_pass_rejects_bad_shapes_and_positions() -> None:
    spec = tiny_model_spec()
    model = _tiny_decoder(max_positions=16)
    arena = allocate_kv_arena(spec, 2, 64, CPU, torch.float32)
    ids = torch.zeros((2, 1), dtype=torch.long)
    with pytest.raises(ValueError, match="decode_ids"):
        model.forward_mixed(ids.view(1, 2), 4, arena.views(1, 4), ids, arena.views(1, 2, 8))
    with pytest.raises(ValueError, match="max_positions=16"):
        model.forward_mixed(ids, 17, arena.views(2, 17), ids.view(1, 2), arena.views(1, 2, 40))


def test_arena_views_at_an_offset_are_disjoint() -> None:
    arena = allocate_kv_arena(tiny_model_spec(), 1, 12, CPU, torch.float32)
    first, second = arena.views(2, 4)[0][0], arena.views(1, 4, offset_tokens=8)[0][0]
    assert second.shape == (1, 2, 4, 16)
    assert second.data_ptr() == first.data_ptr() + 8 * 2 * 16 * first.element_size()
    with pytest.raises(ValueError, match="exceeds"):
        arena.views(1, 5, offset_tokens=8)


def test_mixed_grid_is_small_capped_and_sizes_the_plan() -> None:
    spec = get_model("Qwen2.5-7B")
    grid = make_grid(
        spec, tiny=False, max_input=None, max_batch=None, warmup=1, repeats=3, mixed=True
    )
    assert set(grid.mixed_points) == {(b, 1024, p) for b in (8, 32, 128) for p in (256, 1024, 2048)}
    plain = _grid(spec)
    assert plain.mixed_points == ()
    # the mixed points change neither the layers built nor the arena
    assert plan_memory(spec, grid, 2, 79 * 2**30) == plan_memory(spec, plain, 2, 79 * 2**30)
    capped = make_grid(
        spec, tiny=False, max_input=1024, max_batch=32, warmup=1, repeats=3, mixed=True
    )
    assert set(capped.mixed_points) == {(b, 1024, p) for b in (8, 32) for p in (256, 1024)}
    with pytest.raises(ConfigError, match="--max-input 512 leaves no mixed context lengths"):
        make_grid(spec, tiny=False, max_input=512, max_batch=None, warmup=1, repeats=3, mixed=True)
    small = make_grid(spec, tiny=False, max_input=512, max_batch=None, warmup=1, repeats=3)
    assert small.mixed_points == ()  # the caps only matter to --mixed
    tiny = _grid(tiny_model_spec(), tiny=True, mixed=True)
    assert tiny.max_kv_tokens == max(4 * 32, 4 * 16 + 16)


def test_failed_capture_falls_back_to_eager_and_is_recorded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(fn: Any, device: Any) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(_sweeps, "capture_graph", refuse)
    bench = _tiny_bench(graphs=True, layers=1)  # 1 of 2 layers: the head-only pass too
    with torch.inference_mode():
        timed = measure_decode((2, 8), bench)
    assert timed.seconds > 0 and not timed.graph
    assert bench.fallbacks == [
        "decode 2x8: RuntimeError: operation not permitted when stream is capturing",
        "decode 2x8 (head only): RuntimeError: operation not permitted when stream is capturing",
    ]
    assert "CUDA graph capture failed, timing eagerly: decode 2x8" in capsys.readouterr().err
    rows = run_mixed_sweep([(2, 8, 4)], bench, quiet=True)
    assert rows[0]["modes"] == "eager/eager/eager" and len(bench.fallbacks) == 8


def test_captured_passes_are_timed_as_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[Any] = []

    def fake_capture(fn: Any, device: Any) -> Any:
        captured.append(fn())  # a stand-in "graph": run once, replay by calling again
        return fn

    monkeypatch.setattr(_sweeps, "capture_graph", fake_capture)
    bench = _tiny_bench(graphs=True)
    rows = run_mixed_sweep([(2, 8, 4), (4, 8, 4)], bench, [(4, 8, 4)], quiet=True)
    assert len(rows) == 1 and rows[0]["modes"] == "graph/graph/graph"
    assert bench.fallbacks == [] and len(captured) == 3
    assert isinstance(captured[0], tuple)  # the fused pass: decode and chunk logits
    eager = _tiny_bench(graphs=False)
    monkeypatch.setattr(_sweeps, "capture_graph", lambda fn, device: pytest.fail("captured"))
    assert run_mixed_sweep([(2, 8, 4)], eager, quiet=True)[0]["modes"] == "eager/eager/eager"


def test_same_outputs_compares_tensors_and_tuples() -> None:
    a = torch.tensor([1.0, 2.0, float("nan")])
    assert same_outputs(a, a.clone())
    assert same_outputs((a, a), (a + 0.01, a))
    assert not same_outputs(a, a + 1.0)
    assert not same_outputs(a, a[:2])
    assert not same_outputs((a,), (a, a))
    assert not same_outputs(a, torch.tensor([1.0, 2.0, 3.0]))  # NaN against a number
    inf = torch.tensor([1.0, float("inf")])
    assert same_outputs(inf, inf.clone()) and not same_outputs(inf, -inf)
    # rounding in a few of many 16-bit logits passes; nothing computed (zeros) does not
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(6)).half()
    noisy = logits.clone()
    noisy[0, :5] += 0.2
    assert same_outputs(noisy, logits)
    assert not same_outputs(torch.zeros_like(logits), logits)
    assert not same_outputs(logits[:, torch.randperm(1000)], logits)


def test_notes_say_how_the_passes_ran() -> None:
    spec = tiny_model_spec()
    grid = make_grid(
        spec, tiny=True, max_input=None, max_batch=None, warmup=1, repeats=3, mixed=True
    )
    plan = plan_memory(spec, grid, 4, 2**34)
    graphs = HarnessOptions(model=None, device="cuda", tiny=True, cuda_graphs=True, mixed=True)
    fallbacks = [f"decode 1x{c}: RuntimeError: x" for c in (8, 16, 32, 64)]
    notes = _notes(graphs, spec, grid, plan, fallbacks)
    assert "CUDA graphs: every prefill, decode and mixed forward pass captured" in notes
    assert "failed for 4 pass(es), timed eagerly instead: decode 1x8: RuntimeError: x;" in notes
    assert notes.count("decode 1x") == 3 and "; ..." in notes
    assert "_mixed.csv" in notes
    assert "failed" not in _notes(graphs, spec, grid, plan, [])
    eager = HarnessOptions(model=None, device="cpu", tiny=True)
    assert "no CUDA graphs" in _notes(eager, spec, _grid(spec, tiny=True), plan)


class _FakeCuda:
    """Stand-ins for the torch.cuda calls of capture_graph, logging the order they run in."""

    def __init__(self, fail_capture_end: bool = False) -> None:
        self.log: list[str] = []
        self.fail_capture_end = fail_capture_end
        log = self.log
        fake = self

        class Stream:
            def __init__(self, name: Any = "side") -> None:
                self.name = name if isinstance(name, str) else "side"

            def wait_stream(self, other: Any) -> None:
                log.append(f"{self.name} waits {other.name}")

        class Graph:
            def replay(self) -> None:
                log.append("replay")

        class GraphContext:
            def __init__(self, graph: Any, stream: Any = None) -> None:
                assert isinstance(graph, Graph) and stream.name == "side"

            def __enter__(self) -> None:
                log.append("capture begin")

            def __exit__(self, *args: object) -> None:
                log.append("capture end")
                if fake.fail_capture_end:
                    raise RuntimeError("capture invalidated")

        class StreamContext:
            def __init__(self, stream: Any) -> None:
                self.stream = stream

            def __enter__(self) -> None:
                log.append(f"on {self.stream.name}")

            def __exit__(self, *args: object) -> None:
                log.append("off")

        self.default = Stream("default")
        self.Stream, self.CUDAGraph, self.graph, self.stream = (
            Stream,
            Graph,
            GraphContext,
            StreamContext,
        )

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = _sweeps.torch.cuda
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: self.default)
        monkeypatch.setattr(cuda, "Stream", self.Stream)
        monkeypatch.setattr(cuda, "stream", self.stream)
        monkeypatch.setattr(cuda, "CUDAGraph", self.CUDAGraph)
        monkeypatch.setattr(cuda, "graph", self.graph)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: self.log.append("sync"))
        monkeypatch.setattr(cuda, "set_stream", lambda s: self.log.append(f"set {s.name}"))


def test_capture_graph_warms_up_captures_replays_and_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeCuda()
    fake.install(monkeypatch)
    out = torch.ones(3)

    def forward() -> Any:
        fake.log.append("run")
        return (out, out * 2)

    replay = _sweeps.capture_graph(forward, torch.device("cuda", 0))
    assert fake.log == [
        "side waits default",
        "on side",
        "run",  # the eager warm-up on the side stream
        "off",
        "default waits side",
        "sync",
        "capture begin",
        "run",
        "capture end",
        "replay",  # checked against the warm-up's outputs
        "sync",
    ]
    result = replay()
    assert fake.log[-1] == "replay" and torch.equal(result[1], out * 2)


def test_capture_graph_refuses_a_replay_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeCuda().install(monkeypatch)
    values = iter([torch.zeros(2), torch.ones(2)])
    with pytest.raises(RuntimeError, match="does not reproduce"):
        _sweeps.capture_graph(lambda: next(values), torch.device("cuda", 0))


def test_capture_graph_restores_the_stream_when_capture_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeCuda(fail_capture_end=True)
    fake.install(monkeypatch)
    with pytest.raises(RuntimeError, match="capture invalidated"):
        _sweeps.capture_graph(lambda: torch.ones(1), torch.device("cuda", 0))
    assert fake.log[-2:] == ["capture end", "set default"]
