"""Control policies run by :func:`pdopt.sim.simulate`; look them up by name."""

from pdopt.policies._baselines import LeastLoaded, RoundRobin, StaticSplit
from pdopt.policies._registry import available_policies, make_policy, register_policy
from pdopt.policies.arrow import Arrow
from pdopt.policies.disagg import DistServe, MemoryCentric, Splitwise
from pdopt.policies.mooncake import Mooncake
from pdopt.policies.phasor import Phasor

__all__ = [
    "Arrow",
    "DistServe",
    "LeastLoaded",
    "MemoryCentric",
    "Mooncake",
    "Phasor",
    "RoundRobin",
    "Splitwise",
    "StaticSplit",
    "available_policies",
    "make_policy",
    "register_policy",
]
