"""pdopt: plan, simulate and tune prefill/decode disaggregated LLM serving."""

from pdopt.errors import (
    ConfigError,
    DataWarning,
    FitQualityWarning,
    InfeasiblePlanError,
    InputError,
    ParameterError,
    PdoptError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataWarning",
    "FitQualityWarning",
    "InfeasiblePlanError",
    "InputError",
    "ParameterError",
    "PdoptError",
    "__version__",
]
