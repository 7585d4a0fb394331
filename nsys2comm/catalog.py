"""The SQL catalog: documented objects parsed from the .sql files under ``queries/``.

Each public object is introduced by a header comment block::

    -- @view|@table|@macro NAME
    -- Description, one or more lines.
    -- @param key: what it does (macros)
    -- @column col: what it holds, with the unit in its name
    -- @column other [key]: a key column (see below)
    CREATE ... NAME ...;

A helper view that several analyses share and that is worth computing once carries ``-- @sweep per_rank`` or
``-- @sweep cross_rank`` (optionally `` order=col,col``: the order its rows are stored in) among its header lines
(:attr:`CatalogObject.sweep`): ``nsys2comm.storage.sweeps`` stores it at ingest and snapshots it, and
``per_rank`` (its rows for a rank read that rank's rows only) lets ``nsys2comm.storage.dask_stage`` compute it in one
task per rank.

A private table macro that returns a public object's rows in another order (or unordered, for the queries that
aggregate them) says so with ``-- @columns_of NAME`` instead of repeating NAME's ``@column`` lines.

A ``[key]`` mark after a column name puts the column in the object's default set for narrow terminals
(:attr:`CatalogObject.key_columns`): the identifiers of a row first, then the figures the object exists for; never
an epoch timestamp (``tests/test_catalog_lint.py``). A table on a terminal too narrow for every column shows the key
columns first (``nsys2comm.output``).

Everything up to the next header belongs to that object. The same text is loaded into DuckDB as
``COMMENT ON`` so that plain ``duckdb run.duckdb`` users see it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

_HEADER = re.compile(r"^--\s*@(table|view|macro)\s+([A-Za-z_][A-Za-z0-9_]*)\s*$")
_SWEEP = re.compile(r"^--\s*@sweep\s+(per_rank|cross_rank)(?:\s+order=([A-Za-z0-9_,]+))?\s*$")
_COLUMNS_OF = re.compile(r"^--\s*@columns_of\s+([A-Za-z_][A-Za-z0-9_]*)\s*$")
_TAG = re.compile(r"^--\s*@(param|column)\s+([A-Za-z_][A-Za-z0-9_]*)\s*(\[key\])?\s*:\s*(.*)$")


@dataclass
class CatalogObject:
    kind: str  # 'table' | 'view' | 'macro'
    name: str
    area: str  # folder under queries/ ('prelude', 'overlap', ...)
    path: Path
    description: str
    params: dict[str, str] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict)
    sql: str = ""
    key_columns: list[str] = field(default_factory=list)  # the @column lines marked [key], in column order
    sweep: str | None = None  # '-- @sweep per_rank|cross_rank': a shared helper view that cache stores/snapshots
    sweep_order: tuple[str, ...] = ()  # its '-- @sweep ... order=a,b' columns: the order its rows are stored in
    columns_of: str | None = None  # '-- @columns_of NAME': its columns are NAME's, documented there

    @property
    def public(self) -> bool:
        return not self.name.startswith("_")

    @property
    def required_params(self) -> list[str]:
        """Macro parameters without a default (``name`` rather than ``name := value``)."""
        m = re.search(r"MACRO\s+" + re.escape(self.name) + r"\s*\(([^)]*)\)", self.sql, re.I)
        if not m:
            return []
        return [a.strip() for a in m.group(1).split(",") if a.strip() and ":=" not in a]

    @property
    def is_table_macro(self) -> bool:
        return self.kind == "macro" and bool(re.search(r"\bAS\s+TABLE\b", self.sql, re.I))

    @property
    def has_view(self) -> bool:
        """A public analysis macro that needs no argument is also a view under its own name, so SQL users can
        write ``FROM overlap_by_rank`` (and see it in SHOW TABLES); ``overlap_by_rank(compat := 'hta')`` still
        calls the macro."""
        return self.public and self.is_table_macro and not self.required_params and self.area != "prelude"

    def view_sql(self, temp: bool = False) -> str:
        return f"CREATE OR REPLACE {'TEMP ' if temp else ''}VIEW {self.name} AS SELECT * FROM {self.name}()"


def queries_dir() -> Path:
    """The queries/ folder: packaged copy when installed from a wheel, else the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_queries", here.parent / "queries"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("nsys2comm: the queries/ folder is missing from this installation")


_INCLUDE = re.compile(r"^--\s*@include\s+(\S+)\s*$")


def includes(path: Path) -> list[str]:
    """Files this one needs first, as it declares them (``-- @include area/file.sql`` lines, before its objects):
    DuckDB binds a view or macro body when it is created, so what it reads must exist already."""
    out = []
    for line in path.read_text().splitlines():
        m = _INCLUDE.match(line.strip())
        if m:
            out.append(m.group(1))
        elif _HEADER.match(line.strip()):
            break
    return out


def _sql_files(root: Path) -> list[Path]:
    """Load order: the prelude (schema, classification rules) first, then every file after what it includes;
    files that depend on nothing between them load in name order."""
    files = sorted(root.glob("*/*.sql"), key=lambda p: (p.parent.name != "prelude", p.parent.name, p.name))
    by_name = {f"{p.parent.name}/{p.name}": p for p in files}
    order: list[Path] = []
    state: dict[Path, str] = {}

    def visit(p: Path, chain: tuple[str, ...]) -> None:
        if state.get(p) == "done":
            return
        if state.get(p) == "visiting":
            raise ValueError(f"{p}: circular @include ({' -> '.join(chain)})")
        state[p] = "visiting"
        for dep in includes(p):
            if dep not in by_name:
                raise FileNotFoundError(f"{p}: @include {dep}: no such file under {root}")
            visit(by_name[dep], chain + (dep,))
        state[p] = "done"
        order.append(p)

    for p in files:
        visit(p, (f"{p.parent.name}/{p.name}",))
    return order


def _object_tag(path: Path, obj: CatalogObject, line: str) -> bool:
    """Read a ``-- @sweep`` or ``-- @columns_of`` header line into ``obj``; False for any other line."""
    if c := _COLUMNS_OF.match(line):
        obj.columns_of = c.group(1)
        return True
    if not re.match(r"^--\s*@sweep\b", line):
        return False
    sw = _SWEEP.match(line)
    if sw is None or obj.kind != "view" or obj.sweep is not None:
        raise ValueError(f"{path}: {obj.name}: one '-- @sweep per_rank|cross_rank [order=a,b]' line, on a view "
                         f"only: {line!r}")
    obj.sweep = sw.group(1)
    obj.sweep_order = tuple(sw.group(2).split(",")) if sw.group(2) else ()
    return True


def _finished(obj: CatalogObject, body: list[str]) -> CatalogObject:
    obj.sql = "\n".join(body).strip()
    obj.description = re.sub(r"\n{3,}", "\n\n", obj.description).strip()
    return obj


def parse_file(path: Path, area: str) -> tuple[str, list[CatalogObject]]:
    """Split one .sql file into its preamble and its documented objects."""
    preamble: list[str] = []
    objects: list[CatalogObject] = []
    current: CatalogObject | None = None
    in_doc = False
    body: list[str] = []
    for line in path.read_text().splitlines():
        m = _HEADER.match(line.strip())
        if m:
            if current:
                objects.append(_finished(current, body))
            current = CatalogObject(kind=m.group(1), name=m.group(2), area=area, path=path, description="")
            body, in_doc = [], True
            continue
        if current is None:
            preamble.append(line)
            continue
        stripped = line.strip()
        if in_doc and stripped.startswith("--"):
            if _object_tag(path, current, stripped):
                continue
            t = _TAG.match(stripped)
            if t:
                target = current.params if t.group(1) == "param" else current.columns
                target[t.group(2)] = t.group(4).strip()
                if t.group(3):
                    if t.group(1) == "param":
                        raise ValueError(f"{path}: {current.name}: [key] marks output columns, not @param "
                                         f"{t.group(2)}")
                    current.key_columns.append(t.group(2))
                last = target, t.group(2)
            else:
                text = stripped[2:].strip()
                if current.params or current.columns:
                    # continuation of the previous @param/@column
                    tgt, key = last
                    tgt[key] = (tgt[key] + " " + text).strip()
                else:
                    current.description = ((current.description + "\n" + text).strip() if text
                                           else current.description + "\n")
            continue
        in_doc = False
        body.append(line)
    if current:
        objects.append(_finished(current, body))
    return "\n".join(preamble), objects


@cache
def load_catalog(root: Path | None = None) -> tuple[CatalogObject, ...]:
    root = root or queries_dir()
    out: list[CatalogObject] = []
    for path in _sql_files(root):
        _, objs = parse_file(path, path.parent.name)
        out.extend(objs)
    by_name = {o.name: o for o in out}
    for o in out:
        if o.columns_of:
            if o.columns_of not in by_name:
                raise ValueError(f"{o.path}: {o.name}: @columns_of {o.columns_of}: no such object")
            o.columns, o.key_columns = dict(by_name[o.columns_of].columns), list(by_name[o.columns_of].key_columns)
    return tuple(out)


def public_queries() -> list[CatalogObject]:
    """Analysis objects users run with ``nsys2comm query`` (everything outside prelude)."""
    return [o for o in load_catalog() if o.public and o.area != "prelude"]


def find(name: str) -> CatalogObject | None:
    return next((o for o in load_catalog() if o.name == name), None)


def sweeps() -> tuple[CatalogObject, ...]:
    """The helper views tagged ``-- @sweep``, in catalog order (a sweep comes after those it reads)."""
    return tuple(o for o in load_catalog() if o.sweep is not None)


def sql_string(s: str) -> str:
    """``s`` as an SQL string literal, for the statements that take no parameters (COMMENT ON, ATTACH)."""
    return "'" + s.replace("'", "''") + "'"


# Where a writer records which catalog it installed (``install``), so later sessions can skip installing it again.
INSTALLED_TABLE = "_catalog_installed"

# Definitions of the database's own (persistent) macros and views as DuckDB reports them: recorded at install, and
# compared at open, so a definition changed by hand after the install is noticed.
_DEFINITIONS_SQL = """
SELECT md5(coalesce(string_agg(k, chr(10) ORDER BY k), '')) FROM (
    SELECT 'f:' || function_name || ':' || function_type || ':' || coalesce(macro_definition, '') || ':'
           || coalesce(array_to_string(parameters, ','), '') AS k
    FROM duckdb_functions()
    WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal
    UNION ALL
    SELECT 'v:' || view_name || ':' || sql
    FROM duckdb_views()
    WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal)
"""


def _object_statements(obj: CatalogObject, temp: bool) -> list[str]:
    if temp:  # macros and views only (tables are the data), docs on the views only
        if obj.kind == "table":
            return []
        out = [obj.sql.replace("CREATE OR REPLACE MACRO", "CREATE OR REPLACE TEMP MACRO", 1)
                      .replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1)]
        return out + ([obj.view_sql(temp=True)] + _view_comments(obj) if obj.has_view else [])
    out = [obj.sql]
    if obj.kind in ("table", "view"):
        out.append(f"COMMENT ON {obj.kind.upper()} {obj.name} IS {sql_string(obj.description)}")
        out += [f"COMMENT ON COLUMN {obj.name}.{col} IS {sql_string(doc)}" for col, doc in obj.columns.items()]
    else:
        what = "MACRO TABLE" if obj.is_table_macro else "MACRO"
        out.append(f"COMMENT ON {what} {obj.name} IS {sql_string(obj.description)}")
    return out + ([obj.view_sql()] + _view_comments(obj) if obj.has_view else [])


def _view_comments(obj: CatalogObject) -> list[str]:
    return ([f"COMMENT ON VIEW {obj.name} IS {sql_string(obj.description)}"]
            + [f"COMMENT ON COLUMN {obj.name}.{col} IS {sql_string(doc)}" for col, doc in obj.columns.items()])


@cache
def _script(temp: bool, tables_only: bool = False) -> str:
    objs = [o for o in load_catalog() if o.kind == "table" or not tables_only]
    return ";\n".join(s for obj in objs for s in _object_statements(obj, temp)) + ";"


@cache
def digest() -> str:
    """Fingerprint of this package's catalog: the SQL files (names and bytes) and this module, which turns them
    into the statements ``install`` runs. Hashing the files takes ~2 ms; building the script to hash it took
    ~30 ms, paid by every process that opens a job."""
    import hashlib

    h = hashlib.sha256(Path(__file__).read_bytes())
    root = queries_dir()
    for path in sorted(root.glob("*/*.sql")):
        h.update(f"\0{path.parent.name}/{path.name}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def install(con, *, temp: bool = False, tables_only: bool = False) -> None:
    """Create (or replace) every catalog object in a DuckDB connection, in one script (about 1 s: DuckDB binds
    each macro and view as it is created).

    Persistent (``temp=False``): tables, macros and views with COMMENT ON docs, and a record of what was installed
    (``INSTALLED_TABLE``). ``temp=True``: macros and views as TEMP objects, for read-only databases and in-memory
    sessions over Parquet; they shadow any persistent ones of the same names. ``tables_only``: the canonical
    tables alone (no record: a later ``install`` completes it).
    """
    con.execute(_script(temp, tables_only))
    if not temp and not tables_only:
        con.execute(f"CREATE OR REPLACE TABLE {INSTALLED_TABLE} AS "
                    "SELECT ?::VARCHAR AS catalog_digest, (" + _DEFINITIONS_SQL + ") AS definitions_md5", [digest()])


def is_installed(con) -> bool:
    """True when the database holds this package's catalog, unchanged since ``install`` wrote it: then a session
    can use the stored objects as they are (opening costs ~40 ms instead of ~1 s)."""
    exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
                         "AND schema_name = 'main' AND table_name = ?", [INSTALLED_TABLE]).fetchall()[0][0]
    if not exists:
        return False
    rows = con.execute(f"SELECT catalog_digest, definitions_md5 FROM main.{INSTALLED_TABLE}").fetchall()
    if len(rows) != 1 or rows[0][0] != digest():
        return False
    return rows[0][1] == con.execute(_DEFINITIONS_SQL).fetchall()[0][0]


def comment_view(con, obj: CatalogObject) -> None:
    con.execute(";\n".join(_view_comments(obj)))
