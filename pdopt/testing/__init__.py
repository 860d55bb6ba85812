"""Contract suites other packages and users run against their own policies."""

from pdopt.testing.policy_contract import check_policy, contract_scenarios

__all__ = ["check_policy", "contract_scenarios"]
