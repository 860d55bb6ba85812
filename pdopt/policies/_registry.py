"""The policy registry: names → policy classes; ablations are flags, not copies."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from pdopt._validation import param_error
from pdopt.errors import ConfigError
from pdopt.sim import PolicyProtocol

T = TypeVar("T")

_REGISTRY: dict[str, Callable[..., PolicyProtocol]] = {}


def register_policy(name: str) -> Callable[[T], T]:
    """Class decorator registering a policy under ``name``; a duplicate name raises ConfigError."""
    if not isinstance(name, str) or not name:
        raise param_error("name", "register_policy", "a non-empty string", name)

    def decorate(cls: T) -> T:
        if name in _REGISTRY:
            raise ConfigError(
                f"a policy named {name!r} is already registered ({_REGISTRY[name]!r}); "
                "choose another name"
            )
        _REGISTRY[name] = cls  # type: ignore[assignment]
        return cls

    return decorate


def make_policy(name: str, **flags: Any) -> PolicyProtocol:
    """A new policy object: the class registered as ``name`` built with ``flags``.

    A flag the policy does not have is a :class:`ConfigError` listing the ones it has
    (:func:`policy_flags`); a flag's bad value is the policy's own :class:`ParameterError`.
    """
    accepted = policy_flags(name)
    unknown = sorted(set(flags) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ConfigError(
            f"policy {name!r} does not accept flags {unknown}; its flags are {accepted}"
        )
    try:
        return _REGISTRY[name](**flags)
    except TypeError as exc:
        raise ConfigError(f"policy {name!r} does not accept flags {sorted(flags)}: {exc}") from exc


def policy_flags(name: str) -> list[str] | None:
    """The flags (keyword arguments) of the policy registered as ``name``, sorted; None when it
    takes any keyword (``**kwargs``).

    Examples
    --------
    >>> policy_flags("least_loaded")
    []
    """
    if name not in _REGISTRY:
        raise param_error("name", "make_policy", f"one of {available_policies()}", name)
    parameters = inspect.signature(_REGISTRY[name]).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sorted(p.name for p in parameters if p.kind in keyword)


def available_policies() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(_REGISTRY)
