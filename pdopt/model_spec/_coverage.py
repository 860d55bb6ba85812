"""Expert coverage: how many distinct routed experts a batch of tokens touches in one MoE layer.

The one owner of that formula: the roofline's weight bytes
(:func:`pdopt.model_spec.expected_experts_touched`), the decode cost model's expert term
(:class:`pdopt.costmodel.DecodeModel`) and both simulation engines (:mod:`pdopt.sim._closed_form`,
compiled by :mod:`pdopt.sim._compiled`) all evaluate :func:`expert_coverage`.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

Tokens = TypeVar("Tokens", float, npt.NDArray[np.float64])


def expert_coverage(tokens: Tokens, experts: float, experts_per_token: float) -> Tokens:
    """Expected distinct experts ``tokens`` tokens use in one MoE layer:

        ``cover(B) = E · (1 − (1 − k/E)^B)``

    with ``E`` routed experts, ``k`` chosen per token, and ``B`` tokens. Assumption: uniform,
    independent routing (each expert is missed by one token with probability ``1 − k/E``; the
    ``k`` choices of one token are distinct, which the product form treats as independent per
    expert, exact for the expectation by linearity). ``cover(0) = 0``, ``cover(1) = k``,
    ``cover(B) → E``; concave and increasing in ``B``. Real routers are skewed (popular experts
    are hit more often), so fewer distinct experts are touched than this: the curve saturates
    earlier in ``B``.

    Plain arithmetic on its arguments, so it takes a float or a float array for ``tokens``
    (>= 0), and numba compiles it unchanged for the compiled simulation engine (called there with
    float ``tokens``: a float power, ``pow`` of the C library in both engines).

    Examples
    --------
    >>> expert_coverage(1.0, 8, 2)
    2.0
    >>> round(expert_coverage(4.0, 8, 2), 6)  # 8 · (1 − 0.75⁴)
    5.46875
    """
    covered: Tokens = experts * (1.0 - (1.0 - experts_per_token / experts) ** tokens)
    return covered
