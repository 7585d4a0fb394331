"""Kineto importer, stage 1: decode a block of trace events into typed Structs.

msgspec decodes into Structs that name only the keys nsys2comm needs (Args spells each key as the trace does;
_ARG_ALIASES maps older spellings to the current ones). The args of an event whose values have odd types are
converted tolerantly, event by event; a block whose event fields have odd types is re-decoded with orjson and
converted tolerantly. Epoch ts with a fraction beyond float64 are read from their digits (decode_events_exact).
"""

from __future__ import annotations

import gc
import json
import re
from decimal import Decimal
from typing import ClassVar, Union

import msgspec
import orjson

_NULL = msgspec.Raw(b"null")


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    device: int | None = None
    # text in ROCm traces: roctracer prints a HIP launch's stream as a pointer ("0x7f3a5c0010d0", kineto
    # RoctracerActivity_inl.h); taken in the fast pass and read with stream_id(), not a reason to decode again
    stream: int | str | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    bytes: int | None = None
    graph_id: int | None = msgspec.field(default=None, name="graph id")
    coll: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    in_size: int | None = msgspec.field(default=None, name="In msg size")
    out_size: int | None = msgspec.field(default=None, name="Out msg size")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=_NULL, name="Process Group Ranks")
    pg_id: str | int | None = msgspec.field(default=None, name="Process Group ID")
    src_rank: int | None = msgspec.field(default=None, name="Src Rank")
    dst_rank: int | None = msgspec.field(default=None, name="Dst Rank")
    seq: int | None = msgspec.field(default=None, name="Seq")
    comms_id: int | str | None = msgspec.field(default=None, name="Comms Id")
    input_dims: msgspec.Raw = msgspec.field(default=_NULL, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NULL, name="Input type")
    # per input, its strides in elements (record_shapes=True, PyTorch >= 2.1): the GEMM's transposes (gemm.sql)
    input_strides: msgspec.Raw = msgspec.field(default=_NULL, name="Input Strides")
    # scalar arguments as text ("" for the others): a functional collective's group_size (kineto_comm_ops.sql)
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NULL, name="Concrete Inputs")
    external_id_v1: int | None = msgspec.field(default=None, name="external id")


# Older spellings of a field -> the attribute that holds it (kineto.md §1.3, §1.6): the one map from Kineto's arg
# spellings to canonical fields. Staged args JSON carries only the current names, so the SQL reads one key each.
_ARG_ALIASES = {"external_id_v1": "external_id",  # ≈1.8-1.9 traces
                "in_size": "in_nelems", "out_size": "out_nelems",  # element counts, renamed in kineto #849 (Dec 2023)
                "pg_id": "pg_name"}  # PyTorch 2.2 'Process Group ID', later 'Process Group Name'
assert tuple(_ARG_ALIASES) == ("external_id_v1", "in_size", "out_size", "pg_id")  # _canonical_args' fast path


def _canonical_args(a: Args) -> Args:
    if (a.external_id_v1 is None and a.in_size is None and a.out_size is None and a.pg_id is None
            and a.stream.__class__ is not str):  # the current spellings (most events): nothing to rename
        return a
    fix = {} if a.stream.__class__ is not str else {"stream": _to_int(a.stream)}
    for old, new in _ARG_ALIASES.items():
        v = getattr(a, old)
        if v is not None:
            if getattr(a, new) is None:
                fix[new] = v
            fix[old] = None
    return msgspec.structs.replace(a, **fix) if fix else a


class _EventFields(msgspec.Struct, gc=False):
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    # raw JSON, decoded by the rows' loop for kept events only; the tolerant decoders put Args here
    args: msgspec.Raw = _NULL


class Event(_EventFields, gc=False):
    """One trace event, its ``args`` raw: from the decoders that follow the fast one (see decode_events)."""
    ph: str | None = None


class CompleteEvent(_EventFields, tag_field="ph", tag="X", gc=False):
    """An event of phase 'X' (complete: ts and dur), the only phase the importer keeps; ``args`` raw."""
    ph: ClassVar[str] = "X"


class CompleteEventArgs(CompleteEvent, tag_field="ph", tag="X", gc=False):
    """CompleteEvent from the fast decoder: ``args`` decoded in the same pass (msgspec takes an object as Args
    where the field is this union). One pass beat decoding the kept events' raw args one call each: per 8 MB range
    26 against 29.5 ms (benchmark trace) and 36.6 against 45 ms (long kernel names). A value of an odd type in any
    event's args fails the pass; the next decoder keeps args raw and converts them event by event."""
    args: msgspec.Raw | Args | None = _NULL


# Every other phase of the Trace Event Format (flows, instants, metadata, counters, ...): decoded into an empty
# Struct, its values skipped without building a Python object. Flows alone are a third of a Kineto trace's events:
# this halves the decode. A phase missing here, or a missing "ph", sends the block to the Event decoder.
_SKIPPED_PHASES = tuple(msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False,
                                          namespace={"cat": None, "ph": ph})
                        for i, ph in enumerate(("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O",
                                                "D", "M", "V", "v", "R", "c", "(", ")")))


class EventExactTs(Event, gc=False):
    """An event whose ts is kept as the JSON number's digits (see decode_events)."""
    ts: msgspec.Raw = _NULL


class CompleteEventExactTs(CompleteEventArgs, tag_field="ph", tag="X", gc=False):
    """A complete event whose ts is kept as the JSON number's digits (decode_events_exact), args decoded."""
    ts: msgspec.Raw = _NULL


_events_decoder = msgspec.json.Decoder(list[Event])
_phases_decoder = msgspec.json.Decoder(list[Union[CompleteEventArgs, *_SKIPPED_PHASES]])
_raw_args_phases_decoder = msgspec.json.Decoder(list[Union[CompleteEvent, *_SKIPPED_PHASES]])
_args_decoder = msgspec.json.Decoder(Args)
_exact_ts_decoder = msgspec.json.Decoder(list[EventExactTs])
_exact_phases_decoder = msgspec.json.Decoder(list[Union[CompleteEventExactTs, *_SKIPPED_PHASES]])
# epoch µs beyond float64's exact ns: 2**53 ns. Above it a float ts is read from its digits.
_EXACT_TS_US = 2.0**53 / 1000


class _Events(list):
    """Decoded events that were read after replacing bytes that are not UTF-8 (invalid_utf8)."""
    invalid_utf8 = False


HINT_BAD_VALUE = "the trace is damaged or was edited: export it again from the profiler"


class BadValue(ValueError):
    """A value no trace could hold; read() turns it into an InputError naming the file."""
_EMPTY_ARGS = Args()
_encode = msgspec.json.Encoder().encode

# JSON key for each Args attribute that goes into cpu_ranges.args
_ARG_KEYS = [(f.name, f.encode_name) for f in msgspec.structs.fields(Args)
             if f.name not in ("device", "stream", "grid", "block", "bytes", "graph_id")]


def _to_int(v):
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, (float, Decimal)):
        return int(v) if v == v and abs(v) < 9e18 else None
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            try:
                return _to_int(float(v))
            except ValueError:
                return None
    return None


def _to_num(v):
    if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return None
    return None


def _to_str(v):
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, (int, Decimal)) and not isinstance(v, bool):
        return str(v)
    return orjson.dumps(v, default=str).decode()


def stream_id(v) -> int | None:
    """A stream arg as an int: text is converted as the tolerant decoder converts it (a pointer gives None)."""
    return v if v.__class__ is int else _to_int(v)


def _pidlike(v):
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        return v
    return _to_int(v)


_ARG_CONVERT = {
    "grid": lambda v: [_to_int(x) for x in v] if isinstance(v, list) else None,
    "block": lambda v: [_to_int(x) for x in v] if isinstance(v, list) else None,
    "coll": _to_str, "dtype": _to_str, "pg_desc": _to_str,
    "pg_name": lambda v: v if isinstance(v, (str, int)) else _to_str(v),
    "pg_id": lambda v: v if isinstance(v, (str, int)) else _to_str(v),
    "comms_id": lambda v: v if isinstance(v, (str, int)) else _to_str(v),
    "pg_ranks": lambda v: msgspec.Raw(orjson.dumps(v)),
    "input_dims": lambda v: msgspec.Raw(orjson.dumps(v)),
    "input_type": lambda v: msgspec.Raw(orjson.dumps(v)),
    "input_strides": lambda v: msgspec.Raw(orjson.dumps(v)),
    "concrete_inputs": lambda v: msgspec.Raw(orjson.dumps(v)),
}


def _tolerant_args(a) -> Args | None:
    if not isinstance(a, dict):
        return None
    kw = {}
    for attr, key in _ALL_ARG_KEYS:
        if key in a:
            kw[attr] = _ARG_CONVERT.get(attr, _to_int)(a[key])
    return Args(**kw)


def _tolerant_event(d) -> Event | None:
    """An Event from a plain dict whose values may have unexpected types (slow path)."""
    if not isinstance(d, dict):
        return None
    args = _tolerant_args(d.get("args"))
    return Event(ph=_to_str(d.get("ph")), cat=_to_str(d.get("cat")), name=_to_str(d.get("name")),
                 pid=_pidlike(d.get("pid")), tid=_pidlike(d.get("tid")), ts=_to_num(d.get("ts")),
                 dur=_to_num(d.get("dur")), args=args)


_ALL_ARG_KEYS = [(f.name, f.encode_name) for f in msgspec.structs.fields(Args)]


def _exact_ts(raw: msgspec.Raw):
    """A ts from its JSON digits: Decimal keeps every digit, and round(ts * 1000) stays exact."""
    b = bytes(raw)
    return None if b == b"null" else Decimal(b.decode())


def _needs_exact_ts(events) -> bool:
    lim = _EXACT_TS_US
    return any(type(e.ts) is float and e.ts > lim for e in events)


class NeedsSlowDecode(Exception):
    """Raised by the fast decoders, or while rows are built from their events: the block must be decoded again
    with :func:`decode_events_slow` (an event field of an unexpected type, such as a ts that is not a number; odd
    types inside args are converted per event, see :func:`tolerant_raw_args`)."""


class NeedsExactTs(NeedsSlowDecode):
    """An epoch ts with a fraction finer than float64 keeps (the Kineto traces of early 2024): decode the block
    again with :func:`decode_events_exact`, which keeps each ts's digits."""


# A block whose first ts is epoch µs with a fraction (16+ integer digits): decoded by decode_events_exact at once
_FIRST_TS = re.compile(rb'"ts"\s*:')
_EPOCH_FRACTION_TS = re.compile(rb'"ts"\s*:\s*-?\d{16,}\.\d')


def has_epoch_fraction_ts(data) -> bool:
    """Whether the first ts in the first 64 KB of ``data`` is epoch µs with a fraction."""
    m = _FIRST_TS.search(data, 0, 1 << 16)
    return m is not None and _EPOCH_FRACTION_TS.match(data, m.start()) is not None


_NS_PER_PLACE = (1000, 100, 10, 1)  # ns per unit of a µs value's last digit, by digits after the dot


def exact_ns(ts) -> int | None:
    """round(ts * 1000) of a ts kept as its JSON digits (msgspec.Raw) or read as a Decimal, exactly; None for a
    null ts. NeedsSlowDecode when the value is not a number (the tolerant decoder converts it). Kineto prints
    ``us.nnn``: the digits without the dot are the ns."""
    if ts.__class__ is Decimal:
        return round(ts * 1000)
    b = bytes(ts)
    dot = b.find(b".")
    if dot < 0:
        if b.isdigit():
            return int(b) * 1000
    elif len(b) - dot <= 4:  # 1 to 3 digits after the dot
        try:
            return int(b.replace(b".", b"", 1)) * _NS_PER_PLACE[len(b) - 1 - dot]
        except ValueError:  # not digits ('"12.345"', '1.5e3'): below
            pass
    if b == b"null":
        return None
    try:
        return round(Decimal(b.decode()) * 1000)
    except (ArithmeticError, ValueError):  # a string, object, ... (decimal.InvalidOperation is an ArithmeticError)
        raise NeedsSlowDecode from None


def tolerant_raw_args(a: msgspec.Raw) -> Args | None:
    """Raw args whose values have odd types, converted as the tolerant decoder converts them (one event, not its
    whole block: a block decoded again took twice as long)."""
    b = bytes(a)
    try:
        obj = orjson.loads(b)
    except orjson.JSONDecodeError:  # integers beyond 64 bits, which msgspec reads
        obj = json.loads(b)
    return _tolerant_args(obj)


def decode_events(data: bytes) -> list[Event]:
    """Fast decode of a JSON array of events (complete events' args decoded in the same pass, see
    CompleteEventArgs). msgspec.DecodeError when it is not valid JSON; NeedsSlowDecode when an event field has an
    unexpected type (then use :func:`decode_events_slow`)."""
    return _decode_first((_phases_decoder, _raw_args_phases_decoder, _events_decoder), data)


def _decode_first(decoders, data) -> list[Event]:
    """The events from the first decoder that takes the block: each fails (ValidationError) where the next takes
    more (an odd type in some event's args; a phase not in the format or no "ph"); NeedsSlowDecode when none
    does (an event field of an odd type)."""
    was = gc.isenabled()
    gc.disable()  # millions of small allocations: generation-0 collections would cost ~40 %
    try:
        for decoder in decoders:
            try:
                return decoder.decode(data)
            except msgspec.ValidationError:
                continue
        raise NeedsSlowDecode
    except RecursionError:
        raise BadValue("has JSON nested deeper than any trace event") from None
    finally:
        if was:
            gc.enable()


def decode_events_exact(data: bytes) -> list[Event]:
    """decode_events, with each complete event's ts kept as its JSON digits (msgspec.Raw; rows read them with
    :func:`exact_ns`): for epoch ts with a fraction, which float64 cannot hold to the ns."""
    return _decode_first((_exact_phases_decoder, _exact_ts_decoder), data)


def decode_events_slow(data: bytes) -> list[Event]:
    """Decode a JSON array of events tolerantly: odd value types converted, epoch ts with a fraction beyond
    float64 read from their digits, bytes that are not UTF-8 replaced (``invalid_utf8``). msgspec.DecodeError
    when it is not valid JSON, BadValue when it nests deeper than any trace does."""
    was = gc.isenabled()
    gc.disable()
    try:
        try:
            events = [_canonical_event(e) for e in _events_decoder.decode(data)]
        except msgspec.ValidationError:
            events = None
        if events is not None and not _needs_exact_ts(events):
            return events
        if events is not None:
            events = _exact_ts_decoder.decode(data)
            for e in events:
                e.ts = _exact_ts(e.ts)
            return [_canonical_event(e) for e in events]
        return _tolerant_events(data)
    except RecursionError:
        raise BadValue("has JSON nested deeper than any trace event") from None
    finally:
        if was:
            gc.enable()


def _canonical_event(e: Event) -> Event:
    """args decoded now: Args, or (odd types) converted tolerantly from plain JSON."""
    a = e.args
    if a.__class__ is msgspec.Raw:
        if len(a) <= 4:
            e.args = None
        else:
            try:
                e.args = _args_decoder.decode(a)
            except msgspec.ValidationError:
                e.args = tolerant_raw_args(a)
    return e


def _tolerant_events(data: bytes) -> list[Event]:
    invalid_utf8 = False
    try:
        objs = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        if "recursion" in str(e):
            raise BadValue("has JSON nested deeper than any trace event (over 1,024 levels)") from None
        try:
            data.decode("utf-8")
            raise msgspec.DecodeError(str(e)) from None
        except UnicodeDecodeError:  # read what it says; the note tells names may hold U+FFFD
            data = data.decode("utf-8", errors="replace").encode()
            invalid_utf8 = True
        try:
            objs = orjson.loads(data)
        except orjson.JSONDecodeError as e2:
            raise msgspec.DecodeError(str(e2)) from None
    events = _Events(ev for ev in map(_tolerant_event, objs) if ev is not None)
    if _needs_exact_ts(events):
        objs = json.loads(data, parse_float=Decimal)
        events = _Events(ev for ev in map(_tolerant_event, objs) if ev is not None)
    events.invalid_utf8 = invalid_utf8
    return events
