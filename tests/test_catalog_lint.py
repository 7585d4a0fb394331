"""Lint of the SQL catalog: docs on every public object and column, documented columns = real columns, units in
names, deterministic ORDER BY."""

from __future__ import annotations

import re

import pytest

from nsys2comm import catalog
from nsys2comm.output import is_timestamp_column

MINE = [o for o in catalog.load_catalog() if o.area != "prelude"]  # every analysis area, present and future
PUBLIC = [o for o in MINE if o.public]
UNIT_SUFFIXES = ("_ns", "_bytes", "_pct", "_gbps", "_us")
# words that name a time or a size: a column containing one must carry a unit suffix
UNIT_WORDS = re.compile(r"(^|_)(time|dur|duration|latency|wait|skew|span|size|bytes|bw|alpha|beta|start|end|idle|busy)"
                        r"(_|$)")
UNITLESS_OK = {"group_size", "group_size_assumed", "busbw_factor", "r2", "match_rule", "rank_wait_ns", "start_ns",
               "end_ns"}
REQUIRED = {"comm_kernels", "overlap_by_rank", "time_breakdown_by_rank", "overlap_by_step", "msg_size_histogram",
            "collective_bandwidth", "p2p_latency_by_size", "latency_model", "collective_skew", "rank_wait",
            "diagnostics"}



def test_required_objects_exist():
    assert {o.name for o in PUBLIC} >= REQUIRED
    assert all(o.is_table_macro for o in PUBLIC)


@pytest.mark.parametrize("obj", [o for o in catalog.load_catalog() if not o.public and o.kind != "table"],
                         ids=lambda o: o.name)
def test_private_objects_carry_their_folder(obj):
    """Internal helpers are named _<folder>_…, as Perfetto's stdlib does, so a name says where it is defined.
    Public names stay the documented interface (queries list shows each one's folder)."""
    assert obj.name.startswith(f"_{obj.area}_"), f"{obj.name} in queries/{obj.area}/ should be _{obj.area}_…"


@pytest.mark.parametrize("obj", MINE, ids=lambda o: o.name)
def test_documented(obj):
    assert obj.description.strip(), f"{obj.name}: no description"
    assert obj.columns or obj.kind == "macro" and not obj.is_table_macro, f"{obj.name}: no @column docs"
    for col, doc in obj.columns.items():
        assert doc.strip(), f"{obj.name}.{col}: empty @column doc"
    for p, doc in obj.params.items():
        assert doc.strip(), f"{obj.name}: empty @param {p}"


# a parameter that names a table of another macro's rows (documented so): the lint gives it an empty one
_TABLE_PARAM = re.compile(r"^Name of the table holding the file's (\w+) rows")


# a parameter that names one run's tables by their prefix (queries/diff: <prefix>_<object> for the objects of
# nsys2comm.compare.COLUMNS): the lint gives it empty ones, shaped as the diff registers them
_PREFIX_PARAM = re.compile(r"^Prefix of (a|the base|the new) run's tables")


def _lint_side(con) -> str:
    from nsys2comm.compare import COLUMNS

    for name, cols in COLUMNS.items():
        con.execute(f"CREATE OR REPLACE TEMP TABLE _lint_side_{name} AS SELECT {', '.join(cols)} FROM {name}() LIMIT 0")
    return "_lint_side"


def _lint_args(con, obj) -> str:
    """Arguments for a required-parameter macro: NULL (the importers' file id: the columns, not the rows, are
    checked), or the name of an empty table shaped like the macro rows the parameter's doc names."""
    args = []
    for p in obj.required_params:
        if _PREFIX_PARAM.match(obj.params[p]):
            args.append(f"'{_lint_side(con)}'")
            continue
        m = _TABLE_PARAM.match(obj.params[p])
        if m is None:
            args.append("NULL")
            continue
        source = catalog.find(m.group(1))
        con.execute(f"CREATE OR REPLACE TEMP TABLE _lint_{p} AS "
                    f"SELECT * FROM {source.name}({_lint_args(con, source)}) LIMIT 0")
        args.append(f"'_lint_{p}'")
    return ", ".join(args)


@pytest.mark.parametrize("obj", [o for o in MINE if o.is_table_macro or o.kind == "view"], ids=lambda o: o.name)
def test_columns_match_and_units(con, obj):
    if obj.area == "intervals":
        args = ", ".join("'_lint_in'" for _ in obj.params)
        con.execute("CREATE OR REPLACE TEMP TABLE _lint_in "
                    "(grp INTEGER, probe_id BIGINT, start_ns BIGINT, end_ns BIGINT)")
        sql = f"DESCRIBE SELECT * FROM {obj.name}({args})"
    else:
        sql = f"DESCRIBE SELECT * FROM {obj.name}" + ("" if obj.kind == "view" else f"({_lint_args(con, obj)})")
    described = con.execute(sql).fetchall()
    real = [r[0] for r in described]
    assert real == list(obj.columns), f"{obj.name}: documented {list(obj.columns)} != real {real}"
    if not obj.public:
        return
    for col, kind, *_ in described:  # the one time rule: a timestamp is an integer ns on the timeline
        if is_timestamp_column(col):
            assert kind in ("BIGINT", "INTEGER"), f"{obj.name}.{col}: a timestamp must be BIGINT ns"
        # integer sums stay BIGINT: DuckDB's sum of BIGINT is HUGEINT (or DECIMAL(38,0) over an expression)
        assert kind != "HUGEINT" and not re.fullmatch(r"DECIMAL\(\d+,0\)", kind), \
            f"{obj.name}.{col}: {kind}; cast an integer sum to BIGINT"
    for col in real:
        if col in UNITLESS_OK:
            continue
        if UNIT_WORDS.search(col):
            assert col.endswith(UNIT_SUFFIXES), f"{obj.name}.{col}: time/size column without unit suffix"
        if col.endswith("_us"):
            assert col.startswith("alpha_"), \
                f"{obj.name}.{col}: _us only where µs is the definition (alpha_us and its bounds)"


@pytest.mark.parametrize("obj", [o for o in PUBLIC if o.is_table_macro], ids=lambda o: o.name)
def test_order_by(obj):
    body = re.sub(r"--.*", "", obj.sql)
    last = [m.end() for m in re.finditer(r"\bORDER\s+BY\b", body, re.I)]
    assert last, f"{obj.name}: no ORDER BY"
    tail = body[last[-1]:]
    assert not re.search(r"\b(SELECT|FROM|WHERE|GROUP)\b", tail, re.I) and tail.count("(") == tail.count(")"), \
        f"{obj.name}: the final statement does not end with ORDER BY"


def test_no_range_joins():
    for obj in MINE:
        body = re.sub(r"--.*", "", obj.sql)
        range_join = r"\bJOIN\b[^;]*?\bON\b[^;]*?(start_ns|\.s)\s*<\s*\w+\.(end_ns|e)\b"
        assert not re.search(range_join, body, re.I | re.S), obj.name


# ------------------------------------------------------------------------------------------------------------------
# tier 1: key columns (-- @column name [key]: doc), the default set of a table on a narrow terminal (issue 41)

FIGURE_SUFFIXES = ("_ns", "_pct", "_gbps", "_us", "_tflops")  # the figures an object exists for


def _figure(col: str) -> bool:
    return col.endswith(FIGURE_SUFFIXES) and not is_timestamp_column(col)


@pytest.mark.parametrize("obj", [o for o in PUBLIC if o.columns], ids=lambda o: o.name)
def test_key_columns(obj):
    keys = obj.key_columns
    assert keys, f"{obj.name}: no @column marked [key] (the columns a narrow terminal shows first)"
    assert set(keys) <= set(obj.columns) and keys == [c for c in obj.columns if c in keys]
    stamps = [k for k in keys if is_timestamp_column(k)]
    assert not stamps, f"{obj.name}: epoch timestamps are never key columns: {stamps}"
    if not _figure(next(iter(obj.columns))):  # identifiers first, as the object's own columns are
        assert not _figure(keys[0]), f"{obj.name}: the first key column {keys[0]} should identify the row"
    if any(_figure(c) for c in obj.columns):  # then the figures the object exists for
        assert any(_figure(k) for k in keys), f"{obj.name}: no figure among the key columns {keys}"


def test_key_mark_is_parsed_and_kept_out_of_the_docs(tmp_path):
    f = tmp_path / "x.sql"
    f.write_text("-- @macro demo\n-- Demo.\n-- @column rank [key]: Rank.\n-- @column start_ns: Start (ns).\n"
                 "-- @column busbw_gbps  [key] : Bus bandwidth.\nCREATE MACRO demo() AS TABLE SELECT 1;\n")
    _, (obj,) = catalog.parse_file(f, "demo")
    assert obj.key_columns == ["rank", "busbw_gbps"]
    assert obj.columns == {"rank": "Rank.", "start_ns": "Start (ns).", "busbw_gbps": "Bus bandwidth."}
    f.write_text("-- @macro demo\n-- Demo.\n-- @param n [key]: N.\nCREATE MACRO demo(n) AS n;\n")
    with pytest.raises(ValueError, match="marks output columns"):
        catalog.parse_file(f, "demo")


def test_timestamp_rule_matches_the_docs():
    """The name decides what --timeunit/--relative shift (nsys2comm.output.is_timestamp_column); a column whose
    doc places it on the job timeline must be named so, and offsets and durations must not be."""
    for obj in catalog.load_catalog():
        for col, doc in obj.columns.items():
            if col.endswith("_ns") and re.search(r"\bon the job timeline\b", doc) and "offset" not in col:
                assert is_timestamp_column(col), f"{obj.name}.{col}: a timestamp by its doc, not by its name"
            if re.search(r"(offset|duration|skew|span|wait)_ns$", col):
                assert not is_timestamp_column(col), f"{obj.name}.{col}"
    assert is_timestamp_column("window_start_ns") and is_timestamp_column("first_ns")
    assert is_timestamp_column("event_ts_ns") and not is_timestamp_column("start_offset_ns")


# tier 1: a private unordered copy of a public object takes that object's column docs (-- @columns_of NAME)
def test_columns_of_takes_the_named_objects_docs():
    obj, public = catalog.find("_gemm_efficiency"), catalog.find("gemm_efficiency")
    assert obj is not None and public is not None and obj.columns_of == "gemm_efficiency"
    assert obj.columns == public.columns and obj.key_columns == public.key_columns


def test_columns_of_an_unknown_object_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.sql").write_text("-- @macro _a_x\n-- Rows.\n-- @columns_of nowhere\n"
                                          "CREATE OR REPLACE MACRO _a_x() AS TABLE SELECT 1 AS one;\n")
    with pytest.raises(ValueError, match="@columns_of nowhere: no such object"):
        catalog.load_catalog(tmp_path)
