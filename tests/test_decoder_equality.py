"""The fast Kineto decoder (msgspec Structs) and the tolerant one (orjson and a conversion per event, selected with
``kineto_decoder="tolerant"`` / NSYS2COMM_KINETO_DECODER) give the same canonical rows, value for value and in the
same order, on every fixture, every real Kineto trace in ../shared, and the format variants users have: Kineto's
own layout, compact JSON, gzip, early-2024 epoch ts with a fraction, ROCm's pointer text for a launch's stream; and
in-process as by byte ranges in worker processes."""

# tier 4: every real Kineto trace in ../shared and tiles of them, read by two independent decoders; tier 3: the
# fixtures built by code (fixtures/kineto_writer.py, fixtures/synthetic_tp.py)

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from fixtures.kineto_writer import write_kineto, write_large_kineto
from fixtures.synthetic import make_run
from fixtures.synthetic_tp import make_tp_run, write_tp_kineto
from nsys2comm.errors import InputError
from nsys2comm.ingest import kineto
from nsys2comm.ingest.base import ReadOptions
from tests.benchmarks import bench_sources
from tests.benchmarks.tile import tile_counted, with_epoch_fractions, with_stream_pointers

ROOT = Path(__file__).resolve().parents[1]
SHARED_KINETO = sorted((ROOT.parent / "shared" / "traces" / "kineto").rglob("*.json*"))
SHARED_KINETO = [p for p in SHARED_KINETO if bench_sources.is_kineto_json(p)]


def _read(path: Path, decoder: str, workers: int = 0, block: int | None = None) -> dict[str, list[dict]]:
    """Every batch the reader yields, per table, as rows (the ids the pieces were shifted to included)."""
    opts = ReadOptions(extra={"kineto_decoder": decoder, "kineto_workers": workers})
    tables: dict[str, list[pa.Table]] = {}
    for b in (kineto.read(path, opts) if block is None else kineto.read(path, opts, block=block)):
        tables.setdefault(b.table, []).append(b.data)
    return {t: pa.concat_tables(v).to_pylist() for t, v in tables.items()}


def _same(path: Path, **kw) -> dict[str, list[dict]]:
    fast, tolerant = _read(path, "fast", **kw), _read(path, "tolerant", **kw)
    assert fast.keys() == tolerant.keys()
    for t in fast:
        assert len(fast[t]) == len(tolerant[t]), t
        bad = next((i for i, (a, b) in enumerate(zip(fast[t], tolerant[t], strict=True)) if a != b), None)
        assert bad is None, f"{path.name} {t} row {bad}: fast {fast[t][bad]} != tolerant {tolerant[t][bad]}"
    return fast


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@pytest.mark.parametrize("path", SHARED_KINETO, ids=[f"{p.parent.name}/{p.name}" for p in SHARED_KINETO])
def test_real_trace(path):
    rows = _same(path)
    assert rows.get("kernels") and rows.get("api_calls")


def test_every_real_kineto_trace_is_compared(shared_traces):
    assert len(SHARED_KINETO) >= 12 and {p.parent.name for p in SHARED_KINETO} == {
        n for n, _ in bench_sources.sources()}


@pytest.fixture(scope="module", params=[n for n, _ in bench_sources.sources()])
def tiles(request, tmp_path_factory):
    """Kineto-layout, compact and gzip tiles (two copies of ~3,000 events) of one real source."""
    name = request.param
    src = dict(bench_sources.sources())[name]
    d = tmp_path_factory.mktemp(name)
    one = d / "one.json"
    tile_counted(src, one, 1e-6, "compact", 3000)
    return bench_sources.prepare(name, src, 1.5 * one.stat().st_size / 1e6, d, 3000)


@pytest.mark.parametrize("variant", bench_sources.VARIANTS)
def test_tiled_layouts(tiles, variant):
    _same(tiles[variant][0])


def test_layouts_give_the_same_rows(tiles):
    """Kineto's layout, compact and gzip: one set of rows (the decoders agree with each other above)."""
    rows = [_read(tiles[v][0], "fast") for v in bench_sources.VARIANTS]
    assert rows[0] == rows[1] == rows[2]


def test_epoch_fraction_variant(tiles, tmp_path):
    out = tmp_path / "epoch_fraction.json"
    if not with_epoch_fractions(tiles["kineto"][0], out):
        pytest.skip("the source's ts are not integer epoch µs")
    rows = _same(out)
    assert any(r["start_ns"] % 1000 for r in rows["kernels"])  # the fractions reached the ns


def test_stream_pointer_variant(tiles, tmp_path):
    out = tmp_path / "stream_pointers.json"
    if not with_stream_pointers(tiles["kineto"][0], out):
        pytest.skip("the source has no CUDA runtime calls with a cbid")
    assert _same(out) == _read(tiles["kineto"][0], "fast")  # a launch's stream is in no row: the same rows


def test_byte_ranges_in_workers(tiles):
    """The plain tile cut into 64 KiB ranges, decoded in two worker processes: the decoder travels with each range."""
    fast = _same(tiles["kineto"][0], workers=2, block=1 << 16)
    assert fast == _read(tiles["kineto"][0], "fast")


@pytest.mark.parametrize(("style", "gz"), [("old", False), ("new", False), ("new", True)])
def test_synthetic_fixtures(tmp_path, style, gz):
    for p in write_kineto(make_run(world_size=2, steps=2), tmp_path, style=style, gz=gz):
        _same(p)


def test_large_and_tp_fixtures(tmp_path):
    big = tmp_path / "large.pt.trace.json"
    write_large_kineto(big, 1_500_000)
    _same(big)
    for p in write_tp_kineto(make_tp_run(), tmp_path / "tp"):
        _same(p)


def test_example_fixture():
    for p in sorted((ROOT / "fixtures" / "example").glob("*.json*"))[:2]:
        _same(p)


def test_unknown_decoder_is_refused(tmp_path):
    p = write_kineto(make_run(world_size=2, steps=1), tmp_path)[0]
    with pytest.raises(InputError, match="unknown Kineto decoder"):
        _read(p, "simd")


def test_h200_gemm_fixture_keeps_input_strides():
    """tier 4: a real PyTorch 2.11 H200 profile (fixtures/h200_gemms): both decoders keep each matrix-multiply op's
    'Input Strides' (queries/gemm/gemm.sql reads the transposes from them) beside 'Input Dims', identically."""
    import json

    rows = _same(ROOT / "fixtures" / "h200_gemms" / "h200_gemms.pt.trace.json.gz")
    ops = [json.loads(r["args"]) for r in rows["cpu_ranges"] if r["name"] == "aten::addmm"]
    assert len(ops) == 6
    assert {(str(a["Input Dims"]), str(a["Input Strides"])) for a in ops} == {
        ("[[3000], [4096, 1024], [1024, 3000], [], []]", "[[1], [1024, 1], [1, 1024], [], []]"),
        ("[[4096], [2048, 1024], [1024, 4096], [], []]", "[[1], [1024, 1], [4096, 1], [], []]")}
