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
from pathlib import Path
from typing import Iterator

import msgspec

from ..errors import InputError

BLOCK = 32 << 20
_CANDIDATE = re.compile(rb"\}\s*,\s*\{")
_TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_HEADER_LIMIT = 64 << 20  # bytes before traceEvents we are willing to hold
_MAX_SPLIT_TRIES = 16
_decode_any = msgspec.json.Decoder()
_ERR_POS = re.compile(r"byte (\d+)")

HINT_TRUNCATED = "the file is cut short: re-export the trace or copy it again"


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
    """head: bytes from the file start up to (not incl.) the "traceEvents" key."""
    s = head.strip()
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
    try:
        obj = _decode_any.decode(s)
    except msgspec.DecodeError:
        if s.rstrip().endswith(b"}"):
            raise InputError("has malformed JSON after the traceEvents array", path=str(path),
                             hint="the trace file is damaged; re-export it") from None
        raise InputError("is truncated JSON (ends after the event array)", path=str(path), hint=HINT_TRUNCATED) from None
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


def _finish(buf: bytes, path: Path) -> tuple[list, dict]:
    """The last piece: zero or more events, ']', then the trailer. Decoded with raw_decode, event by event."""
    text = buf.decode("utf-8", errors="replace")
    dec = json.JSONDecoder(strict=False)
    events = []
    i, n = 0, len(text)
    ws = " \t\r\n"
    while True:
        while i < n and text[i] in ws:
            i += 1
        if i >= n:
            raise InputError("is truncated JSON (the traceEvents array never ends)", path=str(path), hint=HINT_TRUNCATED)
        if text[i] == "]":
            return events, _parse_trailer(text[i + 1:].encode(), path)
        if text[i] == "," and events:
            i += 1
            continue
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            raise InputError("is truncated or malformed JSON at the end of the traceEvents array", path=str(path),
                             hint=HINT_TRUNCATED) from None
        events.append(obj)


def iter_raw(path: Path, block: int = BLOCK) -> Iterator[tuple[str, object]]:
    """Yield ("header", dict), then ("raw", piece) byte slices of the event array cut at *unvalidated* candidate
    boundaries (each piece ends just before an event's '{', separator included, so pieces concatenate back to
    the original bytes), then ("tail", bytes): the rest (the last events, ']' and the trailer).

    ``b"[" + piece + b"{}]"`` decodes when the cut was at top level (nearly always); callers that get a
    DecodeError re-join pieces and cut them with :func:`split_validated`.
    """
    f = open_stream(path)
    try:
        buf = b""
        eof = False
        while True:
            m = _TRACE_EVENTS_KEY.search(buf)
            if m:
                break
            if eof or len(buf) > _HEADER_LIMIT:
                if not buf.strip():
                    raise InputError("is empty", path=str(path), hint="give a Kineto trace (.json/.json.gz)")
                if buf.lstrip()[:1] not in (b"{", b"["):
                    raise InputError("is not JSON", path=str(path), hint="give a Kineto trace (.json/.json.gz)")
                if eof:
                    try:
                        _decode_any.decode(buf)
                    except msgspec.DecodeError:
                        raise InputError("is truncated or malformed JSON (no traceEvents array found)", path=str(path),
                                         hint=HINT_TRUNCATED) from None
                raise _not_kineto(path)
            data = _read(f, block, path)
            if not data:
                eof = True
            buf += data
        yield "header", _parse_header(buf[:m.start()], path)
        buf = buf[m.end():]
        while True:
            if not eof:
                data = _read(f, block, path)
                if data:
                    buf = buf + data if buf else data
                else:
                    eof = True
            # last candidate in the buffer's final window
            lo = max(0, len(buf) - (1 << 16))
            last = None
            while True:
                for last in _CANDIDATE.finditer(buf, lo):
                    pass
                if last is not None or lo == 0:
                    break
                lo = max(0, lo - (1 << 20))
            if last is not None:
                cut = last.end() - 1
                yield "raw", buf[:cut]
                buf = buf[cut:]
            if eof:
                break
        yield "tail", buf
    finally:
        f.close()


def split_validated(buf: bytes, path: Path, decode) -> tuple[int, object]:
    """(cut, events) for the largest top-level cut: events = decode of the events in buf[:cut]; (-1, None) if none."""
    return _split(buf, path, 0, decode)


def finish(buf: bytes, path: Path) -> tuple[list, dict]:
    return _finish(buf, path)

