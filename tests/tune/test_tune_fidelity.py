"""``fidelity = "auto"`` (issue 38, item 2): the request-level simulator wherever the study fits
the time budget, else the fluid screening, said with its reason; θ_frag tuned at DES fidelity."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdopt.cli import main
from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.scenario import Scenario
from pdopt.tune import PHASOR_SPACE, choose_fidelity, inert_params, trial_scenario
from pdopt.workload import archetype_workload

COST = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))


def scenario(n_mixed_role: str = "decode") -> Scenario:
    wl = archetype_workload("production_mix", 20.0, n_requests=200, seed=1)
    cluster = ClusterSpec.build(COST, 2, 2, 1, mixed_pool_role=n_mixed_role)
    return Scenario(wl, cluster, "phasor", Slo(1.0, 0.1))


def ticking(step_s: float) -> Iterator[float]:
    """A fake clock: each reading ``step_s`` later (the probe takes exactly ``step_s``)."""
    t = 0.0
    while True:
        yield t
        t += step_s


def test_des_when_the_estimated_study_fits_the_budget() -> None:
    clock = ticking(0.5)
    choice = choose_fidelity(scenario(), 100, budget_s=600.0, clock=lambda: next(clock))
    # 0.5 s on all 200 requests a trial, 100 trials = 50 s <= 600 s
    assert choice.fidelity == "des" and choice.probe_requests == 200
    assert choice.des_trial_s == pytest.approx(0.5) and choice.des_study_s == pytest.approx(50.0)
    assert "fit the 10 min budget (--budget-s)" in choice.reason


def test_fluid_when_it_does_not_and_workers_share_the_trials() -> None:
    clock = ticking(0.5)
    choice = choose_fidelity(
        scenario(), 100, budget_s=20.0, workers=2, probe_requests=100, clock=lambda: next(clock)
    )
    # 0.5 s on 100 of 200 requests: 1 s a trial, 100 trials on 2 workers = 50 s > 20 s
    assert choice.fidelity == "fluid"
    assert choice.des_trial_s == pytest.approx(1.0) and choice.des_study_s == pytest.approx(50.0)
    assert "exceed the 20 s budget" in choice.reason and "θ_frag" in choice.reason
    assert choice.to_dict()["workers"] == 2


def test_colocated_workers_or_a_one_sided_metric_decide_without_a_probe() -> None:
    def no_probe() -> float:
        raise AssertionError("no probe expected")

    mixed = choose_fidelity(scenario("mixed"), 10, clock=no_probe)
    assert mixed.fidelity == "des" and "colocated" in mixed.reason
    assert math.isnan(mixed.des_study_s) and mixed.probe_requests == 0
    des = choose_fidelity(scenario(), 10, des_only_metrics=["kv_fits_nowhere"], clock=no_probe)
    assert des.fidelity == "des" and "kv_fits_nowhere, which only the DES" in des.reason
    fluid = choose_fidelity(scenario(), 10, fluid_only_metrics=["pool_moves"], clock=no_probe)
    assert fluid.fidelity == "fluid" and "only the fluid model" in fluid.reason


def test_theta_frag_is_in_the_space_and_seen_at_des() -> None:
    assert "theta_frag" in PHASOR_SPACE.names
    assert inert_params(PHASOR_SPACE.names, "phasor", "des") == ()
    assert inert_params(PHASOR_SPACE.names, "phasor", "fluid") == ("theta_frag",)
    # a DES trial's policy is built with the sampled threshold
    trial = trial_scenario(scenario(), {"theta_frag": 0.31})
    assert trial.policy_flags["theta_frag"] == 0.31
    assert trial.make_policy().theta_frag == 0.31  # type: ignore[attr-defined]


CONFIG_EDITS = (("n_requests = 2000", "n_requests = 200"),)


def _config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["tune", "--example-config"]) == 0
    text = capsys.readouterr().out
    assert 'fidelity = "auto"' in text and "budget_s = 600.0" in text
    for old, new in CONFIG_EDITS:
        text = text.replace(old, new)
    path = tmp_path / "tune.toml"
    path.write_text(text)
    return path


def _tune(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["tune", *argv, "--n-trials", "2", "--confirm-top", "0", "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_the_command_tunes_theta_frag_at_des_when_it_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _tune(capsys, str(_config(tmp_path, capsys)), "--budget-s", "1e6")
    choice = out["fidelity_choice"]
    assert isinstance(choice, dict) and choice["fidelity"] == "des" == out["fidelity"]
    assert "fit the" in choice["reason"] and choice["budget_s"] == 1e6
    assert out["inert_params"] == []  # θ_frag is seen
    best = out["best_params"]
    assert isinstance(best, dict) and "theta_frag" in best


def test_the_command_screens_with_the_fluid_model_beyond_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, capsys)
    assert main(["tune", str(path), "--n-trials", "2", "--confirm-top", "0",
                 "--budget-s", "1e-6"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    # the report's first line; stderr stays for errors
    assert captured.out.startswith("fidelity fluid: 2 DES trials of 200 requests")
    assert "exceed the" in captured.out and "fidelity" not in captured.err
    assert main(["tune", str(path), "--n-trials", "2", "--confirm-top", "0",
                 "--budget-s", "1e-6", "--quiet"]) == 0  # fmt: skip
    report = capsys.readouterr().out.splitlines()
    assert report[0].startswith("fidelity fluid: ") and report[1].startswith("study ")
    out = _tune(capsys, str(path), "--budget-s", "1e-6")
    assert out["fidelity"] == "fluid" and out["inert_params"] == ["theta_frag"]
    given = _tune(capsys, str(path), "--fidelity", "des")  # asked for: no probe, no reason
    choice = given["fidelity_choice"]
    assert isinstance(choice, dict) and choice["fidelity"] == "des" and choice["reason"] == ""


def test_auto_refuses_a_metric_of_neither_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, capsys)
    with pytest.raises(SystemExit) as exc:  # refused before any probe or trial runs
        main(["tune", str(path), "--target", "min:e2e_p98_s"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "'e2e_p98_s' in 'min:e2e_p98_s' is not a metric of the fluid or des simulator" in err
    assert "closest: e2e_p99_s" in err and "fidelity des:" not in err  # no probe ran


def test_a_resumed_study_keeps_the_fidelity_its_trials_ran_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, capsys)
    url = f"journal:///{tmp_path}/s.log"
    first = _tune(capsys, str(path), "--storage", url, "--budget-s", "1e-6")
    assert first["fidelity"] == "fluid"
    # a budget the DES would fit does not switch the study's simulator half way
    again = _tune(capsys, str(path), "--storage", url, "--budget-s", "1e6")
    choice = again["fidelity_choice"]
    assert isinstance(choice, dict) and choice["fidelity"] == "fluid"
    assert "ran its trials at fluid: resumed at fluid" in choice["reason"]
    # asking for the other one is refused, naming the way out
    assert main(["tune", str(path), "--storage", url, "--fidelity", "des", "--n-trials", "3",
                 "--confirm-top", "0"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "ran its trials at fluid fidelity: resume it with fidelity 'fluid'" in err


@pytest.mark.parametrize(
    "call", ["choose_fidelity(scenario(), 10)", "tune(scenario(), n_trials=1, fidelity='des')"]
)
def test_the_probe_and_the_trials_run_on_the_engine_the_study_uses(call: str) -> None:
    """In a fresh process (the compiled engine not loaded, and the probe's 1,000 requests below
    ``engine="auto"``'s size) the probe loads the compiled engine from numba's cache before it
    times a run, as each DES trial does: the probe had timed the Python engine, 16x slower for
    Phasor on the ``phasor_study`` benchmark's hour, and sent studies that fit the budget to
    the fluid model. With a cold cache neither loads it (compiling takes minutes)."""
    import subprocess
    import sys

    from pdopt.sim._compiled._warm import cache_is_cold

    code = (
        "import sys\n"
        "sys.path.insert(0, '.')\n"
        "from pdopt.sim._simulate import _compiled_loaded\n"
        "from pdopt.tune import choose_fidelity, tune\n"
        "from tests.tune.test_tune_fidelity import scenario\n"
        f"{call}\n"
        "print(_compiled_loaded())\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert done.stdout.strip().splitlines()[-1] == str(not cache_is_cold())
