"""experiments/analysis.ipynb runs headless (nbclient, the python3 kernel), its policy
comparison equals a direct simulation of the same inputs, its figures are stored inline (PNG
outputs: no backend is forced), and an SLO no plan meets goes on with the closest plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdopt.policies import make_policy

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
NOTEBOOK = EXPERIMENTS / "analysis.ipynb"
ROOT = EXPERIMENTS.parent
PROFILE = ROOT / "profiles" / "v100-32gb_qwen2.5-7b_roofline.csv"


def run(extra_source: str, parameters: str = "") -> Any:
    """Run the notebook (``parameters`` appended to its parameter cell) plus one appended cell;
    the executed notebook."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells[1].source += "\n" + parameters
    nb.cells.append(nbformat.v4.new_code_cell(extra_source))
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(EXPERIMENTS)}}
    )
    client.execute()
    return nb


def printed(cell: Any) -> str:
    return "".join(o["text"] for o in cell.outputs if o.get("output_type") == "stream")


def images(nb: Any) -> int:
    """PNG outputs in the whole notebook (figures shown inline)."""
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def execute(extra_source: str) -> list[str]:
    """Run the notebook plus one appended cell; return that cell's printed text."""
    return [printed(run(extra_source).cells[-1])]


def test_notebook_runs_and_matches_a_direct_simulation() -> None:
    import warnings

    from pdopt.cluster import ClusterSpec, Slo
    from pdopt.costmodel import fit_cost_model
    from pdopt.hardware import get_gpu
    from pdopt.model_spec import get_model
    from pdopt.profile import read_profile
    from pdopt.sim import simulate
    from pdopt.workload import archetype_workload

    printed = execute(
        "import json\n"
        "print(json.dumps({'plan': [int(n_prefill), int(n_decode)], "
        "'rows': comparison.to_dict(orient='records'), "
        "'deployment': deployment.plan.to_dict()['counts'], 'meets': deployment.meets}))"
    )
    data = json.loads("".join(printed))
    n_prefill, n_decode = data["plan"]
    assert n_prefill >= 1 and n_decode >= 1
    rows = data["rows"]
    assert rows and all(0.0 <= r["slo_attainment"] <= 1.0 for r in rows)
    assert {r["cluster"] for r in rows} == {f"plan {n_prefill}P{n_decode}D", "4P4D"}

    # Ground truth: the same workload, cost model, cluster and policy simulated here.
    wl = archetype_workload("production_mix", 8.0, n_requests=300, cv=3.0, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost, _ = fit_cost_model(read_profile(PROFILE))
    cluster = ClusterSpec.from_hardware(get_gpu("V100-32GB"), get_model("Qwen2.5-7B"), cost, 4, 4)
    expected = simulate(
        wl, cluster, make_policy("least_loaded"), slo=Slo(1.0, 0.1), seed=0
    ).metrics()
    mine = next(r for r in rows if r["cluster"] == "4P4D" and r["policy"] == "least_loaded")
    assert mine["ttft_p99_s"] == pytest.approx(expected["ttft_p99_s"], rel=1e-12)
    assert mine["goodput_rps"] == pytest.approx(expected["goodput_rps"], rel=1e-12)
    # the notebook's one-call plan (plan_deployment) is the command's answer on the same inputs
    cli = subprocess.run(
        [sys.executable, "-m", "pdopt", "plan", "--profile", str(PROFILE), "--workload",
         "production_mix", "--rate", "8", "--requests", "300", "--cv", "3", "--ttft-slo", "1",
         "--tpot-slo", "0.1", "--gpus", "V100-32GB=8", "--tp", "1", "--verify-draws", "1",
         "--json", "--quiet"],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert cli.returncode in (0, 3), cli.stderr
    payload = json.loads(cli.stdout)
    assert data["deployment"] == payload["recommendation"]["counts"]
    assert data["meets"] is payload["verdict"]["meets"]


def test_figures_show_inline_and_an_infeasible_slo_uses_the_closest_plan() -> None:
    # 0.05 s: below the V100's own prefill time of the longest prompts, so no plan meets it
    nb = run("print(n_prefill, n_decode)", parameters="TTFT_SLO_S = 0.05\nN_REQUESTS = 120")
    plan_cell = next(c for c in nb.cells if "solve_pd_sizing(demand" in c.source)
    text = printed(plan_cell)
    assert text.startswith("infeasible: ") and "closest plan (TTFT SLO " in text
    n_prefill, n_decode = map(int, printed(nb.cells[-1]).split())
    assert n_prefill >= 1 and n_decode >= 1
    assert images(nb) == 4  # the comparison figure and pdopt.report's three
