"""Closed forms and approximations of queues, and LLM prefill/decode service models.

Pure functions of floats and numpy arrays; rates per second, times in seconds. Every function
states whether it is exact or an approximation, and raises
:class:`~pdopt.errors.ParameterError` for an unstable queue (rho >= 1) unless documented otherwise
(:func:`predict_pd` returns ``stable=False`` with infinite latencies).
"""

from __future__ import annotations

from pdopt.queueing._llm import (
    DecodeBatchLimit,
    DecodeLoad,
    PdPrediction,
    ServiceMoments,
    decode_load,
    decode_throughput_tokens_per_s,
    max_decode_batch,
    predict_pd,
    prefill_service_moments,
    service_moments,
)
from pdopt.queueing._multi import (
    allen_cunneen,
    allen_cunneen_wait_quantile_s,
    erlang_c,
    mmc,
    mmc_wait_quantile_s,
)
from pdopt.queueing._single import (
    QueueMetrics,
    kingman_wait_s,
    md1,
    md1_wait_cdf,
    mg1,
    mg1_wait_quantile_s,
    mm1,
    mm1_wait_quantile_s,
    utilization,
)

__all__ = [
    "DecodeBatchLimit",
    "DecodeLoad",
    "PdPrediction",
    "QueueMetrics",
    "ServiceMoments",
    "allen_cunneen",
    "allen_cunneen_wait_quantile_s",
    "decode_load",
    "decode_throughput_tokens_per_s",
    "erlang_c",
    "kingman_wait_s",
    "max_decode_batch",
    "md1",
    "md1_wait_cdf",
    "mg1",
    "mg1_wait_quantile_s",
    "mm1",
    "mm1_wait_quantile_s",
    "mmc",
    "mmc_wait_quantile_s",
    "predict_pd",
    "prefill_service_moments",
    "service_moments",
    "utilization",
]
