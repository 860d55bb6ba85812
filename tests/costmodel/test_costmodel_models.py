"""The immutable latency models: predictions, additivity, dict round trips, validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdopt.costmodel import CostModel, DecodeModel, PrefillModel, TtftModel
from pdopt.errors import ParameterError

PREFILL = PrefillModel(
    alpha_flop_per_token2=2.0e5,
    beta_flop_per_token=1.4e10,
    p_peak_flops=1.0e14,
    p_m=1.0,
    intercept_s=0.002,
)
DECODE = DecodeModel(d0_s=0.02, d1_s_per_request=5e-5, d2_s_per_token=7e-8)
TTFT = TtftModel(a_s_per_token2=2e-9, b_s_per_token=1.5e-4, c_s=0.003)


def test_prefill_request_time_is_the_closed_form() -> None:
    lengths = np.array([1, 128, 4096])
    expected = 0.002 + (2.0e5 * lengths**2 + 1.4e10 * lengths) / 1.0e14
    np.testing.assert_allclose(PREFILL.request_time_s(lengths), expected, rtol=1e-15)
    np.testing.assert_allclose(
        PREFILL.work_flop(lengths), 2.0e5 * lengths**2 + 1.4e10 * lengths, rtol=1e-15
    )


def test_p_m_scales_only_the_linear_term() -> None:
    doubled = PREFILL.with_p_m(2.0)
    assert doubled.p_m == 2.0
    assert doubled.alpha_flop_per_token2 == PREFILL.alpha_flop_per_token2
    assert doubled.intercept_s == PREFILL.intercept_s
    length = 1000.0
    extra = float(doubled.work_flop(length) - PREFILL.work_flop(length))
    assert extra == pytest.approx(PREFILL.beta_flop_per_token * length, rel=1e-12)


@given(
    st.lists(st.integers(min_value=1, max_value=32768), min_size=1, max_size=16),
    st.lists(st.integers(min_value=1, max_value=32768), min_size=1, max_size=16),
)
def test_batch_time_is_additive_in_work(first: list[int], second: list[int]) -> None:
    # One intercept per batch: two batches cost t0 more than their union.
    union = PREFILL.batch_time_s(first + second)
    split = PREFILL.batch_time_s(first) + PREFILL.batch_time_s(second)
    assert split - union == pytest.approx(PREFILL.intercept_s, rel=1e-9, abs=1e-12)
    work = float(np.sum(PREFILL.work_flop(first + second)))
    assert union == pytest.approx(PREFILL.intercept_s + work / PREFILL.p_peak_flops, rel=1e-12)


def test_decode_and_ttft_predictions() -> None:
    batch, context = np.array([1, 32, 256]), np.array([128, 32 * 1024, 256 * 4096])
    np.testing.assert_allclose(
        DECODE.iteration_time_s(batch, context), 0.02 + 5e-5 * batch + 7e-8 * context, rtol=1e-15
    )
    lengths = np.array([1.0, 512.0, 8192.0])
    np.testing.assert_allclose(
        TTFT.predict(lengths), 2e-9 * lengths**2 + 1.5e-4 * lengths + 0.003, rtol=1e-15
    )


def test_hybrid_iteration_is_one_fused_pass_by_hand() -> None:
    # Issue 34: min(max(decode pass, chunks' pass) + decode attention + chunk attention,
    # decode-only + prefill-only). B = 16 decodes holding C = 16·1024 tokens, one chunk of
    # c = 512 tokens of a prompt with d = 1024 already prefilled.
    model = CostModel(PREFILL, DECODE, TTFT)
    decode_pass = 0.02 + 5e-5 * 16  # τ(B, C) − d2·C = d0 + d1·B = 0.0208
    chunk_pass = 0.002 + 1.4e10 * (16 + 512) / 1.0e14  # t0 + beta·P_m·(B + c)/P_peak = 0.07592
    decode_attention = 7e-8 * 16 * 1024  # d2·C = 0.00114688
    chunk_attention = 2.0e5 * ((1024 + 512) ** 2 - 1024**2) / 1.0e14  # alpha·c(2d+c) = 0.00262144
    # the chunks' pass is the larger: the decode pass (and its fixed cost d0) hides under it
    assert decode_pass < chunk_pass
    expected = chunk_pass + decode_attention + chunk_attention  # 0.07968832
    got = model.hybrid_iteration_time_s([512], 16, 16 * 1024, [1024])
    assert got == pytest.approx(expected, rel=1e-12)
    # the new meaning (was: the issue-18 form saved exactly t0 on τ(B, C) + t0 + work): against
    # the two passes run apart, τ(B, C) + t0 + work / P_peak = 0.09824832, the fused pass saves
    # the decode pass less the decode tokens' linear work, d0 + d1·B − beta·B/P_peak = 0.01856
    work = 2.0e5 * ((1024 + 512) ** 2 - 1024**2) + 1.4e10 * 512
    separate = float(DECODE.iteration_time_s(16, 16 * 1024)) + 0.002 + work / 1.0e14
    assert separate - got == pytest.approx(decode_pass - 1.4e10 * 16 / 1.0e14, rel=1e-9)
    # and it costs at least its larger part, the prefill-only pass t0 + work / P_peak
    assert got >= 0.002 + work / 1.0e14


def test_hybrid_iteration_pays_the_fixed_cost_of_the_larger_pass() -> None:
    # Issue 34: one fixed cost, that of the larger pass. t0 = 0.05 > d0 = 0.02, B = 4, C = 4000,
    # c = 256: the chunks' pass t0 + beta·(B + c)/P_peak = 0.05 + 0.0364 is the larger (the decode
    # pass d0 + d1·B = 0.0202), then d2·C and the chunk's attention alpha·c² on top; d0 is not paid
    # (was: t0 + d1·B + d2·C + work / P_peak, the additive form's larger intercept).
    slow_start = dataclasses.replace(PREFILL, intercept_s=0.05)
    model = CostModel(slow_start, DECODE)
    expected = 0.05 + 1.4e10 * (4 + 256) / 1.0e14 + 7e-8 * 4000 + 2.0e5 * 256**2 / 1.0e14
    assert model.hybrid_iteration_time_s([256], 4, 4000) == pytest.approx(expected, rel=1e-12)
    # t0 = 0.002, a chunk of 16: the chunks' pass 0.002 + 1.4e-4·20 = 0.0048 is below the decode
    # pass 0.0202, so the fixed cost is d0 (inside τ(B, C)) and the chunk costs only its
    # attention alpha·c²/P_peak = 5.12e-7: τ(4, 4000) + 5.12e-7 = 0.020480512
    small = CostModel(PREFILL, DECODE)
    expected = 0.02 + 5e-5 * 4 + 7e-8 * 4000 + 2.0e5 * 16**2 / 1.0e14
    assert small.hybrid_iteration_time_s([16], 4, 4000) == pytest.approx(expected, rel=1e-12)


def test_hybrid_iteration_endpoints_are_the_fits() -> None:
    model = CostModel(PREFILL, DECODE, TTFT)
    chunks, prefix = [512, 100], [0, 300]
    assert model.hybrid_iteration_time_s([], 16, 16 * 1024) == float(
        DECODE.iteration_time_s(16, 16 * 1024)
    )
    # chunk-only: the prefill batch time of the chunks' work (a prompt's chunks sum to it)
    assert model.hybrid_iteration_time_s([512], 0, 0) == pytest.approx(PREFILL.batch_time_s([512]))
    whole = PREFILL.work_flop(400) + PREFILL.work_flop(512)
    assert model.hybrid_iteration_time_s(chunks, 0, 0, prefix) == pytest.approx(
        0.002 + (float(whole) - PREFILL.chunk_work_flop(0, 300)) / 1.0e14, rel=1e-12
    )
    assert model.hybrid_iteration_time_s([], 0, 0) == 0.0
    with pytest.raises(ParameterError, match="prefix_tokens"):
        model.hybrid_iteration_time_s([1, 2], 3, 4, [0])


@given(st.integers(0, 4096), st.integers(1, 4096), st.integers(1, 4096))
def test_chunk_work_sums_to_the_whole_prompt(done: int, first: int, second: int) -> None:
    total = PREFILL.chunk_work_flop(0, done) + PREFILL.chunk_work_flop(done, first)
    total += PREFILL.chunk_work_flop(done + first, second)
    whole = float(PREFILL.work_flop(done + first + second))
    assert total == pytest.approx(whole, rel=1e-12)


@pytest.mark.parametrize("ttft", [TTFT, None])
def test_dict_round_trip(ttft: TtftModel | None) -> None:
    model = CostModel(PREFILL.with_p_m(1.7), DECODE, ttft)
    data = model.to_dict()
    assert data["prefill"]["type"] == "PrefillModel"
    assert CostModel.from_dict(data) == model
    for part in (PREFILL, DECODE, TTFT):
        assert type(part).from_dict(part.to_dict()) == part


def test_models_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PREFILL.p_m = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("alpha_flop_per_token2", -1.0, ">= 0"),
        ("beta_flop_per_token", float("nan"), ">= 0"),
        ("p_peak_flops", 0.0, "> 0"),
        ("p_m", -2.0, "> 0"),
        ("intercept_s", -1e-3, ">= 0"),
    ],
)
def test_prefill_validation_message(field: str, value: float, rule: str) -> None:
    with pytest.raises(ParameterError) as info:
        dataclasses.replace(PREFILL, **{field: value})
    assert str(info.value) == (
        f"The {field!r} parameter of PrefillModel must be a finite number {rule}. Got {value!r}."
    )


def test_decode_validation_message() -> None:
    with pytest.raises(ParameterError, match=r"'d1_s_per_request' parameter of DecodeModel"):
        DecodeModel(0.01, -1e-5, 1e-8)


def test_published_cost_model_scales_the_papers_prefill_by_p_m() -> None:
    """Phasor Table 4 as a cost model: its α/β/P_peak, P_m = N_param(model)/N_param(Qwen2.5-7B)
    (Eq. 3), decode from the roofline prior; the quadratic term is ~86% of a 1,024-token
    prefill (issue 15), against ~1.6% for the roofline prior."""
    from pathlib import Path

    from pdopt.costmodel import published_cost_model, read_parameter_file, roofline_cost_model
    from pdopt.model_spec import get_model, param_count

    path = Path(__file__).resolve().parents[2] / "profiles" / "phasor_v100_qwen2.5-7b.json"
    params = read_parameter_file(path)
    base = roofline_cost_model("V100-32GB", "Llama-3-8B")
    cost = published_cost_model(params, "Llama-3-8B", base)
    ratio = param_count(get_model("Llama-3-8B")) / param_count(get_model("Qwen2.5-7B"))
    assert cost.prefill.p_m == pytest.approx(ratio) and 1.0 < ratio < 1.1
    assert cost.decode == base.decode and cost.ttft == base.ttft
    own = published_cost_model(params, "Qwen2.5-7B", roofline_cost_model("V100-32GB", "Qwen2.5-7B"))
    pre = own.prefill
    assert pre.p_m == 1.0
    quad = pre.alpha_flop_per_token2 * 1024**2
    assert quad / (quad + pre.beta_flop_per_token * 1024) == pytest.approx(0.865, abs=0.001)
    # the paper's constants price a 1,024-token prefill at ~0.43 s (above its 0.40 s SLO)
    assert float(pre.request_time_s(1024)) == pytest.approx(0.4258, abs=1e-3)
