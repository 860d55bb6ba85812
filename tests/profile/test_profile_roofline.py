"""The roofline prior: closed forms, monotonicity, determinism, and the shipped files."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest

from pdopt.costmodel import read_parameter_file
from pdopt.errors import ConfigError, ParameterError
from pdopt.hardware import get_gpu
from pdopt.model_spec import gemm_param_count, get_model, kv_capacity_tokens, prefill_cost
from pdopt.profile import read_profile, roofline_profile

PROFILES = Path(__file__).resolve().parents[2] / "profiles"

# The hard-max roofline without the fixed terms, so the closed forms below stay short (the
# presets' terms are tested in test_profile_roofline_presets.py).
COMPUTE_EFFICIENCY, BANDWIDTH_EFFICIENCY, OVERHEAD_S = 0.65, 0.7, 1e-3
PLAIN = {
    "compute_efficiency": COMPUTE_EFFICIENCY,
    "bandwidth_efficiency": BANDWIDTH_EFFICIENCY,
    "overhead_s": OVERHEAD_S,
    "all_reduce_latency_s": 0.0,
    "elementwise_bytes": 0.0,
    "ridge_exponent": math.inf,
    "kernel_latency_s": 0.0,
    "all_reduce_peer_latency_s": 0.0,
    "all_reduce_bandwidth_efficiency": 1.0,
    "all_reduce_switch_min_gpus": math.inf,
}


@pytest.fixture(scope="module")
def v100_qwen() -> pd.DataFrame:
    return roofline_profile("V100-32GB", "Qwen2.5-7B", **PLAIN).rows  # type: ignore[arg-type]


def test_rows_and_meta() -> None:
    profile = roofline_profile(get_gpu("H800"), get_model("Llama-3-8B"))
    assert profile.meta.source == "roofline"
    assert (profile.meta.gpu, profile.meta.model, profile.meta.tp) == ("H800", "Llama-3-8B", 1)
    counts = profile.rows["kind"].value_counts().to_dict()
    capacity = kv_capacity_tokens(get_gpu("H800"), get_model("Llama-3-8B"))
    grid = [
        b * c
        for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)
        for c in (128, 256, 512, 1024, 2048, 4096, 8192)
    ]
    expected_decode = sum(total <= capacity for total in grid)
    assert counts == {"gemm": 24, "prefill": 28, "decode": expected_decode}
    assert f"{len(grid) - expected_decode} decode points beyond it left out" in profile.meta.notes


def test_gemm_rows_peak_at_sustained_peak(v100_qwen: pd.DataFrame) -> None:
    gemm = v100_qwen[v100_qwen["kind"] == "gemm"]
    achieved = 2 * gemm["m"] * gemm["n"] * gemm["k"] / gemm["latency_s"]
    sustained = COMPUTE_EFFICIENCY * 125e12
    assert achieved.max() == pytest.approx(sustained, rel=1e-12)
    assert (achieved <= sustained * (1 + 1e-12)).all()


def test_long_prefill_is_compute_bound(v100_qwen: pd.DataFrame) -> None:
    prefill = v100_qwen[(v100_qwen["kind"] == "prefill") & (v100_qwen["batch_size"] == 1)]
    longest = prefill[prefill["input_tokens"] == 8192].iloc[0]
    flops = prefill_cost(get_model("Qwen2.5-7B"), 8192).flops
    expected = flops / (COMPUTE_EFFICIENCY * 125e12) + OVERHEAD_S
    assert longest["latency_s"] == pytest.approx(expected, rel=1e-12)


def test_short_decode_is_bandwidth_bound(v100_qwen: pd.DataFrame) -> None:
    decode = v100_qwen[(v100_qwen["kind"] == "decode") & (v100_qwen["batch_size"] == 1)]
    # One token reads the layer and LM-head weights (not the embedding table) at 0.7 × 900 GB/s.
    model = get_model("Qwen2.5-7B")
    weights = (gemm_param_count(model) + model.vocab_size * model.hidden_size) * 2
    kv = (128 + 1) * model.kv_bytes_per_token
    expected = (weights + kv) / (BANDWIDTH_EFFICIENCY * 900e9) + OVERHEAD_S
    assert decode["latency_s"].min() == pytest.approx(expected, rel=1e-12)
    assert 0.02 < expected < 0.03  # about 23 ms per step for a 7B model on a V100


def test_monotone_in_tokens_and_batch(v100_qwen: pd.DataFrame) -> None:
    prefill = v100_qwen[v100_qwen["kind"] == "prefill"]
    for _, group in prefill.groupby("batch_size"):
        assert np.all(np.diff(group.sort_values("input_tokens")["latency_s"]) > 0)
    for _, group in prefill.groupby("input_tokens"):
        assert np.all(np.diff(group.sort_values("batch_size")["latency_s"]) > 0)
    decode = v100_qwen[v100_qwen["kind"] == "decode"]
    for _, group in decode.groupby("batch_size"):
        assert np.all(np.diff(group.sort_values("total_context_tokens")["latency_s"]) > 0)


def test_points_beyond_kv_capacity_are_left_out(v100_qwen: pd.DataFrame) -> None:
    decode = v100_qwen[v100_qwen["kind"] == "decode"]
    assert decode["total_context_tokens"].max() <= 254_931
    assert len(decode) == 63 - 10


def test_tp_adds_all_reduce_and_splits_work() -> None:
    plain = {**PLAIN, "overhead_s": 0.0}
    one = roofline_profile("A100-80GB", "Llama-2-70B", 2, **plain).rows  # type: ignore[arg-type]
    four = roofline_profile("A100-80GB", "Llama-2-70B", 4, **plain).rows  # type: ignore[arg-type]
    p1 = one[(one["kind"] == "prefill") & (one["input_tokens"] == 4096)]["latency_s"].iloc[0]
    p4 = four[(four["kind"] == "prefill") & (four["input_tokens"] == 4096)]["latency_s"].iloc[0]
    model, link = get_model("Llama-2-70B"), 300e9
    message = 4096 * model.hidden_size * 2

    def all_reduce(tp: int) -> float:  # two ring all-reduces per layer
        return 2 * model.num_layers * 2 * (tp - 1) / tp * message / link

    # Compute halves from tp=2 to tp=4; the all-reduce traffic per GPU grows.
    assert p4 - all_reduce(4) == pytest.approx((p1 - all_reduce(2)) / 2, rel=1e-9)
    assert p1 / 2 < p4 < p1


def test_seed_makes_reproducible_noise() -> None:
    exact = roofline_profile("L20", "Llama-2-7B").rows
    first = roofline_profile("L20", "Llama-2-7B", seed=7).rows
    again = roofline_profile("L20", "Llama-2-7B", seed=7).rows
    other = roofline_profile("L20", "Llama-2-7B", seed=8).rows
    pd.testing.assert_frame_equal(first, again)
    assert not first["latency_s"].equals(other["latency_s"])
    ratio = first["latency_s"] / exact["latency_s"]
    assert ratio.min() > 0.8 and ratio.max() < 1.25


def test_bad_parameters() -> None:
    with pytest.raises(ParameterError, match="'compute_efficiency' parameter of roofline_profile"):
        roofline_profile("H100", "Llama-3-8B", compute_efficiency=0)
    with pytest.raises(ConfigError, match="does not fit on L20"):
        roofline_profile("L20", "CodeLlama-34B", 1)


def _load_generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "pdopt_profiles_generate", PROFILES / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_shipped_files_equal_regenerated_ones() -> None:
    texts = _load_generate().all_texts()
    assert "v100-32gb_qwen2.5-7b_roofline.csv" in texts
    for name, text in texts.items():
        assert (PROFILES / name).read_text(encoding="utf-8") == text, name


def test_shipped_profiles_read_back() -> None:
    for path in sorted(PROFILES.glob("*_roofline.csv")):
        profile = read_profile(path)
        get_model(profile.meta.model)  # the metadata names a catalogued model
        assert profile.meta.source == "roofline"
        assert set(profile.rows["kind"]) == {"gemm", "prefill", "decode"}


def test_phasor_constants_are_published_values_in_si_units() -> None:
    params = read_parameter_file(PROFILES / "phasor_v100_qwen2.5-7b.json")
    assert params.source.startswith("published constants")
    assert params.prefill.alpha_flop_per_token2 == pytest.approx(4.25e-5 * 1e12)
    assert params.prefill.beta_flop_per_token == pytest.approx(6.8e-3 * 1e12)
    assert params.prefill.p_peak_flops == 121e12
    assert (params.delta_t_s, params.theta_frag, params.theta_flow) == (0.05, 0.168, 0.62)
    assert params.m_total_bytes == 32 * 2**30
    assert params.published["alpha"] == 4.25e-5


def test_latency_and_elementwise_terms_add_exactly() -> None:
    base = roofline_profile("H100", "Llama-3-70B", 4, **PLAIN).rows  # type: ignore[arg-type]
    more = roofline_profile(
        "H100",
        "Llama-3-70B",
        4,
        **{**PLAIN, "all_reduce_latency_s": 15e-6, "elementwise_bytes": 20},  # type: ignore[arg-type]
    ).rows
    step = base["kind"] != "gemm"
    tokens = base["batch_size"] * base["input_tokens"].fillna(1)
    # at tp=4 a call is the faster of one-shot (3·S/link) and two-shot (α + 1.5·S/link) plus α;
    # without α two-shot (the ring) always wins
    link_s = tokens * 8192 * 2 / 450e9
    extra_per_call = 15e-6 + np.minimum(3 * link_s, 15e-6 + 1.5 * link_s) - 1.5 * link_s
    extra = 2 * 80 * extra_per_call + 20 * 80 * 8192 * tokens / (0.7 * 3350e9)
    assert (more.loc[step, "latency_s"] - base.loc[step, "latency_s"]).to_numpy() == (
        pytest.approx(extra[step].to_numpy(), rel=1e-9)
    )
    with pytest.raises(ParameterError, match="'elementwise_bytes' parameter of roofline_profile"):
        roofline_profile("H100", "Llama-3-70B", 4, elementwise_bytes=-1)
