"""The narrow protocol through which the engine's components call its core back.

The core (:class:`pdopt.sim._engine.Engine`) owns the kernel (event loop and clock), the request
table, the workers' roles and pools, the request path (routing, prefill starts, KV transfers,
decode boundaries) and the endings and event log. Its components, each in its own module and each
owning its state, reach it only through :class:`Core`: the migrations
(:mod:`pdopt.sim._migration`), the colocated scheduler (:mod:`pdopt.sim._mixed`) and the control
side (:mod:`pdopt.sim._control`). The prefill and decode sides of each worker
(:mod:`pdopt.sim._prefill`, :mod:`pdopt.sim._decode`) are plain state objects the core shares
with them, and each worker's KV blocks (:mod:`pdopt.sim._kv`) are written only through their
methods; the read-only members below say what a component may read and the methods what it may
ask the core to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pdopt.cluster._spec import Role
    from pdopt.sim._decode import DecodeSide
    from pdopt.sim._kernel import Kernel
    from pdopt.sim._kv import KvBlocks
    from pdopt.sim._prefill import PrefillSide
    from pdopt.sim._requests import RequestTable


class Core(Protocol):
    """What components read from and ask of the engine's core."""

    @property
    def kernel(self) -> Kernel:
        """The event heap and clock (components schedule their own events on it)."""

    @property
    def table(self) -> RequestTable:
        """Per-request columns (components write the columns of the requests they hold)."""

    @property
    def names(self) -> tuple[str, ...]:
        """Worker names, by index."""

    @property
    def roles(self) -> Sequence[Role]:
        """Current worker roles (changed only through :meth:`assign`)."""

    @property
    def pools(self) -> Sequence[str]:
        """Current worker pools (changed only through :meth:`assign`)."""

    @property
    def prefill(self) -> Sequence[PrefillSide]:
        """Each worker's prefill side."""

    @property
    def decode(self) -> Sequence[DecodeSide]:
        """Each worker's decode side."""

    @property
    def kv(self) -> Sequence[KvBlocks]:
        """Each worker's KV blocks (components change them only through its methods)."""

    @property
    def policy_name(self) -> str:
        """The policy's name, for error messages."""

    @property
    def n_total(self) -> int:
        """Requests in the run."""

    @property
    def n_done(self) -> int:
        """Requests that have ended (finished or rejected)."""

    def kv_used_blocks(self, w: int, now: float) -> int:
        """KV blocks worker ``w`` holds at ``now``: its running decodes, blocks reserved for
        migrations and its running prefill batch's prompts."""

    def log(self, now: float, kind: str, worker: int, rid: int, detail: str) -> None:
        """Append one row to the run's event log (``worker``/``rid`` -1 when none)."""

    def assign(self, w: int, role: Role, pool: str) -> Role:
        """Give worker ``w`` a new role and pool at once; return its old role."""

    def route_prefill(self, rid: int, now: float) -> None:
        """Ask the policy for a prefill worker for ``rid`` and queue it there."""

    def route_decode(self, rid: int, src: int, now: float) -> None:
        """Ask the policy for a decode worker for ``rid`` and send its KV there from ``src``."""

    def start_prefill(self, w: int, now: float) -> None:
        """Start a prefill batch on worker ``w`` (its queue is not empty) if its KV fits."""

    def wake_decode(self, j: int, now: float) -> None:
        """Worker ``j``'s decode side has new work: visit its next iteration boundary."""

    def process_boundary(self, j: int, n: int, now: float) -> None:
        """Process iteration boundary ``n`` of worker ``j``'s decode side at ``now``."""

    def release_prefix(self, rid: int) -> None:
        """``rid`` leaves the worker whose cached prefix blocks it holds."""
