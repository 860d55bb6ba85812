"""The roofline prior's fused-MoE terms: ``moe_reduction_overhead`` (``K0`` multiply-adds per
routed-expert GEMM output element) and ``moe_layer_latency_s`` (fixed time per MoE layer)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from pdopt.cli import main
from pdopt.errors import ParameterError
from pdopt.hardware import get_gpu
from pdopt.model_spec import get_model, prefill_cost
from pdopt.profile import ROOFLINE_PRESETS, RooflineKnobs, read_profile, roofline_profile

MOE = "Qwen3-30B-A3B"


def _row(rows, kind: str, batch: int, second: str, value: int) -> float:  # type: ignore[no-untyped-def]
    hit = rows[(rows["kind"] == kind) & (rows["batch_size"] == batch) & (rows[second] == value)]
    return float(hit["latency_s"].iloc[0])


def test_tp2_prefill_step_by_hand() -> None:
    """Qwen3-30B-A3B (48 MoE layers, hidden 2048, 128 experts of 768, 8 per token) at TP2 on
    H100: the routed experts' GEMMs (``2·48·8·P_e/2`` FLOPs per token, ``P_e = 3·2048·768``)
    and the weights of the experts touched leave the step's roofline for one of their own at
    ``moe_ridge_exponent``, whose compute time gains the overhead ``2·K0·48·T·8·(2·768/2 +
    2048)`` FLOPs; 48 MoE-layer latencies join the sum."""
    knobs = RooflineKnobs(
        0.7, 0.8, 5e-4, 20e-6, 20.0, 2.0, 3e-6, 1000.0, 15e-6, moe_ridge_exponent=1.5
    )
    rows = roofline_profile("H100", MOE, 2, **dataclasses.asdict(knobs)).rows
    model = get_model(MOE)
    assert (model.moe_layers, model.hidden_size, model.experts_per_token) == (48, 2048, 8)
    assert (model.num_experts, model.moe_intermediate_size) == (128, 768)
    batch, length = 2, 1024
    tokens = batch * length
    cost = prefill_cost(model, length, batch, 2)
    expert_half = 3 * 2048 * 768 / 2  # one expert's matrices on one of 2 GPUs
    expert_flops = 2 * 48 * 8 * expert_half * tokens
    touched = 128 * (1 - (1 - 8 / 128) ** tokens)  # uniform routing, E·(1 − (1 − k/E)^T)
    expert_bytes = 48 * touched * expert_half * 2
    overhead_flops = 2 * 1000.0 * 48 * tokens * 8 * (768 + 2048)  # n_up = 2·768/2, n_down = 2048
    compute, memory = 0.7 * 989.5e12, 0.8 * 3.35e12
    rest = math.hypot((cost.flops - expert_flops) / compute, (cost.bytes - expert_bytes) / memory)
    e_c, e_m = (expert_flops + overhead_flops) / compute, expert_bytes / memory
    experts = (e_c**1.5 + e_m**1.5) ** (1 / 1.5)
    ring = 2 * (2 - 1) / 2 * tokens * 2048 * 2 / 450e9
    expected = (
        rest  # p = 2
        + experts
        + 5e-4
        + 8 * 48 * 3e-6
        + 48 * 15e-6
        + 2 * 48 * (ring + 20e-6)
        + 20 * 48 * 2048 * tokens / memory
    )
    assert _row(rows, "prefill", batch, "input_tokens", length) == pytest.approx(
        expected, rel=1e-12
    )


def test_the_experts_own_roofline_adds_where_one_roofline_overlaps() -> None:
    """At ``moe_ridge_exponent = 1`` the experts' weight streaming and compute add up: a
    prefill is slower than at the hard max by exactly the smaller of the two times, and a
    dense model is bit-identical whatever the exponent."""
    base = dataclasses.replace(
        ROOFLINE_PRESETS["hopper"], moe_reduction_overhead=0.0, ridge_exponent=math.inf
    )
    rows = {
        p: roofline_profile(
            "H100", MOE, 1, **dataclasses.asdict(dataclasses.replace(base, moe_ridge_exponent=p))
        ).rows
        for p in (1.0, math.inf)
    }
    model = get_model(MOE)
    tokens = 4 * 512
    expert = 3 * 2048 * 768
    e_c = 2 * 48 * 8 * expert * tokens / (base.compute_efficiency * 989.5e12)
    touched = 128 * (1 - (1 - 8 / 128) ** tokens)
    e_m = 48 * touched * expert * 2 / (base.bandwidth_efficiency * 3.35e12)
    gap = _row(rows[1.0], "prefill", 4, "input_tokens", 512) - _row(
        rows[math.inf], "prefill", 4, "input_tokens", 512
    )
    assert model.moe_layers == 48
    assert gap == pytest.approx(min(e_c, e_m), rel=1e-9)
    dense = [
        roofline_profile("H100", "Llama-3.1-8B", moe_ridge_exponent=p).rows for p in (1.0, 9.0)
    ]
    assert dense[0].equals(dense[1])


def test_decode_adds_the_moe_terms_by_hand() -> None:
    """A decode step of B tokens adds ``2·K0·L·B·k·(n_up + n_down)`` FLOPs to the experts'
    roofline (here at the hard max, memory-bound: unchanged) plus ``L · moe_layer_latency_s``."""
    base = dataclasses.replace(
        ROOFLINE_PRESETS["hopper"], ridge_exponent=math.inf, moe_ridge_exponent=math.inf
    )
    off = dataclasses.replace(base, moe_reduction_overhead=0.0, moe_layer_latency_s=0.0)
    on = dataclasses.replace(base, moe_reduction_overhead=500.0, moe_layer_latency_s=10e-6)
    rows_off = roofline_profile("H100", MOE, 1, **dataclasses.asdict(off)).rows
    rows_on = roofline_profile("H100", MOE, 1, **dataclasses.asdict(on)).rows
    expert = 3 * 2048 * 768
    touched = 128 * (1 - (1 - 8 / 128) ** 4)
    e_m = 48 * touched * expert * 2 / (off.bandwidth_efficiency * 3.35e12)
    extra_flops = 2 * 500.0 * 48 * 4 * 8 * (2 * 768 + 2048)
    e_c = (2 * 48 * 8 * expert * 4 + extra_flops) / (off.compute_efficiency * 989.5e12)
    assert e_c < e_m  # memory-bound: the FLOPs do not show at the hard max
    added = _row(rows_on, "decode", 4, "total_context_tokens", 4096) - _row(
        rows_off, "decode", 4, "total_context_tokens", 4096
    )
    assert added == pytest.approx(48 * 10e-6, rel=1e-9)
    # gemm rows (dense GEMMs of one expert's shape) do not carry the fused-MoE terms
    gemm_on, gemm_off = (r[r["kind"] == "gemm"]["latency_s"] for r in (rows_on, rows_off))
    assert gemm_on.to_numpy() == pytest.approx(gemm_off.to_numpy(), rel=0, abs=0)


def test_dense_models_are_bit_identical_and_their_notes_omit_the_moe_knobs() -> None:
    plain = roofline_profile(
        "H100", "Llama-3-8B", moe_reduction_overhead=0.0, moe_layer_latency_s=0.0
    )
    loud = roofline_profile(
        "H100", "Llama-3-8B", moe_reduction_overhead=5e3, moe_layer_latency_s=1e-3
    )
    assert plain.rows.equals(loud.rows)
    assert "moe_" not in plain.meta.notes
    moe_notes = roofline_profile("H100", MOE).meta.notes
    hopper = ROOFLINE_PRESETS["hopper"]
    assert f"moe_reduction_overhead={hopper.moe_reduction_overhead:.4g}" in moe_notes
    assert f"moe_layer_latency_s={hopper.moe_layer_latency_s:.4g}" in moe_notes


def test_expert_parallel_gains_nothing_from_the_overhead() -> None:
    """EP and TP layouts differ by their communication only, whatever ``K0``."""

    def gap(k0: float) -> float:
        rows = {
            ep: roofline_profile("H200", MOE, 4, expert_parallel=ep, moe_reduction_overhead=k0).rows
            for ep in (False, True)
        }
        return _row(rows[True], "prefill", 1, "input_tokens", 2048) - _row(
            rows[False], "prefill", 1, "input_tokens", 2048
        )

    assert gap(0.0) > 0
    assert gap(2000.0) == pytest.approx(gap(0.0), rel=0.2)


@pytest.mark.parametrize(
    "name", ["moe_reduction_overhead", "moe_layer_latency_s", "moe_ridge_exponent"]
)
def test_moe_knobs_are_checked(name: str) -> None:
    with pytest.raises(ParameterError, match=f"'{name}' parameter of roofline_profile"):
        roofline_profile("H100", MOE, **{name: -1.0})
    with pytest.raises(ParameterError, match=f"'{name}' parameter of RooflineKnobs"):
        dataclasses.replace(ROOFLINE_PRESETS["hopper"], **{name: float("nan")})
    for preset in ROOFLINE_PRESETS.values():
        assert getattr(preset, name) >= 0.0


def test_moe_validation_rows_meet_the_readme_bounds(aic_dir: str) -> None:
    """The README's MoE table, re-measured: the MoE terms cut the prefill median error on every
    BF16-expert row outside the L40S TP4 rows (whose all-reduce table the README distrusts),
    and every such row but B200 Mixtral-8x7B (whose measured fused-MoE kernel runs at 0.31 of
    the B200's BF16 peak where Qwen3's reaches 0.40: README) is within 10% at the prefill
    median."""
    validation = pytest.importorskip("calibration.roofline_validation")
    truths = {s: validation.measured(s, aic_dir, Path(".")).rows for s in validation.MOE_SOURCES}
    table = validation.moe_table(truths, {})
    bf16 = table[[get_model(m).expert_dtype == "bfloat16" for m in table["model"]]]
    trusted = bf16[~((bf16["gpu"] == "L40S") & (bf16["tp"] == 4))]
    assert len(trusted) >= 15
    assert (trusted["prefill_median_pct"] < trusted["before_prefill_median_pct"]).all(), trusted
    b200_mixtral = (trusted["gpu"] == "B200") & (trusted["model"] == "Mixtral-8x7B")
    assert b200_mixtral.sum() == 1
    assert (trusted[~b200_mixtral]["prefill_median_pct"] <= 10.0).all(), trusted


def test_routing_bracket_by_hand() -> None:
    """Inside the interval the two routings' measurements span: 0; below it: 1 − roofline/low;
    the errors against the balanced rows are |roofline/balanced − 1|."""
    validation = pytest.importorskip("calibration.roofline_validation")
    source = validation.MOE_SOURCES[0]
    preset = ROOFLINE_PRESETS[get_gpu(source.gpu).generation]
    prior = roofline_profile(source.gpu, source.model, source.tp, **dataclasses.asdict(preset))
    rows = prior.rows

    def scaled(factor: float) -> pd.DataFrame:
        return rows.assign(latency_s=rows["latency_s"] * factor)

    inside = validation.routing_bracket(rows, scaled(1.25), scaled(0.8))
    assert inside["outside_routing_decode_max_pct"] == 0.0
    assert inside["balanced_decode_max_pct"] == pytest.approx(25.0, abs=0.05)
    below = validation.routing_bracket(rows, scaled(1.25), scaled(1.1))
    assert below["outside_routing_decode_max_pct"] == pytest.approx(100 / 11, abs=0.05)
    assert below["balanced_decode_median_pct"] == pytest.approx(100 / 11, abs=0.05)


def test_moe_knobs_are_fitted_where_the_routing_law_does_not_matter() -> None:
    """Qwen3-30B-A3B (128 experts, 8 per token): one token touches 8 experts under any routing
    and 64 tokens 98% of them under uniform routing, so those decode points and every prefill
    point stay; 2–32 tokens (15–112 experts expected) are the routing law's and go."""
    validation = pytest.importorskip("calibration.roofline_validation")
    source = validation.MOE_SOURCES[0]
    assert source.model == "Qwen3-30B-A3B"
    rows = roofline_profile(source.gpu, source.model, source.tp).rows
    kept = validation.routing_insensitive(source, rows)
    decode = kept[kept["kind"] == "decode"]
    assert sorted(decode["batch_size"].unique()) == [1, 64, 128, 256]
    assert (kept["kind"] == "prefill").sum() == (rows["kind"] == "prefill").sum()
    assert (kept["kind"] == "gemm").sum() == (rows["kind"] == "gemm").sum()


def test_moe_decode_maxima_are_the_routing_assumption(aic_dir: str) -> None:
    """AIConfigurator measures the routed experts under a power-law and a balanced routing;
    pdopt's uniform routing lies between them. The BF16-expert rows' decode maxima against the
    power-law rows (12–37%, at 8–32 tokens) fall to ≤ 10.5% as a distance from the interval
    the two measurements span, except the Qwen3-235B-A22B rows (the roofline is 6–15% fast at
    one or two tokens against both: not a routing effect; 12–21% before the MoE knobs were
    fitted on the routing-insensitive points only) and B200 Mixtral-8x7B (README)."""
    validation = pytest.importorskip("calibration.roofline_validation")
    sources = [
        s
        for s in validation.MOE_SOURCES
        if get_model(s.model).expert_dtype == "bfloat16" and s.gpu != "L40S"
    ]
    truths = {s: validation.measured(s, aic_dir, Path(".")).rows for s in sources}
    evens = {s: validation.balanced(s, aic_dir) for s in sources}
    table = validation.moe_table(truths, evens).dropna(subset=["outside_routing_decode_max_pct"])
    assert len(table) >= 14
    outside, power = table["outside_routing_decode_max_pct"], table["decode_max_pct"]
    assert (outside <= power).all()
    explained = ~table["model"].isin(["Qwen3-235B-A22B"]) & ~(
        (table["gpu"] == "B200") & (table["model"] == "Mixtral-8x7B")
    )
    assert explained.sum() >= 11
    assert (outside[explained] <= 10.5).all(), table[explained]
    assert (power[explained] > 10.5).sum() >= 8  # the power-law rows alone miss the bound
    qwen_235b = table["model"] == "Qwen3-235B-A22B"
    assert qwen_235b.sum() >= 2
    assert (outside[qwen_235b] < 17.0).all(), table[qwen_235b]


def test_cli_takes_the_moe_knobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "moe.csv"
    argv = ["profile", "roofline", "--gpu", "h100", "--model", MOE, "--out", str(out)]
    assert main([*argv, "--moe-reduction-overhead", "800", "--moe-layer-latency-s", "2e-5"]) == 0
    notes = read_profile(out).meta.notes
    assert "moe_reduction_overhead=800" in notes and "moe_layer_latency_s=2e-05" in notes
    capsys.readouterr()
    assert main([*argv, "--moe-layer-latency-s", "-1"]) == 1
    assert "'moe_layer_latency_s' parameter of roofline_profile" in capsys.readouterr().err


def test_fp8_experts_compute_at_the_fraction_of_the_fp8_peak_by_hand() -> None:
    """Qwen3-30B-A3B with FP8 weights on H100, compute-bound prefill (hard max, no overhead):
    halving ``moe_fp8_peak_fraction`` adds exactly the experts' compute time at the FP8 peak;
    on A100 (no FP8 tensor cores) and for BF16 experts the knob does nothing."""
    knobs = dataclasses.replace(
        ROOFLINE_PRESETS["hopper"],
        moe_reduction_overhead=0.0,
        moe_ridge_exponent=math.inf,
        moe_fp8_peak_fraction=1.0,
    )
    rows = {
        f: roofline_profile(
            "H100",
            f"{MOE}@fp8",
            1,
            **dataclasses.asdict(dataclasses.replace(knobs, moe_fp8_peak_fraction=f)),
        ).rows
        for f in (1.0, 0.5)
    }
    tokens = 8 * 2048
    expert_flops = 2 * 48 * 8 * 3 * 2048 * 768 * tokens
    at_peak = expert_flops / (knobs.compute_efficiency * 1979e12)
    weights = 48 * 128 * 3 * 2048 * 768 * 1 / (knobs.bandwidth_efficiency * 3.35e12)
    assert at_peak > weights  # compute-bound at the hard max
    gap = _row(rows[0.5], "prefill", 8, "input_tokens", 2048) - _row(
        rows[1.0], "prefill", 8, "input_tokens", 2048
    )
    assert gap == pytest.approx(at_peak, rel=1e-9)
    for gpu, model in (("A100-80GB", f"{MOE}@fp8"), ("H100", MOE)):
        same = [roofline_profile(gpu, model, moe_fp8_peak_fraction=f).rows for f in (1.0, 0.3)]
        assert same[0].equals(same[1]), (gpu, model)


def test_fp8_peak_fractions_are_the_kernel_tables_and_predict_deepseek(aic_dir: str) -> None:
    """The presets' FP8 fractions are what ``--fit`` derives from the kernel tables: the
    experts' from the fused-MoE ones (DeepSeek-V3's shape held out), the weight GEMMs' from the
    GEMM grid. Each brings every DeepSeek-V3 FP8-block check row's prefill median error down,
    together to within 25%."""
    validation = pytest.importorskip("calibration.roofline_validation")
    fit_rows = {s.generation: s for s in validation.SOURCES if s.role == "fit"}
    for generation in ("hopper", "blackwell", "ada"):
        preset = ROOFLINE_PRESETS[generation]
        fraction = validation.gemm_fp8_peak_fraction(aic_dir, fit_rows[generation])
        assert fraction == pytest.approx(preset.fp8_peak_fraction, abs=5e-4), generation
        if generation != "ada":
            fraction = validation.moe_fp8_peak_fraction(aic_dir, fit_rows[generation])
            assert fraction == pytest.approx(preset.moe_fp8_peak_fraction, abs=5e-4), generation
    checks = [s for s in validation.MOE_SOURCES if s.model == "DeepSeek-V3"]
    assert len(checks) == 3
    for source in checks:
        truth = validation.measured(source, aic_dir, None).rows
        preset = ROOFLINE_PRESETS[source.generation]
        medians = [
            validation._summary(validation.log_errors(source, truth, knobs))["prefill_median_pct"]
            for knobs in (
                dataclasses.replace(preset, moe_fp8_peak_fraction=1.0, fp8_peak_fraction=1.0),
                dataclasses.replace(preset, fp8_peak_fraction=1.0),
                preset,
            )
        ]
        assert medians[0] > medians[1] > medians[2], (source, medians)
        assert medians[2] <= 25.0, source
