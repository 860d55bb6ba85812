"""The roofline prior's per-generation presets: coverage, overrides, and one step by hand."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from pdopt.errors import ConfigError, ParameterError
from pdopt.hardware import GPU_GENERATIONS, GPUS, GpuSpec, get_gpu
from pdopt.model_spec import decode_step_cost, get_model, prefill_cost
from pdopt.profile import ROOFLINE_PRESETS, RooflineKnobs, roofline_knobs, roofline_profile
from pdopt.profile._knobs import KERNELS_PER_LAYER
from pdopt.profile._roofline import all_reduce_s

VIDUR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "vidur-profiling"


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
    """roofline + overhead + 8·L·kernel latency + 2·L·(ring bytes / link + latency) +
    elementwise bytes / bandwidth."""
    knobs = RooflineKnobs(0.7, 0.8, 5e-4, 20e-6, 20.0, 2.0, 3e-6)
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
        + 8 * model.num_layers * 3e-6
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


def test_kernel_latency_adds_eight_per_layer_to_steps_and_one_per_gemm() -> None:
    model = get_model("Llama-3-8B")
    base = roofline_profile("H100", model, kernel_latency_s=0.0).rows
    more = roofline_profile("H100", model, kernel_latency_s=4e-6).rows
    added = (more["latency_s"] - base["latency_s"]).to_numpy()
    steps = (base["kind"] != "gemm").to_numpy()
    assert KERNELS_PER_LAYER == 8
    assert added[steps] == pytest.approx(8 * model.num_layers * 4e-6, rel=1e-9)
    assert added[~steps] == pytest.approx(4e-6, rel=1e-9)
    with pytest.raises(ParameterError, match="'kernel_latency_s' parameter of roofline_profile"):
        roofline_profile("H100", model, kernel_latency_s=-1.0)


def test_attention_head_latency_adds_per_sequence_head_and_layer_to_decode_only() -> None:
    """Decode steps add batch × layers × query heads per GPU × the knob; prefill and GEMM rows
    are untouched; Ampere's fit leaves it at 0."""
    model = get_model("Llama-3.1-70B")
    for tp in (4, 8):
        base = roofline_profile("H100", model, tp, attention_head_latency_s=0.0).rows
        more = roofline_profile("H100", model, tp, attention_head_latency_s=5e-9).rows
        added = (more["latency_s"] - base["latency_s"]).to_numpy()
        decode = (base["kind"] == "decode").to_numpy()
        per_sequence = model.num_layers * (model.num_heads // tp) * 5e-9
        expected = base.loc[decode, "batch_size"].to_numpy() * per_sequence
        assert added[decode] == pytest.approx(expected, rel=1e-9)
        assert (added[~decode] == 0.0).all()
    assert ROOFLINE_PRESETS["hopper"].attention_head_latency_s > 0
    assert ROOFLINE_PRESETS["ampere"].attention_head_latency_s == 0.0
    with pytest.raises(
        ParameterError, match="'attention_head_latency_s' parameter of roofline_profile"
    ):
        roofline_profile("H100", model, 4, attention_head_latency_s=-1e-9)


def test_fp8_weight_gemms_compute_at_the_fraction_and_attention_at_the_16_bit_peak() -> None:
    """Llama-3.1-8B with FP8 weights on H100, compute-bound prefill (hard max): the gap to the
    BF16 model is exactly the weight GEMMs' and LM head's FLOPs at ``1/r_16 − 1/r_8`` (the
    attention FLOPs cost the same in both); at ``fp8_peak_fraction = peak_16 / peak_8`` the two
    cost the same; on A100 (no FP8 tensor cores) the knob does nothing. No kernel latency, so
    the FP8 GEMMs' quantisation kernels (tests/profile/test_profile_roofline_fp8.py) add
    nothing."""
    knobs = dataclasses.replace(
        ROOFLINE_PRESETS["hopper"], ridge_exponent=math.inf, kernel_latency_s=0.0
    )
    h100 = get_gpu("H100")
    model = get_model("Llama-3.1-8B")
    fp8 = dataclasses.replace(model, dtype="fp8")

    def prefill_s(spec: object, **given: float) -> float:
        rows = roofline_profile(h100, spec, **{**dataclasses.asdict(knobs), **given}).rows
        hit = rows[(rows["kind"] == "prefill") & (rows["batch_size"] == 8)]
        return float(hit[hit["input_tokens"] == 8192]["latency_s"].iloc[0])

    cost = prefill_cost(fp8, 8192, 8)
    r16 = knobs.compute_efficiency * h100.peak_flops
    for fraction in (1.0, 0.6):
        r8 = r16 * fraction * h100.fp8_peak_flops / h100.peak_flops
        assert cost.flops / r8 > cost.bytes / (knobs.bandwidth_efficiency * h100.hbm_bw_bytes_per_s)
        gap = prefill_s(model) - prefill_s(fp8, fp8_peak_fraction=fraction)
        weight_flops = cost.gemm_flops + cost.lm_head_flops
        assert gap == pytest.approx(weight_flops * (1 / r16 - 1 / r8), rel=1e-9)
    even = h100.peak_flops / h100.fp8_peak_flops
    assert prefill_s(fp8, fp8_peak_fraction=even) == pytest.approx(prefill_s(model), rel=1e-12)
    same = [roofline_profile("A100-80GB", fp8, fp8_peak_fraction=f).rows for f in (1.0, 0.3)]
    assert same[0].equals(same[1])
    with pytest.raises(ParameterError, match="'fp8_peak_fraction' parameter of roofline_profile"):
        roofline_profile("H100", fp8, fp8_peak_fraction=1.5)


def test_mla_layers_count_their_norms_and_extra_projections() -> None:
    """DeepSeek-V3 (Q LoRA): 8 + 4 kernels per layer in prefill (latent norms, Q and KV
    up-projections), 8 + 5 in decode (latent norms, Q up-projection, two absorbed BMMs); without
    a Q LoRA one fewer each (one Q projection). Its weights being FP8, each weight GEMM runs a
    quantisation kernel too: 6 per layer in prefill, 5 in decode (test_profile_roofline_fp8)."""
    deepseek = get_model("DeepSeek-V3")
    assert deepseek.dtype == "fp8"
    for model, prefill_kernels, decode_kernels in (
        (deepseek, 12 + 6, 13 + 5),
        (dataclasses.replace(deepseek, q_lora_rank=0), 11 + 6, 12 + 5),
    ):
        base = roofline_profile("H200", model, 8, kernel_latency_s=0.0).rows
        more = roofline_profile("H200", model, 8, kernel_latency_s=4e-6).rows
        added = (more["latency_s"] - base["latency_s"]).to_numpy()
        per_step = 4e-6 * model.num_layers
        prefill = (base["kind"] == "prefill").to_numpy()
        decode = (base["kind"] == "decode").to_numpy()
        assert added[prefill] == pytest.approx(prefill_kernels * per_step, rel=1e-9)
        assert added[decode] == pytest.approx(decode_kernels * per_step, rel=1e-9)


def test_all_reduce_law_by_hand() -> None:
    """α + β(n−1) + min(one-shot (n−1)·S/(η·link), two-shot α + 2(n−1)/n·S/(η·link))."""
    alpha, beta, eta, link = 5e-6, 0.5e-6, 0.5, 300e9
    assert all_reduce_s(1e6, 1, link, alpha, beta, eta) == 0.0
    # two GPUs: one-shot and the ring move the same S; one-shot saves the second barrier
    assert all_reduce_s(1e6, 2, link, alpha, beta, eta) == pytest.approx(
        alpha + beta + 1e6 / (eta * link)
    )
    small, large = 16e3, 64e6  # one-shot below, two-shot above the crossing
    assert all_reduce_s(small, 8, link, alpha, beta, eta) == pytest.approx(
        alpha + 7 * beta + 7 * small / (eta * link)
    )
    assert all_reduce_s(large, 8, link, alpha, beta, eta) == pytest.approx(
        2 * alpha + 7 * beta + 1.75 * large / (eta * link)
    )
    both = all_reduce_s(np.array([small, large]), np.array([8, 8]), link, alpha, beta, eta)
    assert list(np.asarray(both)) == pytest.approx(
        [
            all_reduce_s(small, 8, link, alpha, beta, eta),
            all_reduce_s(large, 8, link, alpha, beta, eta),
        ]
    )


def test_in_switch_branch_by_hand() -> None:
    """From ``switch_min_gpus`` on, the faster of the link law and α_s + S/(η_s·link); below
    it, and by default (never), the link law alone."""
    alpha, beta, eta, link = 5e-6, 0.5e-6, 0.5, 450e9
    switch = {"switch_min_gpus": 8, "switch_latency_s": 20e-6, "switch_efficiency": 0.5}
    small, large = 16e3, 64e6
    for size in (small, large):
        for gpus in (2, 4):
            assert all_reduce_s(size, gpus, link, alpha, beta, eta, **switch) == (
                all_reduce_s(size, gpus, link, alpha, beta, eta)
            )
    # small: the one-shot link path (no second latency) beats the switch's 20 µs
    assert all_reduce_s(small, 8, link, alpha, beta, eta, **switch) == pytest.approx(
        alpha + 7 * beta + 7 * small / (eta * link)
    )
    # large: the switch moves S once, the two-shot 1.75 S
    assert all_reduce_s(large, 8, link, alpha, beta, eta, **switch) == pytest.approx(
        20e-6 + large / (0.5 * link)
    )
    assert all_reduce_s(large, 16, link, alpha, beta, eta, **switch) == pytest.approx(
        20e-6 + large / (0.5 * link)
    )
    assert all_reduce_s(large, 1, link, alpha, beta, eta, **switch) == 0.0
    both = all_reduce_s(
        np.array([small, large]), np.array([4, 8]), link, alpha, beta, eta, **switch
    )
    assert list(np.asarray(both)) == pytest.approx(
        [
            all_reduce_s(small, 4, link, alpha, beta, eta),
            all_reduce_s(large, 8, link, alpha, beta, eta, **switch),
        ]
    )


def test_switch_knobs_reach_tp8_steps_only_and_are_checked() -> None:
    """The Hopper preset reduces in the switch from 8 GPUs: its TP8 prefill is faster than with
    the branch off, TP4 is unchanged; MI300X (Hopper's preset otherwise) has no switch."""
    model = get_model("Llama-3.1-70B")
    assert ROOFLINE_PRESETS["hopper"].all_reduce_switch_min_gpus == 8
    assert ROOFLINE_PRESETS["blackwell"].all_reduce_switch_min_gpus == 8
    for generation in ("ampere", "ada", "volta", "cdna3", "unknown"):
        assert math.isinf(ROOFLINE_PRESETS[generation].all_reduce_switch_min_gpus), generation
    assert (
        dataclasses.replace(ROOFLINE_PRESETS["cdna3"], all_reduce_switch_min_gpus=8)
        == ROOFLINE_PRESETS["hopper"]
    )
    off = {"all_reduce_switch_min_gpus": math.inf}
    for tp, faster in ((4, False), (8, True)):
        on_rows = roofline_profile("H100", model, tp).rows
        off_rows = roofline_profile("H100", model, tp, **off).rows
        prefill = (on_rows["kind"] == "prefill").to_numpy()
        gain = (off_rows["latency_s"] - on_rows["latency_s"]).to_numpy()[prefill]
        assert (gain > 0).any() == faster and (gain >= 0).all()
    for bad in (1, 2.5, -math.inf):
        with pytest.raises(ParameterError, match="'all_reduce_switch_min_gpus' parameter"):
            roofline_profile("H100", model, 8, all_reduce_switch_min_gpus=bad)
    with pytest.raises(ParameterError, match="'all_reduce_switch_efficiency' parameter"):
        roofline_profile("H100", model, 8, all_reduce_switch_efficiency=0.0)
    with pytest.raises(ParameterError, match="'all_reduce_switch_latency_s' parameter"):
        roofline_profile("H100", model, 8, all_reduce_switch_latency_s=-1e-6)


def test_peer_latency_adds_per_peer_per_call_and_knobs_are_checked() -> None:
    model = get_model("Llama-3-70B")
    base = roofline_profile("H100", model, 4, all_reduce_peer_latency_s=0.0).rows
    more = roofline_profile("H100", model, 4, all_reduce_peer_latency_s=1e-6).rows
    steps = (base["kind"] != "gemm").to_numpy()
    added = (more["latency_s"] - base["latency_s"]).to_numpy()
    assert added[steps] == pytest.approx(2 * model.num_layers * 3 * 1e-6, rel=1e-9)
    assert added[~steps] == pytest.approx(0.0, abs=1e-15)
    name = "'all_reduce_bandwidth_efficiency' parameter of roofline_profile"
    with pytest.raises(ParameterError, match=name):
        roofline_profile("H100", model, 4, all_reduce_bandwidth_efficiency=0.0)
    with pytest.raises(ParameterError, match="'all_reduce_peer_latency_s' parameter"):
        roofline_profile("H100", model, 4, all_reduce_peer_latency_s=-1e-6)


def test_all_reduce_law_fitted_on_two_and_four_gpus_predicts_eight(aic_dir: str) -> None:
    """Out of sample in the GPU count: the Hopper law fitted on AIConfigurator's H100 vLLM
    all-reduce at 2 and 4 GPUs (as the preset) predicts its 8-GPU rows up to 8 MiB (vLLM's
    custom all-reduce; decode messages) within 10% at the median (measured 5.1%); beyond,
    NCCL's 8-GPU all-reduce is faster than a two-shot volume allows (NVLink SHARP) and the law
    over-predicts (measured +43% median), which the README reports."""
    validation = pytest.importorskip("calibration.roofline_validation")
    source = validation.SOURCES[0]
    assert (source.gpu, source.kind) == ("H100-SXM", "aic:h100_sxm:vllm")
    link = get_gpu(source.gpu).link_bw_bytes_per_s
    law = validation.all_reduce_law(validation.aic_all_reduce(aic_dir, source, (2, 4)), link)
    preset = ROOFLINE_PRESETS["hopper"]
    assert preset.all_reduce_latency_s == pytest.approx(law["all_reduce_latency_s"], rel=0.01)
    assert preset.all_reduce_bandwidth_efficiency == pytest.approx(
        law["all_reduce_bandwidth_efficiency"], rel=0.01
    )
    eight = validation.aic_all_reduce(aic_dir, source, (8,))
    eight = eight[(eight["bytes"] >= 8192) & (eight["bytes"] <= 8 * 2**20)]
    predicted = all_reduce_s(eight["bytes"].to_numpy(), 8, link, *law.values())
    error = np.abs(np.asarray(predicted) / eight["seconds"].to_numpy() - 1)
    assert len(error) >= 8 and float(np.median(error)) < 0.10


def test_in_switch_branch_fitted_on_h100_predicts_h200(aic_dir: str) -> None:
    """The Hopper preset's in-switch branch is :func:`switch_law` on H100's measured 8-GPU
    all-reduce table (the link law held); out of sample on another GPU, it predicts H200's
    8-GPU table within 10% at the median (measured 7.7%; the link law alone: 22.5%)."""
    validation = pytest.importorskip("calibration.roofline_validation")
    preset = ROOFLINE_PRESETS["hopper"]
    link_law = {
        "all_reduce_latency_s": preset.all_reduce_latency_s,
        "all_reduce_peer_latency_s": preset.all_reduce_peer_latency_s,
        "all_reduce_bandwidth_efficiency": preset.all_reduce_bandwidth_efficiency,
    }
    h100, h200 = validation.SOURCES[0], validation.SOURCES[3]
    assert (h100.gpu, h200.gpu) == ("H100-SXM", "H200")
    link = get_gpu(h100.gpu).link_bw_bytes_per_s
    fitted = validation.switch_law(
        validation.aic_all_reduce(aic_dir, h100, (8,)), link_law, 8, link
    )
    assert fitted["all_reduce_switch_min_gpus"] == preset.all_reduce_switch_min_gpus
    assert preset.all_reduce_switch_latency_s == pytest.approx(
        fitted["all_reduce_switch_latency_s"], rel=0.01
    )
    assert preset.all_reduce_switch_efficiency == pytest.approx(
        fitted["all_reduce_switch_efficiency"], rel=0.01
    )
    eight = validation.aic_all_reduce(aic_dir, h200, (8,))
    eight = eight[eight["bytes"] >= 8192]
    law = (link, *link_law.values())
    switch = {
        "switch_min_gpus": 8,
        "switch_latency_s": preset.all_reduce_switch_latency_s,
        "switch_efficiency": preset.all_reduce_switch_efficiency,
    }
    measured = eight["seconds"].to_numpy()
    with_switch = np.asarray(all_reduce_s(eight["bytes"].to_numpy(), 8, *law, **switch))
    link_only = np.asarray(all_reduce_s(eight["bytes"].to_numpy(), 8, *law))
    assert float(np.median(np.abs(with_switch / measured - 1))) < 0.10
    assert float(np.median(np.abs(link_only / measured - 1))) > 0.15


def test_out_of_sample_check_rows_meet_the_readme_bounds(aic_dir: str) -> None:
    """The README's validation table, re-measured: every check row's median error within 12%
    (prefill and decode; the largest is the Vidur row's prefill, 11.0%) and max within 35%
    (A100 TP8 decode reaches 33% at batch 64, where AIConfigurator's 8-GPU A100 all-reduce
    jumps to 83 µs), except the L40S 70B TP4 row whose all-reduce table the README distrusts
    (it stays the worst, above 50%); the Vidur row (real A100 runs) is checked with the
    all-reduce law of Vidur's NCCL table, and its decode is within 10% at every point since the
    Ampere fit leaves out the reference points faster than HBM; and the presets beat the knobs
    used before them on every row's decode max. Not the issue's 10% everywhere (the README says
    which miss)."""
    validation = pytest.importorskip("calibration.roofline_validation")
    sources = [s for s in validation.SOURCES if s.kind != "vidur" or VIDUR.is_dir()]
    truths = {s: validation.measured(s, aic_dir, VIDUR).rows for s in sources}
    table = validation.table(truths, VIDUR)
    check = table[table["role"] == "check"]
    suspect = (check["gpu"] == "L40S") & (check["model"] == "Llama-3.1-70B")
    trusted = check[~suspect]
    assert len(trusted) >= 6
    for kind in ("prefill", "decode"):
        assert (trusted[f"{kind}_median_pct"] <= 12.0).all(), trusted
        assert (trusted[f"{kind}_max_pct"] <= 35.0).all(), trusted
    vidur = table[table["measured"] == "vidur"]
    assert (vidur["all_reduce"].str.startswith("vidur nccl")).all()
    assert (vidur["decode_max_pct"] <= 10.0).all(), vidur
    assert (table.loc[table["measured"] != "vidur", "all_reduce"] == "preset").all()
    assert (check.loc[suspect, "prefill_median_pct"] > 50.0).all()
    assert (table["decode_max_pct"] <= table["old_decode_max_pct"]).all(), table


def test_hopper_rows_within_ten_percent_at_every_point_but_one(aic_dir: str) -> None:
    """README: every point of the six Hopper rows (H100 and H200, Llama-3.1-8B TP1, 70B TP4 and
    TP8) within 10% but H100 8B's smallest prefill (10.1%, a fit row); the H200 8B decode check
    (256 sequences × 512 tokens) is within 10% because of the decode-attention term: without it,
    the same preset misses it by more than 12%."""
    validation = pytest.importorskip("calibration.roofline_validation")
    hopper = [s for s in validation.SOURCES if s.generation == "hopper"]
    assert len(hopper) == 6
    preset = ROOFLINE_PRESETS["hopper"]
    for source in hopper:
        truth = validation.measured(source, aic_dir, VIDUR).rows
        worst = validation._summary(validation.log_errors(source, truth, preset))
        assert worst["decode_max_pct"] <= 10.0, source
        prefill_bound = 10.5 if (source.gpu, source.tp) == ("H100-SXM", 1) else 10.0
        assert worst["prefill_max_pct"] <= prefill_bound, source
        if (source.gpu, source.tp) == ("H200", 1):
            off = dataclasses.replace(preset, attention_head_latency_s=0.0)
            without = validation._summary(validation.log_errors(source, truth, off))
            assert without["decode_max_pct"] > 12.0


def test_reference_attention_faster_than_hbm_is_flagged_and_explains_two_maxima(
    aic_dir: str,
) -> None:
    """AIConfigurator's decode attention tables read one layer's KV faster than the HBM peak on
    L40S while that KV fits the 96 MB L2 (a cache-resident benchmark) and on the A100 8B table at
    large contexts; no H100/H200 point does. Without those points the L40S 8B TP2 and A100 8B
    decode maxima (22% and 54%) fall to 7.6% and 10.7%: the roofline streams from HBM as a
    serving step does. The flag is the physical bound only (no threshold fitted); the rows keep
    every point, the fits (``--fit``) leave them out."""
    validation = pytest.importorskip("calibration.roofline_validation")
    picked = {(s.gpu, s.model, s.tp): s for s in validation.SOURCES if s.kind != "vidur"}
    keys = [("L40S", "Llama-3.1-8B", 2), ("A100-80GB", "Llama-3.1-8B", 1),
            ("H200", "Llama-3.1-8B", 1), ("H100-SXM", "Llama-3.1-70B", 8)]  # fmt: skip
    sources = [picked[k] for k in keys]
    truths = {s: validation.measured(s, aic_dir, VIDUR).rows for s in sources}
    hot = {s: validation.faster_than_hbm(s, aic_dir, t) for s, t in truths.items()}
    table = validation.table(truths, VIDUR, hot).set_index(["gpu", "tp"])
    l40s, a100 = table.loc[("L40S", 2)], table.loc[("A100-80GB", 1)]
    for row in (l40s, a100):
        assert row["decode_faster_than_hbm_points"] >= 10
        assert row["decode_max_pct"] > 15.0 > 11.0 >= row["hbm_bound_decode_max_pct"]
    hopper = table.loc[[("H200", 1), ("H100-SXM", 8)]]
    assert (hopper["decode_faster_than_hbm_points"] == 0).all()
    assert (hopper["hbm_bound_decode_max_pct"] == hopper["decode_max_pct"]).all()
    # the L40S points are exactly those whose one layer of KV (2 KiB a token at TP2) fits in L2
    l40s_source = picked[("L40S", "Llama-3.1-8B", 2)]
    rows = truths[l40s_source]
    decode = rows[hot[l40s_source]]
    assert (decode["total_context_tokens"] * 2048 <= 96 * 2**20).all()


def test_fits_leave_out_exactly_the_points_faster_than_hbm(aic_dir: str) -> None:
    """``hbm_bound`` (what ``--fit`` fits the dense knobs on) drops the A100 8B fit row's
    flagged decode points and nothing else, keeps every H100 point, and returns a Vidur
    source whole (no AIConfigurator table to flag it with)."""
    validation = pytest.importorskip("calibration.roofline_validation")
    picked = {(s.gpu, s.model, s.tp): s for s in validation.SOURCES}
    for key, dropped in (
        (("A100-80GB", "Llama-3.1-8B", 1), 13),
        (("H100-SXM", "Llama-3.1-8B", 1), 0),
    ):
        source = picked[key]
        truth = validation.measured(source, aic_dir, VIDUR).rows
        kept = validation.hbm_bound(source, aic_dir, truth)
        flags = validation.faster_than_hbm(source, aic_dir, truth)
        assert len(truth) - len(kept) == int(flags.sum()) == dropped, key
        assert kept.equals(truth[~flags])
        assert (kept["kind"] == "prefill").sum() == (truth["kind"] == "prefill").sum()
    vidur = next(s for s in validation.SOURCES if s.kind == "vidur")
    rows = roofline_profile(vidur.gpu, vidur.model, vidur.tp).rows
    assert validation.hbm_bound(vidur, aic_dir, rows) is rows


def test_engine_spread_by_hand() -> None:
    """Measurements at 1.1× and 0.95× the roofline span it (outside 0, spread
    |0.95/1.1 − 1|); at 1.1× and 1.2× it lies 1 − 1/1.1 below the span's low end."""
    validation = pytest.importorskip("calibration.roofline_validation")
    source = validation.SOURCES[0]
    knobs = ROOFLINE_PRESETS[get_gpu(source.gpu).generation]
    prior = roofline_profile(source.gpu, source.model, source.tp, **dataclasses.asdict(knobs))
    rows = prior.rows.groupby("kind").head(3)  # three points of each kind suffice

    def scaled(factor: float):  # type: ignore[no-untyped-def]
        return rows.assign(latency_s=rows["latency_s"] * factor)

    spanned = validation.engine_spread(source, scaled(1.1), {"sglang": scaled(0.95)}, knobs)
    above = validation.engine_spread(
        source, scaled(1.1), {"a": scaled(1.2), "b": scaled(1.15)}, knobs
    )
    for kind in ("prefill", "decode"):
        assert spanned[f"engine_{kind}_points"] == 3
        assert spanned[f"engine_spread_{kind}_max_pct"] == round(100 * (1 - 0.95 / 1.1), 1)
        assert spanned[f"outside_engines_{kind}_max_pct"] == 0.0
        assert above[f"engine_spread_{kind}_max_pct"] == round(100 * (1.2 / 1.1 - 1), 1)
        assert above[f"outside_engines_{kind}_max_pct"] == round(100 * (1 - 1 / 1.1), 1)
    assert spanned["engines"] == "sglang" and above["engines"] == "a,b"
    assert validation.engine_spread(source, rows, {}, knobs) == {"engines": ""}


def test_engines_disagree_where_the_prior_misses_most(aic_dir: str) -> None:
    """AIConfigurator's vLLM, SGLang and TensorRT-LLM tables of one GPU, model and TP are
    themselves apart: within ~12% on Hopper Llama-3.1-70B TP4, by more than 40% on
    DeepSeek-V3 on H200; the roofline lies within 5% of the engines' span on the former."""
    validation = pytest.importorskip("calibration.roofline_validation")
    picked = {
        (s.gpu, s.model, s.tp, s.kind): s for s in validation.MOE_SOURCES + validation.SOURCES
    }
    dense = picked[("H100-SXM", "Llama-3.1-70B", 4, "aic:h100_sxm:vllm")]
    deepseek = picked[("H200", "DeepSeek-V3", 8, "aic:h200_sxm:sglang")]
    rows = {}
    for source in (dense, deepseek):
        truth = validation.measured(source, aic_dir, VIDUR).rows
        others = validation.other_engines(source, aic_dir, VIDUR)
        knobs = ROOFLINE_PRESETS[get_gpu(source.gpu).generation]
        rows[source] = validation.engine_spread(source, truth, others, knobs)
    assert rows[dense]["engines"] == "sglang,trtllm"
    for kind in ("prefill", "decode"):
        assert 5.0 < rows[dense][f"engine_spread_{kind}_max_pct"] < 15.0
        assert rows[dense][f"outside_engines_{kind}_max_pct"] < 5.0
        assert rows[deepseek][f"engine_spread_{kind}_max_pct"] > 40.0
