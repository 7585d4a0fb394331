"""The one output layer: every row set and JSON document the CLI prints goes through here.

Design decisions (sqlite-utils / hf / harlequin habits):

* Rows go to stdout (or to ``-o PATH``); messages, progress and warnings go to stderr, so
  ``nsys2comm query run.duckdb overlap_by_rank --format csv > x.csv`` gives a clean file.
* ``--format`` is one of :data:`FORMATS`; with ``-o PATH`` and no ``--format`` the format comes from the file
  extension (:func:`infer_format`). ``parquet`` is binary and needs ``-o``.
* Values are not converted unless asked: times stay integer nanoseconds, sizes integer bytes. ``--timeunit``
  and ``--relative`` (:func:`convert_times`) rescale the ``*_ns`` columns and rename them to the new unit. Float
  NaN becomes ``null`` (JSON) or an empty field (CSV/TSV). Nested values (lists, structs) are written as JSON text
  in CSV/TSV/markdown.
* Only ``table`` is for eyes: it rounds floats for display and, on a terminal, fits its width the way the duckdb
  CLI does: numbers are never cut, long text is truncated with "…", and columns that do not fit are left out with
  a note on stderr. Every other format is exact and complete.
"""

from __future__ import annotations

import io
import math
import re
import sys
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from .errors import UsageError
from .units import NS_PER_UNIT

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


# epoch timestamps (start_ns, window_start_ns, first_ns, span_end_ns ...), as opposed to durations (span_ns)
_TIMESTAMP = re.compile(r"(^|_)(start|end|first|last)_ns$")


def is_timestamp_column(name: str) -> bool:
    """True for a column named as a point on the job timeline, e.g. ``start_ns`` or ``span_end_ns``."""
    return bool(_TIMESTAMP.search(name))


def convert_times(df: pl.DataFrame, unit: str | TimeUnit = "ns", *, relative: bool = False,
                  origin_ns: int | None = None) -> pl.DataFrame:
    """Numeric ``*_ns`` columns in ``unit``, renamed ``*_us``/``*_ms``/``*_s``; unchanged for ``ns``.

    With ``relative``, timestamp columns (:func:`is_timestamp_column`) count from ``origin_ns`` (the job start),
    or from the earliest timestamp in ``df`` when no origin is given. Durations are never shifted. A column whose
    new name is already taken keeps its ns.
    """
    import polars as pl

    unit = unit.value if isinstance(unit, TimeUnit) else str(unit)
    if unit not in NS_PER_UNIT:
        raise UsageError(f"unknown time unit {unit!r}", hint="choose one of " + ", ".join(NS_PER_UNIT))
    ns_cols = [n for n, t in df.schema.items() if n.endswith("_ns") and t.is_numeric()]
    stamps = [n for n in ns_cols if is_timestamp_column(n)]
    if relative and stamps and origin_ns is None:
        origin_ns = df.select(pl.min_horizontal([pl.col(n).min() for n in stamps])).item()
    exprs = []
    for name in ns_cols:
        new_name = name[:-3] + "_" + unit
        if new_name != name and new_name in df.columns:
            continue
        col = pl.col(name)
        if relative and name in stamps and origin_ns is not None:
            col = col - origin_ns
        if unit != "ns":  # polars divides by multiplying with the reciprocal: round away its last-bit noise
            col = (col.cast(pl.Float64) / NS_PER_UNIT[unit]).round(len(str(NS_PER_UNIT[unit])) - 1)
        exprs.append(col.alias(name))
    renames = {n: n[:-3] + "_" + unit for n in ns_cols if n[:-3] + "_" + unit not in df.columns}
    return df.with_columns(exprs).rename(renames) if exprs else df


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
        cols[n] = pl.Series(n, [None if v is None else dumps(v).decode() for v in df.get_column(n).to_list()],
                            dtype=pl.String)
    return df.with_columns([cols[n] for n in nested])


def _cell_text(v: Any, *, for_table: bool) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if for_table:
            if v == 0 or 1e-3 <= abs(v) < 1e15:
                s = f"{v:.3f}".rstrip("0").rstrip(".")
                return s if s not in ("", "-0") else "0"
            return f"{v:.4g}"
        return repr(v)
    if isinstance(v, (list, dict, tuple)):
        return dumps(v).decode()
    if isinstance(v, (datetime, date, time)):
        return v.isoformat()
    return str(v).replace("\n", " ") if for_table else str(v)


# ----------------------------------------------------------------------------------------------------------------
# writers


_TEXT_MIN_WIDTH = 20  # a truncated text column keeps at least this many cells (or its header's width)
_COLUMN_GAP = 2  # rich puts one cell of padding on each side of a column boundary


def _layout(names: list[str], cells: list[list[str]], fixed: list[bool], width: int | None) -> list[int | None]:
    """Width of each column, or None for a column left out; ``width=None`` means unlimited.

    Fixed columns (numbers, dates) get their full width; text columns shrink to a floor. Columns are kept from the
    left while their floors fit; the room left over is shared fairly among the text columns that want more.
    """
    from rich.cells import cell_len

    natural = [max([cell_len(n), *map(cell_len, col)]) for n, col in zip(names, cells, strict=True)]
    if width is None:
        return list(natural)
    floor = [n if f else min(n, max(_TEXT_MIN_WIDTH, cell_len(h)))
             for n, f, h in zip(natural, fixed, names, strict=True)]
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


def render_table(df: pl.DataFrame, *, width: int | None = None, bold_header: bool = False) -> tuple[str, list[str]]:
    """The table as text no wider than ``width`` (None: as wide as it needs), and the names of left-out columns."""
    import polars as pl
    from rich.console import Console
    from rich.table import Table

    fixed = [not (t == pl.String or t == pl.Categorical or t.is_nested() or t == pl.Object)
             for t in df.schema.values()]
    cells = [[_cell_text(v, for_table=True) for v in df.get_column(n).to_list()] for n in df.columns]
    widths = _layout(df.columns, cells, fixed, width)
    shown = [i for i, w in enumerate(widths) if w is not None]
    numeric = {n for n, t in df.schema.items() if t.is_numeric()}
    table = Table(show_edge=False, box=None, pad_edge=False, header_style="bold" if bold_header else None)
    for i in shown:
        name = df.columns[i]
        # a fixed column's width is its full width, so only text is ever cut; "…" would show any slip
        table.add_column(name, justify="right" if name in numeric else "left", width=widths[i], no_wrap=True,
                         overflow="ellipsis")
    for r in range(df.height):
        table.add_row(*[cells[i][r] for i in shown])
    buf = io.StringIO()
    total = sum(w for w in widths if w is not None) + _COLUMN_GAP * max(len(shown) - 1, 0)
    Console(file=buf, width=max(total, 1), no_color=not bold_header, force_terminal=bold_header or None,
            highlight=False, emoji=False, markup=False).print(table)
    text = "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())
    return text, [n for n, w in zip(df.columns, widths, strict=True) if w is None]


def _write_table(df: pl.DataFrame, stream: IO[str], stderr: IO | None = None) -> None:
    """On a terminal: fit its width and say which columns were left out. Elsewhere: every column in full."""
    tty = hasattr(stream, "isatty") and stream.isatty()
    width = None
    if tty:
        from rich.console import Console

        width = Console(file=stream).width
    text, dropped = render_table(df, width=width, bold_header=tty)
    stream.write(text)
    stream.flush()
    if dropped:
        message(f"{len(dropped)} column{'s' if len(dropped) != 1 else ''} not shown (the terminal is {width} "
                f"wide): {', '.join(dropped)}; use --format csv or -o FILE for every column", stderr=stderr)


def _write_markdown(df: pl.DataFrame, stream: IO[str]) -> None:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    numeric = {n for n, t in df.schema.items() if t.is_numeric()}
    stream.write("| " + " | ".join(esc(c) for c in df.columns) + " |\n")
    stream.write("|" + "|".join("---:" if c in numeric else "---" for c in df.columns) + "|\n")
    for row in df.iter_rows():
        stream.write("| " + " | ".join(esc(_cell_text(v, for_table=False)) for v in row) + " |\n")


def _json_rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    return _nan_to_null(df).rows(named=True)


def render(df: pl.DataFrame, fmt: str) -> bytes:
    """The bytes of ``df`` in a text format (everything but ``parquet``)."""
    if fmt == "json":
        return dumps(_json_rows(df)) + b"\n"
    if fmt == "jsonl":
        return b"".join(dumps(r) + b"\n" for r in _json_rows(df))
    if fmt in ("csv", "tsv"):
        flat = _nested_to_json(_nan_to_null(df))
        return flat.write_csv(separator="," if fmt == "csv" else "\t", null_value="").encode()
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


def write_rows(df: pl.DataFrame, *, fmt: str | Format | None = None, out: str | Path | None = None,
               stdout: IO | None = None, stderr: IO | None = None, quiet: bool = False) -> str:
    """Write a result set: to ``out`` when given (format inferred from its extension), else to stdout.

    Returns the format used. A table on a terminal goes through rich; everything else is exact.
    """
    fmt = infer_format(fmt, out)
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    if out is not None and str(out) != "-":
        path = Path(out)
        if path.parent and not path.parent.exists():
            raise UsageError("the folder for -o does not exist", path=str(path.parent),
                             hint="create it first or choose another path")
        if fmt == "parquet":
            _nested_safe_parquet(df, path)
        else:
            path.write_bytes(render(df, fmt) if fmt != "table" else _table_plain(df))
        if not quiet:
            message(f"wrote {df.height} row{'s' if df.height != 1 else ''} ({fmt}) to {path}", stderr=stderr)
        return fmt
    if fmt == "table":
        _write_table(df, stdout, stderr)
    else:
        data = render(df, fmt)
        try:
            _binary(stdout).write(data)
        except TypeError:  # a text-only stream (some test harnesses)
            stdout.write(data.decode())
        stdout.flush()
    return fmt


def _table_plain(df: pl.DataFrame) -> bytes:
    return render_table(df)[0].encode()


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
