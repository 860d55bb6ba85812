"""The benchmark modules import and their functions run on tiny sizes (issue 38 item 4).

Nothing here is timed: speed and memory are what ``make bench`` measures; these only check that
each benchmark runs and reports what it claims (targets, refusals, the identity check).
"""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_policies, bench_sim
from benchmarks.run import discover


def test_discover_lists_every_benchmark_and_full_swaps_the_sampled_study() -> None:
    sampled, full = discover(), discover(full=True)
    for name in ("policy_throughput", "sim_memory_timeseries", "phasor_study",
                 "first_compiled_run", "sim_throughput", "tune_200_trials"):  # fmt: skip
        assert name in sampled
    assert sampled["phasor_study"][0] is bench_policies.run_phasor_study
    assert full["phasor_study"][0] is bench_policies.run_phasor_study_full
    assert full["policy_throughput"] == sampled["policy_throughput"]


def test_layouts_cover_each_kind_with_eight_workers() -> None:
    for policy, kind, roles in (
        ("least_loaded", "disaggregated", {"prefill", "decode"}),
        ("vllm", "colocated", {"mixed"}),
        ("phasor", "pooled", {"prefill", "decode"}),
    ):
        assert bench_policies.layout(policy) == kind
        cluster = bench_policies.cluster_of(kind)
        assert len(cluster.workers) == 8
        assert {str(w.role) for w in cluster.workers} == roles
    pooled = bench_policies.cluster_of("pooled")
    assert sum(w.pool == "mixed" for w in pooled.workers) == 2


def test_policy_throughput_runs_both_engines_and_records_refusals() -> None:
    out = bench_policies.run_policies(200, policies=["least_loaded", "ecoserve"])
    json.dumps(out)  # the runner writes it as JSON
    assert out["n_requests_python"] == 20
    ll = out["policies"]["least_loaded"]
    assert ll["identical"] is True
    assert ll["compiled"]["n_requests"] == 200
    assert ll["compiled"]["with_timeseries"]["timeseries_rows"] > 0
    assert ll["compiled"]["no_timeseries"]["timeseries_rows"] == 0
    assert ll["python"]["no_timeseries"]["requests_per_cpu_s"] > 0
    eco = out["policies"]["ecoserve"]
    assert "error" not in eco
    # whatever the compiled engine supports today: a refusal with its reason, or identical
    if eco["compiled"] is None:
        assert "engine='compiled'" in eco["compiled_refused"]
        assert eco["met"] is False
        assert "ecoserve" in out["refused_compiled"]
    else:
        assert eco["identical"] is True
    assert out["met"] == all(case["met"] for case in out["policies"].values())


def test_memory_child_reports_its_peak_with_a_time_series(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench_policies._child_memory("python", 50)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["peak_rss_bytes"] > 0
    assert report["timeseries_rows"] > 0


def test_memory_extrapolation_is_the_line_through_both_peaks() -> None:
    # 0.2 GB at 1,000 requests, 0.3 GB at 101,000: 1e-6 GB a request, 1.199 GB at 1M
    assert bench_policies.extrapolate(0.2, 1000, 0.3, 101_000, 1_000_000) == pytest.approx(1.199)
    assert bench_policies.extrapolate(0.2, 1000, 0.3, 101_000, 101_000) == pytest.approx(0.3)


def test_phasor_study_samples_trials_and_extrapolates() -> None:
    out = bench_policies.run_phasor_study(4)
    json.dumps(out)
    assert out["fidelity"] == "des"
    assert out["trials_run"] == bench_policies.SAMPLE_TRIALS
    assert len(out["trial_wall_s"]) == out["trials_run"]
    # 3600 / 4 s of traffic, 200 trials on 2 workers
    mean = sum(out["trial_wall_s"]) / out["trials_run"]
    assert out["extrapolated_200_trials_s"] == pytest.approx(mean * 900 * 100)
    assert out["met"] == (out["extrapolated_200_trials_s"] <= 300.0)


def test_first_run_child_times_import_and_two_compiled_calls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pdopt.sim._compiled._warm import warm

    warm()  # this process holds the engine, as the benchmark's child loads it after the warm step
    bench_sim._child_first_run(100)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report) == {"import_s", "cache_was_cold", "first_call_s", "second_call_s"}
    assert report["cache_was_cold"] is False
    assert all(report[key] >= 0 for key in ("import_s", "first_call_s", "second_call_s"))
