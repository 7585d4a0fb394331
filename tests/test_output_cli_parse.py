"""``nsys2comm query``'s plain parse (``cli.plain_query_args``, which spares a fresh process typer's parse) gives the
command the same values as typer's parse of the same arguments, and leaves to typer what it is not sure of."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from nsys2comm import cli


class _Stop(BaseException):
    """Raised where the command would open the job: past every parsed value (not caught by cli._errors)."""


def _values(monkeypatch, run) -> dict:
    """What ``query`` received, as the values it hands on before opening the job."""
    got: dict = {}

    def params(pairs):
        got["param"] = list(pairs) if pairs is not None else None
        return {}

    def marker(name, params, marker):
        got.update(name=name, step_marker=marker)
        return params

    def fmt(f, out):
        got.update(fmt=f, fmt_type=type(f), output=out, output_type=type(out))
        return "csv"

    def columns(c):
        got["columns"] = c
        return None

    def stop(sources, **kw):
        got["sources"] = list(sources)
        raise _Stop

    monkeypatch.setattr(cli, "parse_params", params)
    monkeypatch.setattr(cli, "_with_step_marker", marker)
    monkeypatch.setattr(cli.out_, "infer_format", fmt)
    monkeypatch.setattr(cli.out_, "parse_columns", columns)
    monkeypatch.setattr(cli, "_check_query", lambda name, params: None)
    monkeypatch.setattr(cli, "_open", stop)
    with pytest.raises(_Stop):
        run()
    return got


def _same_as_typer(monkeypatch, argv: list[str]) -> bool:
    plain = cli.plain_query_args(argv)
    if plain is None:
        return False
    mine = _values(monkeypatch, lambda: cli.query(**plain))
    typers = _values(monkeypatch, lambda: cli.app(argv, prog_name="nsys2comm", standalone_mode=False))
    assert mine == typers, argv
    return True


_OPTIONS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["-f", "--format"]), st.sampled_from(["csv", "CSV", "Json", "table", "markdown"])),
    st.tuples(st.sampled_from(["-o", "--output"]), st.sampled_from(["rows.csv", "out dir/x.json", "-", "r.parquet"])),
    st.tuples(st.sampled_from(["-p", "--param"]), st.sampled_from(["max_segments=50", "marker=train_step 12", "a="])),
    st.tuples(st.sampled_from(["-c", "--columns"]), st.sampled_from(["rank,busbw_gbps", "start_us", " a , b"])),
    st.tuples(st.just("--step-marker"), st.sampled_from(["train_step", "step 3", "ProfilerStep#"])),
), max_size=5)


# tier 2: argument lists built from query's options, in any order and both spellings (`--opt v`, `--opt=v`)
@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.sampled_from(["run.duckdb", "a.sqlite", "dir/", "b c.json"]), min_size=1, max_size=3),
       st.sampled_from(["run_overview", "step_timeline", "nope"]), _OPTIONS, st.booleans(), st.integers(0, 5))
def test_plain_parse_gives_what_typer_gives(sources, name, options, joined, at):
    with pytest.MonkeyPatch.context() as mp:
        groups = [[f"{opt}={value}"] if joined and opt.startswith("--") else [opt, value] for opt, value in options]
        at = min(at, len(groups))  # the arguments go between two options, never between an option and its value
        argv = ["query", *sum(groups[:at], []), *sources, name, *sum(groups[at:], [])]
        once = {o for o, _ in options if o not in ("-p", "--param")}
        dests = [cli._PLAIN_QUERY_OPTS[o] for o, _ in options if o in once]
        plain = cli.plain_query_args(argv)
        if len(dests) == len(set(dests)) and not any(v == "-" for _, v in options):
            assert plain is not None, argv  # plain arguments take the plain parse
        _same_as_typer(mp, argv)


# tier 2: what the plain parse leaves to typer (help, other options, values it does not check, odd spellings)
@pytest.mark.parametrize("argv", [
    ["query", "run.duckdb"], ["query", "-h"], ["query", "run.duckdb", "x", "--help"],
    ["query", "run.duckdb", "x", "--relative"], ["query", "run.duckdb", "x", "--timeunit", "us"],
    ["query", "run.duckdb", "x", "-fcsv"], ["query", "run.duckdb", "x", "-f=csv"], ["query", "run.duckdb", "x", "-f"],
    ["query", "run.duckdb", "x", "-f", "xml"], ["query", "run.duckdb", "x", "-f", "csv", "-f", "json"],
    ["query", "run.duckdb", "x", "--", "-y"], ["query", "run.duckdb", "x", "-o", "-"],
    ["query", "run.duckdb", "x", "-o", "."], ["--debug", "query", "run.duckdb", "x"], ["sql", "run.duckdb", "x"],
])
def test_plain_parse_leaves_the_rest_to_typer(argv):
    assert cli.plain_query_args(argv) is None


def test_plain_parse_values(monkeypatch):
    assert _same_as_typer(monkeypatch, ["query", "a.duckdb", "b.duckdb", "step_timeline", "-p", "max_segments=5",
                                        "--param=x=1", "--format=TSV", "-o", "rows.tsv", "-c", "rank"])
    assert cli.plain_query_args(["query", "r.duckdb", "run_overview"]) == {
        "sources": ["r.duckdb"], "name": "run_overview", "param": None}
