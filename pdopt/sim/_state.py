"""The engine's shared state, as its mixins see it.

:class:`pdopt.sim._engine.Engine` is assembled from mixins
(:class:`pdopt.sim._migration.Migrations`, :class:`pdopt.sim._control.Control`,
:class:`pdopt.sim._mixed.Colocated`) that read the same
attributes and call the same hooks. :class:`EngineState` declares them once, for type checkers
only: at run time it is an empty base class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdopt.sim._decode import DecodeSide
    from pdopt.sim._kernel import Kernel
    from pdopt.sim._policy import PolicyProtocol, PolicyTraits
    from pdopt.sim._prefill import PrefillSide
    from pdopt.sim._requests import RequestTable
    from pdopt.sim._spec import ClusterSpec, Role


class EngineState:
    """Base of the engine's mixins: the attributes and hooks the engine provides."""

    if TYPE_CHECKING:
        kernel: Kernel
        cluster: ClusterSpec
        policy: PolicyProtocol
        traits: PolicyTraits
        policy_name: str
        table: RequestTable
        n_total: int
        n_done: int
        bt: int  # KV block size, tokens
        names: tuple[str, ...]
        roles: list[Role]
        pools: list[str]
        prefill: list[PrefillSide]
        decode: list[DecodeSide]

        def log(self, now: float, kind: str, worker: int, rid: int, detail: str) -> None: ...
        def route_prefill(self, rid: int, now: float) -> None: ...
        def route_decode(self, rid: int, src: int, now: float) -> None: ...
        def start_prefill(self, w: int, now: float) -> None: ...
        def process_boundary(self, j: int, n: int, now: float) -> None: ...
