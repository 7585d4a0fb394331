"""A full disk or a read-only target: a one-line error naming the target, no half-written part left visible or
uncleaned, an exit code that agrees with what was committed, and the next ingest completes.

Tier 3. Two ways to fill the disk: a patched writer that fails with ENOSPC after its third part (runs everywhere),
and, where this process may mount one (root on Linux, as in CI), a real 48 KiB tmpfs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nsys2comm.cli import app
from nsys2comm.ingest import jobwrite

ROOT = Path(__file__).resolve().parents[1]
TRACE = sorted((ROOT / "fixtures" / "example").glob("worker0_*.json.gz"))[0]
TRACE1 = sorted((ROOT / "fixtures" / "example").glob("worker1_*.json.gz"))[0]


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file())


def _one_line_error(out: str, target: Path) -> str:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), out
    assert str(target) in lines[0] and "Error:" not in lines[0][7:] and "OSError" not in lines[0], out
    return lines[0]


def test_patched_full_disk_job_directory(tmp_path, monkeypatch):
    real, n = jobwrite._copy, [0]

    def copy(con, select, final):
        n[0] += 1
        if n[0] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(final))
        return real(con, select, final)

    monkeypatch.setattr(jobwrite, "_copy", copy)
    out = tmp_path / "job"
    res = CliRunner().invoke(app, ["ingest", str(TRACE), "--out", str(out), "-q"])
    assert res.exit_code == 1
    assert "the disk is full" in _one_line_error(res.output, out)
    assert [p.name for p in _files(out)] == ["_nsys2comm.json"]  # no part, no claim, no temp file
    monkeypatch.setattr(jobwrite, "_copy", real)
    res = CliRunner().invoke(app, ["ingest", str(TRACE), "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output


def test_orphan_parts_of_a_dead_writer_are_removed_by_the_next(tmp_path):
    out = tmp_path / "job"
    jobwrite.write([TRACE], out, jobs=1)
    orphan = out / "kernels" / "rank=5" / "part-0123456789abcdef.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"PAR1")
    jobwrite.write([TRACE1], out, jobs=1)
    assert not orphan.exists()
    assert len(list((out / "files").rglob("part-*.parquet"))) == 2


@contextlib.contextmanager
def _tmpfs(where: Path, opts: str):
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (the patched-writer test covers the full disk)")
    try:
        yield where
    finally:  # lazily, so that a handle the code under test leaked cannot leave the mount behind
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/mounts").exists(), reason="mounting needs root on Linux")
@pytest.mark.parametrize("target", ["db", "out"])
def test_real_full_and_read_only_file_systems(tmp_path, target):
    for opts, words in (("size=48k", "the disk is full"), ("ro,size=48k", "read-only file system")):
        with _tmpfs(tmp_path / opts.replace(",", "_").replace("=", ""), opts) as fs:
            dest = fs / ("x.duckdb" if target == "db" else "job")
            res = CliRunner().invoke(app, ["ingest", str(TRACE), f"--{target}", str(dest), "-q"])
            assert res.exit_code == 1, res.output
            assert words in _one_line_error(res.output, dest)
            left = _files(fs)
            assert [p.name for p in left] in ([], ["_nsys2comm.json"]), left


def test_doctor_lists_and_fixes(tmp_path):
    """nsys2comm doctor: a conflict is listed and kept; a dead writer's temp file and orphan part are removed."""
    import shutil

    out, other = tmp_path / "job", tmp_path / "other"
    jobwrite.write([TRACE], out, jobs=1)
    res = CliRunner().invoke(app, ["doctor", str(out)])
    assert res.exit_code == 0 and "no problems found" in res.output
    jobwrite.write([TRACE1], other, jobs=1, rank=0)  # another job's rank 0
    for d in other.iterdir():
        if d.is_dir() and d.name != jobwrite.CLAIMS:
            shutil.copytree(d, out / d.name, dirs_exist_ok=True)
    orphan = out / "kernels" / "rank=3" / "part-0123456789abcdef.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"PAR1")
    temp = out / "kernels" / "rank=3" / ".part-0123456789abcdef.parquet.nohost.1.tmp"
    temp.write_bytes(b"x")
    os.utime(temp, (1, 1))  # another host's, older than a day
    res = CliRunner().invoke(app, ["doctor", str(out), "-f", "csv"])
    assert res.exit_code == 1
    kinds = [ln.split(",")[0] for ln in res.output.splitlines()[1:] if ln]
    assert sorted(kinds) == ["orphan", "rank_conflict", "temp_file"], res.output
    assert orphan.exists() and temp.exists()
    res = CliRunner().invoke(app, ["doctor", str(out), "--fix", "-f", "csv"])
    assert res.exit_code == 1  # the conflict remains: which trace belongs is the user's call
    assert not orphan.exists() and not temp.exists()
    assert "rank_conflict" in res.output


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/mounts").exists(), reason="mounting needs root on Linux")
def test_wal_export_in_a_read_only_directory_says_so(tmp_path):
    """An nsys export in WAL mode needs its -shm file beside it: on a read-only file system the error says that,
    not 'corrupt'."""
    import sqlite3

    from fixtures.nsys_writer import write_nsys
    from fixtures.synthetic import make_run

    src = write_nsys(make_run(world_size=2, steps=1), tmp_path / "w.sqlite", "3.25.0")
    con = sqlite3.connect(src)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE extra (x)")
    con.commit()
    payload = [src.read_bytes(), Path(f"{src}-wal").read_bytes()]
    con.close()
    with _tmpfs(tmp_path / "ro", "size=4m") as fs:
        (fs / "w.sqlite").write_bytes(payload[0])
        (fs / "w.sqlite-wal").write_bytes(payload[1])
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        res = CliRunner().invoke(app, ["ingest", str(fs / "w.sqlite"), "--db", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 1
    line = _one_line_error(res.output, fs / "w.sqlite")
    assert "write-ahead log" in line and "corrupt" not in line
