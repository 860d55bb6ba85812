"""Parameter files: published constants (not measurements) of a cost model and a controller.

The file is JSON. Keys (SI units: seconds, FLOP, FLOP/s, bytes)::

    {
      "pdopt-parameters": 1,
      "gpu": "V100-32GB", "model": "Qwen2.5-7B",
      "source": "published constants: ...",   # where the numbers come from (required)
      "units": "...",                          # how published units were converted
      "prefill": {"alpha_flop_per_token2": ..., "beta_flop_per_token": ...,
                  "p_peak_flops": ..., "p_m": 1.0, "intercept_s": 0.0},
      "m_total_bytes": ..., "delta_t_s": ..., "theta_frag": ..., "theta_flow": ...,
      "published": {...}                       # the values exactly as printed, for reference
    }
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pdopt.costmodel._models import CostModel, PrefillModel
from pdopt.errors import InputError, PdoptError

FORMAT_KEY = "pdopt-parameters"
_PREFILL_KEYS = ("alpha_flop_per_token2", "beta_flop_per_token", "p_peak_flops")
_OPTIONAL_PREFILL = {"p_m": 1.0, "intercept_s": 0.0}
_SCALARS = ("m_total_bytes", "delta_t_s", "theta_frag", "theta_flow")


@dataclass(frozen=True, slots=True)
class PublishedParameters:
    """A parameter set from a file: the prefill cost model and the control constants.

    Attributes
    ----------
    prefill : PrefillModel
        ``T = t0 + Σ (alpha·l² + beta·P_m·l) / P_peak`` in SI units (DESIGN.md "Cost model").
    m_total_bytes : float
        KV memory of one decode worker, the M_total of Φ_S, bytes.
    delta_t_s : float
        Control-loop period Δt, seconds.
    theta_frag, theta_flow : float
        Defragmentation and pool-flow thresholds (Phasor).
    source, units : str
        Where the numbers come from and how they were converted.
    published : Mapping
        The values as printed by their source, unconverted.
    """

    gpu: str
    model: str
    source: str
    units: str
    prefill: PrefillModel
    m_total_bytes: float
    delta_t_s: float
    theta_frag: float
    theta_flow: float
    published: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object :func:`write_parameter_file` writes."""
        prefill = {k: v for k, v in self.prefill.to_dict().items() if k != "type"}
        return {
            FORMAT_KEY: 1,
            "gpu": self.gpu,
            "model": self.model,
            "source": self.source,
            "units": self.units,
            "prefill": prefill,
            **{key: getattr(self, key) for key in _SCALARS},
            "published": dict(self.published),
        }


def read_parameter_file(path: str | Path) -> PublishedParameters:
    """Read and validate a parameter file (format in the module docstring).

    Raises
    ------
    InputError
        Unreadable JSON, a missing key, or a value that is not a finite number in range; the
        message names the file and the key.

    Examples
    --------
    >>> params = read_parameter_file("profiles/phasor_v100_qwen2.5-7b.json")  # doctest: +SKIP
    >>> params.prefill.p_peak_flops  # doctest: +SKIP
    121000000000000.0
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path.name}: not a readable JSON parameter file ({exc})") from exc
    if not isinstance(data, dict) or data.get(FORMAT_KEY) != 1:
        raise InputError(f"{path.name}: key '{FORMAT_KEY}' must be 1 (is this a parameter file?)")
    name = path.name
    prefill_data = data.get("prefill")
    published = data.get("published", {})
    if not isinstance(prefill_data, dict):
        raise InputError(f"{name}: key 'prefill' must be an object with keys {_PREFILL_KEYS}")
    if not isinstance(published, dict):
        raise InputError(f"{name}: key 'published' must be an object")
    prefill_values = {k: _number(prefill_data, k, name, "prefill.") for k in _PREFILL_KEYS}
    for key, default in _OPTIONAL_PREFILL.items():
        prefill_values[key] = _number(prefill_data, key, name, "prefill.", default)
    try:
        prefill = PrefillModel(**prefill_values)
    except PdoptError as exc:
        raise InputError(f"{name}: key 'prefill': {exc}") from exc
    return PublishedParameters(
        gpu=_text(data, "gpu", name),
        model=_text(data, "model", name),
        source=_text(data, "source", name),
        units=_text(data, "units", name),
        prefill=prefill,
        m_total_bytes=_number(data, "m_total_bytes", name),
        delta_t_s=_number(data, "delta_t_s", name),
        theta_frag=_number(data, "theta_frag", name),
        theta_flow=_number(data, "theta_flow", name),
        published=MappingProxyType(dict(published)),
    )


def write_parameter_file(params: PublishedParameters, path: str | Path) -> Path:
    """Write ``params`` as indented JSON (keys in a fixed order) and return the path."""
    path = Path(path)
    path.write_text(json.dumps(params.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


def _text(data: dict[str, Any], key: str, name: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{name}: key '{key}' must be a non-empty string (got {value!r})")
    return value


def _number(
    data: dict[str, Any], key: str, name: str, prefix: str = "", default: float | None = None
) -> float:
    if key not in data and default is not None:
        return default
    value = data.get(key)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0:  # type: ignore[operator]
        raise InputError(f"{name}: key '{prefix}{key}'={value!r} must be a finite number >= 0")
    return float(value)  # type: ignore[arg-type]


def published_cost_model(params: PublishedParameters, model: str, base: CostModel) -> CostModel:
    """A cost model whose prefill is the published one, scaled to ``model`` by P_m.

    ``P_m = N_param(model) / N_param(params.model)`` (Phasor Eq. 3, total parameters from the
    catalogue), so the published α, β and P_peak price another model of the same serving stack.
    A paper publishes the prefill surrogate only, so decode and the TTFT predictor come from
    ``base`` (e.g. :func:`pdopt.costmodel.roofline_cost_model` of the same GPU and model): the
    result is a hybrid whose provenance a caller must state.

    Examples
    --------
    >>> from pdopt.costmodel import roofline_cost_model
    >>> params = read_parameter_file("profiles/phasor_v100_qwen2.5-7b.json")  # doctest: +SKIP
    >>> base = roofline_cost_model("V100-32GB", "Llama-3-8B")
    >>> cost = published_cost_model(params, "Llama-3-8B", base)  # doctest: +SKIP
    """
    from pdopt.model_spec import get_model, param_count

    p_m = param_count(get_model(model)) / param_count(get_model(params.model))
    prefill = replace(params.prefill, p_m=params.prefill.p_m * p_m)
    return CostModel(prefill, base.decode, base.ttft)
