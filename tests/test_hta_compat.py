"""overlap_by_rank(compat := 'hta') against HolisticTraceAnalysis 0.5.0's algorithm, sub-µs events included.

The reference is a pure-Python transcription of HTA 0.5.0 (PyPI HolisticTraceAnalysis==0.5.0), one function per
HTA function, below. It reads Kineto events as json.loads gives them, as HTA does.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_db import catalog_db
from tiers import examples  # tier: the inner loop runs fewer examples (tests/tiers.py)

from nsys2comm import analysis

# ---------------------------------------------------------------------------------------------- HTA 0.5.0 transcription

# hta/utils/utils.py: NCCL_KERNEL_RE, MEMORY_KERNEL_RE, NCCL_COMPUTE_KERNEL_RE (used with re.match)
HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def hta_kernel_type(name: str) -> str:
    """hta/utils/utils.py get_kernel_type."""
    if HTA_COMM_RE.match(name) is not None:
        return "COMMUNICATION"
    if HTA_MEMORY_RE.match(name) is not None:
        return "MEMORY"
    if not HTA_NOT_COMPUTE_RE.match(name):
        return "COMPUTATION"
    return "OTHER"


def hta_round_down_time_stamps(events: list[dict]) -> list[dict]:
    """hta/common/trace_parser.py round_down_time_stamps, then _compress_df's dropna(dur, cat) and 'Trace' drop.

    Rounding happens only when pandas gives the ts column dtype float64: a float ts, or an event without ts.
    Then end = floor(ts + dur) is computed in float64 before ts = ceil(ts), and dur = end - ts (may be < 0)."""
    as_float = any(not isinstance(e.get("ts"), int) for e in events)
    out = []
    for e in events:
        if e.get("dur") is None or e.get("cat") is None or e.get("ts") is None or e["cat"] == "Trace":
            continue
        ts, dur = e["ts"], e["dur"]
        if as_float:
            end = math.floor(float(ts) + float(dur))
            ts = math.ceil(float(ts))
            dur = end - ts
        args = e.get("args") or {}
        try:
            stream = int(args.get("stream", -1))  # hta/utils/utils.py normalize_gpu_stream_numbers
        except (TypeError, ValueError):
            stream = -1
        out.append({"name": e["name"], "ts": ts, "dur": dur, "end": ts + dur, "stream": stream,
                    "correlation": args.get("correlation", -1)})
    return out


def hta_is_gpu_kernel(e: dict) -> bool:
    """hta/common/trace_filter.py _filter_gpu_kernels_with_cuda_sync (GPUKernelFilter; CPUOperatorFilter is its
    negation)."""
    return (e["stream"] >= 0 and e["correlation"] >= 0) or e["name"] in ("Event Sync", "Context Sync")


def hta_filter_irrelevant_gpu_kernels(traces: dict[int, list[dict]]) -> dict[int, list[dict]]:
    """hta/common/trace.py Trace._filter_irrelevant_gpu_kernels (include_last_profiler_step=False).

    The symbol table is job-wide: the filter runs on every rank when >= 2 distinct names containing 'ProfilerStep'
    exist in all ranks together. A rank without such an event then keeps nothing (ts < NaN is False)."""
    step_names = {e["name"] for evs in traces.values() for e in evs if "ProfilerStep" in e["name"]}
    if len(step_names) < 2:
        return traces
    out = {}
    for rank, evs in traces.items():
        cpu = [e for e in evs if not hta_is_gpu_kernel(e)]
        gpu = [e for e in evs if hta_is_gpu_kernel(e)]
        starts = [e["ts"] for e in cpu if e["name"] in step_names]
        cpu = [e for e in cpu if starts and e["ts"] < max(starts)]
        kept = Counter(e["correlation"] for e in cpu)
        # gpu_kernels.merge(cpu_kernels["correlation"], how="inner"): left order, one row per matching CPU event
        out[rank] = [g for g in gpu for _ in range(kept[g["correlation"]])] + cpu
    return out


def hta_merge_kernel_intervals(kernels: list[dict]) -> list[tuple[float, float]]:
    """hta/utils/utils.py merge_kernel_intervals: sort by ts; a row starts a new group when ts > the running max of
    all previous ends; a group is (min ts, max end). A negative interval (end < ts) can head its own group.

    pandas sorts with an unstable quicksort; this transcription takes ties in input (file) order (a stable sort)."""
    rows = sorted(kernels, key=lambda k: k["ts"])
    groups: list[list[float]] = []
    cummax = None
    for k in rows:
        if groups and k["ts"] > cummax:
            groups.append([k["ts"], k["end"]])
        elif groups:
            groups[-1][0] = min(groups[-1][0], k["ts"])
            groups[-1][1] = max(groups[-1][1], k["end"])
        else:
            groups.append([k["ts"], k["end"]])
        cummax = k["end"] if cummax is None else max(cummax, k["end"])
    return [(g[0], g[1]) for g in groups]


def hta_comm_comp_overlap(trace: list[dict]) -> tuple[float, float]:
    """hta/analyzers/communication_analysis.py get_comm_comp_overlap_value, as (overlapped, merged comm) in µs."""
    gpu = [e for e in trace if e["stream"] != -1]
    comp = hta_merge_kernel_intervals([e for e in gpu if hta_kernel_type(e["name"]) == "COMPUTATION"])
    comm = hta_merge_kernel_intervals([e for e in gpu if hta_kernel_type(e["name"]) == "COMMUNICATION"])
    # status +1/-1 for comm starts/ends, +2/-2 for comp; time where the running sum is 3 is overlap
    status = ([(s, 1) for s, _ in comm] + [(e, -1) for _, e in comm]
              + [(s, 2) for s, _ in comp] + [(e, -2) for _, e in comp])
    status.sort(key=lambda x: x[0])
    running, overlapped = 0, 0
    for i, (t, d) in enumerate(status[:-1]):
        running += d
        if running == 3:
            overlapped += status[i + 1][0] - t
    return overlapped, sum(e - s for s, e in comm)


def hta_overlap_pct(traces: dict[int, list[dict]]) -> dict[int, tuple[float, float, float | None]]:
    """TraceAnalysis(...).get_comm_comp_overlap(): per rank (overlapped_us, comm_us, comp_comm_overlap_pctg).

    pctg = round(100 * ratio, 2) with numpy's round (half to even); 0/0 is NaN, given here as None."""
    parsed = {r: hta_round_down_time_stamps(evs) for r, evs in traces.items()}
    out = {}
    for rank, trace in hta_filter_irrelevant_gpu_kernels(parsed).items():
        num, den = hta_comm_comp_overlap(trace)
        pct = None if den == 0 else _np_round2(100 * (num / den))
        out[rank] = (num, den, pct)
    return out


def _np_round2(x: float) -> float:
    """numpy.round(x, 2): scale by 100, round half to even, unscale."""
    return round(x * 100.0) / 100.0


# ---------------------------------------------------------------------------------------------- traces built by code

COMM_NAMES = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
              "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
              "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"]
COMP_NAMES = ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
              "execute_segment_k_off_kernel",
              "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
              "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
              "triton_poi_fused_add_0"]


def sub_us_run(seed: int, world: int = 2, steps: int = 3, per_step: int = 60, shuffle: bool = False):
    """A Run whose kernels are mostly sub-µs, at arbitrary ns, on a compute and a comm stream, in start order in
    the file (or shuffled); launches sit a few hundred ns to µs before their kernels, some in a step's first µs."""
    import random

    from fixtures import synthetic as syn

    rng = random.Random(seed)
    ranks = []
    for r in range(world):
        rr = syn.RankRun(rank=r, pid=1000 + r, tid=1000 + r, device=r)
        t = syn.T0_NS + rng.randint(0, 999)
        corr = 1
        for s in range(steps):
            s0 = t
            cursor = {7: s0 + rng.randint(0, 1500), 20: s0 + rng.randint(0, 1500)}
            for _ in range(per_step):
                stream = rng.choice([7, 7, 20])
                dur = rng.choice([rng.randint(1, 999), rng.randint(1, 999), rng.randint(1000, 4000)])
                start = cursor[stream] + rng.choice([0, rng.randint(0, 400), rng.randint(0, 1500)])
                names = COMM_NAMES if stream == 20 else COMP_NAMES
                launch = max(s0 - rng.randint(0, 900), start - rng.randint(100, 3000))
                k = syn.Kernel(r, r, stream, start, start + dur, rng.choice(names), corr,
                               launch_start_ns=launch, launch_end_ns=launch + rng.randint(1, 1500), launch_tid=rr.tid)
                rr.kernels.append(k)
                corr += 1
                cursor[stream] = start + dur
            m0 = cursor[7] + rng.randint(0, 800)
            rr.memops.append(syn.MemOp(r, r, 7, m0, m0 + rng.randint(1, 1800), "memcpy", "DtoD", 4096, corr,
                                       m0 - 2000, m0 - 1500))
            corr += 1
            cursor[7] = m0 + 2000
            t = max(cursor.values()) + rng.randint(0, 1200)
            rr.steps.append(syn.Step(100 + s, s0, t))
            t += rng.randint(1, 999)
        if shuffle:
            rng.shuffle(rr.kernels)
        else:
            rr.kernels.sort(key=lambda k: k.start_ns)
        ranks.append(rr)
    return syn.Run(world, "new", ranks)


def load_traces(trace_dir: Path) -> dict[int, list[dict]]:
    """Events per rank as HTA reads a trace directory (json.loads; rank from distributedInfo)."""
    out = {}
    for p in sorted(Path(trace_dir).glob("*.json*")):
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rb") as f:
            doc = json.loads(f.read())
        out[doc["distributedInfo"]["rank"]] = doc["traceEvents"]
    return out


# ---------------------------------------------------------------------------------------------- inline VALUES

def _json_number(ns: int, as_int: bool):
    """The µs number a Kineto file holds for ns, as json.loads returns it ('1234.567' -> float, or int)."""
    if as_int:
        assert ns % 1000 == 0
        return ns // 1000
    sign = "-" if ns < 0 else ""
    return json.loads(f"{sign}{abs(ns) // 1000}.{abs(ns) % 1000:03d}")


_DB: list[duckdb.DuckDBPyConnection] = []
_TABLES = ("kernels", "mem_ops", "api_calls", "cpu_ranges", "ranks", "files")


def _empty_db() -> duckdb.DuckDBPyConnection:
    """One catalog install per test session (it is the slow part); the canonical tables are emptied per use."""
    if not _DB:
        con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
        _DB.append(con)
    for table in _TABLES:
        _DB[0].execute(f"DELETE FROM {table}")
    return _DB[0]


def _sql(v) -> str:
    return "NULL" if v is None else str(v)


def build_db(ranks: list[dict]) -> tuple[duckdb.DuckDBPyConnection, dict[int, list[dict]]]:
    """One file per rank. A rank: {'raw': file-clock origin (ns), 'off': clock_offset_ns, 'int': whole-µs file,
    'gpu': [(table, name, start, end, corr)], 'api': [(start, corr)], 'ranges': [(name, kind, start, end)]} with
    times relative to 'raw'. Returns the DB (rows through inline VALUES) and the same data as Kineto events."""
    con = _empty_db()
    events: dict[int, list[dict]] = {}
    files, rank_rows, kern, mem, api, rng = [], [], [], [], [], []
    kid = mid = aid = rid = 0
    for r, spec in enumerate(ranks):
        fid, raw, off, as_int = r + 1, spec["raw"], spec["off"], spec["int"]
        files.append(f"({fid}, 'f{r}', 's{r}', 0, 'kineto', {off})")
        rank_rows.append(f"({r}, {fid}, 'cli')")
        ev = events[r] = []
        for table, name, s, e, corr in spec["gpu"]:
            if table == "kernels":
                kid += 1
                kern.append(f"({kid}, {fid}, {r}, 0, 7, {off + raw + s}, {off + raw + e}, '{name}', '', "
                            f"{_sql(corr)}, '')")
            else:
                mid += 1
                mem.append(f"({mid}, {fid}, {r}, 0, 7, {off + raw + s}, {off + raw + e}, 'memcpy', 'DtoD', 1, "
                           f"'{name}', {_sql(corr)})")
            ev.append({"ph": "X", "cat": "kernel" if table == "kernels" else "gpu_memcpy", "name": name,
                       "ts": _json_number(raw + s, as_int), "dur": _json_number(e - s, as_int),
                       "args": {"stream": 7} if corr is None else {"stream": 7, "correlation": corr}})
        for s, corr in spec["api"]:
            aid += 1
            api.append(f"({aid}, {fid}, {r}, 1, 1, {off + raw + s}, {off + raw + s + 1000}, 'cudaLaunchKernel', "
                       f"{corr}, 'runtime')")
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                       "ts": _json_number(raw + s, as_int), "dur": _json_number(1000, as_int),
                       "args": {"correlation": corr}})
        for name, kind, s, e in spec["ranges"]:
            rid += 1
            rng.append(f"({rid}, {fid}, {r}, {off + raw + s}, {off + raw + e}, '{name}', '{kind}')")
            ev.append({"ph": "X", "cat": kind, "name": name, "ts": _json_number(raw + s, as_int),
                       "dur": _json_number(e - s, as_int), "args": {}})
    con.execute("INSERT INTO files (file_id, path, sha256, size_bytes, source, clock_offset_ns) "
                f"VALUES {', '.join(files)}")
    con.execute(f"INSERT INTO ranks (rank, file_id, rank_source) VALUES {', '.join(rank_rows)}")
    if kern:
        con.execute("INSERT INTO kernels (kernel_id, file_id, rank, device_id, stream_id, start_ns, end_ns, name, "
                    f"short_name, correlation_id, kernel_class) VALUES {', '.join(kern)}")
        con.execute("UPDATE kernels SET short_name = kernel_short_name(name), kernel_class = kernel_class(name)")
    if mem:
        con.execute(f"INSERT INTO mem_ops VALUES {', '.join(mem)}")
    if api:
        con.execute(f"INSERT INTO api_calls VALUES {', '.join(api)}")
    if rng:
        con.execute("INSERT INTO cpu_ranges (range_id, file_id, rank, start_ns, end_ns, name, kind) "
                    f"VALUES {', '.join(rng)}")
    return con, events


def compare(con, events: dict[int, list[dict]]) -> None:
    want = hta_overlap_pct(events)
    got = {r["rank"]: r for r in analysis.run_query(con, "overlap_by_rank", {"compat": "hta"}).iter_rows(named=True)}
    for rank, (num_us, den_us, pct) in want.items():
        row = got[rank]
        assert (row["comm_overlapped_ns"], row["comm_ns"]) == (num_us * 1000, den_us * 1000), rank
        assert row["comm_overlap_pct"] == pct, rank


def _rank(gpu, api=(), ranges=(), raw=10**9, off=0, as_int=False) -> dict:
    return {"raw": raw, "off": off, "int": as_int, "gpu": list(gpu), "api": list(api), "ranges": list(ranges)}


COMM, COMP = COMM_NAMES[0], COMP_NAMES[0]


def test_lone_negative_comm_interval_counts_in_file_order():
    # N = [1.2, 1.8] µs becomes [2, 1] (length -1); P = [1.9, 5.0] becomes [2, 5]. Both start at 2 after rounding.
    # HTA's merge: N before P -> N heads its own group and the merged comm total is 3 - 1 = 2 µs;
    # P before N -> N joins P's group (2 <= running max 5) and the total is 3 µs.
    n, p, c = ("kernels", COMM, 1200, 1800, 1), ("kernels", COMM, 1900, 5000, 2), ("kernels", COMP, 0, 4000, 3)
    for gpu, comm_us in (([n, p, c], 2), ([p, n, c], 3)):
        con, ev = build_db([_rank(gpu)])
        compare(con, ev)
        row = analysis.run_query(con, "overlap_by_rank", {"compat": "hta"}).row(0, named=True)
        assert row["comm_ns"] == comm_us * 1000 and row["comm_overlapped_ns"] == 2000  # [2, 4] under compute
    # a lone negative computation interval changes nothing; an exact-mode run never sees a negative length
    con, ev = build_db([_rank([p, ("kernels", COMP, 2100, 2600, 4)])])
    compare(con, ev)
    assert analysis.run_query(con, "overlap_by_rank", {"compat": "hta"})["comm_overlapped_ns"][0] == 0
    assert analysis.run_query(con, "overlap_by_rank")["comm_overlapped_ns"][0] == 500


def test_only_sub_us_comm_gives_hta_negative_total():
    con, ev = build_db([_rank([("kernels", COMM, 1200, 1800, 1), ("kernels", COMM, 3100, 3300, 2)])])
    compare(con, ev)
    row = analysis.run_query(con, "overlap_by_rank", {"compat": "hta"}).row(0, named=True)
    assert row["comm_ns"] == -2000 and row["comm_overlap_pct"] == 0.0
    assert analysis.run_query(con, "overlap_by_rank").row(0, named=True)["comm_ns"] == 800


def test_times_are_float64_us_like_hta():
    # An epoch-µs float file: float64 has a 0.25 µs grid there. ts 1716000000000000.007 parses as ...000.0, so HTA's
    # ceil gives ...000 (exact decimal: ...001); ts + dur = ...000.0 + 2.87 rounds to ...002.75, floor ...002.
    raw = 1_716_000_000_000_000_000
    con, ev = build_db([_rank([("kernels", COMM, 7, 2877, 1), ("kernels", COMP, 0, 5000, 2)], raw=raw)])
    kernel = ev[0][0]
    assert (math.ceil(kernel["ts"]), math.floor(kernel["ts"] + kernel["dur"])) == (raw // 1000, raw // 1000 + 2)
    compare(con, ev)
    assert analysis.run_query(con, "overlap_by_rank", {"compat": "hta"})["comm_ns"][0] == 2000


def test_last_profiler_step_rule():
    # Job-wide step names: rank 0 has only ProfilerStep#1, rank 1 has #2, so HTA filters both ranks. The cut is
    # the last step start ceiled to µs (a GPU annotation counts); a launch in the same µs before it is dropped.
    # GPU work without a correlation id is an HTA "CPU operator": kept when it starts before the cut.
    k = [("kernels", COMM, 5000, 9000, 1), ("kernels", COMP, 6000, 8000, 2), ("kernels", COMM, 12000, 15000, 3),
         ("kernels", COMP, 7000, 10000, None), ("kernels", COMP, 21500, 23000, None)]
    r0 = _rank(k, api=[(4000, 1), (4500, 2), (20100, 3)],
               ranges=[("ProfilerStep#1", "user_annotation", 0, 19000),
                       ("ProfilerStep#1", "gpu_user_annotation", 20500, 30000)])
    r1 = _rank(k, api=[(4000, 1), (4000, 2), (4000, 2), (11000, 3)],
               ranges=[("ProfilerStep#2", "user_annotation", 11500, 30000)])
    r2 = _rank(k, api=[(4000, 1)])  # no step at all: HTA keeps nothing (NaN)
    con, ev = build_db([r0, r1, r2])
    compare(con, ev)
    got = analysis.run_query(con, "overlap_by_rank", {"compat": "hta"})
    assert got["comm_ns"].to_list() == [4000, 7000, 0] and got["comm_overlap_pct"][2] is None
    assert got["comm_overlapped_ns"].to_list() == [3000, 3000, 0]  # [6, 9]: the kernel without correlation counts


_t = st.one_of(st.integers(0, 12_000), st.integers(0, 60).map(lambda x: x * 100))  # clustered: ties after rounding
_dur = st.one_of(st.integers(0, 999), st.integers(0, 4000))
_gpu = st.one_of(
    st.tuples(st.just("kernels"),
              st.sampled_from(COMM_NAMES * 3 + COMP_NAMES + ["dma_copy_kernel", "cudaEventSync_kernel"]), _t, _dur),
    st.tuples(st.just("mem_ops"), st.sampled_from(["Memcpy DtoD (Device -> Device)", "Memset (Device)"]), _t, _dur))
_rank_spec = st.fixed_dictionaries({
    "raw": st.sampled_from([0, 7_000_123, 4_832_000_000_000_000, 1_716_000_000_000_000_123]),
    "int": st.booleans(),
    "gpu": st.lists(_gpu, max_size=25),
    "api": st.lists(st.tuples(st.integers(0, 24), _t), max_size=30),
    "steps": st.lists(st.tuples(st.sampled_from(["ProfilerStep#7", "ProfilerStep#8", "ProfilerStep#9"]),
                                st.sampled_from(["user_annotation", "gpu_user_annotation"]), _t), max_size=3),
})


def _materialize(spec) -> dict:
    """A whole-µs file gets every time in µs (integer ts in its JSON: HTA does not round); others get ns."""
    u = 1000 if spec["int"] else 1
    gpu = [(t, name, s * u, (s + d) * u, None if i % 7 == 6 else i + 1)  # some GPU work has no correlation id
           for i, (t, name, s, d) in enumerate(spec["gpu"])]
    api = [(s * u, i + 1) for i, s in spec["api"]]  # correlation i + 1: the i-th GPU item, if any; repeats allowed
    steps = [(name, kind, s * u, (s + 5000) * u) for name, kind, s in spec["steps"]]
    return _rank(gpu, api, steps, raw=spec["raw"] // u * u, off=10**15, as_int=spec["int"])


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(_rank_spec, min_size=1, max_size=2))
def test_hta_compat_matches_transcription(specs):
    con, ev = build_db([_materialize(s) for s in specs])
    compare(con, ev)


# ---------------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("seed", [3, 11])
def test_kineto_trace_with_sub_us_kernels_end_to_end(tmp_path, seed):
    from fixtures.kineto_writer import write_kineto
    from nsys2comm.ingest import ingest

    run = sub_us_run(seed, world=2, steps=3, per_step=120, shuffle=seed == 11)
    write_kineto(run, tmp_path, style="new")
    events = load_traces(tmp_path)
    want = hta_overlap_pct(events)
    # the trace really exercises the rounding: sub-µs kernels that end before they start once rounded
    parsed = hta_round_down_time_stamps(events[0])
    assert sum(1 for e in parsed if e["stream"] >= 0 and e["dur"] < 0) > 20
    con = catalog_db()  # the catalog template's copy (tests/synth_db.py)
    ingest(con, [tmp_path])
    got = analysis.run_query(con, "overlap_by_rank", {"compat": "hta"})
    assert got.height == 2
    for row in got.iter_rows(named=True):
        num_us, den_us, pct = want[row["rank"]]
        assert (row["comm_overlapped_ns"], row["comm_ns"], row["comm_overlap_pct"]) == \
            (num_us * 1000, den_us * 1000, pct)
