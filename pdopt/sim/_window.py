"""Requests beyond the model's context window: rejected before the run, with the reason.

The rule (one owner; :mod:`pdopt.plan` applies the same one when it sizes): as vLLM's
``max_model_len``, a prompt longer than the window is rejected, and so is a prompt whose output
would run past it. :func:`simulate` runs the engine (either one: this happens outside both) on
the requests that fit and adds the others as rejected rows (``reason`` says why, ``rejection``
events at their arrival), so every request still ends exactly once and keeps its id.
"""

from __future__ import annotations

from array import array
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pandas as pd

from pdopt.cluster._spec import ClusterSpec
from pdopt.sim._enums import Status
from pdopt.sim._requests import RequestTable
from pdopt.sim._result import EVENT_COLUMNS, SimResult
from pdopt.workload import Workload


def context_rejections(
    input_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike, max_context_tokens: int
) -> npt.NDArray[np.object_]:
    """Per request, why it does not fit a ``max_context_tokens`` window ("" when it fits)."""
    inputs = np.asarray(input_tokens, dtype=np.int64)
    outputs = np.asarray(output_tokens, dtype=np.int64)
    out = np.full(len(inputs), "", dtype=object)
    out[inputs + outputs > max_context_tokens] = (
        f"prompt + output exceed the {max_context_tokens}-token context window"
    )
    out[inputs > max_context_tokens] = (
        f"prompt exceeds the {max_context_tokens}-token context window"
    )
    return out


def split_by_window(
    workload: Workload, max_context_tokens: int
) -> tuple[Workload, npt.NDArray[np.int64], npt.NDArray[np.object_]]:
    """``(kept workload, ids of the kept requests, reason per request)``."""
    reasons = context_rejections(workload.input_tokens, workload.output_tokens, max_context_tokens)
    keep = np.flatnonzero(reasons == "")
    kept = workload.take(keep)  # with its prefix blocks
    return kept, keep.astype(np.int64), reasons


def with_rejections(
    result: SimResult,
    workload: Workload,
    kept_ids: npt.NDArray[np.int64],
    reasons: npt.NDArray[np.object_],
    cluster: ClusterSpec,
) -> SimResult:
    """``result`` of the kept requests, renumbered to the workload's ids, plus the rejected."""
    rejected = np.flatnonzero(reasons != "")
    table = RequestTable(len(rejected))
    for name, column, code in (("arrival_s", workload.arrival_s, "d"),
                               ("input_tokens", workload.input_tokens, "q"),
                               ("output_tokens", workload.output_tokens, "q")):  # fmt: skip
        dtype = np.float64 if code == "d" else np.int64
        values = np.ascontiguousarray(column[rejected], dtype=dtype)
        setattr(table, name, array(code, values.tobytes()))
    for i, rid in enumerate(rejected):
        table.status[i] = Status.REJECTED
        table.reason[i] = str(reasons[rid])
    names = tuple(w.name for w in cluster.workers)
    extra = table.to_frame(len(rejected), names)
    extra["request_id"] = rejected.astype(np.int64)
    requests = result.requests.copy()
    requests["request_id"] = kept_ids[requests["request_id"].to_numpy()]
    requests = pd.concat([requests, extra], ignore_index=True)
    requests = requests.sort_values("request_id", kind="stable").reset_index(drop=True)
    events = result.events.copy()
    ids = events["request_id"].to_numpy(dtype=np.int64).copy()  # an empty log is untyped
    has_id = ids >= 0
    ids[has_id] = kept_ids[ids[has_id]]
    events["request_id"] = ids
    new = pd.DataFrame(
        {"t_s": workload.arrival_s[rejected], "kind": "rejection", "worker": "",
         "request_id": rejected.astype(np.int64), "detail": [str(reasons[r]) for r in rejected]},
        columns=list(EVENT_COLUMNS),
    )  # fmt: skip
    events = pd.concat([events, new], ignore_index=True)
    events = events.sort_values("t_s", kind="stable").reset_index(drop=True)
    makespan = max(result.makespan_s, float(workload.arrival_s[rejected].max(initial=0.0)))
    workers = result.workers.copy()
    if makespan > result.makespan_s:  # idle energy over the longer span
        idle = np.array([w.idle_power_w for w in cluster.workers])
        workers["energy_j"] = workers["energy_j"] + idle * (makespan - result.makespan_s)
    return replace(result, requests=requests, events=events, workers=workers, makespan_s=makespan)
