"""Kernel base names and classes: the SQL rules (kernel_short_name, kernel_class in queries/prelude/classify.sql)
against a reviewed corpus of real kernel names (fixtures/kernel_names/corpus.csv), against an independent
bracket-scanning oracle on generated C++ signatures, and across sources (the same kernels written as Kineto JSON
and as an nsys export)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.kernel_names.build_corpus import kineto_kernel_names, nsys_kernel_names
from fixtures.kernel_names.reference_parser import base_name

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_names" / "corpus.csv"


def _corpus_rows() -> list[dict]:
    with open(CORPUS, newline="") as f:
        return list(csv.DictReader(f))


ROWS = _corpus_rows()
CLASSES = {"communication", "memory", "convolution", "attention", "gemm", "compute"}
RETURN_TYPES = ("void", "std::enable_if", "std::enable_if::type", "typename", "auto")

# Every name shape quoted in issue 17, with what it must give (these rows must be in the corpus).
ISSUE_SHAPES = {
    "void std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
    "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, "
    "float, int, int)": "vllm::fused_add_rms_norm_kernel",
    "void <unnamed>::softmax_warp_forward<float, float, float, (int)6, (bool)0, (bool)0>(T2 *, const T1 *, int, int, "
    "int, const bool *, int, bool)": "(anonymous namespace)::softmax_warp_forward",
    "void at::native::<unnamed>::CatArrayBatchedCopy_vectorized<at::native::<unnamed>::OpaqueType<(unsigned int)2>, "
    "unsigned int, (int)1, (int)128, (int)1, (int)16, (int)8>(char *, at::native::<unnamed>::CatArrInputTensorMetadata"
    "<T1, T2, T4, T5>, at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, int, T2)":
        "at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized",
}



@pytest.fixture(scope="module")
def sql_results(con):
    names = [r["name"] for r in ROWS]
    got = con.execute("SELECT n, kernel_short_name(n), kernel_class(n) FROM unnest(?) t(n)", [names]).fetchall()
    return {n: (s, k) for n, s, k in got}


def test_corpus_size_and_review():
    names = [r["name"] for r in ROWS]
    assert len(names) == len(set(names)) >= 200
    assert {r["expected_class"] for r in ROWS} <= CLASSES, "a corpus row awaits review (REVIEW) or has a bad class"
    assert all(r["origin"].strip() for r in ROWS)
    assert sum(r["source"] == "public" for r in ROWS) >= 100


def test_issue_shapes_in_corpus():
    by_name = {r["name"]: r for r in ROWS}
    for name, short in ISSUE_SHAPES.items():
        assert by_name[name]["expected_short_name"] == short


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["name"][:80])
def test_corpus_row(row, sql_results):
    short, cls = sql_results[row["name"]]
    assert short == row["expected_short_name"]
    assert cls == row["expected_class"]


def test_gemm_families_have_a_class(sql_results):
    """Each GEMM family the issue lists is present and classed (MIOpen igemm as convolution, by decision)."""
    families = {"nvjet_": "gemm", "sm90_xmma_gemm": "gemm", "cutlass3x_": "gemm", "cutlass::Kernel<": "gemm",
                "Cijk_": "gemm", "ck::kernel_gemm": "gemm", "triton_tem_fused_mm": "gemm", "gemv": "gemm",
                "igemm_fwd": "convolution", "naive_conv": "convolution", "ampere_sgemm": "gemm",
                "reshape_and_cache_flash": "compute", "ncclDevKernel": "communication", "flash_fwd": "attention"}
    for part, cls in families.items():
        hits = [sql_results[r["name"]][1] for r in ROWS if part in r["name"]]
        assert hits and set(hits) == {cls}, (part, hits)


def _check_base(short: str, name: str) -> None:
    assert short and short.strip() == short
    assert not short.endswith("::") and not short.startswith("::")
    assert short.split("::")[0] not in RETURN_TYPES and not short.startswith("void ")
    assert "<unnamed>" not in short


def test_invariants_on_corpus(sql_results):
    for name, (short, _) in sql_results.items():
        _check_base(short, name)


@pytest.mark.slow  # tier: slow (over 1 s in the fast profile)
def test_corpus_covers_every_trace_name(shared_traces):
    """The corpus holds every distinct kernel name of the shared traces (rebuild with build_corpus otherwise)."""
    corpus = {r["name"] for r in ROWS if r["source"] in ("nsys", "kineto")}
    found = set()
    for p in sorted((shared_traces / "nsys").glob("*.sqlite")):
        found |= nsys_kernel_names(p)
    for p in sorted((shared_traces / "kineto").glob("*/*.json*")):
        found |= kineto_kernel_names(p)
    assert found and found == corpus


# --- generated signatures: the SQL rule against the oracle ------------------------------------------------------

IDENT = st.sampled_from(["foo", "at", "native", "cub", "vllm", "Kernel", "kernel_impl", "flash", "T1", "ck",
                         "(anonymous namespace)", "<unnamed>", "detail", "x"])


def _qualified(draw) -> str:
    return "::".join(draw(st.lists(IDENT, min_size=1, max_size=4)))


@st.composite
def template_arg(draw, depth=0):
    kind = draw(st.sampled_from(["int", "cast", "type", "cmp", "func"] + (["nested"] if depth < 3 else [])))
    if kind == "int":
        return str(draw(st.integers(0, 4096))) + draw(st.sampled_from(["", "ul", "l", "u"]))
    if kind == "cast":
        return f"({draw(st.sampled_from(['int', 'bool', 'unsigned long']))}){draw(st.integers(0, 9))}"
    if kind == "cmp":
        return f"((({draw(st.integers(0, 9))})>({draw(st.integers(0, 9))})))"
    if kind == "func":
        return f"&(float {_qualified(draw)}<float>(float const&))"
    if kind == "nested":
        args = draw(st.lists(template_arg(depth + 1), min_size=1, max_size=3))
        return f"{_qualified(draw)}<{', '.join(args)}>"
    return draw(st.sampled_from(["float", "c10::BFloat16", "__nv_bfloat16 const*", "char *"]))


@st.composite
def signature(draw):
    ret = draw(st.sampled_from(["", "void ", "std::enable_if<(((8)>(0))), void>::type ",
                                "void std::enable_if<true, void>::type "]))
    name = _qualified(draw)
    targs = draw(st.lists(template_arg(), max_size=4))
    t = f"<{', '.join(targs)}>" if targs else ""
    params = draw(st.sampled_from(["", "()", "(int, float*)", "(T2 *, const T1 *, int)", "(char*, at::Tensor&)"]))
    lam = draw(st.sampled_from(["", "::{lambda(int)#1}::operator()() const",
                                "::[lambda(int) (instance 2)]::operator ()() const"]))
    return f"{ret}{name}{t}{params}{lam if params else ''}"


@pytest.mark.slow  # tier: slow (brute force over generated cases; CI runs it)
@settings(max_examples=150, deadline=None)
@given(names=st.lists(signature(), min_size=1, max_size=20))
def test_sql_matches_oracle_on_generated_signatures(con, names):
    got = con.execute("SELECT n, kernel_short_name(n) FROM unnest(?) t(n)", [names]).fetchall()
    for n, short in got:
        assert short == base_name(n), n
        _check_base(short, n)


# --- the same kernels from nsys and from Kineto -----------------------------------------------------------------

# (Kineto / c++filt spelling, nsys spelling) of the same kernels
SAME_KERNELS = [
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous namespace)::"
     "OpaqueType<2u>, unsigned int, 1, 128, 1, 16, 8>(char*, at::native::(anonymous namespace)::"
     "CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 128, 1>, "
     "at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)",
     "void at::native::<unnamed>::CatArrayBatchedCopy_vectorized<at::native::<unnamed>::OpaqueType<(unsigned int)2>, "
     "unsigned int, (int)1, (int)128, (int)1, (int)16, (int)8>(char *, at::native::<unnamed>::"
     "CatArrInputTensorMetadata<T1, T2, T4, T5>, at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, "
     "int, T2)"),
    ("void std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
     "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, "
     "float, int, int)",
     "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
     "vllm::fused_add_rms_norm_kernel<c10::BFloat16, (int)8>(c10::BFloat16 *, c10::BFloat16 *, const c10::BFloat16 *, "
     "float, int, int)"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 6, false, false>(float*, float const*, "
     "int, int, int, bool const*, int, bool)",
     "void <unnamed>::softmax_warp_forward<float, float, float, (int)6, (bool)0, (bool)0>(T2 *, const T1 *, int, int, "
     "int, const bool *, int, bool)"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar("
     "at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()"
     "() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, float, "
     "std::array<char*, 2ul>)",
     "void at::native::vectorized_elementwise_kernel<(int)4, at::native::<unnamed>::launch_clamp_scalar("
     "at::TensorIteratorBase &, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::[lambda() (instance 1)]"
     "::operator ()() const::[lambda() (instance 7)]::operator ()() const::[lambda(float) (instance 1)], "
     "std::array<char *, (unsigned long)2>>(int, T2, T3)"),
    ("void at::native::(anonymous namespace)::foo_kernel<float>(float*)::{lambda()#1}::operator()() const",
     "void at::native::<unnamed>::foo_kernel<float>(float *)::[lambda() (instance 1)]::operator ()() const"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align1>"
     "(cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align1::Params)",
     "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align1>(T1::Params)"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>"
     "(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, __nv_bfloat16*, long const*, long, long, long, "
     "long, long, int, int, int, float const*, float const*)",
     "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>"
     "(const __nv_bfloat16 *, const __nv_bfloat16 *, __nv_bfloat16 *, __nv_bfloat16 *, const long *, long, long, "
     "long, long, long, int, int, int, const float *, const float *)"),
]


def test_cross_source_same_short_name_and_class(tmp_path, monkeypatch):
    from fixtures import nsys_writer
    from fixtures.kineto_writer import write_kineto
    from fixtures.synthetic import make_run
    from nsys2comm.ingest import ingest
    from nsys2comm.storage import db

    run = make_run(world_size=2, steps=1, era="new")
    to_nsys = dict(SAME_KERNELS)
    compute = [k for rr in run.ranks for k in rr.kernels if "nccl" not in k.name]
    assert len(compute) >= len(SAME_KERNELS)
    for i, k in enumerate(compute):
        k.name = SAME_KERNELS[i % len(SAME_KERNELS)][0]
    real = nsys_writer.nsys_demangled
    monkeypatch.setattr(nsys_writer, "nsys_demangled", lambda n: to_nsys.get(n) or real(n))

    def rows(paths):
        c = db.connect(None)
        assert all(r.status == "ingested" for r in ingest(c, paths, jobs=1))
        return c.execute("SELECT rank, start_ns, name, short_name, kernel_class FROM kernels "
                         "WHERE kernel_class <> 'communication' ORDER BY rank, start_ns").fetchall()

    kin = rows(write_kineto(run, tmp_path / "kineto", style="new"))
    nsy = rows([nsys_writer.write_nsys(run, tmp_path / "run.sqlite")])
    assert len(kin) == len(nsy) == len(compute)
    # the full names do differ between the two sources
    assert sum(a[2] != b[2] for a, b in zip(kin, nsy, strict=False)) > 0
    assert [(a[0], a[1], a[3], a[4]) for a in kin] == [(b[0], b[1], b[3], b[4]) for b in nsy]
    assert {a[3] for a in kin} >= {base_name(k) for k, _ in SAME_KERNELS}


def test_base_names_end_in_the_nsys_short_name(con, shared_traces):
    """nsys stores its own unqualified short name beside every demangled name: the last component of our base name
    must be that name (checked on every kernel name of the shared nsys exports)."""
    import sqlite3

    pairs = set()
    for p in sorted((shared_traces / "nsys").glob("*.sqlite")):
        db = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        pairs |= set(db.execute("SELECT DISTINCT d.value, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                "JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName"))
        db.close()
    assert pairs
    got = con.execute("SELECT n, s, kernel_short_name(n) FROM (SELECT unnest(?) n, unnest(?) s)",
                      [[d for d, _ in pairs], [s for _, s in pairs]]).fetchall()
    assert [(n, s, b) for n, s, b in got if b.split("::")[-1] != s] == []


def test_python_comm_rule_is_the_sql_rule(con):
    """One definition of a communication kernel: the importer's _COMM_KERNEL_RE (which kernels get their args
    staged) says what SQL is_comm_kernel_name says, on every corpus name and on each of them without 'void '."""
    from nsys2comm.ingest.kineto_rows import _COMM_KERNEL_RE

    names = [r["name"] for r in ROWS]
    names += [n[5:] for n in names if n.startswith("void ")]
    got = dict(con.execute("SELECT n, is_comm_kernel_name(n) FROM unnest(?) t(n)", [names]).fetchall())

    def py(n: str) -> bool:
        return bool(_COMM_KERNEL_RE.search(n[5:] if n.startswith("void ") else n))

    assert {n: py(n) for n in names} == got
    assert sum(got.values()) >= 20 and not all(got.values())
    # the corpus' communication rows are exactly those
    assert {r["name"] for r in ROWS if r["expected_class"] == "communication"} == {r["name"] for r in ROWS
                                                                                  if got[r["name"]]}
