"""The policy registry: duplicates raise, unknown names and flags are clear errors."""

from __future__ import annotations

import pytest

from pdopt.errors import ConfigError, ParameterError
from pdopt.policies import StaticSplit, available_policies, make_policy, register_policy


def test_baselines_are_registered() -> None:
    assert {"round_robin", "least_loaded", "static_split"} <= set(available_policies())


def test_duplicate_name_raises() -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_policy("round_robin")(StaticSplit)


def test_unknown_name_and_bad_flags() -> None:
    with pytest.raises(ParameterError, match="make_policy"):
        make_policy("no_such_policy")
    with pytest.raises(ConfigError, match="does not accept flags"):
        make_policy("round_robin", theta=1)
    with pytest.raises(ParameterError, match="prefill_routing"):
        make_policy("static_split", prefill_routing="random")


def test_make_policy_returns_fresh_objects() -> None:
    assert make_policy("round_robin") is not make_policy("round_robin")


def test_a_misspelled_flag_lists_the_policys_flags() -> None:
    from pdopt.policies import policy_flags

    assert policy_flags("least_loaded") == []
    assert "theta_flow" in (policy_flags("phasor") or [])
    with pytest.raises(ConfigError) as info:
        make_policy("phasor", theta_flo=0.5)
    assert str(info.value).startswith(
        "policy 'phasor' does not accept flags ['theta_flo']; its flags are ['cool_s', "
    )
    assert "__init__" not in str(info.value)
