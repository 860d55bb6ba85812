"""What a plan costs per token and how much energy it draws per token (issue 37, deliver 5).

A P/D plan splits its cost naturally: the prefill workers produce the input tokens' KV and the
first tokens, the decode workers the other output tokens. So USD per million input tokens is
the prefill pool's cost over the input token rate, USD per million output tokens the decode
pool's over the output token rate, and USD per million tokens the whole plan's (a Mixed reserve
included) over both. A colocated deployment has no such split: it states the total only.
Energy is the GPUs' board power at full load (the catalogue's ``max_power_w``, TDP) over the
token rate: an upper bound, since no GPU draws TDP all the time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from pdopt.hardware import get_gpu
from pdopt.plan._demand import Demand

MILLION = 1e6


def token_economics(
    counts: Iterable[Mapping[str, Any]],
    price_per_worker_hour: Mapping[tuple[str, int], float],
    demand: Demand,
) -> dict[str, float | None]:
    """USD per million input, output and total tokens and joules per token of a deployment.

    Parameters
    ----------
    counts : iterable of mapping
        The deployment's worker counts (``gpu``, ``tp``, ``role``: ``prefill``, ``decode``,
        ``mixed`` or ``colocated``, ``workers``), as :meth:`PdSizingPlan.to_dict` lists them.
    price_per_worker_hour : mapping (gpu, tp) -> float
        USD per hour of one worker of that GPU type and TP degree.
    demand : Demand
        The rate served and the length samples (mean input and output tokens per request).

    Examples
    --------
    >>> import numpy as np
    >>> d = Demand(10.0, np.full(4, 1000.0), np.full(4, 100.0), 1.0, 0.1)
    >>> rows = [{"gpu": "H100-SXM", "tp": 1, "role": "prefill", "workers": 1},
    ...         {"gpu": "H100-SXM", "tp": 1, "role": "decode", "workers": 1}]
    >>> e = token_economics(rows, {("H100-SXM", 1): 3.6}, d)
    >>> round(e["usd_per_m_input_tokens"], 4), round(e["usd_per_m_output_tokens"], 3)
    (0.1, 1.0)
    """
    in_rate = demand.rate_per_s * float(np.mean(demand.input_tokens))
    out_rate = demand.rate_per_s * float(np.mean(demand.output_tokens))
    by_role: dict[str, float] = {}
    watts = 0.0
    for c in counts:
        cost = price_per_worker_hour[(str(c["gpu"]), int(c["tp"]))] * int(c["workers"])
        by_role[str(c["role"])] = by_role.get(str(c["role"]), 0.0) + cost
        watts += get_gpu(str(c["gpu"])).max_power_w * int(c["tp"]) * int(c["workers"])
    total = sum(by_role.values())
    split = "prefill" in by_role and "decode" in by_role

    def per_million(usd_per_hour: float, tokens_per_s: float) -> float | None:
        return usd_per_hour / (tokens_per_s * 3600.0) * MILLION if tokens_per_s > 0 else None

    return {
        "usd_per_m_input_tokens": per_million(by_role["prefill"], in_rate) if split else None,
        "usd_per_m_output_tokens": per_million(by_role["decode"], out_rate) if split else None,
        "usd_per_m_tokens": per_million(total, in_rate + out_rate),
        "joules_per_token_at_tdp": watts / (in_rate + out_rate) if in_rate + out_rate else None,
        "joules_per_output_token_at_tdp": watts / out_rate if out_rate else None,
        "power_w_at_tdp": watts,
    }
