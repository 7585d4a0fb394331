"""The one output layer: every row set and JSON document the CLI prints goes through here.

Design decisions (sqlite-utils / hf / harlequin habits):

* Rows go to stdout (or to ``-o PATH``); messages, progress and warnings go to stderr, so
  ``nsys2comm query run.duckdb overlap_by_rank --format csv > x.csv`` gives a clean file.
* ``--format`` is one of :data:`FORMATS`; with ``-o PATH`` and no ``--format`` the format comes from the file
  extension (:func:`infer_format`). ``parquet`` is binary and needs ``-o``.
* Values are not converted: times stay integer nanoseconds, sizes integer bytes. Float NaN becomes ``null``
  (JSON) or an empty field (CSV/TSV). Nested values (lists, structs) are written as JSON text in CSV/TSV/markdown.
* Only ``table`` is for eyes: it rounds floats for display and sizes itself to the terminal. Every other format is
  exact and complete.
"""

from __future__ import annotations

import io
import math
import sys
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import IO, Any

import orjson
import polars as pl

from .errors import UsageError


class Format(str, Enum):
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
    floats = [n for n, t in df.schema.items() if t in (pl.Float32, pl.Float64)]
    if not floats:
        return df
    return df.with_columns([pl.col(n).fill_nan(None) for n in floats])


def _nested_to_json(df: pl.DataFrame) -> pl.DataFrame:
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
    return str(v)


# ----------------------------------------------------------------------------------------------------------------
# writers


def _write_table(df: pl.DataFrame, stream: IO[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    tty = hasattr(stream, "isatty") and stream.isatty()
    # Off a terminal the table must not wrap at 80 columns: give it the room it needs.
    console = Console(file=stream, highlight=False, emoji=False, markup=False)
    table = Table(show_edge=False, box=None, pad_edge=False, header_style="bold" if tty else None)
    numeric = {n for n, t in df.schema.items() if t.is_numeric()}
    for name in df.columns:
        table.add_column(name, justify="right" if name in numeric else "left", overflow="fold")
    for row in df.iter_rows():
        table.add_row(*[_cell_text(v, for_table=True) for v in row])
    if tty:
        console.print(table)
        return
    buf = io.StringIO()
    Console(file=buf, width=100_000, no_color=True, highlight=False, emoji=False, markup=False).print(table)
    stream.write("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()))


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
        _write_table(df, stdout)
    else:
        data = render(df, fmt)
        try:
            _binary(stdout).write(data)
        except TypeError:  # a text-only stream (some test harnesses)
            stdout.write(data.decode())
        stdout.flush()
    return fmt


def _table_plain(df: pl.DataFrame) -> bytes:
    buf = io.StringIO()
    _write_table(df, buf)
    return buf.getvalue().encode()


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
