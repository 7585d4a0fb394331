"""Build a job database's canonical tables directly from fixtures.synthetic.make_run() (no importer needed)."""

from __future__ import annotations

from pathlib import Path

import duckdb

from fixtures import synthetic as syn
from nsys2comm import catalog


def _canon_dtype(t: str) -> str:
    return {"Float": "float32", "BFloat16": "bfloat16", "Half": "float16", "Long": "int64", "Byte": "uint8"}[t]


def catalog_db() -> duckdb.DuckDBPyConnection:
    """A new in-memory database with the catalog installed and empty canonical tables: the product's in-memory job
    database (``db.memory_job``: a copy of the catalog template, ≈ 0.1 s, where ``catalog.install`` binds a thousand
    statements in ≈ 2 s; installed where there is no usable template)."""
    from nsys2comm.storage import db

    return db.memory_job()


def save(con: duckdb.DuckDBPyConnection, path) -> Path:
    """Write the in-memory job ``con`` (catalog and rows) to the new database file ``path`` and close ``con``: one
    ``COPY FROM DATABASE`` (milliseconds), where building on a file connection installs the catalog there (seconds
    of binding)."""
    path = Path(path)
    db = con.execute("SELECT current_database()").fetchall()[0][0]
    con.execute(f"ATTACH {catalog.sql_string(str(path))} AS _synth_save")
    try:
        con.execute(f'COPY FROM DATABASE "{db}" TO _synth_save')
    finally:
        con.execute("DETACH _synth_save")
        con.close()
    return path


def empty_job(ranks: int) -> duckdb.DuckDBPyConnection:
    """A database with the catalog, one synthetic file and ``ranks`` ranks on one host, and nothing else: tests add
    the kernels, launches and comm_ops rows they are about."""
    con = catalog_db()
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source, clock_offset_ns) "
                "VALUES (1, '/synthetic', 'x', 0, 'kineto', 0)")
    for r in range(ranks):
        con.execute("INSERT INTO ranks VALUES (?, 1, ?, 'host', ?, 'cli')", [r, 100 + r, ranks])
    return con


_CLASSIFIED: dict[str, tuple[str, str]] = {}


def classify(con, name: str) -> tuple[str, str]:
    """(kernel_short_name(name), kernel_class(name)) by the catalog's own macros, once per name in this process: a
    statement that calls them binds them anew (≈ 30 ms, against ≈ 1 ms for a plain insert), and tests insert the same
    few names thousands of times."""
    if name not in _CLASSIFIED:
        _CLASSIFIED[name] = con.execute("SELECT kernel_short_name(?), kernel_class(?)", [name, name]).fetchall()[0]
    return _CLASSIFIED[name]


def add_kernel(con, k: int, rank: int, name: str, start_ns: int, end_ns: int, stream: int,
               launch_ns: tuple[int, int] | None = None) -> None:
    """Kernel ``k`` (its id and correlation id) of an :func:`empty_job`, classified by the catalog's own rules, and
    its cudaLaunchKernel call on the rank's thread 1 when ``launch_ns`` (start, end) is given."""
    short_name, kernel_class = classify(con, name)
    con.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, stream_id, start_ns, end_ns, name, "
                "short_name, correlation_id, kernel_class) VALUES (?, 1, ?, 0, ?, ?, ?, ?, ?, ?, ?)",
                [k, rank, stream, start_ns, end_ns, name, short_name, k, kernel_class])
    if launch_ns is not None:
        con.execute("INSERT INTO api_calls VALUES (?, 1, ?, ?, 1, ?, ?, 'cudaLaunchKernel', ?, 'runtime')",
                    [k, rank, 100 + rank, launch_ns[0], launch_ns[1], k])


def build(run: syn.Run | None = None, con: duckdb.DuckDBPyConnection | None = None, *, steps: bool = True,
          comm_ops: bool = True) -> duckdb.DuckDBPyConnection:
    run = run or syn.make_run()
    if con is None:
        con = catalog_db()
    else:
        catalog.install(con)
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source, clock_offset_ns) "
                "VALUES (1, '/synthetic', 'synthetic', 0, 'kineto', 0)")
    kid = mid = rid = cid = 0
    krows, mrows, rrows, crows, orows = [], [], [], [], []
    kmap = {}
    for rr in run.ranks:
        con.execute("INSERT INTO ranks VALUES (?, 1, ?, ?, ?, 'cli')", [rr.rank, rr.pid, run.host, run.world_size])
        for k in rr.kernels:
            kid += 1
            kmap[id(k)] = kid
            krows.append((kid, rr.rank, k.device, k.stream, k.start_ns, k.end_ns, k.name, k.correlation))
            cid += 1
            crows.append((cid, rr.rank, rr.pid, k.launch_tid, k.launch_start_ns, k.launch_end_ns, "cudaLaunchKernel",
                          k.correlation, "runtime"))
        for m in rr.memops:
            mid += 1
            name = {"HtoD": "Memcpy HtoD (Pageable -> Device)"}.get(m.copy_kind, "Memset (Device)")
            mrows.append((mid, rr.rank, m.device, m.stream, m.start_ns, m.end_ns, m.kind, m.copy_kind, m.bytes, name,
                          m.correlation))
            cid += 1
            crows.append((cid, rr.rank, rr.pid, rr.tid, m.launch_start_ns, m.launch_end_ns,
                          "cudaMemcpyAsync" if m.kind == "memcpy" else "cudaMemsetAsync", m.correlation, "runtime"))
        if steps:
            for s in rr.steps:
                rid += 1
                rrows.append((rid, rr.rank, rr.pid, rr.tid, s.start_ns, s.end_ns, f"ProfilerStep#{s.number}",
                              "user_annotation"))
        if comm_ops:
            for op in rr.comm:
                orows.append((kmap[id(op.kernel)], rr.rank, op.collective, op.msg_bytes // syn.DTYPE_BYTES[op.dtype],
                              _canon_dtype(op.dtype), op.in_bytes, op.out_bytes, op.msg_bytes, op.group_size,
                              op.pg_name, op.pg_desc, op.pg_ranks, op.peer, op.seq))
    con.executemany("INSERT INTO kernels (kernel_id, file_id, rank, device_id, stream_id, start_ns, end_ns, name, "
                    "short_name, correlation_id, kernel_class) VALUES (?, 1, ?, ?, ?, ?, ?, ?, '', ?, '')", krows)
    con.execute("UPDATE kernels SET short_name = kernel_short_name(name), kernel_class = kernel_class(name)")
    if mrows:
        con.executemany("INSERT INTO mem_ops VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", mrows)
    if rrows:
        con.executemany("INSERT INTO cpu_ranges (range_id, file_id, rank, pid, tid, start_ns, end_ns, name, kind) "
                        "VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?)", rrows)
    con.executemany("INSERT INTO api_calls VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?)", crows)
    if orows:
        con.executemany("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, element_count, dtype, in_bytes, "
                        "out_bytes, msg_bytes, group_size, pg_name, pg_desc, pg_ranks, peer_rank, seq, n_ops, "
                        "collective_source, size_source) VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, "
                        "'kernel_args', 'kernel_args')", orows)
    return con
