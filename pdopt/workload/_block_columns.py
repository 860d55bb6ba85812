"""Prefix blocks from a generic trace's columns (CSV or JSON lines, through the column map).

Two ways to say which prompts share a prefix, one per trace:

``block_hashes``
    Each row's full-block identities in prompt order: a JSON list of integers (``[3, 9]``), or
    in a CSV integers separated by spaces or ``;`` (``3 9``, ``3;9``); an empty CSV field lists
    none. At most ``input_tokens // block_tokens`` per row (full blocks only).
``prefix_group`` with ``prefix_tokens``
    Rows with equal ``prefix_group`` (any text, compared as written; in JSON lines the JSON value,
    so ``1`` and ``"1"`` differ) share their first ``prefix_tokens // block_tokens`` blocks
    (``prefix_tokens``: a whole number, 0 <= prefix_tokens <= input_tokens). Two rows of one
    group with different ``prefix_tokens`` share the shorter one's blocks. Every other full block
    of a row is its own (identified by the file row), so it takes cache space but is never reused.

``block_tokens`` (tokens per block) comes from the reader's ``block_tokens`` argument or a
``block_tokens`` column holding one value on every row (what :func:`write_csv_trace` writes);
both given must agree, and neither is an error: a silently assumed block size would change every
reuse count.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pdopt._validation import check_int_at_least, param_error
from pdopt.workload._prefix import PrefixBlocks, mix64
from pdopt.workload._tables import Table
from pdopt.workload._workload import IntArray

BLOCK_COLUMNS = ("block_hashes", "prefix_group", "prefix_tokens", "block_tokens")
"""Optional column-map keys of the generic readers: a trace's prefix blocks (see above). A key not
in the column map is read from a column of its own name when the file has one."""
_GROUP_TAG, _ROW_TAG = 0x4752_4F55_50, 0x524F_57
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv1a64(text: str) -> int:
    """The 64-bit FNV-1a hash of ``text``'s UTF-8 bytes, as an int64 (deterministic)."""
    value = _FNV_OFFSET
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def read_block_columns(
    table: Table,
    columns: Mapping[str, str],
    inputs: IntArray,
    block_tokens: int | None,
    owner: str,
) -> PrefixBlocks | None:
    """Each row's prefix blocks from ``columns`` (keys among :data:`BLOCK_COLUMNS`, the file's
    column names), rows in file order; None when neither ``block_hashes`` nor ``prefix_group``
    is among them."""
    if "block_hashes" in columns and "prefix_group" in columns:
        rule = "either 'block_hashes' or 'prefix_group' (two ways to give the same blocks)"
        raise param_error("columns", owner, rule, dict(columns))
    if ("prefix_group" in columns) != ("prefix_tokens" in columns):
        rule = "'prefix_group' and 'prefix_tokens' together (a group shares that many tokens)"
        raise param_error("columns", owner, rule, dict(columns))
    if "block_hashes" not in columns and "prefix_group" not in columns:
        if block_tokens is not None:
            rule = "given only with a block_hashes or prefix_group column (the trace has none)"
            raise param_error("block_tokens", owner, rule, block_tokens)
        return None
    size = _block_tokens(table, columns.get("block_tokens"), block_tokens, owner)
    full = inputs // size
    if "block_hashes" in columns:
        field = columns["block_hashes"]
        lists, counts = table.int_lists(field)
        table.fail(
            counts > full,
            field,
            f"lists more blocks than the prompt's full blocks of {size} tokens "
            "(list full blocks only, or check block_tokens)",
        )
        return PrefixBlocks.from_lists(lists, size)
    return _group_blocks(table, columns, inputs, size)


def _group_blocks(
    table: Table, columns: Mapping[str, str], inputs: IntArray, size: int
) -> PrefixBlocks:
    groups = table.texts(columns["prefix_group"])
    field = columns["prefix_tokens"]
    shared_tokens = table.tokens(field, keep=np.zeros(len(inputs), dtype=bool))
    table.fail(shared_tokens > inputs, field, "must be <= the row's input tokens")
    shared = shared_tokens // size
    full = inputs // size
    group_ids = np.fromiter((fnv1a64(g) for g in groups), dtype=np.int64, count=len(groups))
    offsets = np.concatenate([[0], np.cumsum(full)]).astype(np.int64)
    row = np.repeat(np.arange(len(full), dtype=np.int64), full)
    position = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[row]
    in_group = position < shared[row]
    hashes = np.where(
        in_group, mix64(_GROUP_TAG, group_ids[row], position), mix64(_ROW_TAG, row, position)
    )
    return PrefixBlocks(offsets, hashes.astype(np.int64), size)


def _block_tokens(table: Table, field: str | None, given: int | None, owner: str) -> int:
    if given is not None:
        given = check_int_at_least(given, 1, "block_tokens", owner)
    if field is None:
        if given is None:
            rule = (
                "given (the tokens per block of the trace's block hashes, e.g. 16 for vLLM, "
                "512 for Mooncake; --hash-block-tokens), or a block_tokens column"
            )
            raise param_error("block_tokens", owner, rule, given)
        return given
    values = table.tokens(field)
    table.fail(values != values[0], field, f"must be the same on every row ({int(values[0])})")
    if given is not None and given != int(values[0]):
        rule = f"the trace's {field} column ({int(values[0])}) when both are given"
        raise param_error("block_tokens", owner, rule, given)
    return int(values[0])
