"""The cost model of a roofline prior: :func:`pdopt.profile.roofline_profile` fitted by
:func:`fit_cost_model`, for a GPU × model × TP that has no measured profile.

Fit quality, stated once: the roofline prefill is the model's own form, so α, β and P_peak fit it
exactly; the roofline decode prior is ``max(compute, memory) + a fixed cost``, which the linear
``τ(B, C) = d0 + d1·B + d2·C`` fits with R² ≈ 0.87 (MAPE ≈ 4%, README "Calibrated cost models").
An MoE model's roofline prices the experts a batch touches with the same ``cover(B)`` as the
decode model's expert term, which therefore fits it almost exactly (README "MoE decode"). The
dense fit raises a :class:`pdopt.errors.FitQualityWarning`, which is expected for a prior and is
the only warning filtered here: ``pdopt calibrate`` reports it for a user who asks.
"""

from __future__ import annotations

import warnings

from pdopt.costmodel._fit import fit_cost_model
from pdopt.costmodel._models import CostModel
from pdopt.errors import FitQualityWarning
from pdopt.hardware import GpuSpec
from pdopt.model_spec import ModelSpec, get_model
from pdopt.profile import roofline_profile


def roofline_cost_model(
    gpu: GpuSpec | str,
    model: ModelSpec | str,
    tp: int = 1,
    *,
    memory_utilization: float = 0.9,
    expert_parallel: bool = False,
    compute_efficiency: float | None = None,
) -> CostModel:
    """The cost model fitted from the roofline profile of ``model`` on ``gpu`` at TP ``tp``.

    Parameters
    ----------
    gpu, model : spec or catalogue name
    tp : int
        Tensor-parallel degree.
    memory_utilization : float
        Fraction of GPU memory the profile's KV capacity assumes (vLLM's setting).
    expert_parallel : bool
        MoE at ``tp > 1``: experts spread over the GPUs (see
        :func:`pdopt.profile.roofline_profile`).
    compute_efficiency : float, optional
        The prior's compute efficiency (default: the GPU generation's preset), e.g. one
        calibrated on the GPU's measured GEMMs by
        :func:`pdopt.profile.calibrate_compute_efficiency`.

    Examples
    --------
    >>> cost = roofline_cost_model("V100-32GB", "Qwen2.5-7B")
    >>> cost.prefill.p_peak_flops > 0
    True
    """
    # the spec itself goes to the fit: a user's MoE model, which the profile's header names
    # but the catalogue does not hold, keeps its expert term
    spec = get_model(model) if isinstance(model, str) else model
    profile = roofline_profile(
        gpu,
        spec,
        tp,
        memory_utilization=memory_utilization,
        expert_parallel=expert_parallel,
        compute_efficiency=compute_efficiency,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitQualityWarning)
        cost, _ = fit_cost_model(profile, model=spec)
    return cost
