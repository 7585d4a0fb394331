"""The per-source ingest benchmark (tests/benchmarks/bench_sources.py) on every real Kineto trace in ../shared: each
source tiled small in Kineto's own layout, compact and as gzip ingests to the rows of one copy times the copies.
No timing is asserted (speed and memory targets live in the harness)."""

# tier 4: the real traces in ../shared (CI has them), tiled by the harness's own code; rows checked against the
# ingest of a single copy, the same events

from __future__ import annotations

import re

import pytest

from nsys2comm.ingest import kineto
from nsys2comm.ingest.base import ReadOptions
from tests.benchmarks import bench_sources, decoder_ab
from tests.benchmarks.tile import tile_counted

SOURCES = bench_sources.sources()
SAMPLE = 4000  # events of each source, evenly spaced: small tiles, two copies
_TABLES = ("kernels", "api_calls", "mem_ops", "cpu_ranges")


def _rows(path) -> dict:
    """Rows the Kineto reader gives per canonical table (the stage the benchmark's MB/s is mostly made of)."""
    out = dict.fromkeys(_TABLES, 0)
    for batch in kineto.read(path, ReadOptions(extra={"kineto_workers": 0})):
        if batch.table in out:
            out[batch.table] += batch.data.num_rows
    return out


def test_every_kineto_trace_in_shared_is_a_source(shared_traces):
    dirs = {p.parent.name for p in (shared_traces / "kineto").rglob("*.json.gz")}
    assert {name for name, _ in SOURCES} == dirs and len(dirs) >= 4


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize(("name", "src"), SOURCES, ids=[n for n, _ in SOURCES])
def test_tiled_source_ingests_as_its_copies(tmp_path, name, src):
    one = tmp_path / "one.json"
    _, n_one = tile_counted(src, one, 1e-6, "compact", SAMPLE)  # a single copy
    size_mb = one.stat().st_size / 1e6
    tiles = bench_sources.prepare(name, src, 1.5 * size_mb, tmp_path, SAMPLE)
    # Kineto's writer's layout (output_json.cpp handleActivity): ph/cat/name/pid/tid on one line, ts/dur on the
    # next, then the args block
    text = tiles["kineto"][0].read_text()
    assert re.search(r'\n  \{\n    "ph": "X", "cat": "[^"]*", "name": .*, "pid": [^,]+, "tid": [^,\n]+,\n'
                     r'    "ts": [0-9.]+, "dur": [0-9.]+,\n    "args": \{\n      "', text)
    assert "\n  },\n  {\n" in text
    copies = tiles["kineto"][1] // n_one
    assert copies == 2 and tiles["kineto"][1] == tiles["compact"][1] == tiles["kineto_gz"][1] == 2 * n_one
    base = _rows(one)
    assert base["kernels"] > 0
    for variant in bench_sources.VARIANTS:
        assert _rows(tiles[variant][0]) == {t: copies * n for t, n in base.items()}, variant


@pytest.mark.slow  # tier: slow (tiling a source takes ~1 s)
@pytest.mark.parametrize("style", ["kineto", "compact"])
def test_decoder_ab_parses_every_event_with_each_alternative(tmp_path, style):
    """The decoder A/B's lower bounds time the parse of the very events today's decoder reads: pyarrow's reader,
    once the commas between events are gone, returns one row per event that msgspec decodes."""
    name, src = SOURCES[0]
    path = tmp_path / f"{name}.json"
    tile_counted(src, path, 3, style, SAMPLE)  # a range of ~2 MB: the importer leaves the last MiB to its reader
    res = decoder_ab.measure_source(path, 1, tmp_path)
    assert res["ranges"] >= 1
    assert set(res["median_seconds_per_range"]) == {"today", "msgspec_parse", "duckdb_parse", "duckdb_kept",
                                                    "arrow_parse"}
    parsed = res["events_parsed"]
    assert parsed["arrow_parse"] == parsed["msgspec_parse"] > SAMPLE
