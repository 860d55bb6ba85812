"""The policy registry: names → policy classes; ablations are flags, not copies."""

from __future__ import annotations

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
    """A new policy object: the class registered as ``name`` built with ``flags``."""
    if name not in _REGISTRY:
        raise param_error("name", "make_policy", f"one of {available_policies()}", name)
    try:
        return _REGISTRY[name](**flags)
    except TypeError as exc:
        raise ConfigError(f"policy {name!r} does not accept flags {sorted(flags)}: {exc}") from exc


def available_policies() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(_REGISTRY)
