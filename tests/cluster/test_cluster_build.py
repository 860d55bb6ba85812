"""One cluster builder and one owner per engine default (issue 37, deliver 7):
:func:`pdopt.cluster.build_cluster` and :func:`pdopt.cluster.worker_spec` make every cluster,
and the KV block size and the running-request default are read from one place."""

from __future__ import annotations

import dataclasses

import pytest

from pdopt.cluster import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_MAX_RUNNING,
    ClusterSpec,
    LinkSpec,
    Role,
    WorkerSpec,
    build_cluster,
    gpu_link,
    worker_spec,
)
from pdopt.costmodel import CostModel, DecodeModel, PrefillModel, roofline_cost_model
from pdopt.errors import ConfigError
from pdopt.hardware import get_gpu
from pdopt.model_spec import DEFAULT_MAX_SEQS, get_model
from pdopt.scenario import EXAMPLE_CONFIG

COST = CostModel(PrefillModel(0.0, 1e9, 1e12, 1.0, 0.0), DecodeModel(0.01, 0.0, 0.0))


def test_the_defaults_are_vllms_and_have_one_value_everywhere() -> None:
    assert (DEFAULT_BLOCK_TOKENS, DEFAULT_MAX_RUNNING) == (16, 256)
    assert DEFAULT_MAX_RUNNING == DEFAULT_MAX_SEQS
    worker = WorkerSpec("w", Role.DECODE, COST, 10)
    assert (worker.block_tokens, worker.max_running) == (DEFAULT_BLOCK_TOKENS, DEFAULT_MAX_RUNNING)
    built = ClusterSpec.build(COST, 1, 1).workers[0]
    assert (built.block_tokens, built.max_running) == (DEFAULT_BLOCK_TOKENS, DEFAULT_MAX_RUNNING)
    # the example scenario documents the same values
    assert f"block_tokens = {DEFAULT_BLOCK_TOKENS} " in EXAMPLE_CONFIG
    assert f"max_running = {DEFAULT_MAX_RUNNING}\n" in EXAMPLE_CONFIG


def test_worker_spec_counts_whole_blocks_and_takes_the_gpus_power() -> None:
    h100 = get_gpu("H100-SXM")
    w = worker_spec("p0", "prefill", COST, kv_tokens=16 * 100 + 15, gpu=h100, tp=2)
    assert w.kv_capacity_blocks == 100 and w.role is Role.PREFILL
    assert (w.idle_power_w, w.max_power_w) == (2 * h100.idle_power_w, 2 * h100.max_power_w)
    assert w.max_power_w > 0
    tiny = worker_spec("d0", Role.DECODE, COST, kv_tokens=3.0)
    assert tiny.kv_capacity_blocks == 1 and tiny.max_power_w == 0.0
    given = worker_spec("d1", Role.DECODE, COST, kv_capacity_blocks=7, gpu=h100, max_power_w=9e9)
    assert given.kv_capacity_blocks == 7 and given.max_power_w == 9e9
    with pytest.raises(ConfigError, match="kv_capacity_blocks or kv_tokens"):
        worker_spec("x", Role.DECODE, COST)


def test_build_cluster_defaults_link_and_window_from_gpu_and_model() -> None:
    h100, model = get_gpu("H100-SXM"), get_model("gpt-oss-120b")
    workers = [worker_spec("p0", Role.PREFILL, COST, kv_capacity_blocks=10),
               worker_spec("d0", Role.DECODE, COST, kv_capacity_blocks=10)]  # fmt: skip
    plain = build_cluster(workers, 1000.0)
    assert plain.link == LinkSpec.nvlink() and plain.max_context_tokens is None
    on_gpu = build_cluster(workers, 1000.0, gpu=h100, model=model)
    assert on_gpu.link == gpu_link(h100)
    assert on_gpu.max_context_tokens == model.max_context_tokens
    assert on_gpu.sliding_window == model.sliding_window is not None
    kept = build_cluster(workers, 1000.0, model=model, max_context_tokens=100)
    assert kept.max_context_tokens == 100


def test_the_class_builders_go_through_build_cluster() -> None:
    """``ClusterSpec.build`` is ``build_cluster`` over ``worker_spec`` workers, and
    ``from_hardware`` is ``build`` with the GPU's power and link."""
    built = ClusterSpec.build(COST, 2, 1, 1, mixed_pool_role="decode")
    common = dict(kv_capacity_blocks=4096, idle_power_w=60.0, max_power_w=400.0)
    workers = [worker_spec("p0", Role.PREFILL, COST, **common),
               worker_spec("p1", Role.PREFILL, COST, **common),
               worker_spec("d0", Role.DECODE, COST, **common),
               worker_spec("m0", Role.DECODE, COST, pool="mixed", **common)]  # fmt: skip
    assert built == build_cluster(workers, 131072.0)
    h100, model = get_gpu("H100-SXM"), get_model("Llama-3.1-8B")
    hw = ClusterSpec.from_hardware(h100, model, roofline_cost_model(h100, model, 1), 1, 1)
    assert hw.link == gpu_link(h100)
    assert {w.max_power_w for w in hw.workers} == {h100.max_power_w}
    assert dataclasses.replace(hw, kv_accounting=None) == hw  # equality ignores the terms
