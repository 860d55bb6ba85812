"""``pdopt simulate CONFIG.toml [--json] [--requests-csv F] [--timeseries-csv F] [--plots DIR]``:
one request-level simulation from a config file, its exports, progress on stderr (``--quiet``).
vLLM's engine arguments (``--max-num-batched-tokens``, ``--max-num-seqs``, ``--block-size``,
``--gpu-memory-utilization``, ``--num-gpu-blocks``, ``--enable-prefix-caching``) override the
config's cluster (:meth:`pdopt.sim.ClusterSpec.with_engine_args`).

``pdopt simulate --example-config`` prints a commented example config.

The KV capacity per worker and its terms (:class:`pdopt.model_spec.KvCapacity`): at start on
stderr where progress shows (a terminal, no ``--quiet``, not ``--json``; pipes stay clean), in
the text report on stdout, and as ``kv_capacity`` in the ``--json`` output.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from pdopt.cli._args import FRACTION, POSITIVE_INT
from pdopt.cli._output import add_json_flag, print_json
from pdopt.cli._runs import activity, add_run_flags, describe_run, export, print_written

if TYPE_CHECKING:
    from pdopt.cluster import ClusterSpec


def register(subparsers: Any) -> None:
    """Add ``pdopt simulate``."""
    parser = subparsers.add_parser(
        "simulate", help="run one request-level simulation from a TOML config"
    )
    parser.add_argument("config", nargs="?", help="simulation config (TOML)")
    parser.add_argument(
        "--example-config", action="store_true", help="print a commented example config"
    )
    add_run_flags(parser, "the run")
    parser.add_argument(
        "--check",
        nargs="?",
        const=0.99,
        type=FRACTION,
        metavar="QUANTILE",
        help="exit 3 when the run misses its [slo] at this quantile (default 0.99) over all "
        "requests, a rejected one counting as late: pdopt plan's verdict",
    )
    engine = parser.add_argument_group(
        "engine arguments (vLLM's names; override the config's [cluster] on every worker)"
    )
    engine.add_argument(
        "--max-num-batched-tokens",
        type=POSITIVE_INT,
        metavar="N",
        help="token budget of one iteration (chunked prefill included)",
    )
    engine.add_argument(
        "--max-num-seqs",
        type=POSITIVE_INT,
        metavar="N",
        help="running sequences, prefilling ones included",
    )
    engine.add_argument("--block-size", type=POSITIVE_INT, metavar="N", help="tokens per KV block")
    engine.add_argument(
        "--gpu-memory-utilization",
        type=FRACTION,
        metavar="F",
        help="share of GPU memory for weights, activations and KV",
    )
    engine.add_argument(
        "--num-gpu-blocks",
        type=POSITIVE_INT,
        metavar="N",
        help="KV blocks per worker, given directly",
    )
    engine.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse the KV of prompt blocks already computed",
    )
    engine.add_argument(
        "--server-overhead",
        choices=("none", "vllm_v1"),  # pdopt.scenario.SERVER_OVERHEADS (not imported: startup)
        help="the client's TTFT and E2E: add the serving stack's per-request time "
        "(vllm_v1: 4.2 ms + 1.35 iterations)",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=_simulate, parser=parser)


ENGINE_ARGS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "block_size",
    "gpu_memory_utilization",
    "num_gpu_blocks",
    "enable_prefix_caching",
)
"""``pdopt simulate``'s engine flags (:meth:`pdopt.sim.ClusterSpec.with_engine_args`)."""


def _simulate(args: argparse.Namespace) -> int:
    from pdopt.scenario import EXAMPLE_CONFIG, Scenario
    from pdopt.sim import ClosedLoop, rejections_by_reason

    if args.example_config:
        print(EXAMPLE_CONFIG, end="")
        return 0
    if not args.config:
        args.parser.error("give a CONFIG.toml (or --example-config)")
    scenario = Scenario.from_toml(args.config)
    engine_args = {k: getattr(args, k) for k in ENGINE_ARGS if getattr(args, k) is not None}
    if engine_args:
        scenario = scenario.replace(cluster=scenario.cluster.with_engine_args(**engine_args))
    if args.server_overhead is not None:
        from pdopt.costmodel import VLLM_V1_OVERHEAD
        from pdopt.scenario import with_server_overhead

        overhead = VLLM_V1_OVERHEAD if args.server_overhead == "vllm_v1" else None
        scenario = scenario.replace(cluster=with_server_overhead(scenario.cluster, overhead))
    if args.timeseries_csv or args.plots:
        scenario = scenario.replace(record_timeseries=True)
    kv_line, kv_terms = kv_capacity_summary(scenario.cluster)
    if not args.json and not args.quiet and sys.stderr.isatty():
        print(kv_line, file=sys.stderr)
    driver = scenario.workload
    n = driver.n_requests if isinstance(driver, ClosedLoop) else len(driver)
    with activity(describe_run(scenario, n), args.quiet):
        result = scenario.run()
    metrics = result.metrics()
    written = export(result, args)
    rejected = rejections_by_reason(result.requests)
    check = None if args.check is None else _check(result, scenario, args.check)
    code = 0 if check is None or check["meets"] else EXIT_MISSES
    if args.json:
        print_json(
            {
                "config": args.config,
                "policy": scenario.policy_name,
                "workers": result.workers,
                "kv_capacity": kv_terms,
                "metrics": metrics,
                **written,
                "rejected_by_reason": rejected,
                **({} if check is None else {"check": check}),
            }
        )
        return code
    print(f"{args.config}: policy {scenario.policy_name}, {len(scenario.cluster.workers)} workers")
    print(f"  {kv_line}")
    for key, value in metrics.items():
        print(f"  {key:28s} {value:.6g}")
    for reason, count in rejected.items():
        print(f"  rejected: {count} × {reason}")
    print_written(written)
    if check is not None:
        print(f"check: {check['text']}")
    return code


EXIT_MISSES = 3
"""``--check``'s exit code when the run misses its SLOs (as ``pdopt plan``'s)."""


def _check(result: Any, scenario: Any, quantile: float) -> dict[str, Any]:
    """The run against its SLOs at ``quantile``, as ``pdopt plan`` judges a plan."""
    import math

    from pdopt.plan._verify import slo_quantiles

    ttft_q, tpot_q = slo_quantiles(result, quantile)
    slo = scenario.slo
    q = f"P{quantile * 100:g}"
    parts, meets = [], True
    for name, value, limit in (("TTFT", ttft_q, slo.ttft_s), ("TPOT", tpot_q, slo.tpot_s)):
        if math.isnan(value):
            continue
        ok = value <= limit
        meets = meets and ok
        parts.append(f"{q} {name} {value:.4g} s {'<=' if ok else '>'} {limit:g} s")
    text = ("meets the SLOs: " if meets else "MISSES the SLOs: ") + ", ".join(parts)
    return {"quantile": quantile, "ttft_q_s": ttft_q, "tpot_q_s": tpot_q, "meets": meets,
            "text": text}  # fmt: skip


def kv_capacity_summary(cluster: ClusterSpec) -> tuple[str, dict[str, Any]]:
    """A line and a JSON-ready table of the workers' KV capacity: the formula's terms when the
    cluster was built from hardware, else the blocks given (per distinct value)."""
    terms = cluster.kv_accounting
    if terms is not None:
        return terms.describe(), {"source": "formula", **terms.to_dict()}
    blocks = sorted({w.kv_capacity_blocks for w in cluster.workers})
    shown = ", ".join(str(b) for b in blocks)
    line = f"KV per worker: {shown} blocks of {cluster.block_tokens} tokens (given)"
    return line, {"source": "given", "blocks": blocks, "block_tokens": cluster.block_tokens}
