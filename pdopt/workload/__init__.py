"""Workloads: the columnar request table, generators, archetypes and trace readers."""

from pdopt.workload._workload import Workload

__all__ = ["Workload"]
