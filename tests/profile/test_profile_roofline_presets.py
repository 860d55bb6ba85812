"""The roofline prior's per-generation presets: coverage, overrides, and one step by hand."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from pdopt.errors import ConfigError, ParameterError
from pdopt.hardware import GPU_GENERATIONS, GPUS, GpuSpec, get_gpu
from pdopt.model_spec import decode_step_cost, get_model
from pdopt.profile import ROOFLINE_PRESETS, RooflineKnobs, roofline_knobs, roofline_profile


def _decode(rows, batch: int, total: int) -> float:  # type: ignore[no-untyped-def]
    hit = rows[
        (rows["kind"] == "decode")
        & (rows["batch_size"] == batch)
        & (rows["total_context_tokens"] == total)
    ]
    return float(hit["latency_s"].iloc[0])


def test_every_generation_and_catalogue_gpu_has_a_preset() -> None:
    assert set(ROOFLINE_PRESETS) == set(GPU_GENERATIONS)
    for gpu in GPUS.values():
        assert gpu.generation in GPU_GENERATIONS and gpu.generation != "unknown", gpu.name
        assert roofline_knobs(gpu) is ROOFLINE_PRESETS[gpu.generation]
    assert get_gpu("H200").generation == "hopper" and get_gpu("A100").generation == "ampere"
    assert get_gpu("MI300X").generation == "cdna3" and get_gpu("L40S").generation == "ada"


def test_defaults_are_the_preset_and_the_notes_say_so() -> None:
    knobs = ROOFLINE_PRESETS["hopper"]
    default = roofline_profile("H100", "Llama-3-8B")
    explicit = roofline_profile("H100", "Llama-3-8B", **dataclasses.asdict(knobs))
    assert default.rows.equals(explicit.rows)
    assert "hopper preset" in default.meta.notes
    assert f"compute_efficiency={knobs.compute_efficiency:.4g}" in default.meta.notes
    assert f"ridge_exponent={knobs.ridge_exponent:.4g}" in default.meta.notes


def test_explicit_knobs_override_the_preset() -> None:
    base = roofline_profile("H100", "Llama-3-8B", overhead_s=0.0).rows
    more = roofline_profile("H100", "Llama-3-8B", overhead_s=2e-3).rows
    steps = base["kind"] != "gemm"
    difference = (more.loc[steps, "latency_s"] - base.loc[steps, "latency_s"]).to_numpy()
    assert difference == pytest.approx(2e-3, rel=1e-9)
    slower = roofline_profile("H100", "Llama-3-8B", bandwidth_efficiency=0.4).rows
    assert _decode(slower, 1, 128) > 1.5 * _decode(base, 1, 128)
    assert "overhead_s=0.002" in roofline_profile("H100", "Llama-3-8B", overhead_s=2e-3).meta.notes


def test_tp2_decode_step_by_hand() -> None:
    """roofline + overhead + 2·L·(ring bytes / link + latency) + elementwise bytes / bandwidth."""
    knobs = RooflineKnobs(0.7, 0.8, 5e-4, 20e-6, 20.0, 2.0)
    rows = roofline_profile("A100-80GB", "Llama-2-70B", 2, **dataclasses.asdict(knobs)).rows
    model = get_model("Llama-2-70B")
    batch, total = 16, 16 * 1024
    cost = decode_step_cost(model, batch, total, 2)
    t_c = cost.flops / (0.7 * 312e12)
    t_m = cost.bytes / (0.8 * 2039e9)
    ring = 2 * (2 - 1) / 2 * batch * model.hidden_size * 2 / 300e9
    expected = (
        math.hypot(t_c, t_m)  # p = 2
        + 5e-4
        + 2 * model.num_layers * (ring + 20e-6)
        + 20 * model.num_layers * model.hidden_size * batch / (0.8 * 2039e9)
    )
    assert _decode(rows, batch, total) == pytest.approx(expected, rel=1e-12)


def test_hard_max_is_the_limit_of_large_exponents() -> None:
    hard = roofline_profile("H100", "Llama-3-8B", ridge_exponent=math.inf).rows
    steep = roofline_profile("H100", "Llama-3-8B", ridge_exponent=200.0).rows
    smooth = roofline_profile("H100", "Llama-3-8B", ridge_exponent=2.0).rows
    assert steep["latency_s"].to_numpy() == pytest.approx(hard["latency_s"].to_numpy(), rel=0.01)
    assert (smooth["latency_s"] >= hard["latency_s"]).all()
    with pytest.raises(ParameterError, match="'ridge_exponent' parameter of roofline_profile"):
        roofline_profile("H100", "Llama-3-8B", ridge_exponent=0.5)


def test_generation_is_checked_and_optional_in_spec_files(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="generation: expected one of"):
        GpuSpec("x", 1e15, 1e11, 1e12, 1e11, 10.0, 100.0, generation="pascal")
    base = "[gpu]\npeak_flops = 1e15\nmemory_bytes = 8e10\nhbm_bw_bytes_per_s = 3e12\n"
    base += "link_bw_bytes_per_s = 4e11\nidle_power_w = 50.0\nmax_power_w = 700.0\n"
    (tmp_path / "plain.toml").write_text(base)
    (tmp_path / "new.toml").write_text(base + 'generation = "blackwell"\n')
    (tmp_path / "bad.toml").write_text(base + 'generation = "fast"\n')
    assert get_gpu(str(tmp_path / "plain.toml")).generation == "unknown"
    assert get_gpu(str(tmp_path / "new.toml")).generation == "blackwell"
    with pytest.raises(ConfigError, match=r"bad.toml \[gpu\].*generation"):
        get_gpu(str(tmp_path / "bad.toml"))
    assert (
        "unknown preset" in roofline_profile(str(tmp_path / "plain.toml"), "Llama-3-8B").meta.notes
    )
