"""Error and warning types of pdopt.

One root, :class:`PdoptError`. Bad data raises :class:`InputError` naming the file, row, field and
rule; bad parameters raise :class:`ParameterError` in one format (see
:func:`pdopt._validation.param_error`).
"""

from __future__ import annotations


class PdoptError(Exception):
    """Root of every error pdopt raises on purpose."""


class InputError(PdoptError, ValueError):
    """Bad input data: a trace or profile row that breaks a rule.

    The message names the file, the row, the field and the rule, e.g.
    ``trace.csv row 42: input_tokens=-3 must be >= 1``.
    """


class MissingColumnsError(InputError):
    """A trace file lacks columns that its format or column map names.

    ``missing`` lists them; ``present`` lists the columns (CSV header) or fields (JSON records)
    the file has, so a caller can say which names would do.
    """

    def __init__(self, message: str, missing: list[str], present: list[str]) -> None:
        super().__init__(message)
        self.missing = missing
        self.present = present


class ParameterError(PdoptError, ValueError):
    """A parameter given to a pdopt function has a value outside its allowed set.

    Built by :func:`pdopt._validation.param_error`, it also carries ``parameter`` (the name),
    ``rule`` (what it must be) and ``value`` (what was given), so a caller that knows where the
    value came from (a config file's key) can say so in its own words; each is None when the
    error was built from a message only.
    """

    def __init__(
        self,
        message: str,
        *,
        parameter: str | None = None,
        rule: str | None = None,
        value: object = None,
    ) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.rule = rule
        self.value = value


class ConfigError(PdoptError, ValueError):
    """A configuration (cluster, simulation, plan) that cannot be run as written."""


class InfeasiblePlanError(PdoptError):
    """No plan meets the constraints; the message says which binds and what is closest."""


class PdoptWarning(UserWarning):
    """Root of pdopt's warnings."""


class FitQualityWarning(PdoptWarning):
    """A fitted model is poor (R² below the threshold) or rests on too few points."""


class DataWarning(PdoptWarning):
    """Input data was repaired (sorted, filtered) and the message says how much."""
