"""Nsight Systems SQLite importer: real exports, synthetic exports (2.9.1, 3.25.0), bad inputs, privacy."""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import nsys2comm.storage.db as db
from fixtures.nsys_writer import SECRET_ENV, _Db, comm_id, write_large_nsys, write_nsys
from fixtures.synthetic import make_run
from nsys2comm.errors import InputError
from nsys2comm.ingest import ingest

TOKEN = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
         "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "send_recv", "AllToAll": "all_to_all"}


def _nsys_files(traces: Path) -> list[Path]:
    return sorted((traces / "nsys").glob("*.sqlite"))


def _ingest_one(path, **kw):
    con = db.connect(None)
    res = ingest(con, [path], jobs=1, **kw)
    assert [r.status for r in res] == ["ingested"], res
    return con


def _batches(path: Path, **extra) -> dict:
    from nsys2comm.ingest import nsys
    from nsys2comm.ingest.base import ReadOptions

    out: dict = {}
    for b in nsys.read(path, ReadOptions(extra=extra)):
        out.setdefault(b.table, []).append(b.data)
    return {t: pa.concat_tables(parts, promote_options="default").to_pylist() for t, parts in out.items()}


@pytest.mark.parametrize("version", ["2.9.1", "3.25.0"])
def test_reading_by_rowid_ranges_in_decoder_processes_gives_the_same_rows(tmp_path, version):
    """The row tables read in two decoder processes, 7 rowids at a time (ranges ending mid-table, memset ids after
    memcpy's, NVTX ranges filtered inside a range), equal a read in one process, notes included; and a range reader
    keeps rows of processes that are not ranks out as the sequential reader does."""
    path = write_nsys(make_run(world_size=2, steps=2, seed=5), tmp_path / "r.sqlite", version)
    c = sqlite3.connect(path)  # rows the notes count: one negative kernel, one memcpy, one runtime call
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        c.execute(f'UPDATE {t} SET "end" = start - 1 WHERE rowid = (SELECT max(rowid) FROM {t}) - 3')
    c.commit()
    c.close()
    one = _batches(path, nsys_workers=0)
    assert one["ingest_notes"] and len(one["kernels"]) > 20 and one["mem_ops"] and one["cpu_ranges"]
    assert _batches(path, nsys_workers=2, nsys_range_rows=7) == one


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_real_exports_read_by_rowid_ranges_give_the_same_rows(shared_traces):
    """Every real export of ../shared (nsys 2022.2 to 2026.2), read by two decoder processes 101 rowids at a time
    (hundreds of ranges per file, most ending mid-table; the synthetic test above takes 7), gives the rows of a
    one-process read."""
    files = _nsys_files(shared_traces)
    assert files
    for path in files:
        assert _batches(path, nsys_workers=2, nsys_range_rows=101) == _batches(path, nsys_workers=0), path.name


def test_a_table_without_rowids_is_read_whole_by_a_decoder_process(tmp_path):
    """nsys writes rowid tables; a hand-made export may not (WITHOUT ROWID): that table is read in one piece."""
    path = write_nsys(make_run(world_size=2, steps=1), tmp_path / "w.sqlite", "3.25.0")
    c = sqlite3.connect(path)
    cols = [r[1] for r in c.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_RUNTIME)")]
    c.executescript(f"CREATE TABLE _t ({', '.join(cols)}, PRIMARY KEY (start, correlationId, globalTid)) WITHOUT ROWID;"
                    "INSERT INTO _t SELECT * FROM CUPTI_ACTIVITY_KIND_RUNTIME; DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME;"
                    "ALTER TABLE _t RENAME TO CUPTI_ACTIVITY_KIND_RUNTIME;")
    c.close()
    one = _batches(path, nsys_workers=0)
    assert one["api_calls"]
    assert _batches(path, nsys_workers=2, nsys_range_rows=7) == one


def test_a_bad_value_read_in_a_decoder_process_is_the_same_one_line_error(tmp_path):
    path = write_nsys(make_run(world_size=2, steps=1), tmp_path / "b.sqlite", "3.25.0")
    c = sqlite3.connect(path)
    c.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 'soon' WHERE rowid = 5")
    c.commit()
    c.close()
    errs = []
    for workers in (0, 2):
        with pytest.raises(InputError) as ei:
            _batches(path, nsys_workers=workers, nsys_range_rows=3)
        errs.append((str(ei.value), ei.value.path, ei.value.hint))
    assert errs[0] == errs[1] and errs[1][1] == str(path) and "not integers" in errs[1][0], errs


def _independent_counts(path: Path):
    """Kernels, communication kernels and their collectives, counted straight from SQLite: the innermost PyTorch
    'nccl:<op>' NVTX range (default domain, same thread) around the kernel's launch names the operation, else the
    kernel name's token does (brute force over every range)."""
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n_kernels = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    kern = c.execute("SELECT s.value, k.correlationId, k.globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                     "JOIN StringIds s ON s.id = k.shortName").fetchall()
    launches, ranges = {}, []
    tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master")}
    if "NVTX_EVENTS" in tables:
        ranges = c.execute("SELECT start, \"end\", globalTid, text FROM NVTX_EVENTS WHERE text LIKE 'nccl:%' "
                           "AND coalesce(domainId, 0) = 0 AND \"end\" IS NOT NULL").fetchall()
        for s_, e, gtid, corr in c.execute("SELECT start, \"end\", globalTid, correlationId FROM "
                                            "CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IS NOT NULL"):
            launches.setdefault((gtid >> 24 << 24, corr), (s_, e, gtid))
    c.close()
    colls = Counter()
    for short, corr, gpid in kern:
        if not re.match(r"(nccl|rccl)", short, re.I):
            continue
        got = None
        if (gpid, corr) in launches:
            ls, le, gtid = launches[(gpid, corr)]
            around = [r for r in ranges if r[2] == gtid and r[0] <= ls and r[1] >= le]
            if around:
                got = re.match(r"nccl:([a-z_]+)", max(around)[3]).group(1)
        if got is None:
            m = re.match(r"^(?:nccl|rccl)(?:Dev|Sym|Symk)?(?:Kernel_|DevKernel_)?(AllReduce|AllGather|ReduceScatter|"
                         r"Reduce|Broadcast|SendRecv|AllToAll)", short)
            got = TOKEN[m.group(1)] if m else "unknown"
        colls[got] += 1
    return n_kernels, sum(colls.values()), colls


def test_every_shared_nsys_export_ingests(shared_traces):
    files = _nsys_files(shared_traces)
    assert len(files) >= 4
    for path in files:
        con = _ingest_one(path)
        n_kernels, n_comm, colls = _independent_counts(path)
        assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == n_kernels, path.name
        assert con.execute("SELECT count(*) FROM kernels WHERE kernel_class = 'communication'").fetchone()[0] == n_comm
        got = Counter(dict(con.execute("SELECT collective, count(*) FROM comm_ops GROUP BY ALL").fetchall()))
        assert got == colls, path.name
        # every row belongs to a known rank; times are on the Unix epoch (2020..2030)
        assert con.execute("SELECT count(*) FROM kernels WHERE rank NOT IN (SELECT rank FROM ranks)").fetchone()[0] == 0
        lo, hi = con.execute("SELECT min(start_ns), max(end_ns) FROM kernels").fetchone()
        assert 1_577_836_800 * 10**9 < lo <= hi < 1_893_456_000 * 10**9
        assert con.execute("SELECT count(*) FROM kernels WHERE name LIKE '%(unsigned long)%'").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM devices").fetchone()[0] >= 1


def test_fastvideo_train_sendrecv_groups(shared_traces):
    path = next(p for p in _nsys_files(shared_traces) if p.name.startswith("fastvideo-torchrun"))
    con = _ingest_one(path)
    assert con.execute("SELECT list(rank ORDER BY rank), list(pid ORDER BY rank) FROM ranks").fetchone() == \
        ([0, 1], [144, 145])
    assert con.execute("SELECT rank, count(*) FROM comm_ops GROUP BY rank ORDER BY rank").fetchall() == \
        [(0, 33), (1, 33)]
    # every grouped send/recv kernel sits inside PyTorch's 'nccl:all_to_all' range: the user's operation wins;
    # the two kernels launched before the window keep their kernel name's collective
    assert con.execute("SELECT collective, collective_source, count(*) FROM comm_ops GROUP BY ALL ORDER BY ALL"
                       ).fetchall() == [("all_to_all", "pytorch_nvtx", 64), ("send_recv", "kernel_name", 2)]
    linked = con.execute("SELECT count(*) FROM comm_ops WHERE collective_source = 'pytorch_nvtx' AND n_ops = 4 "
                         "AND peer_rank IS NULL AND msg_bytes IS NULL AND element_count IS NULL").fetchone()[0]
    assert linked == 64
    assert con.execute("SELECT count(*) FROM comm_ops").fetchone()[0] == 66
    notes = dict(con.execute("SELECT code, count(*) FROM ingest_notes GROUP BY code").fetchall())
    assert notes == {"orphan_kernels": 2, "no_msg_sizes": 1}
    assert "--include-blobs=true" in con.execute(
        "SELECT message FROM ingest_notes WHERE code = 'no_msg_sizes'").fetchone()[0]
    assert con.execute("SELECT count(*) FROM cpu_ranges WHERE domain = 'NCCL'").fetchone()[0] == 462
    assert con.execute("SELECT name FROM kernels WHERE kernel_class = 'communication' LIMIT 1").fetchone()[0] == \
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    assert con.execute("SELECT count(*) FROM api_calls "
                       "WHERE name = 'cuLaunchKernelEx' AND api = 'driver'").fetchone()[0] == 402
    fr = con.execute("SELECT format_version, producer, clock_offset_ns FROM files").fetchone()
    assert fr == ("3.25.0", "2026.2.1.210", 1779782330176752435 - 28254349605)


def test_pipit_saxpy_old_schema_with_user_columns(shared_traces):
    path = next(p for p in _nsys_files(shared_traces) if p.name.startswith("pipit-saxpy"))
    con = _ingest_one(path)
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n_rt = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    n_mem = c.execute("SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY) + "
                      "(SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET)").fetchone()[0]
    c.close()
    assert con.execute("SELECT format_version FROM files").fetchone()[0] == "2.9.1"
    assert con.execute("SELECT rank, rank_source FROM ranks").fetchall() == [(0, "file_name")]
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 5
    assert con.execute("SELECT count(*) FROM api_calls").fetchone()[0] == n_rt
    assert con.execute("SELECT count(*) FROM mem_ops").fetchone()[0] == n_mem
    assert con.execute("SELECT count(*) FROM cpu_ranges WHERE domain = 'MPI' AND name = 'MPI_Send'").fetchone()[0] == 10
    assert con.execute("SELECT name, sm_count FROM devices").fetchall() == [("NVIDIA A100-SXM4-40GB", 108)]


@pytest.mark.parametrize("schema,era", [("3.25.0", "new"), ("2.9.1", "old")])
def test_synthetic_run(tmp_path, schema, era):
    run = make_run(world_size=4, steps=2, era=era)
    path = write_nsys(run, tmp_path / f"synth-{schema}.sqlite", schema)
    con = _ingest_one(path)
    assert con.execute("SELECT count(*) FROM ranks").fetchone()[0] == 4
    assert con.execute("SELECT DISTINCT rank_source FROM ranks").fetchone()[0] == \
        ("nccl_comm_init" if schema == "3.25.0" else "process_order")
    assert sorted(con.execute("SELECT rank, pid FROM ranks").fetchall()) == [(r.rank, r.pid) for r in run.ranks]
    want = sorted((k.rank, k.start_ns, k.end_ns, k.name) for k in run.all_kernels())
    assert sorted(con.execute("SELECT rank, start_ns, end_ns, name FROM kernels").fetchall()) == want
    assert con.execute("SELECT count(*) FROM mem_ops").fetchone()[0] == sum(len(r.memops) for r in run.ranks)
    assert con.execute("SELECT count(*) FROM cpu_ranges WHERE name = 'torchrun launch'").fetchone()[0] == 0
    rows = {(r, s): rest for r, s, *rest in con.execute(
        "SELECT k.rank, k.start_ns, c.collective, c.collective_source, c.n_ops, c.msg_bytes, c.peer_rank, "
        "c.group_size, c.pg_name, c.in_bytes, c.out_bytes FROM comm_ops c JOIN kernels k USING (kernel_id)").fetchall()}
    ops = [c for r in run.ranks for c in r.comm]
    assert len(rows) == len(ops)
    for c in ops:
        coll, src, n_ops, msg, peer, gsize, pg, in_b, out_b = rows[(c.kernel.rank, c.kernel.start_ns)]
        assert (coll, src, n_ops) == (c.collective, "nvtx", 1)
        if schema == "3.25.0":
            assert msg == c.msg_bytes, c
            assert peer == c.peer and gsize == c.group_size and pg == str(comm_id(c.pg_name))
            if c.peer is None:
                assert (in_b, out_b) == (c.in_bytes, c.out_bytes)
        else:
            assert msg is None and peer is None
    notes = {r[0] for r in con.execute("SELECT code FROM ingest_notes").fetchall()}
    assert notes == (set() if schema == "3.25.0" else {"no_msg_sizes"})
    if schema == "3.25.0":
        assert con.execute("SELECT count(*) FROM comm_ops "
                           "WHERE collective = 'all_reduce' AND dtype IS NULL").fetchone()[0] == 0
        assert con.execute("SELECT DISTINCT sm_count FROM devices").fetchall() == [(132,)]
    else:
        assert con.execute("SELECT DISTINCT name FROM devices").fetchall() == [("NVIDIA H100 80GB HBM3",)]


def test_large_generator_roundtrip(tmp_path):
    path = write_large_nsys(tmp_path / "large.sqlite", 20_000, 4)
    con = _ingest_one(path)
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 20_000
    assert con.execute("SELECT count(*), count(*) FILTER (WHERE collective_source = 'nvtx' AND msg_bytes = 1048576 "
                       "AND collective = 'all_reduce' AND group_size = 4) FROM comm_ops").fetchone() == (2000, 2000)
    assert con.execute("SELECT count(*) FROM api_calls").fetchone()[0] == 20_000


def _not_nsys(path: Path) -> Path:
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE t (a INTEGER)")
    c.execute("INSERT INTO t VALUES (1)")
    c.commit()
    c.close()
    return path


def _no_kernels(path: Path) -> Path:
    d = _Db(path, "3.25.0")
    d.insert("META_DATA_EXPORT", [{"name": "EXPORT_SCHEMA_VERSION", "value": "3.25.0"}])
    d.sid("main")
    d.finish()
    return path


def _truncated(path: Path, src: Path) -> Path:
    data = src.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])
    return path


def _counts(con):
    tabs = ["files", "ranks", "devices", "kernels", "mem_ops", "cpu_ranges", "api_calls", "comm_ops", "ingest_notes"]
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tabs}


@pytest.mark.parametrize("kind", ["not_nsys", "no_kernels", "truncated"])
def test_bad_inputs_leave_db_unchanged(tmp_path, kind):
    good = write_nsys(make_run(world_size=2, steps=1), tmp_path / "good.sqlite", "3.25.0")
    con = db.connect(tmp_path / "job.duckdb", write=True)
    ingest(con, [good], jobs=1)
    before = _counts(con)
    bad = {"not_nsys": lambda p: _not_nsys(p), "no_kernels": lambda p: _no_kernels(p),
           "truncated": lambda p: _truncated(p, good)}[kind](tmp_path / f"bad-{kind}.sqlite")
    with pytest.raises(InputError) as ei:
        ingest(con, [bad], jobs=1)
    msg = str(ei.value)
    assert str(bad) in msg and "\n" not in msg
    if kind == "no_kernels":
        assert "nsys profile --trace=cuda,nvtx" in msg
    if kind == "not_nsys":
        assert "not an Nsight Systems export" in msg
    assert _counts(con) == before


def test_truncated_to_page_boundary(tmp_path):
    """A cut exactly on a page boundary still fails cleanly (header page count)."""
    good = write_nsys(make_run(world_size=2, steps=1), tmp_path / "good.sqlite", "3.25.0")
    data = good.read_bytes()
    bad = tmp_path / "cut.sqlite"
    bad.write_bytes(data[: 4096 * 3])
    con = db.connect(None)
    with pytest.raises(InputError, match="cut.sqlite"):
        ingest(con, [bad], jobs=1)
    assert _counts(con)["kernels"] == 0


def test_no_secrets_reach_the_database(tmp_path):
    path = write_nsys(make_run(world_size=2, steps=1), tmp_path / "secret.sqlite", "3.25.0", plant_secret=True)
    raw = path.read_bytes()
    assert raw.count(b"hf_secret123") >= 3  # planted in META_DATA_CAPTURE, TARGET_INFO_SYSTEM_ENV, StringIds
    con = db.connect(None)
    ingest(con, [path], jobs=1)
    hits = []
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall():
        cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
        expr = " OR ".join(f"CAST(\"{c}\" AS VARCHAR) ILIKE '%secret123%'" for c in cols)
        n = con.execute(f"SELECT count(*) FROM {table} WHERE {expr}").fetchone()[0]
        if n:
            hits.append((table, n))
    assert hits == []
    assert SECRET_ENV.split("=")[0] not in str(con.execute("SELECT * FROM files").fetchall())


def test_copy_of_shared_file_with_rank_option(shared_traces, tmp_path):
    src = next(p for p in _nsys_files(shared_traces) if p.name.startswith("fastvideo-torchrun"))
    dst = tmp_path / "copy.sqlite"
    shutil.copy(src, dst)
    con = db.connect(None)
    res = ingest(con, [dst], rank=4, jobs=1)
    assert res[0].ranks == [4, 5]
    assert con.execute("SELECT DISTINCT rank_source FROM ranks").fetchall() == [("cli",)]
