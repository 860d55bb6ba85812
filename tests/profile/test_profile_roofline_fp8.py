"""FP8 (W8A8) weight GEMMs in the roofline prior: their weights stream at
``fp8_bandwidth_fraction`` and each quantises its input in a kernel of its own; checked by
hand, and (AIConfigurator-gated) against the kernel tables the presets come from and the
composed FP8 profiles they were not fitted on."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from pdopt.errors import ParameterError
from pdopt.hardware import get_gpu
from pdopt.model_spec import decode_step_cost, get_model, with_precision
from pdopt.profile import ROOFLINE_PRESETS, roofline_profile
from pdopt.profile._knobs import FP8_GEMM_EXTRA_KERNELS, KERNELS_PER_LAYER
from pdopt.profile._roofline import _weight_gemms_per_pass

LLAMA_FP8 = with_precision(get_model("Llama-3.1-8B"), "fp8")


def _row(rows: pd.DataFrame, kind: str, batch: int, column: str, value: int) -> float:
    hit = rows[(rows["kind"] == kind) & (rows["batch_size"] == batch) & (rows[column] == value)]
    return float(hit["latency_s"].iloc[0])


def test_weight_gemms_per_pass_counts_projections_and_dense_mlps() -> None:
    """GQA: QKV, O, gate+up, down per layer; MoE without shared experts: QKV and O only (the
    routed experts run in the fused-MoE kernels); DeepSeek-V3 (MLA, one shared expert in every
    MoE layer, three dense layers): 4 attention GEMMs in prefill, 3 in decode, 2 MLP GEMMs in
    all 61 layers."""
    assert _weight_gemms_per_pass(get_model("Llama-3.1-8B"), decode=True) == 32 * 4
    assert _weight_gemms_per_pass(get_model("Qwen3-30B-A3B"), decode=False) == 48 * 2
    assert _weight_gemms_per_pass(get_model("Mixtral-8x7B"), decode=True) == 32 * 2
    deepseek = get_model("DeepSeek-V3")
    assert _weight_gemms_per_pass(deepseek, decode=False) == 61 * 4 + 61 * 2
    assert _weight_gemms_per_pass(deepseek, decode=True) == 61 * 3 + 61 * 2


def test_fp8_weights_stream_at_the_fraction_and_quantise_in_a_kernel_each() -> None:
    """Llama-3.1-8B with FP8 weights on H100, one-sequence decode (memory-bound at the hard
    max): lowering ``fp8_bandwidth_fraction`` from 1 to ``f`` adds exactly the weights' bytes
    at ``1/f − 1`` of the bandwidth (the KV bytes keep theirs); the kernel latency counts
    ``KERNELS_PER_LAYER`` per layer plus one per weight GEMM."""
    h100 = get_gpu("H100")
    knobs = dataclasses.replace(ROOFLINE_PRESETS["hopper"], ridge_exponent=math.inf)

    def decode_s(**given: float) -> float:
        rows = roofline_profile(h100, LLAMA_FP8, **{**dataclasses.asdict(knobs), **given}).rows
        return _row(rows, "decode", 1, "total_context_tokens", 128)

    cost = decode_step_cost(LLAMA_FP8, 1, 128)
    bandwidth = knobs.bandwidth_efficiency * h100.hbm_bw_bytes_per_s
    for fraction in (0.5, 0.9):
        gap = decode_s(fp8_bandwidth_fraction=fraction) - decode_s(fp8_bandwidth_fraction=1.0)
        assert gap == pytest.approx(cost.weight_bytes * (1 / fraction - 1) / bandwidth, rel=1e-9)
    latency = 5e-6
    gap = decode_s(kernel_latency_s=latency) - decode_s(kernel_latency_s=0.0)
    kernels = KERNELS_PER_LAYER * 32 + FP8_GEMM_EXTRA_KERNELS * 4 * 32
    assert gap == pytest.approx(kernels * latency, rel=1e-9)


def test_fp8_gemm_rows_price_the_same_terms() -> None:
    """The profile's ``gemm`` rows of an FP8 model: at ``m = 16`` (memory-bound, hard max) the
    weights' bytes at ``1/f`` and two kernel latencies (the GEMM and its quantisation)."""
    knobs = dataclasses.replace(ROOFLINE_PRESETS["hopper"], ridge_exponent=math.inf)
    h100 = get_gpu("H100")
    rows = roofline_profile(h100, LLAMA_FP8, **dataclasses.asdict(knobs)).rows
    gemm = rows[(rows["kind"] == "gemm") & (rows["m"] == 16)].iloc[0]
    n, k = int(gemm["n"]), int(gemm["k"])
    moved = n * k / knobs.fp8_bandwidth_fraction + 16 * (n + k) * LLAMA_FP8.activation_bytes
    expected = moved / (knobs.bandwidth_efficiency * h100.hbm_bw_bytes_per_s)
    expected += (1 + FP8_GEMM_EXTRA_KERNELS) * knobs.kernel_latency_s
    assert float(gemm["latency_s"]) == pytest.approx(expected, rel=1e-9)


def test_the_fp8_terms_are_inert_without_fp8_tensor_cores_or_fp8_weights() -> None:
    """On A100 FP8 weights are dequantised (weight-only), and 16-bit weights are 16-bit: the
    knob changes nothing and no quantisation kernel is counted."""
    for gpu, model in (("A100-80GB", LLAMA_FP8), ("H100", get_model("Llama-3.1-8B"))):
        same = [roofline_profile(gpu, model, fp8_bandwidth_fraction=f).rows for f in (1.0, 0.3)]
        assert same[0].equals(same[1]), gpu
    fp8 = roofline_profile("A100-80GB", LLAMA_FP8, kernel_latency_s=0.0).rows
    counted = roofline_profile("A100-80GB", LLAMA_FP8, kernel_latency_s=1e-6).rows
    step = fp8["kind"] == "decode"
    gap = (counted.loc[step, "latency_s"] - fp8.loc[step, "latency_s"]).to_numpy()
    assert gap == pytest.approx(KERNELS_PER_LAYER * 32 * 1e-6, rel=1e-9)


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.2])
def test_a_bad_fraction_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ParameterError, match="'fp8_bandwidth_fraction' parameter of roofline"):
        roofline_profile("H100", LLAMA_FP8, fp8_bandwidth_fraction=bad)


def test_the_presets_hold_a_fraction_where_the_gpu_has_fp8_tensor_cores() -> None:
    for generation in ("hopper", "blackwell", "ada"):
        assert 0.8 <= ROOFLINE_PRESETS[generation].fp8_bandwidth_fraction < 1.0, generation
    assert ROOFLINE_PRESETS["ampere"].fp8_bandwidth_fraction == 1.0


def test_fractions_are_the_kernel_tables_and_predict_fp8_decode(aic_dir: str) -> None:
    """The presets' ``fp8_bandwidth_fraction`` is what ``--fit`` derives from each fit
    system's GEMM table, whose FP8 GEMMs' fixed time lies about one kernel latency above the
    BF16 ones' (the quantisation kernel counted). Out of sample, on every FP8 check source
    (dense Llama, vLLM per-tensor FP8), the FP8 terms bring the decode median error down, to
    within 10%; and on DeepSeek-V3's FP8-block SGLang rows within 10% too."""
    validation = pytest.importorskip("calibration.roofline_validation")
    fit_rows = {s.generation: s for s in validation.SOURCES if s.role == "fit"}
    for generation in ("hopper", "blackwell", "ada"):
        preset = ROOFLINE_PRESETS[generation]
        fraction, extra_s = validation.gemm_fp8_bandwidth_fraction(aic_dir, fit_rows[generation])
        assert fraction == pytest.approx(preset.fp8_bandwidth_fraction, abs=5e-4), generation
        assert 0.5 * preset.kernel_latency_s < extra_s < 1.5 * preset.kernel_latency_s
    table = validation.fp8_table(
        {s: validation.measured(s, aic_dir, None).rows for s in validation.FP8_SOURCES}, {}
    )
    assert len(table) == len(validation.FP8_SOURCES) >= 9
    assert (table["decode_median_pct"] < table["before_decode_median_pct"]).all()
    assert (table["decode_median_pct"] <= 10.0).all(), table[["gpu", "model", "tp"]]
    deepseek = [
        s for s in validation.MOE_SOURCES if s.model == "DeepSeek-V3" and "sglang" in s.kind
    ]
    for source in deepseek:
        truth = validation.measured(source, aic_dir, None).rows
        errors = validation.log_errors(source, truth, ROOFLINE_PRESETS[source.generation])
        assert validation._summary(errors)["decode_median_pct"] <= 10.0, source
