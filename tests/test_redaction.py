"""Credentials anywhere in a trace's free text never reach a table or an output.

Tier 2: the redaction rules on a list of real-world credential shapes (and texts that must stay as they are).
Tier 3: credentials planted anywhere in NVTX texts (nsys) and in Kineto annotation names, op names and args, ingested
into a DuckDB file and into a Parquet job directory; every table, the summary JSON and the report are searched.
"""

from __future__ import annotations

import gzip
import json
import sqlite3

import duckdb
import pyarrow as pa
import pytest

from fixtures.kineto_writer import write_kineto
from fixtures.nsys_writer import write_nsys
from fixtures.synthetic import make_run
from nsys2comm.ingest import ingest
from nsys2comm.ingest.redact import REDACTED, redact_array, redact_text
from nsys2comm.storage import db

# (text with a secret, the secret) — shapes seen in launch lines, NVTX ranges and config dumps
PLANTED = [
    ("run.sh --token=S3cr3tTok1 --epochs 3", "S3cr3tTok1"),
    ("password: hunter2-S3cr3t", "hunter2-S3cr3t"),
    ("Authorization: Bearer abcDEF123456ghiJKL", "abcDEF123456ghiJKL"),
    ("curl -H 'Authorization: Basic dXNlcjpwYXNzd29yZA==' x", "dXNlcjpwYXNzd29yZA=="),
    ("export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"),
    ("step 3 WANDB_API_KEY=0123456789abcdef0123", "0123456789abcdef0123"),
    ("launch --password hunter2secret --nodes 2", "hunter2secret"),
    ('{"api_key": "AKsecretvalue99", "lr": 0.1}', "AKsecretvalue99"),
    ("clone https://bob:pw-S3cret@github.example/x.git", "pw-S3cret"),
    ("push with ghp_" + "A1b2" * 9, "ghp_" + "A1b2" * 9),
    ("github_pat_" + "x9" * 20, "github_pat_" + "x9" * 20),
    ("slack xoxb-1234567890-abcdefghij", "xoxb-1234567890-abcdefghij"),
    ("key id AKIAIOSFODNN7EXAMPLE in use", "AKIAIOSFODNN7EXAMPLE"),
    ("openai sk-proj-" + "Q" * 40, "sk-proj-" + "Q" * 40),
    ("hub hf_" + "z" * 34, "hf_" + "z" * 34),
    ("maps AIza" + "B" * 35, "AIza" + "B" * 35),
    ("jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4", "SflKxwRJSMeKKF2QT4"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA"),
    ("db_passwd='p a s s w'", "p a s s w"),
    ("GITLAB glpat-" + "k" * 20, "glpat-" + "k" * 20),
]
HARMLESS = ["ProfilerStep#3", "nccl:all_reduce", "aten::mm", "nn.Module: key_proj", "step 3 key_padding_mask",
            "autograd::engine::evaluate_function: MmBackward0", "Optimizer.step#AdamW.step", "token embedding",
            "basic block", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "torch/nn/modules/module.py(1501): _call_impl", "tokenizer.py(12): encode"]


@pytest.mark.parametrize(("text", "secret"), PLANTED)
def test_every_shape_is_redacted(text, secret):
    out = redact_text(text)
    assert secret not in out
    assert REDACTED in out


@pytest.mark.parametrize("text", HARMLESS)
def test_harmless_texts_stay(text):
    assert redact_text(text) == text


def test_json_args_stay_json():
    out = redact_text('{"api_key": "AKsecretvalue99", "n": 3}')
    assert json.loads(out) == {"api_key": REDACTED, "n": 3}


def test_array_untouched_when_nothing_matches():
    arr = pa.array(HARMLESS + [None])
    assert redact_array(arr) is arr
    mixed = pa.array(["a", None, PLANTED[0][0], "b"])
    assert redact_array(mixed).to_pylist() == ["a", None, redact_text(PLANTED[0][0]), "b"]


def _plant_nsys(path):
    con = sqlite3.connect(path)
    start, gtid = con.execute("SELECT start, globalTid FROM NVTX_EVENTS WHERE text LIKE 'ProfilerStep%' "
                              "ORDER BY start LIMIT 1").fetchone()
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId, binaryData) "
                    "VALUES (?,?,59,?,?,NULL,0,NULL)",
                    [(start + i, start + i + 100, text, gtid) for i, (text, _) in
                     enumerate(PLANTED)])
    con.commit()
    con.close()


def _plant_kineto(path):
    doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    ev = doc["traceEvents"]
    ann = next(e for e in ev if e.get("cat") == "user_annotation")
    for i, (text, secret) in enumerate(PLANTED):
        ev.append({**ann, "name": text, "ts": ann["ts"] + i, "dur": 1, "args": {"External id": 90000 + i}})
        ev.append({**ann, "cat": "cpu_op", "name": f"op{i}", "ts": ann["ts"] + i, "dur": 1,
                   "args": {"External id": 91000 + i, "Collective name": "allreduce", "note": text,
                            "token": secret}})
    path.write_text(json.dumps(doc))


def _tables_holding(con, secrets) -> list[tuple[str, str]]:
    hits = []
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall():
        text = str(con.execute(f'SELECT * FROM "{table}"').fetchall())
        hits += [(table, s) for s in secrets if s in text]
    return hits


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("planted")
    run = make_run(world_size=2, steps=1)
    (d / "nsys").mkdir()
    nsys = write_nsys(run, d / "nsys" / "job.sqlite", "3.25.0")
    _plant_nsys(nsys)
    kin = write_kineto(make_run(world_size=2, steps=1), d / "kineto")
    for p in kin:
        _plant_kineto(p)
    return nsys, kin


@pytest.mark.subprocess
def test_no_planted_secret_reaches_tables_or_outputs(planted, tmp_path):
    """tier 3"""
    from typer.testing import CliRunner

    from nsys2comm.cli import app

    nsys, kin = planted
    secrets = [s for _, s in PLANTED]
    for files in ([nsys], kin):
        con = db.connect(None)
        ingest(con, files, jobs=1)
        assert con.execute("SELECT count(*) FROM cpu_ranges WHERE name LIKE '%[redacted]%'").fetchone()[0] >= 10
        assert _tables_holding(con, secrets) == []
    runner = CliRunner()
    for files in ([str(nsys)], [str(p) for p in kin]):
        out = runner.invoke(app, ["summary", *files, "--json"])
        assert out.exit_code in (0, 3), out.output
        assert not [s for s in secrets if s in out.output]
        html = tmp_path / "r.html"
        out = runner.invoke(app, ["report", *files, "-o", str(html)])
        assert out.exit_code == 0, out.output
        assert not [s for s in secrets if s in html.read_text()]
    jobdir = tmp_path / "job"
    out = runner.invoke(app, ["ingest", str(nsys), "--out", str(jobdir)])
    assert out.exit_code == 0, out.output
    parts = sorted(jobdir.rglob("*.parquet"))
    assert parts
    text = "".join(str(duckdb.sql(f"SELECT * FROM read_parquet('{p}')").fetchall()) for p in parts)
    assert "[redacted]" in text
    assert not [s for s in secrets if s in text]
