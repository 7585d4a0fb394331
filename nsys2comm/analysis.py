"""Run the documented SQL analyses (queries/<area>/*.sql) from Python.

The shared sweeps behind several analyses (snapshots, stored cache) are nsys2comm.storage.sweeps's.
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
from typing import TYPE_CHECKING

import duckdb

from . import catalog
from .errors import HelperNotRunnable, UnknownQuery, UsageError
from .storage import settle

if TYPE_CHECKING:  # imported where rows are made (rows_frame)
    import polars as pl

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")



def _runnable(name: str) -> catalog.CatalogObject:
    """The catalog object ``run_query`` runs for ``name`` (a table macro before a view of the same name)."""
    objs = [o for o in catalog.load_catalog()
            if o.name == name and o.public and o.area != "prelude" and o.kind in ("view", "macro")]
    if not objs or not isinstance(name, str) or not _IDENT.match(name):
        names = sorted({o.name for o in catalog.public_queries()})
        raise UnknownQuery(str(name), difflib.get_close_matches(str(name), names, n=3, cutoff=0.6))
    obj = next((o for o in objs if o.is_table_macro), objs[0])
    if obj.kind == "macro" and not obj.is_table_macro:
        raise UnknownQuery(name, [])
    if obj.required_params:  # table-name arguments cannot travel as bound values
        raise HelperNotRunnable(name, obj.required_params)
    return obj


def check_query(name: str, params: dict | None = None) -> tuple[catalog.CatalogObject, dict]:
    """Validate a query name and its parameters before any work; returns the object and the checked values.

    Raises :class:`UsageError` (exit 2 in the CLI) for an unknown name, a helper, an unknown parameter or a value
    of the wrong kind, each naming what is wrong.
    """
    obj = _runnable(name)
    params = dict(params or {})
    if params and obj.kind == "view":
        raise UsageError(f"{name} takes no parameters", hint="filter its rows in SQL")
    unknown = sorted(set(params) - set(obj.params))
    if unknown:
        allowed = ", ".join(obj.params)
        raise UsageError(f"{name} has no parameter {', '.join(unknown)}",
                         hint=f"parameters: {allowed}" if allowed else "it takes no parameters")
    defaults = macro_defaults(obj)
    return obj, {k: _check_value(name, k, v, defaults.get(k), obj.params[k]) for k, v in params.items()}


def run_query(con, name: str, params: dict | None = None) -> pl.DataFrame:
    """Run a public analysis by name with named parameters; returns a polars DataFrame."""
    obj, params = check_query(name, params)
    if obj.kind == "view":
        return rows_frame(con.sql(f"SELECT * FROM {obj.name}"))
    # names are validated identifiers from the catalog; values travel as bound parameters
    args = ", ".join(f"{k} := ${k}" for k in params)
    try:
        return rows_frame(con.sql(f"SELECT * FROM {obj.name}({args})", params=params or None))
    except duckdb.ConversionException as e:  # a value DuckDB could not cast (e.g. a step number given as text)
        culprit = next((k for k, v in params.items() if isinstance(v, str) and repr(v) in str(e)), None)
        if culprit is None:
            raise
        raise UsageError(f"{name}: parameter {culprit} cannot be {params[culprit]!r}",
                         hint=f"{culprit}: {obj.params[culprit]}") from e


def rows_frame(rel) -> pl.DataFrame:
    """A catalog query's rows as a polars DataFrame, through the Arrow C stream (PyCapsule): DuckDB's ``.pl()``
    builds a pyarrow table first, and importing pyarrow cost 0.025 s of each fresh process's query (a CLI call).
    The frames are equal, schemas included, for every catalog query (tests/test_analyses.py). Not for arbitrary
    SQL: polars cannot take some DuckDB types from the stream (an INTERVAL panics), so ``Job.sql`` keeps ``.pl()``."""
    import polars as pl

    return pl.DataFrame(rel)


# ---------------------------------------------------------------------------------------------------------------
# parameter values: the kind of each parameter is that of its default in the macro's signature

_SIGNATURE_ARG = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*:=\s*('(?:[^']|'')*'|[^,()]+)")


def macro_defaults(obj: catalog.CatalogObject) -> dict[str, str]:
    """Parameter name -> default literal (SQL text) of a table macro's signature."""
    m = re.search(r"MACRO\s+" + re.escape(obj.name) + r"\s*\(([^)]*)\)", obj.sql, re.I)
    return {k: v.strip() for k, v in _SIGNATURE_ARG.findall(m.group(1))} if m else {}


_MAX_COUNT = 1 << 53


def _check_value(query: str, key: str, value, default: str | None, doc: str):
    """``value`` if it suits the parameter (converted where lossless), else a UsageError naming the parameter."""
    def bad(expected: str) -> UsageError:
        return UsageError(f"{query}: parameter {key} must be {expected}, not {_show(value)}",
                          hint=f"{key}: {doc}" if doc else None)

    default = default or "NULL"
    if re.fullmatch(r"\d+", default):  # an integer default: a count
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        # bounded so that the macro's arithmetic stays exact in DOUBLE and within BIGINT
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= _MAX_COUNT:
            raise bad(f"a whole number from 0 to {_MAX_COUNT}")
        return int(value)
    if re.fullmatch(r"\d*\.\d+", default):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise bad("a finite number")
        return float(value)
    if default.startswith("'"):
        choices = _quoted_choices(doc)
        if not isinstance(value, str) or (choices and value not in choices):
            raise bad(" or ".join(repr(c) for c in choices) if choices else "text")
    if isinstance(value, float) and not math.isfinite(value):
        raise bad("a finite number")
    return value


def _quoted_choices(doc: str) -> list[str]:
    """Values a text parameter's doc lists in quotes at its start (``'none' (exact) or 'hta' (...)``)."""
    first = re.split(r"[.;]\s", doc or "", maxsplit=1)[0]
    return re.findall(r"'([^']*)'", first) if first.lstrip().startswith("'") else []


def _show(value) -> str:
    return "null" if value is None else repr(value)


def job_start_ns(con) -> int | None:
    """The job's first timestamp: the earliest start in any canonical table with a ``start_ns`` column."""
    tables = [o.name for o in catalog.load_catalog() if o.kind == "table" and "start_ns" in o.columns]
    if not tables:
        return None
    union = " UNION ALL ".join(f"SELECT min(start_ns) AS t FROM {t}" for t in tables)
    return settle(con).execute(f"SELECT min(t) FROM ({union})").fetchall()[0][0]
