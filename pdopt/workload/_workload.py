"""The columnar request workload every other layer consumes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pandas as pd

from pdopt._validation import check_positive
from pdopt.errors import InputError
from pdopt.workload._prefix import PrefixBlocks

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MAX_TOKENS = 2**53 - 1
"""The largest token count a workload holds (a prompt or output length, per request): the largest
whole number below which every integer is exact in float64, which trace readers parse through.
Far beyond any context window; a larger count is refused, never wrapped or rounded."""
TOO_MANY_TOKENS = f"must be <= {MAX_TOKENS} (2**53 - 1, pdopt's largest token count)"


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests as equal-length columns.

    Parameters
    ----------
    arrival_s : array of float, shape (n,)
        Arrival times in seconds, sorted ascending, >= 0.
    input_tokens : array of int, shape (n,)
        Prompt lengths in tokens, >= 1.
    output_tokens : array of int, shape (n,)
        Generated lengths in tokens, >= 1 (the first token is produced by prefill).
    name : str
        A label carried into reports.
    prefix_blocks : PrefixBlocks or None
        Each prompt's full-block identities for prefix caching (None: unknown, no reuse
        modelled). Request ``i`` lists at most ``input_tokens[i] // block_tokens`` blocks.
        Every method that builds a workload from another (:meth:`from_unsorted`, slicing,
        :meth:`take`, :meth:`window`, :meth:`scale_rate`, :meth:`shifted_to_zero`,
        :meth:`with_arrivals`, :meth:`with_lengths`, :meth:`concat`) carries them along; build
        a filtered workload with :meth:`take`, not from its columns, or the blocks are lost.

    Examples
    --------
    >>> w = Workload([0.0, 0.5, 1.0], [128, 256, 64], [16, 32, 8])
    >>> len(w)
    3
    """

    arrival_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray
    name: str = field(default="workload")
    prefix_blocks: PrefixBlocks | None = None

    def __post_init__(self) -> None:
        arrival = _as_time_array(self.arrival_s, self.name)
        inputs = _as_token_array(self.input_tokens, "input_tokens", self.name)
        outputs = _as_token_array(self.output_tokens, "output_tokens", self.name)
        if not (arrival.ndim == inputs.ndim == outputs.ndim == 1):
            raise InputError(f"{self.name}: columns must be one-dimensional")
        if not (len(arrival) == len(inputs) == len(outputs)):
            raise InputError(
                f"{self.name}: columns have different lengths: arrival_s={len(arrival)}, "
                f"input_tokens={len(inputs)}, output_tokens={len(outputs)}"
            )
        _check_rows(
            arrival, ~np.isfinite(arrival), "arrival_s", "must be a finite number", self.name
        )
        _check_rows(arrival, arrival < 0, "arrival_s", "must be >= 0", self.name)
        if len(arrival) > 1:
            bad = np.flatnonzero(np.diff(arrival) < 0)
            if len(bad):
                i = int(bad[0]) + 1
                raise InputError(
                    f"{self.name}: arrival_s[{i}]={float(arrival[i])!r} is before "
                    f"arrival_s[{i - 1}]={float(arrival[i - 1])!r}; arrivals must be sorted "
                    "(build it with Workload.from_unsorted to sort them)"
                )
        if self.prefix_blocks is not None:
            if not isinstance(self.prefix_blocks, PrefixBlocks):
                raise InputError(
                    f"{self.name}: prefix_blocks must be a PrefixBlocks or None, got "
                    f"{type(self.prefix_blocks).__name__}"
                )
            self.prefix_blocks.check_fits(inputs, self.name)
        for name, values in (
            ("arrival_s", arrival),
            ("input_tokens", inputs),
            ("output_tokens", outputs),
        ):
            values.setflags(write=False)
            object.__setattr__(self, name, values)

    @classmethod
    def from_unsorted(
        cls,
        arrival_s: npt.ArrayLike,
        input_tokens: npt.ArrayLike,
        output_tokens: npt.ArrayLike,
        name: str = "workload",
        prefix_blocks: PrefixBlocks | None = None,
    ) -> Workload:
        """Build a workload from rows in any order, sorting them stably by arrival time
        (``prefix_blocks``, in the rows' given order, are reordered with them)."""
        arrival = np.asarray(arrival_s, dtype=np.float64)
        order = np.argsort(arrival, kind="stable")
        blocks = None
        if prefix_blocks is not None:
            if len(prefix_blocks) != len(arrival):
                raise InputError(
                    f"{name}: prefix_blocks lists {len(prefix_blocks)} requests, the workload "
                    f"has {len(arrival)}"
                )
            blocks = prefix_blocks.take(order)
        return cls(
            arrival[order],
            np.asarray(input_tokens)[order],
            np.asarray(output_tokens)[order],
            name=name,
            prefix_blocks=blocks,
        )

    def __eq__(self, other: object) -> bool:
        # NOTE: the generated dataclass __eq__ compares arrays with ==, which raises for n > 1.
        if not isinstance(other, Workload):
            return NotImplemented
        return (
            self.name == other.name
            and all(
                np.array_equal(getattr(self, col), getattr(other, col))
                for col in ("arrival_s", "input_tokens", "output_tokens")
            )
            and self.prefix_blocks == other.prefix_blocks
        )

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival, in seconds (0 for fewer than 2 requests)."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def rate_per_s(self) -> float:
        """Mean arrival rate in requests per second: (n - 1) / duration."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else float("nan")

    def stats(self) -> pd.Series:
        """Summary: count, duration, rate, inter-arrival CV and length quantiles.

        The rate is (n - 1) / (last - first arrival); the inter-arrival CV is the sample standard
        deviation (ddof=1) over the mean of the gaps between consecutive arrivals (1 for a
        Poisson process); quantiles use numpy's linear interpolation. Undefined values are NaN.
        """
        gaps = np.diff(self.arrival_s)
        cv = (
            float(gaps.std(ddof=1) / gaps.mean())
            if len(gaps) > 1 and gaps.mean() > 0
            else float("nan")
        )
        out: dict[str, float] = {
            "requests": float(len(self)),
            "duration_s": self.duration_s,
            "rate_per_s": self.rate_per_s,
            "interarrival_cv": cv,
        }
        for col in ("input_tokens", "output_tokens"):
            values = getattr(self, col)
            out[f"{col}_mean"] = float(values.mean()) if len(values) else float("nan")
            for q in (50, 90, 99):
                out[f"{col}_p{q}"] = (
                    float(np.percentile(values, q)) if len(values) else float("nan")
                )
            out[f"{col}_max"] = float(values.max()) if len(values) else float("nan")
        return pd.Series(out, name=self.name)

    def window(self, start_s: float, end_s: float) -> Workload:
        """Requests arriving in [start_s, end_s), times kept as they are."""
        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s], side="left")
        return self[int(lo) : int(hi)]

    def __getitem__(self, index: slice) -> Workload:
        if not isinstance(index, slice):
            raise TypeError("Workload supports slicing only; use to_frame() for row access")
        return self.take(np.arange(len(self))[index])

    def take(self, rows: npt.ArrayLike) -> Workload:
        """The requests at ``rows`` (int indices, or a boolean mask of length n), with their
        prefix blocks; the rows taken must stay in arrival order (e.g. a filter, or a slice).

        Examples
        --------
        >>> w = Workload([0.0, 0.5, 1.0], [128, 256, 64], [16, 32, 8])
        >>> w.take(w.input_tokens > 100).input_tokens.tolist()
        [128, 256]
        """
        idx = np.asarray(rows)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise InputError(
                    f"{self.name}: a row mask must have shape ({len(self)},), got {idx.shape}"
                )
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64)
        blocks = self.prefix_blocks.take(idx) if self.prefix_blocks is not None else None
        return Workload(
            self.arrival_s[idx],
            self.input_tokens[idx],
            self.output_tokens[idx],
            name=self.name,
            prefix_blocks=blocks,
        )

    def with_arrivals(self, arrival_s: npt.ArrayLike) -> Workload:
        """The same requests (lengths, prefix blocks, name) at new sorted arrival times."""
        return Workload(
            np.asarray(arrival_s, dtype=np.float64),
            self.input_tokens,
            self.output_tokens,
            name=self.name,
            prefix_blocks=self.prefix_blocks,
        )

    def with_lengths(self, input_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike) -> Workload:
        """The same arrivals with new lengths (e.g. prompts truncated to a context window);
        each request's prefix blocks are cut to its new prompt's full blocks (a cut prompt keeps
        its leading blocks, so its reuse stays exact)."""
        inputs = _as_token_array(input_tokens, "input_tokens", self.name)
        blocks = self.prefix_blocks
        if blocks is not None and inputs.shape == (len(self),):
            blocks = blocks.truncated(inputs // blocks.block_tokens)
        outputs = _as_token_array(output_tokens, "output_tokens", self.name)
        return Workload(self.arrival_s, inputs, outputs, self.name, blocks)

    @classmethod
    def concat(cls, parts: Sequence[Workload], name: str | None = None) -> Workload:
        """The requests of all ``parts`` in arrival order (stable: ties keep the parts' order),
        with their prefix blocks; every part has blocks (of one block size) or none has.

        Examples
        --------
        >>> a = Workload([0.0, 2.0], [8, 8], [1, 1])
        >>> Workload.concat([a, Workload([1.0], [9], [2])]).input_tokens.tolist()
        [8, 9, 8]
        """
        if not parts:
            raise InputError("Workload.concat: give at least one workload")
        label = name if name is not None else parts[0].name
        with_blocks = [p.prefix_blocks is not None for p in parts]
        if any(with_blocks) and not all(with_blocks):
            bare = [p.name for p in parts if p.prefix_blocks is None]
            raise InputError(
                f"Workload.concat: {bare} have no prefix blocks and others have; concatenating "
                "them would make their prompts look unshared (give all or none blocks)"
            )
        blocks = (
            PrefixBlocks.concat([p.prefix_blocks for p in parts if p.prefix_blocks is not None])
            if all(with_blocks)
            else None
        )
        return cls.from_unsorted(
            np.concatenate([p.arrival_s for p in parts]),
            np.concatenate([p.input_tokens for p in parts]),
            np.concatenate([p.output_tokens for p in parts]),
            name=label,
            prefix_blocks=blocks,
        )

    def shifted_to_zero(self) -> Workload:
        """The same requests with the first arrival moved to t = 0."""
        if not len(self):
            return self
        return self.with_arrivals(self.arrival_s - self.arrival_s[0])

    def scale_rate(self, factor: float) -> Workload:
        """Multiply the arrival rate by ``factor`` by compressing time stamps (t / factor)."""
        factor = check_positive(factor, "factor", "Workload.scale_rate")
        return self.with_arrivals(self.arrival_s / factor)

    def to_frame(self) -> pd.DataFrame:
        """The workload as a DataFrame with columns arrival_s, input_tokens, output_tokens
        (prefix blocks are not a column: see :attr:`prefix_blocks`)."""
        return pd.DataFrame(
            {
                "arrival_s": self.arrival_s,
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
            }
        )


def _as_token_array(values: npt.ArrayLike, field_name: str, source: str) -> IntArray:
    raw = np.asarray(values)
    if raw.dtype.kind == "f":
        _check_rows(raw, ~np.isfinite(raw), field_name, "must be a finite number", source)
        _check_rows(raw, raw != np.round(raw), field_name, "must be a whole number", source)
    elif raw.dtype.kind not in "iu":
        raise InputError(f"{source}: {field_name} must be numeric, got dtype {raw.dtype}")
    # NOTE: checked before the cast, which would wrap a count >= 2**63 to a negative one.
    _check_rows(raw, raw < 1, field_name, "must be >= 1", source)
    _check_rows(raw, raw > MAX_TOKENS, field_name, TOO_MANY_TOKENS, source)
    return raw.astype(np.int64)


def _check_rows(
    values: np.ndarray, bad: np.ndarray, field_name: str, rule: str, source: str
) -> None:
    """Raise :class:`InputError` naming the first bad index (0-based) and how many there are."""
    rows = np.flatnonzero(bad)
    if len(rows):
        i = int(rows[0])
        more = f" ({len(rows) - 1} more rows break this rule)" if len(rows) > 1 else ""
        raise InputError(f"{source}: {field_name}[{i}]={values[i].item()!r} {rule}{more}")


def _as_time_array(values: npt.ArrayLike, source: str) -> FloatArray:
    raw = np.asarray(values)
    if raw.dtype.kind not in "iuf":
        raise InputError(f"{source}: arrival_s must be numeric seconds, got dtype {raw.dtype}")
    return raw.astype(np.float64)
