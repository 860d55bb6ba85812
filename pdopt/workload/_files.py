"""Trace files as text: plain, gzip- or zstd-compressed (told by their first bytes, not their
name), in UTF-8; anything else is an :class:`InputError` naming the file and what to do."""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path
from typing import Any

from pdopt.errors import InputError

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FIRST_LINE_LIMIT = 1 << 20  # bytes read to find the first line (a header or one record)
_WHAT_TO_DO = (
    "give a CSV or JSON-lines trace in UTF-8, plain or compressed with gzip (.gz) or zstd (.zst)"
)


def compression_of(path: str | Path) -> str | None:
    """``"gzip"``, ``"zstd"`` or None (plain), from the file's first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head == _ZSTD_MAGIC:
        return "zstd"
    return None


def _zstandard(source: str) -> Any:
    try:
        import zstandard
    except ImportError:  # pragma: no cover - a dependency of pdopt
        raise InputError(
            f"{source}: a zstd-compressed trace needs the 'zstandard' package "
            "(pip install zstandard), or decompress it first (zstd -d)"
        ) from None
    return zstandard


def _zstd_bytes(path: str | Path, limit: int | None) -> bytes:
    """Decompressed bytes (the first ``limit`` or so, or all): every frame, each checked
    complete, since zstandard's stream reader returns a truncated file's bytes without a word."""
    zstandard = _zstandard(Path(path).name)
    out: list[bytes] = []
    size = 0
    frame = zstandard.ZstdDecompressor().decompressobj()
    with open(path, "rb") as raw:
        while limit is None or size < limit:
            chunk = frame.unused_data if frame.eof else raw.read(1 << 20)
            if frame.eof:
                if not chunk:
                    chunk = raw.read(1 << 20)
                if not chunk:
                    break  # every frame complete
                frame = zstandard.ZstdDecompressor().decompressobj()
            elif not chunk:
                raise zstandard.ZstdError("the file ends inside a frame")
            piece = frame.decompress(chunk)
            out.append(piece)
            size += len(piece)
    return b"".join(out)


def _read_bytes(path: str | Path, limit: int | None = None) -> bytes:
    source = Path(path).name
    kind = compression_of(path)
    try:
        if kind == "zstd":
            return _zstd_bytes(path, limit)
        with gzip.open(path, "rb") if kind == "gzip" else open(path, "rb") as handle:
            return handle.read() if limit is None else handle.read(limit)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(
            f"{source}: a corrupt or truncated gzip file ({exc}); fetch it again "
            "(gzip -t checks it)"
        ) from None
    except Exception as exc:  # zstandard.ZstdError, without importing zstandard here
        if type(exc).__name__ == "ZstdError":
            raise InputError(
                f"{source}: a corrupt or truncated zstd file ({exc}); fetch it again "
                "(zstd -t checks it)"
            ) from None
        raise


def _decode(data: bytes, source: str, *, partial: bool = False) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if partial and exc.start >= len(data) - 3:  # a character cut by the read limit
            text = data[: exc.start].decode("utf-8-sig")
        else:
            raise InputError(
                f"{source}: not a text trace (byte 0x{data[exc.start]:02x} at offset "
                f"{exc.start} is not UTF-8; a binary file, or compressed in an unknown "
                f"format?); {_WHAT_TO_DO}"
            ) from None
    if "\x00" in text:
        raise InputError(
            f"{source}: not a text trace (it holds NUL bytes: a binary file, or UTF-16 text?); "
            f"{_WHAT_TO_DO}"
        )
    return text


def read_text(path: str | Path) -> str:
    """The whole file as text, decompressed and decoded (a leading BOM dropped)."""
    return _decode(_read_bytes(path), Path(path).name)


def read_lines(path: str | Path) -> list[str]:
    """The file's lines, split as text-mode files split them (``\n``, ``\r\n`` or ``\r``)."""
    return _lines(read_text(path))


def _lines(text: str) -> list[str]:
    # NOTE: not str.splitlines, which also splits at U+2028 and other separators a JSON
    # string may hold raw.
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def read_first_line(path: str | Path) -> str:
    """The file's first line (within its first 1 MiB), decompressed and decoded."""
    data = _read_bytes(path, _FIRST_LINE_LIMIT)
    return _lines(_decode(data, Path(path).name, partial=True))[0]


def text_stream(path: str | Path) -> io.StringIO:
    """The whole file as a text stream (for pandas)."""
    return io.StringIO(read_text(path))
