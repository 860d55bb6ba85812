"""Launch configurations for a recommended deployment: vLLM, SGLang and Dynamo (issue 37).

A starting point, not a tuned deployment: each role's engine settings are the ones the plan
was simulated with — the model, its TP degree and expert layout, ``max_num_seqs`` (the
option's ``max_running``), the context window (``max_model_len``), the memory share the KV
capacity was computed from (``gpu_memory_utilization`` 0.9) — plus a per-role token budget:
a prefill worker's ``max_num_batched_tokens`` holds the longest prompt of the workload (the
simulation prefilled one whole prompt at a time), a decode worker's is its ``max_num_seqs``
(one token per running request), a colocated worker's the chunk the simulation used (512
tokens for chunked prefill). KV transfer between the P and D roles uses the connector each
engine documents for disaggregated serving (vLLM's ``NixlConnector``, SGLang's ``nixl``
transfer backend, Dynamo's NIXL-based remote prefill). Model ids, hosts, ports and the
connector's availability in the engine version at hand are the user's to check; the file says
so at its top.

Formats: ``vllm`` and ``sglang`` write a bash script (one server per worker, a router or proxy
named in a comment); ``dynamo`` writes a YAML graph configuration (one section per role,
``ServiceArgs.workers`` replicas of ``resources.gpu`` GPUs each).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdopt.cluster import DEFAULT_MAX_RUNNING
from pdopt.model_spec import DEFAULT_MEMORY_UTILIZATION

EMIT_FORMATS = ("vllm", "sglang", "dynamo")
"""The launch-configuration formats of ``pdopt plan --emit``."""

COLOCATED_CHUNK_TOKENS = 512
"""Token budget per iteration of a colocated worker (the simulator's chunked-prefill default)."""

_BASE_PORT = 8100


@dataclass(frozen=True, slots=True)
class RoleLaunch:
    """One count of a deployment as an engine runs it: ``replicas`` servers of ``tp`` GPUs of
    type ``gpu`` in ``role`` (``prefill``, ``decode`` or ``colocated``)."""

    role: str
    gpu: str
    tp: int
    replicas: int
    expert_parallel: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int | None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.gpu}-tp{self.tp}"


def role_launches(
    counts: Iterable[Mapping[str, Any]],
    max_running: Mapping[tuple[str, int, bool], int],
    *,
    longest_prompt_tokens: int,
    max_model_len: int | None,
) -> list[RoleLaunch]:
    """The launches of a deployment's worker counts (``gpu``, ``tp``, ``role``, ``workers``,
    ``expert_parallel``, as :meth:`PdSizingPlan.to_dict` lists them; role ``mixed`` is the
    peak reserve and ``colocated`` a compared mode's workers), ``max_running`` by option key."""
    out = []
    for c in counts:
        key = (str(c["gpu"]), int(c["tp"]), bool(c.get("expert_parallel", False)))
        seqs = int(max_running.get(key, DEFAULT_MAX_RUNNING))
        role = str(c["role"])
        if role == "decode":
            budget = seqs
        elif role == "colocated":
            budget = COLOCATED_CHUNK_TOKENS
        else:  # prefill, and the Mixed reserve, which starts as prefill capacity
            budget = max(2048, 256 * math.ceil(longest_prompt_tokens / 256))
        out.append(RoleLaunch(role, key[0], key[1], int(c["workers"]), key[2], seqs, budget,
                              max_model_len))  # fmt: skip
    return out


def emit(fmt: str, model: str, launches: Sequence[RoleLaunch], header: Sequence[str]) -> str:
    """The launch configuration of ``launches`` in ``fmt`` (one of :data:`EMIT_FORMATS`)."""
    if fmt not in EMIT_FORMATS:
        raise ValueError(f"fmt must be one of {EMIT_FORMATS}; got {fmt!r}")
    disaggregated = any(x.role == "decode" for x in launches)
    lines = [f"# {line}" for line in _header(fmt, model, header)]
    if fmt == "dynamo":
        return "\n".join([*lines, *_dynamo(model, launches, disaggregated)]) + "\n"
    body = _vllm(launches, disaggregated) if fmt == "vllm" else _sglang(launches, disaggregated)
    script = ["#!/usr/bin/env bash", *lines, "set -euo pipefail",
              f'MODEL="${{MODEL:-{model}}}"  # set the Hugging Face id (or local path) you serve',
              *body, "wait"]  # fmt: skip
    return "\n".join(script) + "\n"


def _header(fmt: str, model: str, header: Sequence[str]) -> list[str]:
    return [
        f"pdopt plan --emit {fmt}: launch configuration of the recommended deployment of {model}",
        "A STARTING POINT: the engine settings the plan was simulated with; check the model id,",
        "hosts, ports, GPU placement and the KV connector of your engine version before use.",
        *header,
    ]


def _servers(launches: Sequence[RoleLaunch]) -> Iterable[tuple[RoleLaunch, int, int]]:
    """(launch, replica index, port) for every server, ports from 8100 up."""
    port = _BASE_PORT
    for launch in launches:
        for i in range(launch.replicas):
            yield launch, i, port
            port += 1


def _vllm(launches: Sequence[RoleLaunch], disaggregated: bool) -> list[str]:
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    out: list[str] = []
    for launch, i, port in _servers(launches):
        if i == 0:
            out.append(f"# {launch.role}: {launch.replicas} × {launch.gpu}/tp{launch.tp}")
        args = ["vllm", "serve", "$MODEL", "--port", str(port),
                "--tensor-parallel-size", str(launch.tp),
                "--max-num-seqs", str(launch.max_num_seqs),
                "--max-num-batched-tokens", str(launch.max_num_batched_tokens),
                "--gpu-memory-utilization", str(DEFAULT_MEMORY_UTILIZATION)]  # fmt: skip
        if launch.max_model_len:
            args += ["--max-model-len", str(launch.max_model_len)]
        if launch.expert_parallel:
            args.append("--enable-expert-parallel")
        if disaggregated:
            args += ["--kv-transfer-config", kv]
        out.append(_command(args) + f" &  # {launch.name}-{i}")
    if disaggregated:
        out.append("# route each request to a prefill server, then to a decode server (vLLM's")
        out.append("# disaggregated-serving proxy example), on the ports above")
    return out


def _sglang(launches: Sequence[RoleLaunch], disaggregated: bool) -> list[str]:
    out: list[str] = []
    urls: dict[str, list[str]] = {"prefill": [], "decode": []}
    for launch, i, port in _servers(launches):
        if i == 0:
            out.append(f"# {launch.role}: {launch.replicas} × {launch.gpu}/tp{launch.tp}")
        args = ["python", "-m", "sglang.launch_server", "--model-path", "$MODEL",
                "--port", str(port), "--tp-size", str(launch.tp),
                "--max-running-requests", str(launch.max_num_seqs),
                "--chunked-prefill-size", str(launch.max_num_batched_tokens),
                "--mem-fraction-static", str(DEFAULT_MEMORY_UTILIZATION)]  # fmt: skip
        if launch.max_model_len:
            args += ["--context-length", str(launch.max_model_len)]
        if launch.expert_parallel:
            args += ["--ep-size", str(launch.tp)]
        if disaggregated:
            mode = "decode" if launch.role == "decode" else "prefill"
            args += ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", "nixl"]
            urls[mode].append(f"http://127.0.0.1:{port}")
        out.append(_command(args) + f" &  # {launch.name}-{i}")
    if disaggregated:
        router = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for url in urls["prefill"]:
            router += ["--prefill", url]
        for url in urls["decode"]:
            router += ["--decode", url]
        out.append("# the router in front of them, once they are up:")
        out.append("# " + _command(router))
    return out


def _command(args: Sequence[str]) -> str:
    return " ".join('"$MODEL"' if a == "$MODEL" else shlex.quote(a) for a in args)


def _dynamo(model: str, launches: Sequence[RoleLaunch], disaggregated: bool) -> list[str]:
    out = ["Common:", f"  model: {_yaml(model)}"]
    window = next((x.max_model_len for x in launches if x.max_model_len), None)
    if window:
        out.append(f"  max-model-len: {window}")
    if disaggregated:
        kv = json.dumps({"kv_connector": "DynamoNixlConnector"})
        out.append(f"  kv-transfer-config: {_yaml(kv)}")
    out += ["Frontend:", "  common-configs: [model]", "Processor:", "  router: round-robin"]
    seen: dict[str, int] = {}
    for launch in launches:
        base = "PrefillWorker" if launch.role in ("prefill", "mixed") else "VllmWorker"
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}-{launch.gpu}-tp{launch.tp}"
        out += [
            f"{name}:  # {launch.role}: {launch.replicas} × {launch.gpu}/tp{launch.tp}",
            "  common-configs: [model, max-model-len"
            + (", kv-transfer-config]" if disaggregated else "]"),
            f"  tensor-parallel-size: {launch.tp}",
            f"  max-num-seqs: {launch.max_num_seqs}",
            f"  max-num-batched-tokens: {launch.max_num_batched_tokens}",
            f"  gpu-memory-utilization: {DEFAULT_MEMORY_UTILIZATION}",
        ]
        if launch.expert_parallel:
            out.append("  enable-expert-parallel: true")
        if base == "VllmWorker":
            out.append(f"  remote-prefill: {'true' if disaggregated else 'false'}")
            out.append("  conditional-disagg: false")
        out += ["  ServiceArgs:", f"    workers: {launch.replicas}", "    resources:",
                f"      gpu: {_yaml(str(launch.tp))}"]  # fmt: skip
    return out


def _yaml(text: str) -> str:
    """A YAML scalar in single quotes (a quote inside doubled)."""
    return "'" + text.replace("'", "''") + "'"
