"""A small typed search space: each tuned parameter with its range, and where it goes.

A parameter is a :class:`FloatParam`, :class:`IntParam` or :class:`CategoricalParam`; a
:class:`SearchSpace` is an ordered tuple of them with unique names. Text form (CLI, config)::

    theta_flow=0.3:0.95          float in [0.3, 0.95]
    delta_t_s=0.01:0.5:log       float, sampled on a log scale
    max_moves=1:8:int            integer in [1, 8]
    decode_routing=free_kv|phi_s categorical

Names are policy flags (``theta_frag``, ``theta_flow``, ``delta_t_s``, ``cool_s`` for
``phasor``) plus ``alpha_scale``, which multiplies the prefill cost model's α (the attention
term) of every worker (see :mod:`pdopt.tune._scenario`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pdopt._validation import param_error
from pdopt.errors import ConfigError, ParameterError

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, slots=True)
class FloatParam:
    """A float in ``[low, high]`` (log-uniform when ``log``)."""

    name: str
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        _check_range(self.name, self.low, self.high, self.log)

    def suggest(self, trial: optuna.Trial) -> float:
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)


@dataclass(frozen=True, slots=True)
class IntParam:
    """An integer in ``[low, high]``."""

    name: str
    low: int
    high: int
    log: bool = False

    def __post_init__(self) -> None:
        _check_range(self.name, self.low, self.high, self.log)

    def suggest(self, trial: optuna.Trial) -> int:
        return trial.suggest_int(self.name, self.low, self.high, log=self.log)


@dataclass(frozen=True, slots=True)
class CategoricalParam:
    """One of ``choices`` (str, int, float or bool values)."""

    name: str
    choices: tuple[str | int | float | bool, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))
        if not self.choices:
            raise param_error("choices", f"CategoricalParam {self.name!r}", "non-empty", ())

    def suggest(self, trial: optuna.Trial) -> Any:
        return trial.suggest_categorical(self.name, self.choices)


Param = FloatParam | IntParam | CategoricalParam


def _check_range(name: str, low: float, high: float, log: bool) -> None:
    owner = f"search-space parameter {name!r}"
    if not name or not name.isidentifier():
        raise param_error("name", "a search-space parameter", "a Python identifier", name)
    if not low < high:
        raise param_error("high", owner, f"> low ({low})", high)
    if log and low <= 0:
        raise param_error("low", owner, "> 0 on a log scale", low)


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Parameters in order (unique names)."""

    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        names = [p.name for p in self.params]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"search space: parameter names repeat: {dupes}")
        if not names:
            raise ConfigError("search space: give at least one parameter to tune")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """One value per parameter, drawn by the trial's sampler."""
        return {p.name: p.suggest(trial) for p in self.params}

    @classmethod
    def parse(cls, specs: list[str] | tuple[str, ...]) -> SearchSpace:
        """From text entries (module docstring)."""
        return cls(tuple(parse_param(s) for s in specs))


def parse_param(spec: str) -> Param:
    """``name=low:high[:log|:int|:intlog]`` or ``name=a|b|c`` (module docstring)."""
    name, sep, rest = spec.partition("=")
    name = name.strip()
    if not sep or not rest:
        raise ConfigError(f"search-space entry {spec!r}: write name=low:high or name=a|b")
    if "|" in rest:
        return CategoricalParam(name, tuple(_scalar(v.strip()) for v in rest.split("|")))
    parts = rest.split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"search-space entry {spec!r}: write name=low:high[:log|:int|:intlog]")
    kind = parts[2].strip() if len(parts) == 3 else ""
    if kind not in ("", "log", "int", "intlog"):
        raise ConfigError(f"search-space entry {spec!r}: scale {kind!r} is not log, int, intlog")
    try:
        if kind.startswith("int"):
            return IntParam(name, int(parts[0]), int(parts[1]), log=kind == "intlog")
        return FloatParam(name, float(parts[0]), float(parts[1]), log=kind == "log")
    except ParameterError:
        raise  # a range check of the parameter (e.g. high <= low): its own message
    except ValueError as exc:
        raise ConfigError(f"search-space entry {spec!r}: bounds must be numbers") from exc


def _scalar(text: str) -> str | int | float | bool:
    if text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


PHASOR_SPACE = SearchSpace(
    (
        FloatParam("theta_frag", 0.05, 0.5),
        FloatParam("theta_flow", 0.3, 0.95),
        FloatParam("delta_t_s", 0.01, 0.5, log=True),
        FloatParam("cool_s", 0.1, 10.0, log=True),
    )
)
"""Phasor's thresholds with ranges around the published values (θ_frag 0.168, θ_flow 0.62,
Δt 50 ms, T_cool 20·Δt). NOTE: ``alpha_scale`` is left out on purpose: it changes the true
prefill cost (the hardware), so a study would "win" by making prompts cheaper; it belongs to
sensitivity sweeps (Table 5) or an explicit ``alpha_scale=0.5:2:log`` robustness study."""

PHASOR_DEFAULTS: dict[str, float] = {
    "theta_frag": 0.168,
    "theta_flow": 0.62,
    "delta_t_s": 0.05,
    "cool_s": 1.0,
    "alpha_scale": 1.0,
}
"""The published Phasor settings the sensitivity table normalises to."""
