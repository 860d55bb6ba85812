"""Which knob would make an infeasible sizing feasible: a larger TP degree, another GPU type
(with the number it reaches), or a looser SLO (issue 17, item 5)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdopt.model_spec import ModelSpec
from pdopt.plan._demand import Demand
from pdopt.plan._workers import DEFAULT_TPS, WorkerOption, worker_options


def _idle_ttft_s(option: WorkerOption, demand: Demand) -> float:
    """The demand's TTFT quantile on an idle worker of ``option`` (its own prefill time)."""
    service = demand.prefill_service_s(option.cost.prefill)
    return float(np.quantile(service, demand.ttft_quantile))


def knob_hint(
    binding: str, demand: Demand, model: str | ModelSpec, tried: Sequence[WorkerOption]
) -> str | None:
    """A sentence naming the TP degree or GPU type (catalogue, roofline prior) not tried that
    relaxes ``binding`` (``"ttft_slo"``: the fastest idle prefill; ``"kv_capacity"``: the
    largest KV), with its number; None when no untried option helps or the binding is another.
    """
    from pdopt.hardware import GPUS

    if binding not in ("ttft_slo", "kv_capacity"):
        return None
    seen = {(o.gpu, o.tp) for o in tried}
    gpus_tried = {o.gpu for o in tried}
    others = [
        o for o in worker_options(list(GPUS), model, DEFAULT_TPS) if (o.gpu, o.tp) not in seen
    ]
    if not others:
        return None
    q = f"P{demand.ttft_quantile * 100:g}"
    if binding == "kv_capacity":
        fit = [o for o in others if o.kv_capacity_tokens >= demand.peak_kv_tokens(o.model)]
        if not fit:
            return None
        best = min(fit, key=lambda o: o.price_per_hour)
        kv = best.kv_capacity_tokens
        peak_kv = demand.peak_kv_tokens(best.model)
        number = f"holds {kv:.0f} KV tokens (the longest request needs {peak_kv:.0f})"
    else:
        timed = [(o, _idle_ttft_s(o, demand)) for o in others]
        fast = [(o, t) for o, t in timed if t < demand.ttft_slo_s]
        if not fast:
            best, t = min(timed, key=lambda ot: ot[1])
            return (
                f"knob: no catalogued GPU and TP meets it either; the fastest, {best.name}, "
                f"has {q} prefill {t:.3g} s alone: loosen --ttft-slo above that"
            )
        best, t = min(fast, key=lambda ot: (ot[0].price_per_hour, ot[1]))
        number = f"has {q} prefill {t:.3g} s alone (roofline prior)"
    how = (
        f"--tp {best.tp}"
        if best.gpu in gpus_tried
        else f"--gpus {best.gpu}=N (with --tp {best.tp})"
    )
    return f"knob: {best.name} {number}: try {how}"
