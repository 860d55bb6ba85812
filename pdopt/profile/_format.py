"""The profile: measured (or roofline) latencies of one GPU × model × TP, and its CSV format.

File format (``profiles/*.csv``)::

    # pdopt-profile: 1
    # gpu: V100-32GB
    # model: Qwen2.5-7B
    # dtype: float16
    # tp: 1
    # source: roofline | measured:<harness> | vidur:<dir>
    kind,batch_size,input_tokens,total_context_tokens,m,n,k,latency_s,prefix_tokens
    gemm,,,,4096,4096,4096,0.00121,
    prefill,2,1024,,,,,0.0931,
    decode,32,,65536,,,,0.0214,
    hybrid,32,256,65536,,,,0.0305,512

Row kinds and the fields each must have (others empty):

* ``gemm``: ``m, n, k`` (a dense ``m×k @ k×n`` product, 2·m·n·k FLOP) and ``latency_s``.
* ``prefill``: ``batch_size`` requests of ``input_tokens`` each, ``latency_s`` for the batch.
* ``decode``: one iteration of ``batch_size`` running requests holding ``total_context_tokens``
  in all (the C of τ(B, C)), ``latency_s``.
* ``hybrid``: one mixed (Sarathi-style, fused) iteration: ``batch_size`` running decodes holding
  ``total_context_tokens`` in all (B and C, as in ``decode`` rows) plus **one** prefill chunk of
  ``input_tokens`` tokens (c) of a prompt whose first ``prefix_tokens`` tokens are already
  prefilled (d, 0 for a first chunk), ``latency_s`` for the whole iteration. One chunk per row:
  the fit (:func:`pdopt.costmodel.fit_hybrid`) sums the chunk terms of an iteration with several.

``prefix_tokens`` (the last column) is used by ``hybrid`` rows only. A file without hybrid rows
may leave the column out, as profiles written before it existed do (they read unchanged), and is
written without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

PROFILE_COLUMNS: tuple[str, ...] = (
    "kind",
    "batch_size",
    "input_tokens",
    "total_context_tokens",
    "m",
    "n",
    "k",
    "latency_s",
    "prefix_tokens",
)
LEGACY_COLUMNS: tuple[str, ...] = PROFILE_COLUMNS[:-1]
"""The header of a profile without ``hybrid`` rows (and of every profile before they existed)."""
ROW_KINDS: tuple[str, ...] = ("gemm", "prefill", "decode", "hybrid")
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k", "latency_s"),
    "prefill": ("batch_size", "input_tokens", "latency_s"),
    "decode": ("batch_size", "total_context_tokens", "latency_s"),
    "hybrid": ("batch_size", "input_tokens", "total_context_tokens", "latency_s", "prefix_tokens"),
}


@dataclass(frozen=True, slots=True)
class ProfileMeta:
    """Where a profile comes from: the GPU, model, dtype, tensor-parallel degree and source."""

    gpu: str
    model: str
    dtype: str = "float16"
    tp: int = 1
    source: str = "unknown"
    notes: str = ""

    @property
    def prefill_without_attention(self) -> bool:
        """The profile's notes say its prefill rows hold no attention (an importer found no
        attention measurements, :data:`NO_ATTENTION_NOTE`): an l² term fitted on them means
        nothing."""
        return NO_ATTENTION_NOTE in self.notes


NO_ATTENTION_NOTE = "prefill rows are linear ops only"
"""The words a profile's notes carry when its prefill rows hold no attention (written by
:func:`pdopt.profile.import_vidur` without an attention file; read by
:attr:`ProfileMeta.prefill_without_attention`)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Profile rows (columns :data:`PROFILE_COLUMNS`) and their metadata.

    ``path`` is the file it was read from, used in error messages ("<memory>" otherwise).
    """

    meta: ProfileMeta
    rows: pd.DataFrame
    path: str = field(default="<memory>")

    def of_kind(self, kind: str) -> pd.DataFrame:
        """The rows of one kind (one of :data:`ROW_KINDS`), original row index kept."""
        return self.rows[self.rows["kind"] == kind]
