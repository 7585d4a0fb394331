"""Values of an nsys export that cannot be stored as they are: each is refused with a one-line InputError naming
the file, or stored correctly with an ingest note (the policy per kind is in ``nsys.py``'s docstring).

The checks ride on the streamed chunks (null counts, one comparison, checked additions) so a clean export pays
almost nothing; the SQLite queries that say *which* column is wrong run only after a chunk failed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputError
from .base import impossible_clock as base_impossible_clock

_REEXPORT_HINT = "the export is damaged or was edited; export the report again with nsys export --type sqlite"
MAX_DEVICE = 65535  # device ids are packed in 16 bits while streaming (CUDA ordinals are small)
_INT64 = (-(1 << 63), (1 << 63) - 1)
CONVERT_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError)


def bad(ex, what: str, hint: str = _REEXPORT_HINT) -> InputError:
    return InputError(what, path=str(ex.path), hint=hint)


def _example(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def explain_types(ex, table: str, cols: list[str], err: Exception) -> InputError:
    """After a chunk failed to convert: the first listed column holding something other than an integer."""
    for c in cols:
        if c not in ex.cols(table):
            continue
        n, ex_val = ex.con.execute(
            f'SELECT count(*), min("{c}") FROM {table} WHERE typeof("{c}") NOT IN (\'integer\', \'null\')').fetchone()
        if n:
            return bad(ex, f"{table}.{c} holds {n} values that are not integers (e.g. {_example(ex_val)})")
    return bad(ex, f"{table} holds a value that is not a 64-bit integer ({type(err).__name__}: {err})")


def chunks(ex, table: str, sql: str, types: list[pa.DataType], int_cols: list[str]) -> Iterator[list[pa.Array]]:
    """Arrow columns per fetched chunk; a non-integer value refuses the file, naming the column."""
    it = ex.rows(sql)
    while True:
        try:
            rows = next(it)
        except StopIteration:
            return
        try:
            st = pa.struct([(f"c{i}", t) for i, t in enumerate(types)])
            yield pa.array(rows, type=st).flatten()
        except CONVERT_ERRORS as e:
            raise explain_types(ex, table, int_cols, e) from None


def require(ex, table: str, arr: pa.Array, what: str) -> None:
    if arr.null_count:
        raise bad(ex, f"{table} has {arr.null_count} rows with a NULL {what}")


def times(ex, table: str, start: pa.Array, end: pa.Array, offset: int, *, end_optional: bool = False):
    """(start_ns, end_ns, keep) on the job timeline; keep is None when every row has end >= start."""
    require(ex, table, start, "start")
    if not end_optional:
        require(ex, table, end, "end")
    try:
        s, e = pc.add_checked(start, offset), pc.add_checked(end, offset)
    except pa.ArrowInvalid:
        raise bad(ex, f"{table} timestamps overflow 64-bit integers after adding the clock offset {offset} ns "
                      "(TARGET_INFO_SESSION_START_TIME)",
                  "check TARGET_INFO_SESSION_START_TIME and the timestamps; export the report again") from None
    neg = pc.fill_null(pc.less(end, start), False)
    return s, e, (pc.invert(neg) if pc.any(neg).as_py() else None)


def explain_process_device(ex, table: str) -> InputError:
    """After a packed (process, device) value came out NULL: which of globalPid/deviceId is wrong."""
    n_pid, n_dev, n_range, example = ex.con.execute(
        f"SELECT count(*) FILTER (WHERE globalPid IS NULL), count(*) FILTER (WHERE deviceId IS NULL), "
        f"count(*) FILTER (WHERE deviceId NOT BETWEEN 0 AND {MAX_DEVICE}), "
        f"min(deviceId) FILTER (WHERE deviceId NOT BETWEEN 0 AND {MAX_DEVICE}) FROM {table}").fetchone()
    if n_pid:
        return bad(ex, f"{table} has {n_pid} rows with a NULL globalPid")
    if n_dev:
        return bad(ex, f"{table} has {n_dev} rows with a NULL deviceId")
    if n_range:
        return bad(ex, f"{table}.deviceId holds {n_range} values that are not CUDA device indexes "
                       f"(0..{MAX_DEVICE}, e.g. {_example(example)})")
    return bad(ex, f"{table} has rows whose process or device cannot be read")


def check_device(ex, table: str, gpid, dev) -> None:
    """One (globalPid, deviceId) pair of the GPU-process scan."""
    if not isinstance(gpid, int) or not _INT64[0] <= gpid <= _INT64[1]:
        raise bad(ex, f"{table}.globalPid holds {_example(gpid)}, not an integer")
    if not isinstance(dev, int) or not 0 <= dev <= MAX_DEVICE:
        raise bad(ex, f"{table}.deviceId holds {_example(dev)}, not a CUDA device index (0..{MAX_DEVICE})")


def session_clock(ex, utc, sysclk) -> int:
    """utcEpochNs - systemClockNs (or utcEpochNs), refusing TEXT and offsets outside int64."""
    t = "TARGET_INFO_SESSION_START_TIME"
    for name, v in (("utcEpochNs", utc), ("systemClockNs", sysclk)):
        if v is not None and not isinstance(v, int):
            raise bad(ex, f"{t}.{name} holds {type(v).__name__} {_example(v)}, not integer nanoseconds")
    offset = utc - (sysclk or 0)
    if not _INT64[0] <= offset <= _INT64[1]:
        raise bad(ex, f"{t} gives a clock offset ({offset} ns) outside 64-bit integers")
    impossible_clock(ex, utc)
    return offset


def impossible_clock(ex, utc: int) -> None:
    """Refuse a session start (utcEpochNs: the epoch time of the session's start on both clock rules) by the rule
    both importers follow (base.impossible_clock)."""
    why = base_impossible_clock(utc, ex.path)
    if why:
        raise bad(ex, f"has TARGET_INFO_SESSION_START_TIME.utcEpochNs {utc} {why}")


def note_batch(notes: list[tuple[str, str, str]]):
    """ingest_notes rows (file-wide) for what was stored with a caveat."""
    return pa.table({"rank": pa.nulls(len(notes), pa.int32()),
                     "severity": pa.array([n[0] for n in notes], pa.string()),
                     "code": pa.array([n[1] for n in notes], pa.string()),
                     "message": pa.array([n[2] for n in notes], pa.string())})
