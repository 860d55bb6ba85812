"""Control policies run by :func:`pdopt.sim.simulate`; look them up by name."""

from pdopt.policies._baselines import LeastLoaded, MinLoadTokens, RoundRobin, StaticSplit
from pdopt.policies._registry import (
    available_policies,
    make_policy,
    policy_flags,
    register_policy,
)
from pdopt.policies.arrow import Arrow
from pdopt.policies.colocated import VLLM, Sarathi
from pdopt.policies.disagg import DistServe, MemoryCentric, Splitwise
from pdopt.policies.ecoserve import EcoServe
from pdopt.policies.mooncake import Mooncake
from pdopt.policies.phasor import Phasor

__all__ = [
    "VLLM",
    "Arrow",
    "DistServe",
    "EcoServe",
    "LeastLoaded",
    "MemoryCentric",
    "MinLoadTokens",
    "Mooncake",
    "Phasor",
    "RoundRobin",
    "Sarathi",
    "Splitwise",
    "StaticSplit",
    "available_policies",
    "make_policy",
    "policy_flags",
    "register_policy",
]
