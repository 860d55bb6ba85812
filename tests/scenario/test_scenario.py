"""``pdopt.scenario.Scenario``: TOML in and out, runs, and the run's SLO reaching the policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pdopt.cluster import ClusterSpec, LinkSpec, Slo
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel
from pdopt.errors import ConfigError
from pdopt.policies import make_policy
from pdopt.scenario import EXAMPLE_CONFIG, Scenario, TomlTable, dumps_toml
from pdopt.sim import ClosedLoop
from pdopt.workload import Workload

# Phasor with a Mixed pool at a load where Φ_T's scale decides the macro flow control: the mean
# Φ_T of the prefill pool (queued work over P_peak · T_TTFT_SLO) falls below θ_flow × the decode
# pool's mean Φ_S under a 0.4 s SLO but not under 2 s, so Mixed workers move only with 0.4 s.
PHASOR_TOML = """
seed = 0
tick_s = 0.05
record_timeseries = false

[workload]
archetype = "production_mix"
rate_per_s = 30.0
n_requests = 400

[cluster]
gpu = "A100-80GB"
model = "Llama-2-7B"
n_prefill = 2
n_decode = 2
n_mixed = 2
mixed_pool_role = "decode"

[policy]
name = "phasor"
{flags}

[slo]
ttft_s = 0.4
tpot_s = 0.1
"""
FLAGS = {
    "run": "",
    "flag_0.4": "[policy.flags]\nttft_slo_s = 0.4",
    "flag_2.0": "[policy.flags]\nttft_slo_s = 2.0",
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def _cli_json(path: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [sys.executable, "-m", "pdopt", "simulate", str(path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    out = json.loads(proc.stdout)
    out.pop("config")
    return out  # type: ignore[no-any-return]


def _pool_moves(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["kind"] == "pool_move"].reset_index(drop=True)


def test_simulate_runs_phasor_phi_t_against_the_configs_slo(tmp_path: Path) -> None:
    """[slo] ttft_s = 0.4 with policy "phasor" is the same run as ttft_slo_s = 0.4 given as a
    flag, and not the run with Phasor's old default of 2 s (issue 14, "Done when")."""
    paths = {k: _write(tmp_path, k, PHASOR_TOML.format(flags=f)) for k, f in FLAGS.items()}
    cli = {k: _cli_json(p) for k, p in paths.items()}
    assert cli["run"] == cli["flag_0.4"]
    assert cli["run"]["metrics"] != cli["flag_2.0"]["metrics"]  # type: ignore[index]

    runs = {k: Scenario.from_toml(p).run(record_timeseries=True) for k, p in paths.items()}
    for frame in ("requests", "timeseries", "events", "workers"):
        assert getattr(runs["run"], frame).equals(getattr(runs["flag_0.4"], frame))
    moves = {k: _pool_moves(r.events) for k, r in runs.items()}
    assert len(moves["run"]) > 0 and len(moves["flag_2.0"]) == 0
    assert moves["run"]["detail"].str.contains("decode->prefill").any()
    assert not runs["run"].requests.equals(runs["flag_2.0"].requests)


def test_the_policy_reads_the_slo_from_the_run_not_a_default(tmp_path: Path) -> None:
    sc = Scenario.from_toml(_write(tmp_path, "run", PHASOR_TOML.format(flags="")))
    policy = make_policy("phasor")
    assert policy.settings(sc.slo, sc.tick_s).ttft_slo_s == 0.4
    assert make_policy("phasor", ttft_slo_s=2.0).settings(sc.slo, sc.tick_s).ttft_slo_s == 2.0


COST = CostModel(PrefillModel(5e5, 1.6e10, 2e14), DecodeModel(0.012, 2e-4, 5e-8))


def _hand_made() -> Scenario:
    """Values no TOML layout names: odd links, a pair link, a named workload, policy flags."""
    base = ClusterSpec.build(COST, 2, 2, 1, kv_capacity_blocks=900, mixed_pool_role="decode")
    pool = LinkSpec.kv_pool(LinkSpec.ethernet(25))
    cluster = ClusterSpec(
        base.workers,
        base.kv_bytes_per_token,
        pool,
        (("p0", "d1", pool),),
        preempted_requeue="back",
    )
    rng = np.random.default_rng(1)
    n = 60
    wl = Workload(
        np.cumsum(rng.exponential(0.1, n)), rng.integers(10, 900, n), rng.integers(1, 40, n), "hm"
    )
    return Scenario(
        wl, cluster, "phasor", Slo(0.7, 0.08), {"theta_flow": 0.5, "defrag": False}, tick_s=0.02
    )


def test_to_toml_reads_back_an_equal_scenario_that_runs_the_same(tmp_path: Path) -> None:
    example = Scenario.from_toml(
        _write(tmp_path, "ex", EXAMPLE_CONFIG.replace("n_requests = 2000", "n_requests = 80"))
    )
    closed = example.replace(workload=ClosedLoop(3, 0.2, example.workload, 30, "exponential"))
    spread = closed.replace(workload=ClosedLoop(3, 0.2, example.workload, 30, start_spread_s=0.3))
    for i, sc in enumerate((example, closed, spread, _hand_made())):
        back = Scenario.from_toml(sc.to_toml(tmp_path / f"out{i}.toml"))
        assert back == sc
        a, b = sc.run(), back.run()
        assert a.requests.equals(b.requests) and a.events.equals(b.events)


SARATHI_TOML = """
[workload]
archetype = "production_mix"
rate_per_s = 5.0
n_requests = 20

[cluster]
gpu = "A100-80GB"
model = "Llama-2-7B"
n_prefill = 0
n_decode = 0
n_mixed = 1
{cluster}

[policy]
name = "sarathi"
{flags}

[slo]
ttft_s = 2.0
tpot_s = 0.1
"""


def test_toml_sets_the_requeue_and_the_chunk_budget(tmp_path: Path) -> None:
    """Issue 18: ``[cluster] preempted_requeue`` and the policy's ``chunk_budget`` flag."""
    default = Scenario.from_toml(_write(tmp_path, "d", SARATHI_TOML.format(cluster="", flags="")))
    assert default.cluster.preempted_requeue == "front"
    assert default.make_policy().traits().chunk_budget == "iteration"
    text = SARATHI_TOML.format(
        cluster='preempted_requeue = "back"', flags='[policy.flags]\nchunk_budget = "prefill"'
    )
    sc = Scenario.from_toml(_write(tmp_path, "b", text))
    assert sc.cluster.preempted_requeue == "back"
    assert sc.make_policy().traits().chunk_budget == "prefill"
    bad = SARATHI_TOML.format(cluster='preempted_requeue = "middle"', flags="")
    with pytest.raises(ConfigError, match="preempted_requeue"):
        Scenario.from_toml(_write(tmp_path, "x", bad))


def test_run_overrides_fields_and_builds_a_fresh_policy_each_time() -> None:
    sc = _hand_made()
    assert sc.make_policy() is not sc.make_policy()
    assert sc.run(seed=3).requests.equals(sc.replace(seed=3).run().requests)
    assert sc.run(record_timeseries=False).timeseries.empty


def test_policy_objects_run_but_take_no_flags_and_cannot_be_written(tmp_path: Path) -> None:
    sc = _hand_made()
    obj = sc.replace(policy=make_policy("phasor", theta_flow=0.5, defrag=False), policy_flags={})
    assert obj.run().requests.equals(sc.run().requests)
    assert obj.policy_name == "Phasor"
    with pytest.raises(ConfigError, match="policy_flags go with a policy name"):
        obj.replace(policy_flags={"defrag": True})
    with pytest.raises(ConfigError, match="give a registered name"):
        obj.to_toml(tmp_path / "x.toml")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.integer("n"), 'f.toml [t] n: expected an int, got "4"'),
        (lambda t: t.integer("flag"), "f.toml [t] flag: expected an int, got true"),
        (lambda t: t.number("x", positive=True), "f.toml [t] x: expected a number > 0, got -1.5"),
        (lambda t: t.number("x", non_negative=True), "f.toml [t] x: expected a number >= 0, got"),
        (lambda t: t.string("s", choices=("a", "b")), "f.toml [t] s: expected one of ['a', 'b']"),
        (lambda t: t.array("xs", of=int), 'f.toml [t] xs: expected a list of ints, got [1, "2"]'),
        (lambda t: t.boolean("missing"), "f.toml [t] missing: expected true or false, got nothing"),
        (lambda t: t.only(("n",)), "f.toml [t] flag: expected a key among ['n'], got an unknown"),
    ],
)
def test_one_error_format(call: object, message: str) -> None:
    table = TomlTable({"n": "4", "flag": True, "x": -1.5, "s": "c", "xs": [1, "2"]}, "f.toml", "t")
    with pytest.raises(ConfigError) as info:
        call(table)  # type: ignore[operator]
    assert str(info.value).startswith(message)


def test_dumps_toml_writes_what_tomllib_reads() -> None:
    import tomllib

    data = {"a": 1, "b": [1.5, float("inf")], "s": 'q"\n', "t": {"u": True, "v": None}}
    back = tomllib.loads(dumps_toml(data))
    assert back == {"a": 1, "b": [1.5, float("inf")], "s": 'q"\n', "t": {"u": True}}


def test_import_direction() -> None:
    """scenario sits above sim, policies and workload; sim never imports it (nor policies)."""
    code = (
        "import sys, pdopt.sim; "
        "assert 'pdopt.scenario' not in sys.modules and 'pdopt.policies' not in sys.modules; "
        "import pdopt.scenario; "
        "assert not {'pdopt.capacity', 'pdopt.tune', 'pdopt.cli'} & set(sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


MOE_CLUSTER_TOML = """
[workload]
archetype = "short_short"
rate_per_s = 2.0
n_requests = 10

[cluster]
gpu = "H100-SXM"
model = "my-moe.json"
profile = "{profile}"
n_prefill = 1
n_decode = 1

[policy]
name = "distserve"

[slo]
ttft_s = 1.0
tpot_s = 0.1
"""


def test_a_profile_fits_with_the_clusters_model_and_must_measure_it(tmp_path: Path) -> None:
    """``[cluster] model`` may be a Hugging Face config; its measured (here roofline) profile
    is fitted with that spec, so a user's MoE model keeps its expert term, and a profile of
    another model is an error naming the key, not a silent mismatch."""
    from pdopt.model_spec import MODELS, get_model
    from pdopt.profile import roofline_profile, write_profile

    config = {
        "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    }  # fmt: skip
    (tmp_path / "my-moe.json").write_text(json.dumps(config))
    spec = get_model(str(tmp_path / "my-moe.json"))
    assert spec.name == "my-moe" and "my-moe" not in MODELS
    write_profile(roofline_profile("H100-SXM", spec), tmp_path / "mine.csv")
    write_profile(roofline_profile("H100-SXM", "Qwen3-8B"), tmp_path / "other.csv")
    good = _write(tmp_path, "good", MOE_CLUSTER_TOML.format(profile="mine.csv"))
    decode = Scenario.from_toml(good).cluster.workers[0].cost.decode
    assert (decode.experts, decode.experts_per_token) == (128, 8)
    bad = _write(tmp_path, "bad", MOE_CLUSTER_TOML.format(profile="other.csv"))
    with pytest.raises(ConfigError, match=r"\[cluster\] profile: expected a profile of the model "
                       r"my-moe, got 'other.csv', a profile of Qwen3-8B"):  # fmt: skip
        Scenario.from_toml(bad)
