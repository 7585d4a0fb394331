"""Contention (issue 16 part 2): GEMM and communication slowdown under overlap, on canonical tables written
directly (no importer), so every sample is placed by hand; plus a brute-force property test of the alone /
overlapped / partial classification and the catalog lint of the exposure objects.

Issue 36 part 7 (tier 2 and 3): groups by recorded problem shape (cpu_op 'Input Dims' linked through the launch),
the bimodality guard ('mixed_shapes') and the job row's time-weighted median (a hypothesis property test: it is one
measured group's own figure, the brute-force lower weighted median, always within their range)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth_db import catalog_db
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

sys.path.insert(0, str(Path(__file__).parent))
import test_catalog_lint as lint

from nsys2comm import analysis, catalog

US = 1000
T0 = 1_700_000_000_000_000_000
STEP_US = 20_000  # ProfilerStep ranges [k * STEP_US, (k + 1) * STEP_US) µs from T0
GEMM_G = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", (132, 1, 1), (256, 1, 1))
GEMM_H = ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", (66, 2, 1), (384, 1, 1))
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
MY_FILES = {"contention.sql", "producers.sql"}
RANGE_JOIN = re.compile(r"\bJOIN\b[^;]*?\bON\b[^;]*?(start_ns|\.s)\s*<\s*\w+\.(end_ns|e)\b", re.I | re.S)  # lint's


class Tables:
    """Rows of the canonical tables, written with inline INSERTs (kernel ids 1, 2, ... in call order)."""

    def __init__(self):
        self.kernels: list[tuple] = []
        self.steps: list[tuple] = []
        self.ops: list[tuple] = []
        self.launches: list[tuple] = []
        self.gemm_ops: list[tuple] = []

    def gemm_op(self, rank: int, kid: int, name: str, dims: list, types: list) -> None:
        """Kernel kid's launch (2 µs before it starts) inside a record_shapes cpu_op of its rank's thread 1."""
        start = self.kernels[kid - 1][3] - 2 * US
        self.launches.append((len(self.launches) + 1, rank, start, start + US, kid))
        self.gemm_ops.append((10_000 + len(self.gemm_ops), rank, start - US, start + 2 * US, name,
                              json.dumps({"Input Dims": dims, "Input type": types})))

    def kernel(self, rank: int, start_ns: int, end_ns: int, cls: str, shape=GEMM_G) -> int:
        kid = len(self.kernels) + 1
        name, grid, block = shape if cls != "communication" else (NCCL, (32, 1, 1), (640, 1, 1))
        stream = 20 if cls == "communication" else 7
        self.kernels.append((kid, rank, stream, T0 + start_ns, T0 + end_ns, name, name, kid, *grid, *block, cls))
        return kid

    def comm_op(self, kid: int, rank: int, msg_bytes: int, group_size: int = 8) -> None:
        self.ops.append((kid, rank, "all_reduce", msg_bytes, group_size))

    def step(self, rank: int, k: int) -> None:
        self.steps.append((len(self.steps) + 1, rank, T0 + k * STEP_US * US, T0 + (k + 1) * STEP_US * US,
                           f"ProfilerStep#{k}"))

    def connect(self) -> duckdb.DuckDBPyConnection:
        con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
        con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source, clock_offset_ns) "
                    "VALUES (1, '/synthetic', 'synthetic', 0, 'kineto', 0)")
        return self.fill(con)

    def fill(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
        """Replace the rows of con's kernels, cpu_ranges, api_calls and comm_ops with these."""
        for table in ("kernels", "cpu_ranges", "api_calls", "comm_ops"):
            con.execute(f"DELETE FROM {table}")
        if self.kernels:
            con.executemany("INSERT INTO kernels (kernel_id, file_id, rank, device_id, stream_id, start_ns, end_ns, "
                            "name, short_name, correlation_id, grid_x, grid_y, grid_z, block_x, block_y, block_z, "
                            "kernel_class) VALUES (?, 1, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", self.kernels)
        if self.steps:
            con.executemany("INSERT INTO cpu_ranges (range_id, file_id, rank, pid, tid, start_ns, end_ns, name, kind) "
                            "VALUES (?, 1, ?, 1, 1, ?, ?, ?, 'user_annotation')", self.steps)
        if self.launches:
            con.executemany("INSERT INTO api_calls (call_id, file_id, rank, pid, tid, start_ns, end_ns, name, "
                            "correlation_id, api) VALUES (?, 1, ?, 1, 1, ?, ?, 'cudaLaunchKernel', ?, 'runtime')",
                            self.launches)
        if self.gemm_ops:
            con.executemany("INSERT INTO cpu_ranges (range_id, file_id, rank, pid, tid, start_ns, end_ns, name, kind, "
                            "args) VALUES (?, 1, ?, 1, 1, ?, ?, ?, 'cpu_op', ?)", self.gemm_ops)
        if self.ops:
            con.executemany("INSERT INTO comm_ops (kernel_id, file_id, rank, collective, msg_bytes, group_size, "
                            "n_ops, collective_source) VALUES (?, 1, ?, ?, ?, ?, 1, 'kernel_args')", self.ops)
        return con


def _slots(rank: int, k: int):
    """Start times (ns from T0) of 1 ms slots in step k on rank; rank r is shifted by r × 500 µs so that one
    rank's communication never lines up with another rank's GEMMs unless placed there on purpose."""
    base = (k * STEP_US + 100 + rank * 500) * US
    return [base + i * 1000 * US for i in range(16)]


def _known_slowdown_job() -> tuple[Tables, dict]:
    """GEMM shape G: alone 100 µs, overlapped 125 µs, on 2 ranks × 2 steps; shape H: 2 + 2 samples only."""
    t = Tables()
    for r in (0, 1):
        for k in (1, 2):
            t.step(r, k)
            s = _slots(r, k)
            for i in range(3):  # alone
                t.kernel(r, s[i], s[i] + 100 * US, "gemm")
            for i in (3, 4):  # fully under communication
                t.kernel(r, s[i], s[i] + 125 * US, "gemm")
                t.kernel(r, s[i] - 10 * US, s[i] + 200 * US, "communication")
            # exactly 50 % covered: overlapped (the bound is inclusive)
            t.kernel(r, s[5], s[5] + 125 * US, "gemm")
            t.kernel(r, s[5] + 62_500, s[5] + 300 * US, "communication")
            # partial: 49 % and 1 µs covered; in neither sample (they would move both medians if counted)
            t.kernel(r, s[6], s[6] + 400 * US, "gemm")
            t.kernel(r, s[6] + 204 * US, s[6] + 500 * US, "communication")
            t.kernel(r, s[7], s[7] + 400 * US, "gemm")
            t.kernel(r, s[7] + 399 * US, s[7] + 450 * US, "communication")
            if k == 1:  # shape H: one alone and one overlapped per rank
                t.kernel(r, s[8], s[8] + 50 * US, "gemm", GEMM_H)
                t.kernel(r, s[9], s[9] + 60 * US, "gemm", GEMM_H)
                t.kernel(r, s[9], s[9] + 60 * US, "communication")
        # communication on rank 1 exactly when rank 0 runs an alone GEMM: other ranks do not count
        t.kernel(1, _slots(0, 1)[0], _slots(0, 1)[0] + 100 * US, "communication")
    return t, {"alone": 12, "overlapped": 12, "partial": 8}


@pytest.fixture(scope="module")
def known():
    t, counts = _known_slowdown_job()
    return t.connect(), counts


def _rows(con, name: str, **params) -> list[dict]:
    return analysis.run_query(con, name, params).to_dicts()


def test_known_gemm_slowdown_is_recovered_exactly(known):
    con, counts = known
    rows = _rows(con, "gemm_contention")
    g = next(r for r in rows if r["short_name"] == GEMM_G[0])
    assert g["scope"] == "shape_group" and g["status"] == "measured"
    assert (g["grid_x"], g["grid_y"], g["grid_z"], g["block_x"], g["block_y"], g["block_z"]) == GEMM_G[1] + GEMM_G[2]
    assert g["alone_samples"] == counts["alone"] and g["overlapped_samples"] == counts["overlapped"]
    assert g["partial_samples"] == counts["partial"]
    assert g["kernels"] == counts["alone"] + counts["overlapped"] + counts["partial"]
    assert g["windows"] == 2
    assert g["median_alone_ns"] == 100 * US and g["median_overlapped_ns"] == 125 * US
    assert g["slowdown_pct"] == 25.0
    assert g["lost_ns"] == counts["overlapped"] * 25 * US
    job = rows[-1]
    assert job["scope"] == "job" and job["status"] == "measured"
    assert job["slowdown_pct"] == 25.0 and job["lost_ns"] == 12 * 25 * US  # H is skipped: too few samples
    assert job["alone_samples"] == 12 and job["overlapped_samples"] == 12
    assert [r["scope"] for r in rows] == ["shape_group", "shape_group", "job"]


def test_too_few_samples_gives_null_not_zero(known):
    con, _ = known
    h = next(r for r in _rows(con, "gemm_contention") if r["short_name"] == GEMM_H[0])
    assert (h["alone_samples"], h["overlapped_samples"], h["status"]) == (2, 2, "too_few_samples")
    assert h["slowdown_pct"] is None and h["lost_ns"] is None
    assert (h["median_alone_ns"], h["median_overlapped_ns"]) == (50 * US, 60 * US)  # shown, but not compared
    h2 = next(r for r in _rows(con, "gemm_contention", min_samples=2) if r["short_name"] == GEMM_H[0])
    assert h2["status"] == "measured" and h2["slowdown_pct"] == 20.0 and h2["lost_ns"] == 2 * 10 * US
    # nothing measured: the job row says so with NULLs
    job = _rows(con, "gemm_contention", min_samples=13)[-1]
    assert job["scope"] == "job" and job["status"] == "too_few_samples"
    assert job["slowdown_pct"] is None and job["lost_ns"] is None


def test_overlapped_threshold_moves_partial_samples(known):
    con, counts = known
    # at 100 %, the 50 %-covered kernels become partial; at 49 %, the 49 %-covered ones become overlapped
    g100 = next(r for r in _rows(con, "gemm_contention", overlapped_min_pct=100) if r["short_name"] == GEMM_G[0])
    assert (g100["overlapped_samples"], g100["partial_samples"]) == (8, counts["partial"] + 4)
    g49 = next(r for r in _rows(con, "gemm_contention", overlapped_min_pct=49) if r["short_name"] == GEMM_G[0])
    assert (g49["overlapped_samples"], g49["partial_samples"]) == (16, 4)
    # the overlapped side now holds 125 µs and 400 µs kernels (P90 / P10 = 3.2 > 2): the bimodality guard
    # refuses to read that as contention; a looser guard measures it
    assert g49["status"] == "mixed_shapes" and g49["slowdown_pct"] is None and g49["lost_ns"] is None
    assert g49["spread_ratio"] == pytest.approx(400 / 125)
    g49 = next(r for r in _rows(con, "gemm_contention", overlapped_min_pct=49, mixed_ratio=4)
               if r["short_name"] == GEMM_G[0])
    assert g49["median_overlapped_ns"] == 125 * US and g49["lost_ns"] == 12 * 25 * US + 4 * 300 * US


def test_samples_are_compared_within_the_same_steps():
    """Alone samples only in step 1 and overlapped ones only in step 2: no step holds both, nothing is compared;
    without steps the whole trace is one window and the group is measured."""
    t = Tables()
    for r in (0, 1):
        for k in (1, 2):
            t.step(r, k)
            for x in _slots(r, k)[:3]:
                t.kernel(r, x, x + (100 if k == 1 else 130) * US, "gemm")
                if k == 2:
                    t.kernel(r, x, x + 130 * US, "communication")
        # outside every step: never a sample when the job has steps
        t.kernel(r, 100 * STEP_US * US, 100 * STEP_US * US + 130 * US, "gemm")
        t.kernel(r, 100 * STEP_US * US, 100 * STEP_US * US + 130 * US, "communication")
    con = t.connect()
    g = _rows(con, "gemm_contention")[0]
    assert (g["kernels"], g["windows"], g["alone_samples"], g["overlapped_samples"]) == (14, 0, 0, 0)
    assert g["status"] == "too_few_samples" and g["slowdown_pct"] is None
    con.execute("DELETE FROM cpu_ranges")
    g = _rows(con, "gemm_contention")[0]
    assert (g["windows"], g["alone_samples"], g["overlapped_samples"], g["status"]) == (1, 6, 8, "measured")
    assert g["slowdown_pct"] == 30.0


def test_comm_contention_busbw_and_slowdown():
    """all_reduce of 1 MiB over 8 ranks: 100 µs alone, 150 µs under a GEMM; busbw = S / t × 2 (n − 1) / n."""
    t = Tables()
    size = 1 << 20
    for r in range(3):
        t.step(r, 1)
        s = _slots(r, 1)
        for i in range(2):
            t.comm_op(t.kernel(r, s[i], s[i] + 100 * US, "communication"), r, size)
        for i in (2, 3):
            t.comm_op(t.kernel(r, s[i], s[i] + 150 * US, "communication"), r, size)
            t.kernel(r, s[i] - 5 * US, s[i] + 200 * US, "gemm")
        t.comm_op(t.kernel(r, s[4], s[4] + 150 * US, "communication"), r, size)  # 20 % under compute: partial
        t.kernel(r, s[4], s[4] + 30 * US, "gemm")
    con = t.connect()
    (row,) = _rows(con, "comm_contention")
    assert (row["collective"], row["msg_bytes"], row["group_size"]) == ("all_reduce", size, 8)
    assert (row["alone_samples"], row["overlapped_samples"], row["partial_samples"]) == (6, 6, 3)
    assert (row["median_alone_ns"], row["median_overlapped_ns"]) == (100 * US, 150 * US)
    assert row["slowdown_pct"] == 50.0 and row["lost_ns"] == 6 * 50 * US and row["status"] == "measured"
    assert row["median_busbw_alone_gbps"] == pytest.approx(size / (100 * US) * 2 * 7 / 8, rel=1e-12)
    assert row["median_busbw_overlapped_gbps"] == pytest.approx(size / (150 * US) * 2 * 7 / 8, rel=1e-12)
    (few,) = _rows(con, "comm_contention", min_samples=7)
    assert few["status"] == "too_few_samples" and few["slowdown_pct"] is None and few["lost_ns"] is None


def test_exposure_objects_pass_the_catalog_lint():
    """The rules of test_catalog_lint, applied to this issue's objects, plus their naming rules."""
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    objs = [o for o in catalog.load_catalog() if o.area == "exposure" and o.path.name in MY_FILES]
    assert {o.name for o in objs if o.public} == {"gemm_contention", "comm_contention", "producer_links",
                                                  "serialised_pairs"}
    for o in objs:
        lint.test_documented(o)
        if o.is_table_macro or o.kind == "view":  # the lint's own selection: scalar macros have no columns
            lint.test_columns_match_and_units(con, o)
        assert o.public or o.name.startswith("_exposure_"), o.name
        if o.public:
            assert o.has_view and not o.required_params, o.name
            lint.test_order_by(o)
            assert analysis.run_query(con, o.name).height == 0, o.name  # an empty job has no rows
        body = re.sub(r"--.*", "", o.sql)
        assert not RANGE_JOIN.search(body), o.name


# ---------------------------------------------------------------------------------------------------------------
# property: the classification against a brute-force computation on random intervals

_PROP = {}


def _prop_con() -> duckdb.DuckDBPyConnection:
    if "con" not in _PROP:
        _PROP["con"] = Tables().connect()
    return _PROP["con"]


_iv = st.tuples(st.integers(0, 60), st.integers(0, 15))


@settings(max_examples=examples(40), deadline=None)
@given(comm=st.lists(st.tuples(st.integers(0, 1), _iv), max_size=8),
       gemm=st.lists(st.tuples(st.integers(0, 1), _iv), min_size=1, max_size=8),
       pct=st.sampled_from([25, 50, 100]) | st.integers(1, 100))  # round shares hit the inclusive bound often
def test_classification_matches_brute_force(comm, gemm, pct):
    """Integer unit intervals: coverage counted cell by cell; alone = 0 cells covered, overlapped = 100 × covered
    >= pct × duration, else partial; zero-length kernels are no samples. Both directions: GEMMs under
    communication (_exposure_gemm_samples) and communication under GEMMs (_exposure_comm_samples)."""
    t = Tables()
    ids = {"gemm": [], "communication": []}
    for cls, items in (("communication", comm), ("gemm", gemm)):
        for rank, (a, n) in items:
            ids[cls].append((t.kernel(rank, a, a + n, cls), rank, a, a + n))
    con = _prop_con()
    con.execute("DELETE FROM kernels")
    con.executemany("INSERT INTO kernels (kernel_id, file_id, rank, device_id, stream_id, start_ns, end_ns, name, "
                    "short_name, correlation_id, grid_x, grid_y, grid_z, block_x, block_y, block_z, kernel_class) "
                    "VALUES (?, 1, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", t.kernels)

    def expect(mine, others):
        out = {}
        for kid, rank, a, b in mine:
            if b <= a:
                continue
            cells = {x for _, r, s, e in others if r == rank for x in range(s, e)}
            cov = sum(1 for x in range(a, b) if x in cells)
            out[kid] = (cov, "alone" if cov == 0 else "overlapped" if 100 * cov >= pct * (b - a) else "partial")
        return out

    got = {k: (c, s) for k, c, s in con.execute(
        "SELECT kernel_id, comm_covered_ns, sample FROM _exposure_gemm_samples(?)", [pct]).fetchall()}
    assert got == expect(ids["gemm"], ids["communication"])
    got = {k: (c, s) for k, c, s in con.execute(
        "SELECT kernel_id, compute_covered_ns, sample FROM _exposure_comm_samples(?)", [pct]).fetchall()}
    assert got == expect(ids["communication"], ids["gemm"])


# ---------------------------------------------------------------------------------------------------------------
# issue 36 part 7: shape groups, the bimodality guard, the job row's weighted median

def _pairs(t: Tables, r: int, k: int, alone_us: list[int], overlapped_us: list[int], shape=GEMM_G,
           op=None) -> None:
    """GEMMs of one step: alone ones in slots 0.., overlapped ones (under a longer collective) after them; op =
    (name, dims, types) records a shape for each."""
    s = _slots(r, k)
    for i, d in enumerate(alone_us + overlapped_us):
        kid = t.kernel(r, s[i], s[i] + d * US, "gemm", shape)
        if i >= len(alone_us):
            t.kernel(r, s[i] - 10 * US, s[i] + (d + 50) * US, "communication")
        if op is not None:
            t.gemm_op(r, kid, *op)


MM_SMALL = ("aten::mm", [[64, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"])
MM_LARGE = ("aten::mm", [[1024, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"])


def test_bimodal_durations_are_mixed_shapes_not_a_speedup():
    """One kernel name and launch shape: 500 µs alone, 50 µs beside communication. Read as contention that would be
    '−90 %'; the guard says the two sides hold different work and reports no slowdown."""
    t = Tables()
    for r in (0, 1):
        t.step(r, 1)
        _pairs(t, r, 1, [500] * 3, [50] * 3)
    rows = _rows(t.connect(), "gemm_contention")
    g, job = rows[0], rows[-1]
    assert (g["status"], g["group_by"], g["slowdown_pct"], g["lost_ns"]) == ("mixed_shapes", "kernel", None, None)
    assert (g["median_alone_ns"], g["median_overlapped_ns"]) == (500 * US, 50 * US)  # shown, not compared
    assert (job["status"], job["slowdown_pct"], job["lost_ns"], job["mixed_groups"], job["measured_groups"]) == \
        ("mixed_shapes", None, None, 1, 0)


def test_bimodal_alone_side_is_mixed():
    """Alone durations 50 and 500 µs (the middle 80 % spans 10×): mixed, whatever the medians say."""
    t = Tables()
    for r in (0, 1):
        t.step(r, 1)
        _pairs(t, r, 1, [50, 50, 500, 500], [60, 60, 60])
    g = _rows(t.connect(), "gemm_contention")[0]
    assert g["status"] == "mixed_shapes" and g["slowdown_pct"] is None
    assert g["spread_ratio"] == pytest.approx(500 / 50)


def test_recorded_shapes_split_a_kernel_into_its_problems():
    """The same kernel name, grid and block runs two problem sizes (64 and 1024 rows: 40 and 400 µs alone, +10 %
    beside communication). Without shapes it is one mixed group; with the cpu_op's 'Input Dims' it is two measured
    shape groups, each +10 %."""
    def job(with_shapes: bool):
        t = Tables()
        for r in (0, 1):
            t.step(r, 1)
            _pairs(t, r, 1, [40] * 3, [44] * 3, op=MM_SMALL if with_shapes else None)
            t.step(r, 2)
            _pairs(t, r, 2, [400] * 3, [440] * 3, op=MM_LARGE if with_shapes else None)
        return _rows(t.connect(), "gemm_contention")

    (mixed, job_row) = job(False)
    assert mixed["status"] == "mixed_shapes" and job_row["slowdown_pct"] is None
    rows = job(True)
    groups = {(r["m"], r["n"], r["k"], r["batch"], r["dtype"]): r for r in rows if r["scope"] == "shape_group"}
    assert set(groups) == {(64, 256, 128, 1, "bfloat16"), (1024, 256, 128, 1, "bfloat16")}
    for g in groups.values():
        assert g["group_by"] == "shape" and g["status"] == "measured"
        assert g["slowdown_pct"] == pytest.approx(10.0) and g["short_name"] == GEMM_G[0]
    assert rows[-1]["slowdown_pct"] == pytest.approx(10.0) and rows[-1]["measured_groups"] == 2
    assert rows[-1]["lost_ns"] == 6 * 4 * US + 6 * 40 * US


def _weighted_median(groups: list[tuple[float, float]]) -> float:
    """Lower weighted median, by brute force: the smallest value whose cumulative weight reaches half the total."""
    total = sum(w for _, w in groups)
    acc = 0.0
    for v, w in sorted(groups):
        acc += w
        if 2 * acc >= total:
            return v
    raise AssertionError


def test_job_row_is_the_time_weighted_median_not_a_mean_pulled_by_outliers():
    """The issue's case: the group carrying most GEMM time says +8 %, three small groups say +60 to +90 %. The
    pooled mean would say more than +8 %; the job row says +8 %."""
    t = Tables()
    shapes = [("big_gemm", (132, 1, 1), (256, 1, 1)), ("small_a_gemm", (8, 1, 1), (128, 1, 1)),
              ("small_b_gemm", (8, 1, 1), (128, 1, 1)), ("small_c_gemm", (8, 1, 1), (128, 1, 1))]
    durs = [(500, 540), (20, 32), (20, 34), (20, 38)]
    for r in (0, 1):
        for k, (shape, (a, o)) in enumerate(zip(shapes, durs, strict=True), start=1):
            t.step(r, k)
            _pairs(t, r, k, [a] * 3, [o] * 3, shape)
    rows = _rows(t.connect(), "gemm_contention")
    measured = [r["slowdown_pct"] for r in rows if r["scope"] == "shape_group" and r["status"] == "measured"]
    assert sorted(measured) == pytest.approx([8.0, 60.0, 70.0, 90.0])
    job = rows[-1]
    assert job["slowdown_pct"] == pytest.approx(8.0) and job["measured_groups"] == 4
    pooled = 100 * sum(6 * (o - a) for a, o in durs) / sum(6 * a for a, _ in durs)
    assert pooled > 9.5  # what the old job row reported (Σ lost / Σ alone time)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
@settings(max_examples=examples(30), deadline=None)
@given(st.lists(st.tuples(st.integers(10, 400), st.integers(-40, 99), st.integers(3, 6), st.integers(3, 6)),
                min_size=1, max_size=5))
def test_job_slowdown_lies_within_the_measured_groups(groups):
    """Random groups (alone a µs, overlapped a × (1 + p/100) µs, their sample counts): the job row equals the
    brute-force lower weighted median (weights: overlapped samples × alone median) and lies in the groups' range."""
    t = Tables()
    expect = []
    for g, (a, p, n_alone, n_over) in enumerate(groups):
        o = a + a * p // 100
        shape = (f"g{g}_gemm", (g + 1, 1, 1), (128, 1, 1))
        t.step(0, g + 1)
        _pairs(t, 0, g + 1, [a] * n_alone, [o] * n_over, shape)
        status = "mixed_shapes" if o > 2 * a or a > 2 * o else "measured"
        if n_alone >= 5 and n_over >= 5 and status == "measured":
            expect.append((100 * (o - a) / a, n_over * a))
    job = _rows(t.fill(_prop_con()), "gemm_contention")[-1]
    if not expect:
        assert job["slowdown_pct"] is None
        return
    assert job["slowdown_pct"] == pytest.approx(_weighted_median(expect))
    assert min(v for v, _ in expect) - 1e-9 <= job["slowdown_pct"] <= max(v for v, _ in expect) + 1e-9


def _outlier_job() -> Tables:
    t = Tables()
    shapes = [("big_gemm", (132, 1, 1), (256, 1, 1)), ("small_a_gemm", (8, 1, 1), (128, 1, 1)),
              ("small_b_gemm", (8, 1, 1), (128, 1, 1)), ("mixed_gemm", (8, 1, 1), (128, 1, 1))]
    durs = [(500, 540), (20, 32), (20, 34), (400, 40)]  # the last: 400 µs alone, 40 µs beside communication
    for r in (0, 1):
        for k, (shape, (a, o)) in enumerate(zip(shapes, durs, strict=True), start=1):
            t.step(r, k)
            _pairs(t, r, k, [a] * 3, [o] * 3, shape)
    return t


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_summary_and_findings_read_the_job_row():
    """The summary and the report's finding state the job row's weighted median (+8 %, not the pooled mean nor the
    mixed group's −90 %) and say that the mixed group was left out."""
    from nsys2comm.report.findings import contention_findings
    from nsys2comm.summary import build_summary, format_summary

    con = _outlier_job().connect()
    job = _rows(con, "gemm_contention")[-1]
    assert (job["slowdown_pct"], job["measured_groups"], job["mixed_groups"]) == (pytest.approx(8.0), 3, 1)
    s = build_summary(con)
    assert s["gemm_contention"]["slowdown_pct"] == pytest.approx(8.0)
    assert (s["gemm_contention"]["measured_groups"], s["gemm_contention"]["mixed_groups"]) == (3, 1)
    assert s["gemm_contention"]["lost_ns"] == job["lost_ns"]
    line = next(x for x in format_summary(s).splitlines() if x.startswith("GEMM contention"))
    assert "median 8.0% longer" in line and "1 mixed group(s) left out" in line and "90.0%" not in line
    (f,) = contention_findings(analysis.run_query(con, "gemm_contention", {}))
    assert "8% longer" in f.text and "1 group(s)" in f.text and f.level == "info"


def test_summary_says_why_when_every_group_is_mixed():
    from nsys2comm.report.findings import contention_findings
    from nsys2comm.summary import build_summary

    t = Tables()
    for r in (0, 1):
        t.step(r, 1)
        _pairs(t, r, 1, [500] * 3, [50] * 3)
    con = t.connect()
    s = build_summary(con)
    assert s["gemm_contention"] is None
    assert any(m.startswith("gemm_contention: not available") and "mixed_shapes" in m for m in s["missing"])
    (f,) = contention_findings(analysis.run_query(con, "gemm_contention", {}))
    assert "could not be measured" in f.text
