"""Replay real serving runs through pdopt's colocated engine (issue 34, item 4).

A *run table* holds measured serving latencies of single colocated vLLM engines, one row per
load stage (the format of ``realgpu/h100_vllm_serving.csv`` in pdopt's development data; its
README gives the source). For each run, :func:`replay_runs`

1. generates the run's workload from its parameters: inference-perf's ``shared_prefix`` data,
   ``num_system_prompts × users_per_system_prompt`` fixed prompts (a system prompt of
   ``system_prompt_len`` tokens shared by a group, then the user's question) sent in a shuffled
   cycle, every prompt ``prompt_len_mean`` tokens long (the measured mean, which the tokeniser's
   round trip makes a few percent longer than the configured lengths) and every output
   ``output_len`` tokens (``ignore_eos``); arrivals Poisson within each stage (``n_sent``
   requests uniformly over ``duration_s``), stages one after the other;
2. runs one mixed worker with the run's engine arguments: ``max_num_batched_tokens`` as the
   iteration token budget (Sarathi/vLLM V1 chunked prefill, decode tokens included),
   ``max_num_seqs`` as ``max_running``, ``block_size``, ``kv_blocks_total_gpu`` as the KV
   capacity, prefix caching on, the cost model of the given profile source;
3. gives the cost model the server's per-request overhead (:class:`pdopt.costmodel.ServerOverhead`,
   :attr:`pdopt.costmodel.CostModel.overhead`), so the simulated TTFT and E2E are the client's;
4. lets the client give up on a request :data:`INFERENCE_PERF_TIMEOUT_S` after sending it,
   whatever its state (``client_timeout_s``, :mod:`pdopt.sim._engine`): such a request is a
   failure, as the run tables' ``n_failed`` counts them;
5. compares per stage TTFT mean/P90, TPOT mean and E2E mean/P90 over the requests that
   succeeded (the measured latencies are the succeeded requests'), and the failed counts.

What pdopt assumes where the source is silent: inference-perf's generator builds its prompt list
once, so a user's question is the same every time it is sent (after the first round every prompt
is a prefix-cache hit but its last partial block); the runs' ``multi-turn`` setting did not grow
the prompts (their measured mean is within 5% of system prompt + question).

Only the *form* of the model and the global :class:`ServerOverhead` terms are calibrated on such
runs (:func:`fit_server_overhead`); no constant is per run.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from pdopt.cluster import ClusterSpec, Slo
from pdopt.costmodel import CostModel, ServerOverhead, fit_cost_model
from pdopt.errors import InputError
from pdopt.model_spec import get_model
from pdopt.profile import roofline_profile
from pdopt.sim import simulate
from pdopt.workload import PrefixBlocks, Workload

RUN_COLUMNS = (
    "exp", "pdopt_model", "gpu", "tp", "max_num_batched_tokens", "max_num_seqs", "block_size",
    "kv_blocks_total_gpu", "system_prompt_len", "output_len", "num_system_prompts",
    "users_per_system_prompt", "stage", "rate_rps", "duration_s", "n_sent", "n_failed",
    "prompt_len_mean", "ttft_mean_ms", "ttft_p90_ms", "e2e_mean_ms", "e2e_p90_ms",
    "tpot_mean_ms", "overloaded",
)  # fmt: skip
"""Columns a run table must have (others are kept and ignored)."""

INFERENCE_PERF_TIMEOUT_S = 300.0
"""The client timeout of the measured runs, in seconds: inference-perf sets no request timeout
by default, so each request has aiohttp's default ``ClientTimeout(total=300)``, from sending it to
its last byte (the runs' longest measured E2E, 298 s, is just below it)."""

METRICS = ("ttft_mean", "ttft_p90", "tpot_mean", "e2e_mean", "e2e_p90")
"""What :func:`replay_runs` compares per stage (milliseconds)."""

CostSource = Callable[[pd.Series], CostModel]
"""A run's first row -> the cost model of its GPU × model × TP."""


def read_runs(path: str | Path) -> pd.DataFrame:
    """The load stages of a run table (the ``stage = all`` summary rows left out), checked."""
    path = Path(path)
    try:
        table = pd.read_csv(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; give the path of a run table") from None
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"{path}: not a CSV run table ({exc})") from None
    missing = [c for c in RUN_COLUMNS if c not in table.columns]
    if missing:
        raise InputError(
            f"{path}: missing column(s) {missing}; a run table has one row per load stage with "
            f"{', '.join(RUN_COLUMNS)}"
        )
    stages = table[table["stage"].astype(str) != "all"].reset_index(drop=True)
    for column in ("tp", "max_num_batched_tokens", "max_num_seqs", "block_size",
                   "kv_blocks_total_gpu", "n_sent", "output_len", "duration_s"):  # fmt: skip
        values = pd.to_numeric(stages[column], errors="coerce")
        bad = np.flatnonzero(~(values > 0))
        if len(bad):
            row = int(bad[0])
            raise InputError(
                f"{path} row {row + 2}: {column}={stages[column].iloc[row]!r} must be a number > 0"
            )
    return stages


def roofline_cost(row: pd.Series) -> CostModel:
    """The cost model of the run's GPU × model × TP from pdopt's roofline prior."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = roofline_profile(str(row["gpu"]), str(row["pdopt_model"]), int(row["tp"]))
        cost, _ = fit_cost_model(profile, model=get_model(str(row["pdopt_model"])))
    return cost


def run_workload(stages: pd.DataFrame, seed: int = 0) -> tuple[Workload, np.ndarray]:
    """The workload of one run (see the module docstring) and each request's stage index."""
    first = stages.iloc[0]
    rng = np.random.default_rng(seed)
    arrivals, stage_of, start = [], [], 0.0
    for k, (_, stage) in enumerate(stages.iterrows()):
        n = int(stage["n_sent"])
        arrivals.append(start + np.sort(rng.uniform(0.0, float(stage["duration_s"]), n)))
        stage_of.append(np.full(n, k))
        start += float(stage["duration_s"])
    arrival = np.concatenate(arrivals)
    n = len(arrival)
    prompt = round(float(first["prompt_len_mean"]))
    block = int(first["block_size"])
    groups, users = int(first["num_system_prompts"]), int(first["users_per_system_prompt"])
    shared = min(int(first["system_prompt_len"]), prompt) // block
    own = prompt // block - shared
    prompts = [
        [g * 1_000_003 + j for j in range(shared)]
        + [(1 + g * users + u) * 1_000_000_007 + j for j in range(own)]
        for g in range(groups)
        for u in range(users)
    ]
    order = rng.permutation(len(prompts))
    blocks = PrefixBlocks.from_lists([prompts[order[i % len(prompts)]] for i in range(n)], block)
    workload = Workload(
        arrival, np.full(n, prompt), np.full(n, int(first["output_len"])),
        name=str(first["exp"]), prefix_blocks=blocks,
    )  # fmt: skip
    return workload, np.concatenate(stage_of)


def replay_run(
    stages: pd.DataFrame,
    cost: CostModel,
    overhead: ServerOverhead,
    *,
    seed: int = 0,
    prefix_caching: bool = True,
    client_timeout_s: float | None = INFERENCE_PERF_TIMEOUT_S,
) -> pd.DataFrame:
    """Predicted TTFT mean/P90, TPOT mean and E2E mean/P90 (ms) over the requests that
    succeeded, and the failed ones (``n_failed``: aborted by the client's timeout, None for no
    timeout), per stage of one run (NaN latencies for a stage where none succeeded)."""
    first = stages.iloc[0]
    workload, stage_of = run_workload(stages, seed)
    budget = int(first["max_num_batched_tokens"])
    cost = dataclasses.replace(cost, overhead=overhead)  # the client's view of TTFT and E2E
    cluster = ClusterSpec.build(
        cost, 0, 0, 1, kv_capacity_blocks=int(first["kv_blocks_total_gpu"]),
        block_tokens=int(first["block_size"]), max_running=int(first["max_num_seqs"]),
        max_batch_size=int(first["max_num_seqs"]), max_batch_tokens=budget,
        colocated_schedule="hybrid", chunk_tokens=budget, chunk_budget="iteration",
        prefix_caching=prefix_caching,
    )  # fmt: skip
    from pdopt.policies import make_policy  # the policies import the simulator: keep it lazy

    result = simulate(
        workload, cluster, make_policy("sarathi", chunk_tokens=budget),
        slo=Slo(1.0, 1.0), record_timeseries=False, client_timeout_s=client_timeout_s,
    )  # fmt: skip
    q = result.requests
    ok = (q["status"] == "finished").to_numpy()
    engine_ttft = (q["first_token_s"] - q["arrival_s"]).to_numpy()
    tpot = q["tpot_s"].to_numpy()
    ttft = q["ttft_s"].to_numpy() * 1e3
    e2e = q["e2e_s"].to_numpy() * 1e3
    rows = []
    for k in range(len(stages)):
        mine = (stage_of == k) & ok
        rows.append(
            {
                "ttft_mean": _mean(ttft[mine]),
                "ttft_p90": _p90(ttft[mine]),
                "tpot_mean": _mean(tpot[mine]) * 1e3,
                "e2e_mean": _mean(e2e[mine]),
                "e2e_p90": _p90(e2e[mine]),
                "engine_ttft_mean": _mean(engine_ttft[mine]) * 1e3,
                "n_failed": int(((stage_of == k) & ~ok).sum()),
                "hit_fraction": float(
                    q["cached_tokens"].to_numpy()[mine].sum() / q["input_tokens"][mine].sum()
                )
                if "cached_tokens" in q
                else 0.0,
            }
        )
    return pd.DataFrame(rows)


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def _p90(values: np.ndarray) -> float:
    return float(np.percentile(values, 90)) if len(values) else float("nan")


def replay_runs(
    stages: pd.DataFrame,
    *,
    cost_of: CostSource = roofline_cost,
    overhead: ServerOverhead | None = None,
    seed: int = 0,
    prefix_caching: bool = True,
    client_timeout_s: float | None = INFERENCE_PERF_TIMEOUT_S,
    progress: Callable[[Iterable[str]], Iterable[str]] = lambda runs: runs,
) -> pd.DataFrame:
    """Measured vs predicted per stage of every run in ``stages`` (:func:`read_runs`).

    Columns: ``exp, model, tp, stage, rate_rps, overloaded``, then for each metric of
    :data:`METRICS` ``<metric>_measured``, ``<metric>_predicted`` (ms, over the requests that
    succeeded) and ``<metric>_err_pct`` (predicted / measured − 1, in %), and ``n_failed``,
    ``n_failed_predicted`` (requests the client gave up on after ``client_timeout_s``; None:
    never), ``hit_fraction`` (prompt tokens served by the prefix cache),
    ``engine_ttft_mean_ms`` (the engine's TTFT, before the overhead).
    ``overhead`` defaults to :data:`pdopt.costmodel.VLLM_V1_OVERHEAD`.
    """
    from pdopt.costmodel import VLLM_V1_OVERHEAD
    from pdopt.sim import load_compiled_engine

    # each replay (a few thousand requests, below engine="auto"'s size) then runs compiled, its
    # client timeouts too: about a second to load once, ~0.1 s against ~1.5 s a run
    load_compiled_engine()
    overhead = VLLM_V1_OVERHEAD if overhead is None else overhead
    out = []
    costs: dict[tuple[str, str, int], CostModel] = {}
    for exp in progress(list(dict.fromkeys(stages["exp"]))):
        run = stages[stages["exp"] == exp].reset_index(drop=True)
        first = run.iloc[0]
        key = (str(first["gpu"]), str(first["pdopt_model"]), int(first["tp"]))
        if key not in costs:
            costs[key] = cost_of(first)
        predicted = replay_run(
            run, costs[key], overhead, seed=seed, prefix_caching=prefix_caching,
            client_timeout_s=client_timeout_s,
        )  # fmt: skip
        for k in range(len(run)):
            stage = run.iloc[k]
            row = {
                "exp": exp, "model": first["pdopt_model"], "tp": int(first["tp"]),
                "stage": str(stage["stage"]), "rate_rps": float(stage["rate_rps"]),
                "overloaded": bool(stage["overloaded"]), "n_failed": int(stage["n_failed"]),
            }  # fmt: skip
            for metric in METRICS:
                measured = float(stage[f"{metric}_ms"])
                guess = float(predicted[metric].iloc[k])
                row[f"{metric}_measured"] = measured
                row[f"{metric}_predicted"] = guess
                row[f"{metric}_err_pct"] = (guess / measured - 1.0) * 100.0
            row["n_failed_predicted"] = int(predicted["n_failed"].iloc[k])
            row["hit_fraction"] = float(predicted["hit_fraction"].iloc[k])
            row["engine_ttft_mean_ms"] = float(predicted["engine_ttft_mean"].iloc[k])
            out.append(row)
    return pd.DataFrame(out)


def summarize(replay: pd.DataFrame) -> dict[str, float]:
    """Mean absolute % error (MAPE) per metric over the stages measured not overloaded, the
    largest E2E-mean error there, whether each overloaded stage was predicted overloaded
    (failed requests, or TTFT mean at least 10× the largest of the run table's non-overloaded
    stages), and the failed requests measured and predicted (``failed_*``: on the overloaded
    stages, and predicted on the calm ones)."""
    calm = replay[~replay["overloaded"]]
    summary = {f"{m}_mape_pct": float(calm[f"{m}_err_pct"].abs().mean()) for m in METRICS}
    summary["e2e_mean_max_abs_err_pct"] = float(calm["e2e_mean_err_pct"].abs().max())
    summary["stages"] = float(len(replay))
    summary["calm_stages"] = float(len(calm))
    calm_ttft = float(calm["ttft_mean_predicted"].max()) if len(calm) else 0.0
    stormy = replay[replay["overloaded"]]

    def overloaded(stages: pd.DataFrame) -> pd.Series:
        failed = stages["n_failed_predicted"] > 0 if "n_failed_predicted" in stages else False
        # NaN TTFT (no request succeeded) compares False: the failures say it
        return (stages["ttft_mean_predicted"] >= 10 * calm_ttft) | failed

    summary["overloads_predicted"] = float(overloaded(stormy).sum())
    summary["overloads_measured"] = float(len(stormy))
    summary["false_overloads"] = float(overloaded(calm).sum())
    summary["failed_measured_overloaded"] = float(stormy["n_failed"].sum())
    if "n_failed_predicted" in replay:
        summary["failed_predicted_overloaded"] = float(stormy["n_failed_predicted"].sum())
        summary["failed_predicted_calm"] = float(calm["n_failed_predicted"].sum())
    return summary


def fit_server_overhead(replay: pd.DataFrame) -> ServerOverhead:
    """The global overhead terms that best explain the calm stages' TTFT: non-negative least
    squares of ``measured − engine TTFT`` on ``1`` and the stage's predicted TPOT (the
    iteration time), :class:`ServerOverhead` ``fixed_s`` and ``stream_iterations``. One pair for
    all runs: never a constant per run."""
    from scipy.optimize import nnls

    calm = replay[~replay["overloaded"]]
    gap_s = (calm["ttft_mean_measured"] - calm["engine_ttft_mean_ms"]).to_numpy() / 1e3
    design = np.column_stack([np.ones(len(calm)), calm["tpot_mean_predicted"].to_numpy() / 1e3])
    coef, _ = nnls(design, gap_s)
    return ServerOverhead(fixed_s=float(coef[0]), stream_iterations=float(coef[1]))
