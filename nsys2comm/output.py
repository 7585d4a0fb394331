"""The one output layer: every row set and JSON document the CLI prints goes through here.

Design decisions (sqlite-utils / hf / harlequin habits):

* Rows go to stdout (or to ``-o PATH``); messages, progress and warnings go to stderr, so
  ``nsys2comm query run.duckdb overlap_by_rank --format csv > x.csv`` gives a clean file.
* ``--format`` is one of :data:`FORMATS`; with ``-o PATH`` and no ``--format`` the format comes from the file
  extension (:func:`infer_format`). ``parquet`` is binary and needs ``-o``.
* Values are not converted unless asked: times stay integer nanoseconds, sizes integer bytes. ``--timeunit``
  (:func:`convert_times`) rescales the ``*_ns`` columns, rounded to the unit's ns resolution (us: 3 decimals), and
  renames them to the new unit. **The one time rule**: a column is an absolute timestamp on the job timeline when
  its name ends ``start_ns``, ``end_ns``, ``first_ns``, ``last_ns`` or ``ts_ns`` (:func:`is_timestamp_column`,
  checked against the catalog's docs by ``tests/test_catalog_lint.py``); everything else ending ``_ns`` is a
  duration. Timestamps stay integer ns on the absolute timeline, unless ``--relative`` is given or a unit other than
  ns is chosen: then they count from the job's first event, and the output says so (:func:`time_note`: the first
  line of a table, a line on stderr for the other formats). Integral HUGEINT/DECIMAL(38,0) results (DuckDB's
  ``sum`` of BIGINT) become Int64 (:func:`exact_integers`). ``*_pct`` columns are rounded to
  :data:`~nsys2comm.units.PCT_DECIMALS` decimals, the summary's precision (:func:`round_percentages`). No format
  writes a number in exponent form where the plain form is at most 32 characters long. Float NaN becomes ``null``
  (JSON) or an empty field (CSV/TSV). Nested values (lists, structs) are written as JSON text in
  CSV/TSV/markdown.
* ``--columns a,b`` (:func:`select_columns`) keeps exactly those columns in that order.
* Only ``table`` is for eyes: it rounds floats for display and, on a terminal, fits its width: numbers are never
  cut. When every column does not fit, a catalog object's key columns (``-- @column name [key]:``, see
  :mod:`nsys2comm.catalog`) come first, then the others that fit (stderr names the columns left out); key text
  wraps, other text is truncated with "…". When even the key columns (or the columns asked for with
  ``--columns``) do not fit, the table becomes one record per row (:func:`render_records`). Every other format is
  exact and complete.
"""

from __future__ import annotations

import io
import math
import re
import sys
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import orjson

from .errors import UsageError
from .units import NS_PER_UNIT, PCT_DECIMALS

if TYPE_CHECKING:  # imported where rows are made: commands that make none (ingest) start 0.2 s sooner
    import polars as pl


class Format(StrEnum):
    """Output formats accepted by ``--format``."""

    table = "table"
    csv = "csv"
    tsv = "tsv"
    json = "json"
    jsonl = "jsonl"
    parquet = "parquet"
    markdown = "markdown"


FORMATS = [f.value for f in Format]

EXTENSIONS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "table",
}


def infer_format(fmt: str | Format | None, out: str | Path | None) -> str:
    """The format to write: explicit ``--format`` wins, else the extension of ``-o``, else ``table``."""
    if fmt is not None:
        fmt = fmt.value if isinstance(fmt, Format) else str(fmt)
        if fmt not in FORMATS:
            raise UsageError(f"unknown format {fmt!r}", hint="choose one of " + ", ".join(FORMATS))
        implied = _extension_format(out)
        if implied not in (None, fmt, "table"):  # .txt takes any text format
            raise UsageError(f"--format {fmt} contradicts the extension of {out}, which means {implied}",
                             hint="drop --format or change the file name")
    elif out is not None and str(out) != "-":
        suffix = Path(str(out)).suffix.lower()
        fmt = EXTENSIONS.get(suffix)
        if fmt is None:
            raise UsageError(f"cannot tell the output format from the extension {suffix or '(none)'!r}",
                             path=str(out), hint="add --format " + "|".join(FORMATS))
    else:
        fmt = "table"
    if fmt == "parquet" and (out is None or str(out) == "-"):
        raise UsageError("parquet is a binary format and needs a file", hint="add -o rows.parquet")
    return fmt


def _extension_format(out: str | Path | None) -> str | None:
    if out is None or str(out) == "-":
        return None
    return EXTENSIONS.get(Path(str(out)).suffix.lower())


# ----------------------------------------------------------------------------------------------------------------
# time units: catalog columns hold integer ns; display may rescale them, keeping the unit in the column name


class TimeUnit(StrEnum):
    """Units accepted by ``--timeunit``."""

    ns = "ns"
    us = "us"
    ms = "ms"
    s = "s"


# epoch timestamps (start_ns, window_start_ns, first_ns, span_end_ns ...), as opposed to durations (span_ns) and
# offsets (start_offset_ns): the name decides, and tests/test_catalog_lint.py checks every catalog column against it
_TIMESTAMP = re.compile(r"(^|_)(start|end|first|last|ts)_ns$")
# a column in a time unit: the decimals that are the unit's ns resolution
_UNIT_SUFFIX = re.compile(r"_(ns|us|ms|s)$")


def is_timestamp_column(name: str) -> bool:
    """True for a column named as a point on the job timeline, e.g. ``start_ns``, ``span_end_ns``, ``first_ns``."""
    return bool(_TIMESTAMP.search(name))


def unit_decimals(unit: str) -> int:
    """Decimals of a time in ``unit`` that are whole ns: 0 for ns, 3 for us, 6 for ms, 9 for s."""
    return len(str(NS_PER_UNIT[unit])) - 1


def _unit_value(unit: str | TimeUnit) -> str:
    unit = unit.value if isinstance(unit, TimeUnit) else str(unit)
    if unit not in NS_PER_UNIT:
        raise UsageError(f"unknown time unit {unit!r}", hint="choose one of " + ", ".join(NS_PER_UNIT))
    return unit


def shifts_timestamps(unit: str | TimeUnit | None, relative: bool) -> bool:
    """Whether timestamps count from the job start: with ``--relative``, or with any unit other than ns."""
    return relative or (unit is not None and _unit_value(unit) != "ns")


def convert_times(df: pl.DataFrame, unit: str | TimeUnit = "ns", *, relative: bool = False,
                  origin_ns: int | None = None) -> pl.DataFrame:
    """Numeric ``*_ns`` columns in ``unit``, renamed ``*_us``/``*_ms``/``*_s``; unchanged for ``ns``.

    Timestamp columns (:func:`is_timestamp_column`) count from ``origin_ns`` (the job start, else the earliest
    timestamp in ``df``) with ``relative`` or any unit other than ns (:func:`shifts_timestamps`): an epoch in µs
    is a 16-digit number that floats cannot hold to the ns. Durations are never shifted. Values in a unit are
    rounded to its ns resolution (:func:`unit_decimals`). A column whose new name is already taken keeps its ns.
    """
    import polars as pl

    unit = _unit_value(unit)
    shift = shifts_timestamps(unit, relative)
    ns_cols = [n for n, t in df.schema.items() if n.endswith("_ns") and t.is_numeric()]
    stamps = [n for n in ns_cols if is_timestamp_column(n)]
    if shift and stamps and origin_ns is None:
        origin_ns = df.select(pl.min_horizontal([pl.col(n).min() for n in stamps])).item()
    exprs = []
    for name in ns_cols:
        new_name = name[:-3] + "_" + unit
        if new_name != name and new_name in df.columns:
            continue
        col = pl.col(name)
        if shift and name in stamps and origin_ns is not None:
            col = col - origin_ns
        if unit != "ns":  # polars divides by multiplying with the reciprocal: round away its last-bit noise
            col = (col.cast(pl.Float64) / NS_PER_UNIT[unit]).round(unit_decimals(unit))
        exprs.append(col.alias(name))
    renames = {n: n[:-3] + "_" + unit for n in ns_cols if n[:-3] + "_" + unit not in df.columns}
    return df.with_columns(exprs).rename(renames) if exprs else df


def time_note(columns: list[str], unit: str | TimeUnit | None, relative: bool, origin_ns: int | None) -> str | None:
    """What a reader must know about the times in ``columns`` (as shown, after :func:`convert_times`): which
    timestamps count from the job start, and from which absolute time. None when nothing was shifted."""
    if not shifts_timestamps(unit, relative):
        return None
    u = _unit_value(unit) if unit is not None else "ns"
    stamps = [n for n in columns if n.endswith("_" + u) and is_timestamp_column(n[:-len(u)] + "ns")]
    if not stamps:
        return None
    origin = "the job start" if origin_ns is None else f"the job start ({origin_ns} ns on the job timeline)"
    return f"timestamps in {u} from {origin}: {', '.join(stamps)}"


def convert_diff_times(df: pl.DataFrame, unit: str | TimeUnit = "ns") -> pl.DataFrame:
    """``nsys2comm diff`` rows in ``unit``: ``base``, ``new`` and ``delta`` of the time metrics (names with
    ``_ns`` before any ``_per_…``, e.g. ``exposed_comm_ns_per_step``) and ``impact_ns``, rounded to the unit's ns
    resolution; the metric and column names say the unit. ``delta_pct`` does not change."""
    import polars as pl

    unit = _unit_value(unit)
    if unit == "ns" or "metric" not in df.columns:
        return df
    scale, places = NS_PER_UNIT[unit], unit_decimals(unit)
    is_time = pl.col("metric").str.contains(r"_ns(_per_\w+)?$")
    exprs = [pl.when(is_time).then((pl.col(c).cast(pl.Float64) / scale).round(places)).otherwise(pl.col(c))
             .alias(c) for c in ("base", "new", "delta") if c in df.columns]
    exprs.append(pl.col("metric").str.replace(r"_ns(_per_\w+)?$", "_" + unit + "$1"))
    if "impact_ns" in df.columns:
        exprs.append((pl.col("impact_ns").cast(pl.Float64) / scale).round(places).alias("impact_ns"))
    out = df.with_columns(exprs)
    return out.rename({"impact_ns": "impact_" + unit}) if "impact_ns" in df.columns else out


def round_percentages(df: pl.DataFrame, decimals: int = PCT_DECIMALS) -> pl.DataFrame:
    """Float ``*_pct`` columns rounded to the summary's precision: more digits are noise, not information."""
    import polars as pl

    cols = [n for n, t in df.schema.items() if n.endswith("_pct") and t in (pl.Float32, pl.Float64)]
    return df.with_columns([pl.col(n).round(decimals) for n in cols]) if cols else df


def exact_integers(df: pl.DataFrame) -> pl.DataFrame:
    """Int128 and DECIMAL(p, 0) columns (DuckDB's ``sum`` of BIGINT is HUGEINT or DECIMAL(38,0)) as Int64 where
    every value fits; integer sums stay integers in every format."""
    import polars as pl

    casts = []
    for n, t in df.schema.items():
        if t == pl.Int128 or (isinstance(t, pl.Decimal) and t.scale == 0):
            lo, hi = df.select(pl.col(n).min().alias("lo"), pl.col(n).max().alias("hi")).row(0)
            if all(v is None or -2**63 <= int(v) < 2**63 for v in (lo, hi)):
                casts.append(pl.col(n).cast(pl.Int64))
    return df.with_columns(casts) if casts else df


def parse_columns(spec: str | None) -> list[str] | None:
    """``--columns a,b,c`` as a list of names (None when not given)."""
    if spec is None:
        return None
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError("--columns names no column", hint="e.g. --columns rank,busbw_gbps")
    seen = {n for n in names if names.count(n) > 1}
    if seen:
        raise UsageError(f"--columns names {', '.join(sorted(seen))} twice", hint="name each column once")
    return names


def resolve_column(name: str, columns: list[str]) -> str | None:
    """``name`` as it appears among ``columns``: itself, or the same time column in another unit (``start_ns``
    asked for, ``start_us`` shown after ``--timeunit us``)."""
    if name in columns:
        return name
    m = _UNIT_SUFFIX.search(name)
    if m:
        stem = name[:m.start()]
        return next((stem + "_" + u for u in NS_PER_UNIT if stem + "_" + u in columns), None)
    return None


def select_columns(df: pl.DataFrame, names: list[str] | None) -> pl.DataFrame:
    """Exactly ``names``, in that order; an unknown name is a one-line usage error listing the valid ones."""
    if names is None:
        return df
    picked: list[str] = []
    unknown: list[str] = []
    for n in names:
        r = resolve_column(n, df.columns)
        (picked if r is not None else unknown).append(r if r is not None else n)
    if unknown:
        raise UsageError(f"--columns: no column {', '.join(map(repr, unknown))}",
                         hint="choose from " + ",".join(df.columns))
    return df.select(picked)


# ----------------------------------------------------------------------------------------------------------------
# value helpers


def _json_default(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (timedelta,)):
        return int(v / timedelta(microseconds=1)) * 1000
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    return str(v)


def dumps(obj: Any, *, indent: bool = False) -> bytes:
    """JSON bytes: NaN/inf become null (orjson), datetimes ISO 8601, integers exact."""
    opts = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
    if indent:
        opts |= orjson.OPT_INDENT_2
    return orjson.dumps(obj, default=_json_default, option=opts)


def _nan_to_null(df: pl.DataFrame) -> pl.DataFrame:
    import polars as pl

    floats = [n for n, t in df.schema.items() if t in (pl.Float32, pl.Float64)]
    if not floats:
        return df
    return df.with_columns([pl.col(n).fill_nan(None) for n in floats])


def _nested_to_json(df: pl.DataFrame) -> pl.DataFrame:
    import polars as pl

    nested = [n for n, t in df.schema.items() if t.is_nested() or t == pl.Object]
    if not nested:
        return df
    cols = {}
    for n in nested:
        if _integer_leaves(df.schema[n]):  # polars writes these as orjson does, without a Python value per row
            text = pl.struct(pl.col(n).alias("v")).struct.json_encode().str.strip_prefix('{"v":').str.strip_suffix("}")
            cols[n] = pl.when(pl.col(n).is_null()).then(None).otherwise(text).alias(n)
            continue
        cols[n] = pl.lit(pl.Series(n, [None if v is None else dumps(v).decode() for v in df.get_column(n).to_list()],
                                   dtype=pl.String)).alias(n)
    return df.with_columns([cols[n] for n in nested])


_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _integer_leaves(t: Any) -> bool:
    """A LIST or STRUCT whose every leaf is an integer (at most 64 bits) or a boolean, and whose field names need
    no escaping in JSON: the JSON text of such a value has one spelling."""
    import polars as pl

    if isinstance(t, (pl.List, pl.Array)):
        return _integer_leaves(t.inner)
    if isinstance(t, pl.Struct):
        return all(_FIELD.match(f.name) is not None and _integer_leaves(f.dtype) for f in t.fields)
    return t == pl.Boolean or (t.is_integer() and t not in (pl.Int128, pl.UInt128))


_PLAIN_MAX = 32  # longest plain (positional) form of a float written instead of exponent form


def plain_float(v: float) -> str:
    """``v`` with its shortest round-trip digits, in positional form (``0.000000005``, not ``5e-09``) unless that
    takes more than 32 characters (a p-value of 1e-300)."""
    s = repr(v)
    if "e" not in s or not math.isfinite(v):
        return s
    t = format(Decimal(s), "f")
    if "." not in t:
        t += ".0"
    return t if len(t) <= _PLAIN_MAX else s


def _exponent_prone(df: pl.DataFrame) -> list[str]:
    """Float columns holding a value that Python, polars or orjson would write in exponent form."""
    import polars as pl

    floats = [n for n, t in df.schema.items() if t in (pl.Float32, pl.Float64)]
    if not floats or not df.height:
        return []
    a = [pl.col(n).abs() for n in floats]
    row = df.select([x.filter(x > 0).min().alias(f"lo{i}") for i, x in enumerate(a)]
                    + [x.max().alias(f"hi{i}") for i, x in enumerate(a)]).row(0)
    k = len(floats)
    return [n for i, n in enumerate(floats) if (row[i] is not None and row[i] < 1e-4)
            or (row[k + i] is not None and math.isfinite(row[k + i]) and row[k + i] >= 1e15)]


def _unit_places(name: str) -> int | None:
    """Decimals to show for a float column in a time unit (``span_us``: 3), else None."""
    m = _UNIT_SUFFIX.search(name)
    return unit_decimals(m.group(1)) if m else None


def _cell_text(v: Any, *, for_table: bool, places: int | None = None) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if not for_table:
            return plain_float(v)
        if places is not None and math.isfinite(v):  # a time in a unit: to its ns resolution, never 1.694e+15
            s = f"{v:.{places}f}"
            s = s.rstrip("0").rstrip(".") if "." in s else s
            return s if s not in ("", "-0") else "0"
        if v == 0 or 1e-3 <= abs(v) < 1e15:
            s = f"{v:.3f}".rstrip("0").rstrip(".")
            return s if s not in ("", "-0") else "0"
        if math.isfinite(v) and abs(v) >= 1e15:
            return f"{v:.0f}"
        return f"{v:.4g}"
    if isinstance(v, (list, dict, tuple)):
        return dumps(v).decode()
    if isinstance(v, (datetime, date, time)):
        return v.isoformat()
    return str(v).replace("\n", " ") if for_table else str(v)


# ----------------------------------------------------------------------------------------------------------------
# rows without polars: a catalog query's rows as DuckDB hands them to Python, for a fresh process that would
# otherwise import polars (0.15 s idle) to print a few rows. Every writer gives them the same bytes as the polars
# frame of the same rows (tests/test_output_rows.py holds the two to each other).

# DuckDB type id -> the kind of Python value it gives; other types (HUGEINT, DECIMAL, dates, ...) go through polars
_KINDS = {"bigint": "int", "integer": "int", "smallint": "int", "tinyint": "int", "ubigint": "int",
          "uinteger": "int", "usmallint": "int", "utinyint": "int", "double": "float", "varchar": "str",
          "boolean": "bool"}
FAST_ROWS_MAX = 10_000  # a larger result goes through polars, whose writers are faster per row


def value_kind(t: Any) -> str | None:
    """The kind of a DuckDB type (``int``, ``float``, ``str``, ``bool``, or ``nested`` for a LIST or STRUCT of
    those), or None where only the polars path writes it exactly."""
    tid = getattr(t, "id", None)
    if tid in _KINDS:
        return _KINDS[tid]
    if tid in ("list", "struct") and all(value_kind(c) is not None for _, c in t.children):
        return "nested"
    return None


def fetch_rows(rel: Any, max_rows: int = FAST_ROWS_MAX, *,
               run: Callable[[], Any] | None = None) -> Rows | pl.DataFrame | None:
    """A DuckDB relation's rows as :class:`Rows`; None when a column's type is not covered or a name repeats
    (nothing has run: the caller runs it through polars). Over ``max_rows`` rows: with ``run`` (executes the
    relation's SQL and returns DuckDB's cursor), the polars frame of the same rows, from that one execution (a
    catalog query on millions of rows takes seconds: running it again through polars doubled them); without it,
    None."""
    names = list(rel.columns)
    kinds = [value_kind(t) for t in rel.types]
    if any(k is None for k in kinds) or len(set(names)) != len(names):
        return None
    if run is None:
        got = rel.limit(max_rows + 1).fetchall()
        if len(got) > max_rows:
            return None
    else:
        cur = run()
        got = cur.fetchmany(max_rows + 1)
        if len(got) > max_rows:
            return _frame_of(got, cur)
    return Rows(names, [k for k in kinds if k is not None],
                [list(c) for c in zip(*got, strict=True)] if got else [[] for _ in names])


def _frame_of(head: list[tuple], cur: Any) -> pl.DataFrame:
    """The polars frame of a result whose first rows were fetched as ``head`` and whose rest ``cur`` still holds:
    the rest through Arrow, the head built to the rest's schema (the plain kinds of value_kind convert exactly)."""
    import warnings

    import polars as pl

    with warnings.catch_warnings():  # DuckDB notes that Arrow from a cursor copies the rows once; so be it
        warnings.simplefilter("ignore", UserWarning)
        rest = pl.DataFrame(cur.to_arrow_reader())
    return pl.concat([pl.DataFrame(head, schema=rest.schema, orient="row"), rest], rechunk=False)


def _csv_field(s: str, sep: str) -> str:
    """A text field as polars' CSV writer quotes it: empty text as ``""``; quoted where it holds the separator, a
    quote or a line break."""
    if not s:
        return '""'
    if sep in s or '"' in s or "\n" in s or "\r" in s:
        return '"' + s.replace('"', '""') + '"'
    return s


def round_like_polars(v: float | None, decimals: int) -> float | None:
    """``v`` as polars' ``Expr.round(decimals)`` gives it (half to even on ``v * 10**decimals``, then divided
    back; not Python's correctly rounded ``round``)."""
    if v is None or not math.isfinite(v):
        return v
    scale = 10.0 ** decimals
    x = v * scale
    if not math.isfinite(x):
        return v
    r = round(x)
    return float(r) / scale if r else math.copysign(0.0, v)


class Rows:
    """Rows without polars: column names, their kinds (:func:`value_kind`) and the values, column by column."""

    def __init__(self, columns: list[str], kinds: list[str], data: list[list[Any]]):
        self.columns, self.kinds, self.data = columns, kinds, data

    @property
    def height(self) -> int:
        return len(self.data[0]) if self.data else 0

    def iter_rows(self):
        return zip(*self.data, strict=True)

    def select(self, names: list[str]) -> Rows:
        at = {n: i for i, n in enumerate(self.columns)}
        return Rows(list(names), [self.kinds[at[n]] for n in names], [self.data[at[n]] for n in names])

    def round_percentages(self, decimals: int = PCT_DECIMALS) -> Rows:
        """As :func:`round_percentages`."""
        data = [[round_like_polars(v, decimals) for v in col] if k == "float" and n.endswith("_pct") else col
                for n, k, col in zip(self.columns, self.kinds, self.data, strict=True)]
        return Rows(self.columns, self.kinds, data)

    def _finite_data(self) -> list[list[Any]]:
        """NaN as None (:func:`_nan_to_null`)."""
        return [[None if v is None or v != v else v for v in col] if k == "float" else col
                for k, col in zip(self.kinds, self.data, strict=True)]

    def _exponent_prone(self, data: list[list[Any]]) -> list[bool]:
        """As :func:`_exponent_prone`, column by column."""
        out = []
        for k, col in zip(self.kinds, data, strict=True):
            a = [abs(v) for v in col if v is not None] if k == "float" else []
            lo = min((v for v in a if v > 0), default=None)
            hi = max(a, default=None)
            out.append((lo is not None and lo < 1e-4) or (hi is not None and math.isfinite(hi) and hi >= 1e15))
        return out

    def json_rows(self) -> list[dict[str, Any]]:
        """As :func:`_json_rows`."""
        data = self._finite_data()
        for i, prone in enumerate(self._exponent_prone(data)):
            if prone:
                data[i] = [orjson.Fragment(plain_float(v).encode()) if v is not None and math.isfinite(v) else v
                           for v in data[i]]
        names = self.columns
        return [dict(zip(names, row, strict=True)) for row in zip(*data, strict=True)]

    def csv(self, sep: str) -> str:
        """The CSV (or TSV) text polars writes for the same rows (:func:`_csv_frame`, ``write_csv``)."""
        data = self._finite_data()
        cols = []
        for k, col, prone in zip(self.kinds, data, self._exponent_prone(data), strict=True):
            if k == "int":
                cols.append(["" if v is None else str(v) for v in col])
            elif k == "float":
                text = plain_float if prone else repr
                cols.append(["" if v is None else text(v) for v in col])
            elif k == "bool":
                cols.append(["" if v is None else "true" if v else "false" for v in col])
            elif k == "str":
                cols.append(["" if v is None else _csv_field(v, sep) for v in col])
            else:
                cols.append(["" if v is None else _csv_field(dumps(v).decode(), sep) for v in col])
        lines = [sep.join(_csv_field(n, sep) for n in self.columns)]
        lines += [sep.join(row) for row in zip(*cols, strict=True)]
        return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------------
# writers


_TEXT_MIN_WIDTH = 20  # a truncated text column keeps at least this many cells (or its header's width)
_COLUMN_GAP = 2  # rich puts one cell of padding on each side of a column boundary
_NAME_MAX = 30  # a record's column names take at most this many cells before the values


def _layout(names: list[str], cells: list[list[str]], fixed: list[bool], width: int | None,
            first: int = 0) -> list[int | None]:
    """Width of each column, or None for a column left out; ``width=None`` means unlimited.

    Fixed columns (numbers, dates) get their full width; text columns shrink to a floor. The ``first`` columns (the
    key columns, when they lead) take the room they want before any later column is added. Columns are kept from
    the left while their floors fit; the room left over is shared fairly among the text columns that want more.
    """
    from rich.cells import cell_len

    natural = [max([cell_len(n), *map(cell_len, col)]) for n, col in zip(names, cells, strict=True)]
    if width is None:
        return list(natural)
    floor = _floors(names, natural, fixed)
    if first:
        room = width - sum(floor[:first]) - _COLUMN_GAP * (first - 1)
        for k, (want, i) in enumerate(sorted((natural[i] - floor[i], i) for i in range(first)
                                             if natural[i] > floor[i])):
            give = max(min(want, room // (first - k)), 0) if room > 0 else 0
            floor[i] += give
            room -= give
    widths: list[int | None] = [None] * len(names)
    used = 0
    for i, least in enumerate(floor):
        need = least + (_COLUMN_GAP if i else 0)
        if i and used + need > width:
            break  # this and all later columns are left out
        widths[i], used = least, used + need
    spare = max(width - used, 0)
    wanting = sorted((natural[i] - w, i) for i, w in enumerate(widths) if w is not None and natural[i] > w)
    for k, (want, i) in enumerate(wanting):
        give = min(want, spare // (len(wanting) - k))
        widths[i] = (widths[i] or 0) + give
        spare -= give
    return widths


def _floors(names: list[str], natural: list[int], fixed: list[bool]) -> list[int]:
    from rich.cells import cell_len

    return [n if f else min(n, max(_TEXT_MIN_WIDTH, cell_len(h))) for n, f, h in zip(natural, fixed, names,
                                                                                        strict=True)]


class _Grid(NamedTuple):
    """What a table shows, whatever held the rows: names, which columns are fixed (numbers, dates: never cut),
    which are numeric (right-aligned), and every cell's display text, column by column."""

    names: list[str]
    fixed: list[bool]
    numeric: set[str]
    cells: list[list[str]]

    @property
    def height(self) -> int:
        return len(self.cells[0]) if self.cells else 0

    def select(self, order: list[str]) -> _Grid:
        at = {n: i for i, n in enumerate(self.names)}
        return _Grid(list(order), [self.fixed[at[n]] for n in order], self.numeric, [self.cells[at[n]] for n in order])


def _grid(data: pl.DataFrame | Rows) -> _Grid:
    if isinstance(data, Rows):
        places = {n: _unit_places(n) if k == "float" else None for n, k in zip(data.columns, data.kinds,
                                                                             strict=True)}
        return _Grid(list(data.columns), [k not in ("str", "nested") for k in data.kinds],
                     {n for n, k in zip(data.columns, data.kinds, strict=True) if k in ("int", "float")},
                     [[_cell_text(v, for_table=True, places=places[n]) for v in col]
                      for n, col in zip(data.columns, data.data, strict=True)])
    import polars as pl

    df = data
    fixed = [not (t == pl.String or t == pl.Categorical or t.is_nested() or t == pl.Object)
             for t in df.schema.values()]
    places = {n: _unit_places(n) if t.is_float() else None for n, t in df.schema.items()}
    cells = [[_cell_text(v, for_table=True, places=places[n]) for v in df.get_column(n).to_list()]
             for n in df.columns]
    return _Grid(list(df.columns), fixed, {n for n, t in df.schema.items() if t.is_numeric()}, cells)


def table_plan(df: pl.DataFrame | Rows, *, width: int | None, keys: list[str] | None = None,
               exact: bool = False) -> tuple[str, list[str]]:
    """How ``df`` is shown in ``width`` cells: ``('grid', columns)`` or ``('records', columns)``.

    Everything fits (or no width): every column in order. Otherwise, with ``exact`` (the columns asked for with
    ``--columns``): records. With ``keys``: the key columns first, then the others that fit; records when even the
    key columns do not fit. Without keys: the columns from the left that fit.
    """
    return _plan(_grid(df), width=width, keys=keys, exact=exact)


def _plan(g: _Grid, *, width: int | None, keys: list[str] | None, exact: bool) -> tuple[str, list[str]]:
    from rich.cells import cell_len

    names, fixed, cells = g.names, g.fixed, g.cells
    if width is None or not names:
        return "grid", names
    natural = [max([cell_len(n), *map(cell_len, col)]) for n, col in zip(names, cells, strict=True)]
    if sum(natural) + _COLUMN_GAP * (len(names) - 1) <= width:
        return "grid", names
    if exact:
        return "records", names
    keyed = [k for k in (keys or []) if k in names]
    if keyed:
        floor = dict(zip(names, _floors(names, natural, fixed), strict=True))
        if sum(floor[k] for k in keyed) + _COLUMN_GAP * (len(keyed) - 1) > width:
            return "records", keyed + [n for n in names if n not in keyed]
        return "grid", keyed + [n for n in names if n not in keyed]
    return "grid", names


def render_table(df: pl.DataFrame | Rows, *, width: int | None = None, bold_header: bool = False,
                 keys: list[str] | None = None, exact: bool = False) -> tuple[str, list[str]]:
    """The table as text no wider than ``width`` (None: as wide as it needs), and the names of left-out columns.

    ``keys``: the columns shown first when not all fit, text among them wrapped rather than cut; ``exact``: the
    columns were asked for (``--columns``), so none is left out. See :func:`table_plan`.
    """
    text, dropped, _ = _render(df, width=width, bold_header=bold_header, keys=keys, exact=exact)
    return text, dropped


def _render(df: pl.DataFrame | Rows, *, width: int | None, bold_header: bool, keys: list[str] | None,
            exact: bool) -> tuple[str, list[str], str]:
    g = _grid(df)
    mode, order = _plan(g, width=width, keys=keys, exact=exact)
    if order != g.names:
        g = g.select(order)
    if mode == "records":
        return _records(g, width=width), [], mode
    lead = next((i for i, n in enumerate(order) if n not in set(keys or [])), len(order))
    text, dropped = _render_grid(g, width=width, bold_header=bold_header,
                                 wrap=set(keys or []) if width else set(), first=lead if width else 0)
    return text, dropped, mode


def _render_grid(g: _Grid, *, width: int | None, bold_header: bool, wrap: set[str],
                 first: int = 0) -> tuple[str, list[str]]:
    from rich.console import Console
    from rich.table import Table

    fixed, cells, numeric = g.fixed, g.cells, g.numeric
    widths = _layout(g.names, cells, fixed, width, first)
    shown = [i for i, w in enumerate(widths) if w is not None]
    table = Table(show_edge=False, box=None, pad_edge=False, header_style="bold" if bold_header else None)
    for i in shown:
        name = g.names[i]
        # a fixed column's width is its full width, so only text is ever cut (or wrapped, for a key column)
        folds = name in wrap and not fixed[i]
        table.add_column(name, justify="right" if name in numeric else "left", width=widths[i], no_wrap=not folds,
                         overflow="fold" if folds else "ellipsis")
    for r in range(g.height):
        table.add_row(*[cells[i][r] for i in shown])
    buf = io.StringIO()
    total = sum(w for w in widths if w is not None) + _COLUMN_GAP * max(len(shown) - 1, 0)
    Console(file=buf, width=max(total, 1), no_color=not bold_header, force_terminal=bold_header or None,
            highlight=False, emoji=False, markup=False).print(table)
    text = "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())
    return text, [n for n, w in zip(g.names, widths, strict=True) if w is None]


def render_records(df: pl.DataFrame | Rows, *, width: int | None = None) -> str:
    """One record per row (psql's expanded display): ``-[ row N ]`` and then a ``name  value`` line per column.
    Text wraps at ``width``; a number is never split (it moves to a line of its own when it does not fit beside
    its name)."""
    return _records(_grid(df), width=width)


def _records(g: _Grid, *, width: int | None) -> str:
    import textwrap

    from rich.cells import cell_len

    names, fixed, cells = g.names, g.fixed, g.cells
    name_w = min(max(map(cell_len, names), default=0), _NAME_MAX)
    if width is not None:
        name_w = min(name_w, max(width - _TEXT_MIN_WIDTH - _COLUMN_GAP, 8))
    room = None if width is None else max(width - name_w - _COLUMN_GAP, 8)
    lines: list[str] = []
    if not g.height:  # no rows: the columns there would be, one per line
        title = "-[ no rows ]"
        return "".join(line + "\n" for line in [title + "-" * max(0, min(width or 40, 40) - len(title)), *names])
    for r in range(g.height):
        title = f"-[ row {r + 1} ]"
        lines.append(title + "-" * max(0, min(width or 40, 40) - len(title)))
        for i, name in enumerate(names):
            v = cells[i][r]
            pad = " " * (name_w + _COLUMN_GAP)
            label = name if cell_len(name) <= name_w else None
            if room is None or cell_len(v) <= room:
                parts = [v]
            elif fixed[i]:
                parts = [v]
                label = None  # a number keeps its digits together: it goes below its name
            else:
                parts = textwrap.wrap(v, room, break_on_hyphens=False) or [""]
            if label is None:
                lines.append(name)
                lines += [(pad + p).rstrip() if room is not None and cell_len(p) <= room else "  " + p
                          for p in parts]
                continue
            lines.append((label + " " * (name_w - cell_len(label)) + " " * _COLUMN_GAP + parts[0]).rstrip())
            lines += [(pad + p).rstrip() for p in parts[1:]]
    return "".join(line + "\n" for line in lines)


def _terminal_width(stream: IO) -> int | None:
    """The width to fit: the terminal's when ``stream`` is one, else None (every column in full)."""
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return None
    from rich.console import Console

    return Console(file=stream).width


def text_width(stream: IO | None = None, cap: int = 100) -> int:
    """The width to wrap text for people (the summary): the terminal's when ``stream`` is one, at most ``cap``."""
    width = _terminal_width(stream or sys.stdout)
    return cap if width is None else max(min(width, cap), 20)


def _write_table(df: pl.DataFrame | Rows, stream: IO[str], stderr: IO | None = None, *,
                 keys: list[str] | None = None,
                 exact: bool = False, note: str | None = None) -> None:
    """On a terminal: fit its width and say which columns were left out. Elsewhere: every column in full."""
    import textwrap

    width = _terminal_width(stream)
    tty = hasattr(stream, "isatty") and stream.isatty()
    text, dropped, mode = _render(df, width=width, bold_header=tty, keys=keys, exact=exact)
    if note:  # the table's header: what its times mean
        stream.write("".join(f"# {line}\n" for line in textwrap.wrap(note, (width or 10**6) - 2)))
    stream.write(text)
    stream.flush()
    if mode == "records" and width is not None:
        message(f"one record per row: {'the columns asked for' if exact else 'the key columns'} do not fit the "
                f"terminal ({width} wide)", stderr=stderr)
    if dropped:
        message(f"{len(dropped)} column{'s' if len(dropped) != 1 else ''} not shown (the terminal is {width} "
                f"wide): {', '.join(dropped)}; choose with --columns, or use --format csv or -o FILE for every "
                "column", stderr=stderr)


def _write_markdown(df: pl.DataFrame | Rows, stream: IO[str]) -> None:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    if isinstance(df, Rows):
        numeric = {n for n, k in zip(df.columns, df.kinds, strict=True) if k in ("int", "float")}
        rows = df.iter_rows()
    else:
        numeric = {n for n, t in df.schema.items() if t.is_numeric()}
        rows = df.iter_rows()
    stream.write("| " + " | ".join(esc(c) for c in df.columns) + " |\n")
    stream.write("|" + "|".join("---:" if c in numeric else "---" for c in df.columns) + "|\n")
    for row in rows:
        stream.write("| " + " | ".join(esc(_cell_text(v, for_table=False)) for v in row) + " |\n")


def _json_rows(df: pl.DataFrame | Rows) -> list[dict[str, Any]]:
    if isinstance(df, Rows):
        return df.json_rows()
    df = _nan_to_null(df)
    rows = df.rows(named=True)
    for n in _exponent_prone(df):  # written as a number in positional form (orjson would write 5e-9)
        for row in rows:
            v = row[n]
            if v is not None and math.isfinite(v):
                row[n] = orjson.Fragment(plain_float(v).encode())
    return rows


def _csv_frame(df: pl.DataFrame) -> pl.DataFrame:
    import polars as pl

    flat = _nested_to_json(_nan_to_null(df))
    prone = _exponent_prone(flat)
    if not prone:
        return flat
    return flat.with_columns([pl.Series(n, [None if v is None else plain_float(v) for v in flat.get_column(n)
                                            .to_list()], dtype=pl.String) for n in prone])


def render(df: pl.DataFrame | Rows, fmt: str) -> bytes:
    """The bytes of ``df`` in a text format (everything but ``parquet``)."""
    if fmt == "json":
        return dumps(_json_rows(df)) + b"\n"
    if fmt == "jsonl":
        return b"".join(dumps(r) + b"\n" for r in _json_rows(df))
    if fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        if isinstance(df, Rows):
            return df.csv(sep).encode()
        return _csv_frame(df).write_csv(separator=sep, null_value="").encode()
    buf = io.StringIO()
    if fmt == "markdown":
        _write_markdown(df, buf)
    elif fmt == "table":
        _write_table(df, buf)
    else:
        raise UsageError(f"format {fmt!r} cannot be rendered as text", hint="use -o PATH")
    return buf.getvalue().encode()


def _binary(stream: IO) -> IO[bytes]:
    return getattr(stream, "buffer", stream)


def write_rows(df: pl.DataFrame | Rows, *, fmt: str | Format | None = None, out: str | Path | None = None,
               stdout: IO | None = None, stderr: IO | None = None, quiet: bool = False,
               keys: list[str] | None = None, exact: bool = False, note: str | None = None) -> str:
    """Write a result set: to ``out`` when given (format inferred from its extension), else to stdout.

    Returns the format used. A table on a terminal goes through rich; everything else is exact. ``keys``: the
    columns a narrow table shows first (a catalog object's key columns); ``exact``: the columns were chosen
    (``--columns``), never leave one out; ``note``: what the times mean (:func:`time_note`), the first lines of
    a table, else a line on stderr.
    """
    fmt = infer_format(fmt, out)
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    if note and fmt != "table" and not quiet:
        message(note, stderr=stderr)
    if out is not None and str(out) != "-":
        path = Path(out)
        if path.parent and not path.parent.exists():
            raise UsageError("the folder for -o does not exist", path=str(path.parent),
                             hint="create it first or choose another path")
        if fmt == "parquet":
            if isinstance(df, Rows):
                raise TypeError("parquet is written from a polars frame, not from Rows")
            _nested_safe_parquet(df, path)
        else:
            path.write_bytes(render(df, fmt) if fmt != "table" else _table_plain(df, note))
        if not quiet:
            message(f"wrote {df.height} row{'s' if df.height != 1 else ''} ({fmt}) to {path}", stderr=stderr)
        return fmt
    if fmt == "table":
        _write_table(df, stdout, stderr, keys=keys, exact=exact, note=note)
    else:
        data = render(df, fmt)
        try:
            _binary(stdout).write(data)
        except TypeError:  # a text-only stream (some test harnesses)
            stdout.write(data.decode())
        stdout.flush()
    return fmt


def _table_plain(df: pl.DataFrame | Rows, note: str | None = None) -> bytes:
    return ((f"# {note}\n" if note else "") + render_table(df)[0]).encode()


def _nested_safe_parquet(df: pl.DataFrame, path: Path) -> None:
    df.write_parquet(path)


def write_document(obj: Any, *, out: str | Path | None = None, stdout: IO | None = None) -> None:
    """Write one JSON document (``summary --json``, ``queries show --format json``) to stdout or a file."""
    data = dumps(obj, indent=True) + b"\n"
    if out is not None and str(out) != "-":
        Path(out).write_bytes(data)
        return
    stdout = stdout or sys.stdout
    try:
        _binary(stdout).write(data)
    except TypeError:
        stdout.write(data.decode())
    stdout.flush()


def message(text: str, *, stderr: IO | None = None, style: str | None = None) -> None:
    """A line for people, on stderr (never mixed with rows)."""
    stream = stderr or sys.stderr
    stream.write(text.rstrip("\n") + "\n")
    stream.flush()


def text(s: str, *, stdout: IO | None = None) -> None:
    """Plain text that is the command's product (e.g. the human summary, ``queries show``): stdout."""
    stream = stdout or sys.stdout
    stream.write(s if s.endswith("\n") else s + "\n")
    stream.flush()
