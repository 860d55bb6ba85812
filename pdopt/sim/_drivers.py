"""Drivers: where requests come from. Open loop is a :class:`pdopt.workload.Workload`; closed loop
is :class:`ClosedLoop` (:mod:`pdopt.sim._arrivals` sends either into a run's kernel)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_int_at_least, check_non_negative, check_one_of
from pdopt.errors import ConfigError
from pdopt.workload import Workload


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """``clients`` users, each sending its next request ``think_time_s`` after its previous one
    ends (finished or rejected); ``n_requests`` in all.

    Client ``i`` (0-based) sends its first request, request id ``i``, at
    ``i · start_spread_s / clients`` (all at t = 0 by default; a spread staggers the starts, as
    the Phasor paper's closed-loop clients, §4.3). Later requests take ids ``clients, clients +
    1, ...`` in the order they are sent. Request ``i`` takes the lengths of row ``i mod
    len(lengths)``. With ``think="exponential"`` think times are exponential with mean
    ``think_time_s``, drawn from ``numpy.random.default_rng(seed)`` in the order requests are
    sent.

    Parameters
    ----------
    clients : int
        Concurrent users (in-flight requests at most).
    think_time_s : float
        Think time between a request's end and the client's next request, seconds.
    lengths : Workload or (input_tokens, output_tokens)
        Length rows to cycle through (a workload's arrival times are ignored).
    n_requests : int
        Total requests to send.
    think : {"constant", "exponential"}
    start_spread_s : float
        Window over which the clients' first requests are spread evenly, seconds (>= 0).
    """

    clients: int
    think_time_s: float
    lengths: Workload | tuple[npt.ArrayLike, npt.ArrayLike]
    n_requests: int
    think: str = field(default="constant")
    start_spread_s: float = 0.0

    def __post_init__(self) -> None:
        owner = "ClosedLoop"
        check_int_at_least(self.clients, 1, "clients", owner)
        check_non_negative(self.think_time_s, "think_time_s", owner)
        check_int_at_least(self.n_requests, 1, "n_requests", owner)
        check_one_of(self.think, ("constant", "exponential"), "think", owner)
        check_non_negative(self.start_spread_s, "start_spread_s", owner)
        inputs, outputs = self.length_arrays()
        if len(inputs) == 0 or len(inputs) != len(outputs):
            raise ConfigError(
                f"ClosedLoop lengths need equal, non-empty input and output columns; got "
                f"{len(inputs)} and {len(outputs)}"
            )
        if inputs.min() < 1 or outputs.min() < 1:
            raise ConfigError("ClosedLoop lengths must be >= 1 token")

    def length_arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(input_tokens, output_tokens)`` rows to cycle through."""
        if isinstance(self.lengths, Workload):
            return self.lengths.input_tokens, self.lengths.output_tokens
        inputs, outputs = self.lengths
        return np.asarray(inputs, dtype=np.int64), np.asarray(outputs, dtype=np.int64)

    def tokens(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Input and output tokens of all ``n_requests`` requests, by request id."""
        inputs, outputs = self.length_arrays()
        idx = np.arange(self.n_requests) % len(inputs)
        return inputs[idx], outputs[idx]

    def first_send_s(self) -> npt.NDArray[np.float64]:
        """When client ``i`` sends its first request (request id ``i``): ``i · start_spread_s /
        clients``, seconds, for the ``min(clients, n_requests)`` clients that send one."""
        first = min(self.clients, self.n_requests)
        out: npt.NDArray[np.float64] = (
            np.arange(first, dtype=np.float64) * self.start_spread_s / self.clients
        )
        return out

    def think_times(self, seed: int) -> npt.NDArray[np.float64]:
        """Think time before request ``i`` is sent (index ``i - clients``), seconds."""
        count = max(self.n_requests - self.clients, 0)
        if self.think == "constant":
            return np.full(count, self.think_time_s)
        return np.random.default_rng(seed).exponential(self.think_time_s, size=count)
