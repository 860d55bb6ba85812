"""EcoServe as its Alg. 1/2 and §4 write it, one test per step, each traced on a tiny scenario
against a hand computation (issue 36).

Cost model ``FLAT``: prefill ``2e9·l / 1e13`` = 0.2 ms per prompt token (1000 tokens: 0.2 s,
batched prompts add up, no intercept), decode iterations a constant 20 ms. Two instances in one
macro instance, mitosis off, so only Alg. 1/2 decide where a request goes.
"""

from __future__ import annotations

import pytest

import pdopt.policies.ecoserve  # noqa: F401  (registers "ecoserve")
from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ParameterError
from pdopt.policies import make_policy
from pdopt.sim import SimResult, latency_by_timing, simulate
from pdopt.workload import Workload

FLAT = CostModel(PrefillModel(0.0, 2e9, 1e13), DecodeModel(0.02, 0.0, 0.0))


def _run(
    arrival: list[float],
    prompt: list[int],
    output: list[int],
    slo: Slo,
    **flags: object,
) -> SimResult:
    cluster = ClusterSpec.build(FLAT, 0, 0, 2, kv_capacity_blocks=3000)
    flags = {"phases": "batch", **flags}  # the hand computations below are vLLM's schedule
    policy = make_policy("ecoserve", macro_size=2, mitosis=False, **flags)
    return simulate(Workload(arrival, prompt, output), cluster, policy, slo=slo, engine="python")


def _where(res: SimResult) -> list[str]:
    return list(res.requests["prefill_worker"])


def test_c1_counts_every_prompt_of_the_activation() -> None:
    """Alg. 2 lines 3-8. TTFT SLO 0.5 s; 1000-token prompts (0.2 s each) one second apart, so
    each finds m0 idle. Per activation, t_total after the second is 0.4 s and the third would
    make it 0.6 s > 0.5 s: it goes to m1 (Alg. 1 line 7). pdopt's earlier per-request check
    (``check="request"``) sees an empty queue each time and keeps all three on m0."""
    arrival, prompt, output = [0.0, 1.0, 2.0], [1000] * 3, [2] * 3
    slo = Slo(0.5, 10.0)
    assert _where(_run(arrival, prompt, output, slo)) == ["m0", "m0", "m1"]
    assert _where(_run(arrival, prompt, output, slo, check="request")) == ["m0", "m0", "m0"]


# R1 (200 tokens out) decodes on m0 through two activations of m0; R5 starts the second one
C2_ARRIVAL = [0.0, 0.25, 1.0, 1.5, 2.0, 2.01]
C2_OUTPUT = [200, 2, 2, 2, 2, 2]


def _c2(tpot_slo_s: float, **flags: object) -> list[str]:
    slo = Slo(0.5, tpot_slo_s)
    return _where(_run(C2_ARRIVAL, [1000] * 6, C2_OUTPUT, slo, **flags))


def test_c2_counts_the_decodes_that_existed_before_t_switch() -> None:
    """Alg. 2 lines 9-18 (TTFT SLO 0.5 s, prompts 0.2 s). R1 (t=0) opens m0's activation and
    decodes from 0.2 s. R2 (0.25 s) is checked against the decodes that existed before
    t_switch = 0: none (R1 arrived after it), so R2 joins m0 although R1 has saved only
    2·25 ms − 0.05 s = 0 s (pdopt's per-request check refuses it: R2 -> m1). R3 (1.0 s) fails
    C1 on m0 (0.6 s) and opens m1's activation; R4 joins it; R5 (2.0 s) fails C1 on m1 and
    opens m0's second activation (t_switch = 2.0), whose existed decode is R1. R6 (2.01 s):
    t_total = R5 + R6 = 0.4 s. R1 by then has 80 tokens since its first (3 before R2's
    prefill stalled it 0.26-0.46 s, 77 from 0.46 to 2.0 s), so its saved TPOT is
    81·SLO − (2.01 − 0.2) s: 0.296 s < 0.4 s with a 26 ms SLO (R6 -> m1), 0.62 s >= 0.4 s
    with 30 ms (R6 stays on m0)."""
    assert _c2(0.026) == ["m0", "m0", "m1", "m1", "m0", "m1"]
    assert _c2(0.030) == ["m0", "m0", "m1", "m1", "m0", "m0"]
    assert _c2(0.030, check="request")[1] == "m1"


def test_saved_tpot_margin_is_a_named_departure() -> None:
    """With a 27.5 ms SLO R1's saved TPOT at 2.01 s is 81·0.0275 − 1.81 = 0.4175 s >= 0.4 s:
    the paper's C2 keeps R6 on m0; ``saved_tpot_margin=True`` (pdopt's earlier rule) takes the
    coming 20 ms iteration off, 0.3975 s < 0.4 s, and sends it to m1."""
    assert _c2(0.0275)[5] == "m0"
    assert _c2(0.0275, saved_tpot_margin=True)[5] == "m1"


def _phase_run(**flags: object) -> SimResult:
    """A (100 tokens, 50 out) decodes on m0 from 0.02 s; B (1100 tokens, 0.22 s) arrives at
    0.5 s, C and D (1000 each) at 0.51 and 0.52 s, two tokens out each; loose SLOs keep all on
    m0."""
    return _run(
        [0.0, 0.5, 0.51, 0.52], [100, 1100, 1000, 1000], [50, 2, 2, 2], Slo(10.0, 10.0), **flags
    )


def test_a_prefill_phase_lasts_until_its_pending_batch_is_done() -> None:
    """§4.2.2.1 with vLLM's prefill-first schedule (``phases="batch"``): B starts at the decode
    boundary 0.5 s and runs to 0.72 s; C and D, queued meanwhile, run as one batch from 0.72
    to 1.12 s with no decode iteration between (A holds 25 tokens at 0.5 s); at 1.12 s, not a
    control tick, the instance decodes again: A's 25 remaining tokens end at 1.62 s. Nothing
    idles and nothing waits for a tick."""
    req = _phase_run().requests
    assert list(req["prefill_worker"]) == ["m0"] * 4
    assert req["prefill_start_s"].tolist() == pytest.approx([0.0, 0.5, 0.72, 0.72])
    assert req["prefill_end_s"].tolist() == pytest.approx([0.02, 0.72, 1.12, 1.12])
    assert req["finish_s"].tolist() == pytest.approx([1.62, 1.14, 1.14, 1.14])
    assert req["tpot_s"][0] == pytest.approx((1.62 - 0.02) / 49)


def test_ttft_and_tpot_under_both_definitions() -> None:
    """§4.4 / Fig. 6: B's first token is at 0.72 s but its decoding begins at 1.12 s, after C
    and D's batch. pdopt: TTFT 0.22 s, TPOT (1.14 − 0.72) / 1 = 0.42 s. The paper: TTFT
    1.12 − 0.5 = 0.62 s, TPOT (1.14 − 1.12) / 1 = 20 ms. An SLO of (0.5 s, 50 ms) fails B
    under either; (0.7 s, 50 ms) passes it only under the paper's timing (``Slo.timing``)."""
    res = _phase_run()
    both = latency_by_timing(res.requests, res.workers)
    assert both["first_token"][:, 1] == pytest.approx([0.22, 0.42])
    assert both["decode_start"][:, 1] == pytest.approx([0.62, 0.02])
    ours = res.metrics(Slo(0.7, 0.05))
    paper = res.metrics(Slo(0.7, 0.05, timing="decode_start"))
    # A's TPOT 32.7 ms and C, D's (TTFT 0.61/0.60 s, TPOT 20 ms) pass under both
    assert ours["slo_attainment"] == pytest.approx(3 / 4)
    assert paper["slo_attainment"] == pytest.approx(1.0)
    assert ours["slo_attainment_decode_start"] == paper["slo_attainment"]


def test_phase_rules_and_checks_are_named_flags() -> None:
    with pytest.raises(ParameterError, match="check"):
        make_policy("ecoserve", check="tick")
    with pytest.raises(ParameterError, match="phases"):
        make_policy("ecoserve", phases="always")
    with pytest.raises(ParameterError, match="timing"):
        Slo(1.0, 0.1, timing="first")


def test_tick_phases_hold_a_prefill_until_a_tick() -> None:
    """``phases="ticks"`` (pdopt's earlier rule): B arriving at 0.51 s starts its prefill at
    the first decode boundary after the next control tick (tick 0.55 s, boundary 0.56 s);
    under the paper's phases at the next decode boundary, 0.52 s."""

    def start(**flags: object) -> float:
        res = _run([0.0, 0.51], [100, 1100], [50, 2], Slo(10.0, 10.0), **flags)
        return float(res.requests["prefill_start_s"][1])

    assert start() == pytest.approx(0.52)
    assert start(phases="ticks") == pytest.approx(0.56)


def test_a_scenario_file_carries_the_slo_timing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pdopt.scenario import Scenario

    cluster = ClusterSpec.build(FLAT, 0, 0, 2, kv_capacity_blocks=3000)
    wl = Workload([0.0, 0.5], [100, 1100], [50, 2])
    for timing in ("first_token", "decode_start"):
        sc = Scenario(wl, cluster, "ecoserve", Slo(1.0, 0.05, timing=timing))
        back = Scenario.from_toml(sc.to_toml(tmp_path / f"{timing}.toml"))
        assert back.slo == sc.slo


def _probe(phases: str, **flags: object) -> SimResult:
    """The second reader's probe: R1 (1000 tokens, 6 out) at 0 s, R2 (1000 tokens, 6 out) at
    0.25 s; SLO 0.5 s TTFT / 50 ms TPOT counted as the paper does (§4.4)."""
    slo = Slo(0.5, 0.05, timing="decode_start")
    return _run([0.0, 0.25], [1000, 1000], [6, 6], slo, phases=phases, **flags)


def test_an_activated_instance_commits_to_prefill_until_its_prompts_are_prefilled() -> None:
    """§4.2.2.1 ("commits to processing only prefill tasks for a certain period") under
    ``phases="activation"``, ``hold="deadline"`` (pdopt's reading: an instance with no
    existed decode idles in its phase for more prompts of its activation; the default,
    ``hold="prefilled"``, ends R1's phase at the 0.2 s tick, and R2 finds R1
    decoding on m0 with no saved TPOT to cover its prefill (C2): it goes to m1).
    R1 prefills 0-0.2 s; the tick at 0.05 s puts m0 in a prefill
    phase, so R1 is held, not decoded. R2 (0.25 s): C1 0.4 s <= 0.5 s, no existed decode, so
    it joins m0's activation (prefill 0.25-0.45 s). At the 0.45 s tick nothing is left to
    prefill and another tick would take R1 to its TTFT SLO (0 + 0.5 s): the phase ends, both
    decode from 0.45 s, 5 tokens of 20 ms each. Paper TTFT 0.45 s and 0.2 s, TPOT 20 ms: both
    meet. Under ``phases="batch"`` R1 decodes from 0.2 s and R2's prefill (0.26-0.46 s)
    stalls it: TPOT (0.5 − 0.2) / 5 = 60 ms > 50 ms."""
    res = _probe("activation", hold="deadline")
    req = res.requests
    assert _where(res) == ["m0", "m0"]
    assert req["decode_start_s"].tolist() == pytest.approx([0.45, 0.45])
    paper = latency_by_timing(req, res.workers)["decode_start"]
    assert paper[0] == pytest.approx([0.45, 0.2])
    assert paper[1] == pytest.approx([0.02, 0.02])
    assert res.metrics()["slo_attainment"] == 1.0
    phases = res.events[res.events["kind"] == "phase"]
    assert list(zip(phases["t_s"].round(9), phases["detail"], strict=True)) == [
        (0.05, "both->prefill"),
        (0.45, "prefill->both"),
    ]
    batch = _probe("batch")
    assert latency_by_timing(batch.requests, batch.workers)["decode_start"][1][0] == (
        pytest.approx(0.06)
    )
    assert batch.metrics()["slo_attainment"] == pytest.approx(0.5)


def test_an_activation_phase_does_not_idle_on_existed_decodes() -> None:
    """A (100 tokens, 50 out) decodes on m0 from 0.02 s; B (1000 tokens, 2 out) at 0.5 s
    opens a new activation of m0 (A is an existed decode: C2 needs its saved TPOT, 0.49 s,
    >= B's 0.2 s). The 0.5 s tick puts m0 in a prefill phase; B's prefill ends at 0.7 s and
    the 0.7 s tick ends the phase at once (idling for more prompts would spend A's saved
    TPOT beyond the 0.2 s C2 granted): B decodes from 0.7 s, A finishes at 1.2 s, exactly
    as under ``phases="batch"``."""
    res = _run([0.0, 0.5], [100, 1000], [50, 2], Slo(0.5, 0.05), phases="activation")
    phases = res.events[res.events["kind"] == "phase"]
    assert list(zip(phases["t_s"].round(9), phases["detail"], strict=True)) == [
        (0.5, "both->prefill"),
        (0.7, "prefill->both"),
    ]
    req = res.requests
    assert req["decode_start_s"].tolist() == pytest.approx([0.02, 0.7])
    assert req["finish_s"].tolist() == pytest.approx([1.2, 0.72])
