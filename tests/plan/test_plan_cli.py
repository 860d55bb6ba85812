"""``pdopt plan`` end to end on shipped profiles, with ``--json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.workload import archetype_workload, write_csv_trace

ROOT = Path(__file__).resolve().parents[2]
V100 = str(ROOT / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv")
BASE = ["plan", "--profile", V100, "--ttft-slo", "1.0", "--tpot-slo", "0.1"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    code = main([*BASE, *args, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)  # type: ignore[no-any-return]


def test_plan_json_sizes_verifies_and_prices(capsys: pytest.CaptureFixture[str]) -> None:
    payload = run_json(capsys, "--workload", "production_mix", "--rate", "6",
                       "--requests", "1500", "--gpus", "V100-32GB=16", "--tp", "1")  # fmt: skip
    milp = payload["milp"]
    assert isinstance(milp, dict) and milp["status"] == "optimal"
    assert payload["recommendation"] == milp
    counts = {c["role"]: c["workers"] for c in milp["counts"]}
    assert counts["prefill"] >= 1 and counts["decode"] >= 1
    assert milp["n_gpus"] == sum(counts.values()) <= 16
    # V100 catalogue price 2.5 USD/h per GPU.
    assert milp["cost_per_hour"] == pytest.approx(2.5 * milp["n_gpus"])
    assert milp["cost_per_1k_requests"] == pytest.approx(milp["cost_per_hour"] / 6 / 3.6)
    analytic = payload["analytic"]
    assert isinstance(analytic, dict)
    assert analytic["cost_per_hour"] >= milp["cost_per_hour"] - 1e-9
    check = payload["check"]
    assert isinstance(check, dict) and check["sim_requests"] == 1500
    pred = check["predicted"]
    assert pred["stable"] and pred["ttft_attainment"] >= 0.99
    # The verdict is the simulation's own: both P99s within the SLOs.
    verdict = payload["verdict"]
    assert isinstance(verdict, dict) and verdict["meets"] and verdict["verified"]
    assert check["sim_ttft_q_s"] <= 1.0 and check["sim_tpot_q_s"] <= 0.1
    assert check["sim_tpot_mean_s"] == pytest.approx(pred["tpot_s"], rel=0.15)
    assert payload["model"] == "Qwen2.5-7B"
    options = payload["options"]
    assert isinstance(options, list) and options[0]["cost_model"].startswith("profile ")


def test_plan_searches_tp_degrees_by_default_and_says_where_costs_come_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    payload = run_json(capsys, "--workload", "short_short", "--rate", "4", "--requests", "300",
                       "--gpus", "V100-32GB=16", "--no-sim")  # fmt: skip
    options = payload["options"]
    assert isinstance(options, list)
    # Qwen2.5-7B has 28 heads: TP 8 does not divide them, TP 1, 2, 4 do.
    assert [o["tp"] for o in options] == [1, 2, 4]
    assert [o["cost_model"] == "roofline prior" for o in options] == [False, True, True]


def test_plan_text_output_answers_in_the_first_three_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*BASE, "--workload", "short_short", "--rate", "4", "--requests", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("pdopt plan: RECOMMENDED ") and "per 1,000 requests" in lines[0]
    assert lines[1].startswith(
        "verdict: meets the SLOs in simulation on 3 of 3 draws of 300 requests (seeds 0-2); "
        "worst draw: mean rate P99 TTFT"
    )
    assert lines[2].startswith("demand: Qwen2.5-7B, 4 req/s")
    out = "\n".join(lines)
    assert "TTFT P99 (s)" in out and "[roofline prior]" in out


def test_plan_trace_is_used_whole_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    write_csv_trace(archetype_workload("sharegpt", 5.0, n_requests=5000, seed=3), trace)
    payload = run_json(capsys, "--workload", str(trace), "--no-sim", "--gpus", "V100-32GB=inf")
    assert "check" not in payload and payload["verdict"]["verified"] is False  # type: ignore[index]
    demand = payload["demand"]
    assert isinstance(demand, dict) and demand["rate_per_s"] == pytest.approx(5.0, rel=0.2)
    assert demand["length_samples"] == 5000
    workload = payload["workload"]
    assert isinstance(workload, dict) and workload.pop("too_long")["over_context_window"] == 0
    assert workload == {
        "source": f"trace {trace}", "requests": 5000, "of": 5000, "name": "trace.csv",
    }  # fmt: skip


def test_plan_sampling_is_said_and_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = run_json(capsys, "--workload", "sharegpt", "--rate", "5", "--requests", "3000",
                       "--sample", "1000", "--no-sim", "--gpus", "V100-32GB=inf")  # fmt: skip
    wl = payload["workload"]
    assert isinstance(wl, dict) and wl["sampled_lengths"] == 1000
    assert wl["sample_quantile_error"] == pytest.approx(0.0429, abs=1e-4)  # DKW, 95%, n=1000
    assert any("--sample" in n for n in payload["notes"])  # type: ignore[union-attr]


def test_model_other_than_the_profiles_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*BASE, "--model", "Llama-3-8B", "--workload", "sharegpt", "--rate", "1"])
    assert code == 1
    assert "--model Llama-3-8B (Llama-3-8B) differs from the profiles' model Qwen2.5-7B" in (
        capsys.readouterr().err
    )


def test_plan_infeasible_inventory_exits_1_with_the_binding_constraint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main([*BASE, "--workload", "production_mix", "--rate", "40", "--requests", "200",
                 "--gpus", "V100-32GB=2", "--json"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "binding: GPU inventory" in err and "the closest within the limits serves" in err


def test_plan_infeasible_ttft_names_the_closest_slo_and_a_knob(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--profile", V100, "--ttft-slo", "0.2", "--tpot-slo", "0.1",
            "--workload", "long_short", "--rate", "1", "--requests", "100",
            "--tp", "1"]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "binding: TTFT SLO" in err
    # The knob: an option not tried (a larger TP or another GPU type) with its number.
    assert "knob: " in err and "prefill" in err and "alone" in err


@pytest.mark.parametrize(
    ("model", "gpus", "ways"),
    [
        # 810 GB of BF16 weights: FP8 ones fit at TP 8 (TP 16 would span two 8-GPU nodes)
        ("Llama-3.1-405B", "H100-SXM=64", ("--model Llama-3.1-405B@fp8",)),
        # already FP8: no TP group within one node holds it, and pdopt models no wider one
        ("DeepSeek-V3", "H100-SXM=64", ("no TP group within one 8-GPU node holds it",)),
    ],
)
def test_plan_a_model_that_fits_nowhere_says_why_and_what_would_fit(
    capsys: pytest.CaptureFixture[str], model: str, gpus: str, ways: tuple[str, ...]
) -> None:
    code = main(["plan", "--model", model, "--gpus", gpus, "--workload", "sharegpt",
                 "--rate", "1", "--requests", "50", "--ttft-slo", "5", "--tpot-slo", "0.5",
                 "--no-sim"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"{model} at tp=8 does not fit on H100-SXM: weights need" in err
    assert all(way in err for way in ways)
    assert ("@fp8" in err) == any("@fp8" in way for way in ways)


def test_plan_says_which_options_the_roofline_prior_prices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The profile's V100/tp1 is measured; the V100/tp2 option searched beside it is priced by
    the prior, and the notes say so (and that the simulation cannot tell)."""
    common = ["--workload", "short_short", "--rate", "2", "--requests", "100",
              "--gpus", "V100-32GB=16", "--no-sim"]  # fmt: skip
    measured_only = run_json(capsys, *common, "--tp", "1")
    assert not any("roofline prior" in n for n in measured_only["notes"])  # type: ignore[union-attr]
    both = run_json(capsys, *common, "--tp", "1,2")
    (note,) = [n for n in both["notes"] if "roofline prior" in n]  # type: ignore[union-attr]
    assert note.startswith("V100-32GB/tp2 priced by the roofline prior, not a measurement")
    assert "V100-32GB/tp1" not in note and "import-aic" in note


def test_plan_unknown_workload_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--workload", "no_such_thing", "--rate", "1"]) == 1
    assert "neither an archetype" in capsys.readouterr().err


# A user's MoE model that the catalogue does not hold: Qwen3-30B-A3B's shape under another name.
MY_MOE = {
    "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16", "_name_or_path": "me/my-moe",
}  # fmt: skip
SHORT = ["--workload", "short_short", "--rate", "4", "--requests", "300", "--no-sim"]


def test_plan_a_profile_of_a_hugging_face_config_with_model_pointing_at_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "my-moe" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(MY_MOE))
    profile = tmp_path / "p.csv"
    assert main(["profile", "roofline", "--gpu", "H100-SXM", "--model-config", str(config),
                 "--out", str(profile)]) == 0  # fmt: skip
    capsys.readouterr()
    # the header names "me/my-moe", which only the config defines: --model points at it
    args = ["plan", "--profile", str(profile), "--ttft-slo", "1", "--tpot-slo", "0.1", *SHORT]
    assert main(args) == 1
    assert "plans with --model pointing at that file" in capsys.readouterr().err
    for given in (str(config), str(config.parent)):  # the file, or its folder
        assert main([*args, "--model", given, "--json"]) == 0
        payload = json.loads(capsys.readouterr().out)
        assert payload["model"] == "me/my-moe"
        options = payload["options"]
        assert isinstance(options, list)
        assert options[0]["cost_model"].startswith("profile ")


def test_plan_a_spec_file_model_without_a_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "mine.toml"
    spec.write_text(
        '[model]\nname = "Mine-3B"\nnum_layers = 28\nhidden_size = 3072\nnum_heads = 24\n'
        "num_kv_heads = 8\nintermediate_size = 8192\nvocab_size = 128256\n"
    )
    code = main(["plan", "--model", str(spec), "--gpus", "H100-SXM=8", "--ttft-slo", "1",
                 "--tpot-slo", "0.1", *SHORT, "--json"])  # fmt: skip
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["model"] == "Mine-3B"
