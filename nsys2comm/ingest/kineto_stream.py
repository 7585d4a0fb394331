"""Streaming splitter for Kineto (Chrome-trace) JSON: header, traceEvents in chunks, trailer.

The file is read in blocks (plain or gzip). The bytes of the ``traceEvents`` array are cut at candidate event
boundaries (``}`` ws ``,`` ws ``{``) near the end of the buffer; decoding ``b"[" + prefix + b"]"`` proves the
cut is at top level (a cut inside a string or a nested object cannot decode), otherwise an earlier candidate is
tried. Nothing but one block (plus a partial event) is held at a time.

``iter_raw(path)`` yields ``("header", dict)``, then raw pieces of the event array for speculative (parallel)
decoding, then ``("tail", bytes)``; ``split_validated`` and ``finish`` cut and close what is left. Errors are
:class:`nsys2comm.errors.InputError`.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import msgspec

from ..errors import InputError
from ..limits import GZIP_CEILING_BYTES, GZIP_FLOOR_BYTES, GZIP_RATIO, MAX_EVENT_BYTES

BLOCK = 32 << 20
# iter_raw reads this much at a time and cuts pieces of its ``block``: each piece is then the one large allocation
# (8 MB reads, joined and sliced, were three, and glibc kept ~90 MB of them in its heap in a gzip ingest)
READ_BYTES = 1 << 20
_WS = b" \t\r\n"  # JSON whitespace
_BOM_WS = b"\xef\xbb\xbf" + _WS
_CANDIDATE = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_CONTINUE = {1: re.compile(rb"[ \t\r\n]*,[ \t\r\n]*\{"), 2: re.compile(rb"[ \t\r\n]*\{")}
_TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_HEADER_LIMIT = 64 << 20  # bytes before traceEvents we are willing to hold
_MAX_SPLIT_TRIES = 16
_decode_any = msgspec.json.Decoder()
_ERR_POS = re.compile(r"byte (\d+)")

HINT_TRUNCATED = "the file is cut short: re-export the trace or copy it again"


@dataclass(frozen=True)
class Limits:
    """Limits that stop hostile or broken traces (README "Limits"); ``ReadOptions.extra`` keys of the same names
    (set by ``ingest --max-decompressed-gb`` / ``--max-event-mb``) raise them.

    max_decompressed_bytes: a gzip trace expanding beyond this is refused; None: refused once its output exceeds
    max(GZIP_FLOOR_BYTES, GZIP_RATIO x the compressed bytes read so far), or GZIP_CEILING_BYTES.
    max_event_bytes: the most bytes held without an event boundary (one event, or whitespace between events).
    """

    max_decompressed_bytes: int | None = None
    max_event_bytes: int = MAX_EVENT_BYTES

    @classmethod
    def from_options(cls, options) -> Limits:
        extra = getattr(options, "extra", None) or {}
        dec, ev = extra.get("max_decompressed_bytes"), extra.get("max_event_bytes")
        return cls(None if dec is None else int(dec), MAX_EVENT_BYTES if ev is None else int(ev))

    def decompressed_cap(self, compressed_bytes: int) -> int:
        """Most decompressed bytes allowed after reading ``compressed_bytes`` of the gzip file."""
        if self.max_decompressed_bytes is not None:
            return self.max_decompressed_bytes
        return min(GZIP_CEILING_BYTES, max(GZIP_FLOOR_BYTES, GZIP_RATIO * compressed_bytes))


def open_stream(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _read(f, n: int, path: Path) -> bytes:
    try:
        return f.read(n)
    except EOFError:
        raise InputError("is a truncated gzip file (compressed stream ends early)", path=str(path),
                         hint=HINT_TRUNCATED) from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"is a corrupt gzip file ({e})", path=str(path), hint=HINT_TRUNCATED) from None


def _decode_error_pos(err: Exception) -> int | None:
    m = _ERR_POS.search(str(err))
    return int(m.group(1)) if m else None


def _not_kineto(path: Path) -> InputError:
    return InputError("is JSON but not a PyTorch profiler trace (no traceEvents array)", path=str(path),
                      hint="give a trace written by torch.profiler (export_chrome_trace / tensorboard_trace_handler)")


def _parse_header(head: bytes, path: Path) -> dict:
    """head: bytes from the file start up to (not incl.) the "traceEvents" key (a UTF-8 BOM before it is allowed)."""
    s = head.lstrip(_BOM_WS).strip()
    if not s.startswith(b"{"):
        raise _not_kineto(path)
    body = s[1:].rstrip()
    if body.endswith(b","):
        body = body[:-1]
    try:
        obj = _decode_any.decode(b"{" + body + b"}")
    except msgspec.DecodeError:
        raise _not_kineto(path) from None
    return obj if isinstance(obj, dict) else {}


def _parse_trailer(rest: bytes, path: Path) -> dict:
    """rest: bytes after the closing ']' of traceEvents."""
    s = rest.strip()
    if s.startswith(b","):
        s = b"{" + s[1:]
    elif s.startswith(b"}"):
        s = b"{" + s
    else:
        raise InputError("is not valid JSON after the traceEvents array", path=str(path), hint=HINT_TRUNCATED)
    if _TRACE_EVENTS_KEY.search(s):  # JSON readers disagree on which of two keys wins: refuse to guess
        raise InputError("has two traceEvents arrays", path=str(path),
                         hint="the file was written twice into one object; re-export the trace")
    try:
        obj = _decode_any.decode(s)
    except msgspec.DecodeError:
        if s.rstrip().endswith(b"}"):
            raise InputError("has malformed JSON after the traceEvents array", path=str(path),
                             hint="the trace file is damaged; re-export it") from None
        raise InputError("is truncated JSON (ends after the event array)", path=str(path),
                         hint=HINT_TRUNCATED) from None
    return obj if isinstance(obj, dict) else {}


def _split(buf: bytes, path: Path, consumed: int, decode) -> tuple[int, object]:
    """Cut buf at the largest top-level event boundary and decode the part before it.

    Returns (p, decoded) with buf[p:] starting at the next event's '{', or (-1, None) when no cut decodes.
    ``decode(bytes) -> object`` must raise msgspec.DecodeError for invalid JSON (as msgspec decoders do).
    """
    n = len(buf)
    window = 1 << 16
    tries = 0
    tried: set[int] = set()
    hi = n
    while hi > 0:
        lo = max(0, hi - window)
        cands = list(_CANDIDATE.finditer(buf, lo, hi))
        for m in reversed(cands):
            if m.start() in tried:
                continue
            tried.add(m.start())
            cut_end = m.start() + 1
            try:
                return m.end() - 1, decode(b"[" + buf[:cut_end] + b"]")
            except msgspec.DecodeError as e:
                tries += 1
                pos = _decode_error_pos(e)
                if pos is not None and pos < cut_end - (1 << 20):
                    # fails far before the cut: the JSON itself is broken there
                    raise InputError(f"has malformed JSON near byte {consumed + pos - 1} of the event array",
                                     path=str(path), hint="the trace file is damaged; re-export it") from None
                if tries >= _MAX_SPLIT_TRIES:
                    return -1, None
        if lo == 0:
            break
        hi = lo + 64  # overlap: a candidate is a few bytes of whitespace long
    return -1, None


def _finish(buf: bytes, path: Path) -> tuple[list, dict, bool]:
    """The last piece: zero or more events, ']', then the trailer. Decoded with raw_decode, event by event; numbers
    with a fraction as Decimal (exact epoch timestamps)."""
    try:
        text, replaced = buf.decode("utf-8"), False
    except UnicodeDecodeError:
        text, replaced = buf.decode("utf-8", errors="replace"), True
    dec = json.JSONDecoder(strict=False, parse_float=Decimal)
    events = []
    i, n = 0, len(text)
    ws = " \t\r\n"
    while True:
        while i < n and text[i] in ws:
            i += 1
        if i >= n:
            raise InputError("is truncated JSON (the traceEvents array never ends)", path=str(path),
                             hint=HINT_TRUNCATED)
        if text[i] == "]":
            return events, _parse_trailer(text[i + 1:].encode(), path), replaced
        if text[i] == "," and events:
            i += 1
            continue
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            raise InputError("is truncated or malformed JSON at the end of the traceEvents array", path=str(path),
                             hint=HINT_TRUNCATED) from None
        events.append(obj)


def _array_start(buf: bytes, eof: bool, path: Path) -> tuple[dict, int] | None:
    """Where the event array starts: (header, offset just past its '['), or None when more bytes are needed.

    Object format ``{..., "traceEvents": [...], ...}``: the header is what precedes the key. JSON array format
    (a bare list of events, Trace Event Format): the header is ``{}``.
    """
    s = buf.lstrip(_BOM_WS)
    lead = len(buf) - len(s)
    if s[:1] == b"[":
        rest = s[1:].lstrip(_WS)
        if not rest:
            if eof:
                raise InputError("is truncated JSON (the event array never ends)", path=str(path), hint=HINT_TRUNCATED)
            return None
        if rest[:1] not in (b"{", b"]"):
            raise _not_kineto(path)
        return {}, lead + 1
    m = _TRACE_EVENTS_KEY.search(buf)
    if m:
        return _parse_header(buf[:m.start()], path), m.end()
    if eof or len(buf) > _HEADER_LIMIT:
        if not s.strip(_WS):
            raise InputError("is empty", path=str(path), hint="give a Kineto trace (.json/.json.gz)")
        if s[:1] != b"{":
            raise InputError("is not JSON", path=str(path), hint="give a Kineto trace (.json/.json.gz)")
        if eof:
            try:
                _decode_any.decode(buf)
            except msgspec.DecodeError:
                raise InputError("is truncated or malformed JSON (no traceEvents array found)", path=str(path),
                                 hint=HINT_TRUNCATED) from None
        raise _not_kineto(path)
    return None


def _last_cut(chunk: bytes, state: int) -> tuple[int, int]:
    """The last event boundary completed in ``chunk``: (offset of its '{' in chunk or -1, state at chunk end).

    ``state`` says how the bytes before ``chunk`` end: 0 not in a boundary, 1 '}' ws*, 2 '}' ws* ',' ws* (a
    boundary can span chunks, and a whitespace run can span many). Windows grow ×4 backwards from the end, so a
    chunk costs O(len(chunk)) however far back its last boundary is.
    """
    n = len(chunk)
    cut = -1
    width = 1 << 16
    while True:
        lo = max(0, n - width)
        found = deque(_CANDIDATE.finditer(chunk, lo), maxlen=1)  # the last candidate cut
        last = found[0] if found else None
        if last is not None:
            cut = last.end() - 1
            break
        if lo == 0:
            break
        width <<= 2
    if cut < 0 and state:
        m = _CONTINUE[state].match(chunk)
        if m:
            cut = m.end() - 1
    body = chunk.rstrip(_WS)
    if not body:
        return cut, state
    if body.endswith(b"}"):
        return cut, 1
    if body.endswith(b","):
        before = body[:-1].rstrip(_WS)
        if before.endswith(b"}") or (not before and state == 1):
            return cut, 2
    return cut, 0


class _Source:
    """The decompressed byte stream of a trace, refused past the decompressed-size limit (see :class:`Limits`)."""

    def __init__(self, path: Path, limits: Limits):
        self.path = path
        self.raw = open(path, "rb")  # noqa: SIM115 - held for the stream's life; closed by close()
        self.gzip = self.raw.read(2) == b"\x1f\x8b"
        self.raw.seek(0)
        self.f = gzip.GzipFile(fileobj=self.raw, mode="rb") if self.gzip else self.raw
        self.limits = limits
        self.total = 0

    def read(self, n: int) -> bytes:
        data = _read(self.f, n, self.path)
        self.total += len(data)
        if self.gzip and self.total > (cap := self.limits.decompressed_cap(self.raw.tell())):
            raise InputError(f"expands to more than {cap >> 20:,} MiB when decompressed "
                             f"({self.total // max(1, self.raw.tell())}× the compressed bytes read)",
                             path=str(self.path),
                             hint="if the trace is genuine, raise the limit with --max-decompressed-gb")
        return data

    def close(self) -> None:
        self.f.close()
        self.raw.close()


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def array_start(path: Path, block: int = BLOCK, limits: Limits | None = None) -> tuple[dict, int]:
    """(header, offset just past the event array's '[') of an uncompressed trace, for readers that cut the
    file by byte ranges (see :func:`next_boundary`)."""
    src = _Source(path, limits or Limits())
    try:
        return _read_to_array(src, block, path)[0]
    finally:
        src.close()


def _read_to_array(src: _Source, block: int, path: Path) -> tuple[tuple[dict, int], bytes, bool]:
    """(header and the array's start, the bytes read, whether the file ended): read 64 kB, then 4x more each time
    up to ``block`` (the header is usually a few kB: reading a whole block first cost 0.04 s)."""
    buf, eof = b"", False
    step = min(block, 1 << 16)
    while not (found := _array_start(buf, eof, path)):
        data = src.read(step)
        eof = not data
        buf += data
        step = min(step * 4, block)
    return found, buf, eof


def next_boundary(fd: int, x: int, end: int, max_event_bytes: int) -> int | None:
    """Offset of the '{' of the first candidate event boundary ('}' ws ',' ws '{') starting at or after byte x of
    an open file, before ``end``; None when there is none within ``max_event_bytes``. Two readers asking for the
    same x get the same offset, so ranges cut this way tile the file. Whether it is at the top level is proven by
    decoding (as for iter_raw's pieces)."""
    import os

    width = 1 << 16
    while True:
        buf = os.pread(fd, width, x)
        m = _CANDIDATE.search(buf)
        if m:
            b = x + m.end() - 1
            return b if b < end else None
        if width >= max_event_bytes or x + width >= end:
            return None
        width *= 4


# Closes a piece (which ends with a separator) into a JSON array: a metadata event, which every decoder skips
CLOSE_PIECE = b'{"ph": "M"}]'


def _split_at(parts: list[bytes], at: int) -> tuple[bytes, list[bytes]]:
    """The first ``at`` bytes of the concatenated ``parts`` (one copy), and the parts of the rest."""
    head: list = []
    rest: list[bytes] = []
    pos = 0
    for b in parts:
        if pos + len(b) <= at:
            head.append(b)
        elif pos >= at:
            rest.append(b)
        else:
            view = memoryview(b)
            head.append(view[:at - pos])
            rest.append(bytes(view[at - pos:]))
        pos += len(b)
    return b"".join(head), rest


def iter_raw(path: Path, block: int = BLOCK, limits: Limits | None = None) -> Iterator[tuple[str, object]]:
    """Yield ("header", dict), then ("raw", piece) byte slices of the event array cut at *unvalidated* candidate
    boundaries (each piece ends just before an event's '{', separator included, so pieces concatenate back to
    the original bytes), then ("tail", bytes): the rest (the last events, ']' and the trailer).

    ``b"[" + piece + CLOSE_PIECE`` decodes when the cut was at top level (nearly always); callers that get a
    DecodeError re-join pieces and cut them with :func:`split_validated`. Every byte is scanned a bounded number
    of times (time linear in the input); bytes without an event boundary are held up to ``limits.max_event_bytes``.
    A JSON-array-format trace (top-level list of events) yields header ``{}`` and a tail whose trailer is ``{}``.
    """
    limits = limits or Limits()
    src = _Source(path, limits)
    try:
        (header, start), buf, eof = _read_to_array(src, block, path)
        array_format = not header and buf.lstrip(_BOM_WS)[:1] == b"["
        yield "header", header
        read_bytes = min(block, READ_BYTES)
        pending: list[bytes] = []
        held = 0  # bytes in pending
        cut_at = -1  # offset in the joined pending of the last boundary's '{'
        state = 0
        data, buf = buf[start:], b""
        consumed = 0  # bytes of the event array already yielded
        while True:
            if data:
                cut, state = _last_cut(data, state)
                if cut >= 0:
                    cut_at = held + cut
                pending.append(data)
                held += len(data)
            if cut_at > 0 and (held >= block or eof):
                piece, pending = _split_at(pending, cut_at)
                yield "raw", piece
                consumed += cut_at
                held, cut_at = held - cut_at, -1
            if held > limits.max_event_bytes:
                raise InputError(f"has an event of more than {limits.max_event_bytes >> 20} MB (or that much data "
                                 f"without an event boundary) at byte {consumed} of its event array", path=str(path),
                                 hint="if the trace is genuine, raise the limit with --max-event-mb")
            if eof:
                break
            data = src.read(read_bytes)
            eof = not data
        tail = b"".join(pending)
        if array_format:  # close the list and give it an empty trailer; the closing ']' is optional there
            tail += b"}" if tail.rstrip(_WS).endswith(b"]") else b"]}"
        yield "tail", tail
    finally:
        src.close()


def split_validated(buf: bytes, path: Path, decode, max_event_bytes: int | None = None) -> tuple[int, object]:
    """(cut, events) for the largest top-level cut: events = decode of the events in buf[:cut]; (-1, None) if none.

    When no cut decodes and buf holds more than ``max_event_bytes`` (default: :class:`Limits`'), the file is
    refused: the caller would otherwise grow buf without bound (cuts inside one huge string never validate)."""
    cut, events = _split(buf, path, 0, decode)
    limit = Limits().max_event_bytes if max_event_bytes is None else max_event_bytes
    if cut < 0 and len(buf) > limit:
        raise InputError(f"has an event of more than {limit >> 20} MB in its event array", path=str(path),
                         hint="if the trace is genuine, raise the limit with --max-event-mb")
    return cut, events


def finish(buf: bytes, path: Path) -> tuple[list, dict, bool]:
    """(events, trailer, whether bytes that are not UTF-8 were replaced) of the last piece."""
    return _finish(buf, path)

