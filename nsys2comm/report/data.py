"""Fetching the report's data: catalog queries only, each failure kept as a reason instead of an exception.

Every chart, finding and table declares the catalog columns it reads with :func:`consumes`; the registry
(:data:`CONSUMERS`) is tested against the catalog's ``@column`` docs, so a renamed column fails a test instead of
making a chart or finding vanish.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from ..results import Results, declared, run_batch

# consumer -> {catalog object: columns it reads}
CONSUMERS: dict[str, dict[str, tuple[str, ...]]] = {}


def consumes(**objects: tuple[str, ...]) -> Callable:
    """Declare the catalog columns a function reads: ``@consumes(overlap_by_rank=("rank", "comm_ns"))``."""
    def mark(fn: Callable) -> Callable:
        declare(f"{fn.__module__}.{fn.__qualname__}", **objects)
        fn.consumes = objects
        return fn
    return mark


def declare(consumer: str, **objects: tuple[str, ...]) -> None:
    """Register columns read by something that is not a function (a table layout)."""
    CONSUMERS[consumer] = {name: tuple(cols) for name, cols in objects.items()}


@dataclass(frozen=True)
class Query:
    """One catalog query of the report, and when its numbers cannot be computed.

    ``needs``: job facts (keys of ``sections.FACTS``) without which the result is not available; ``empty``: why
    no rows means not available; ``all_null``: a column that, NULL on every row, means not available, and why."""

    name: str
    params: dict = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    empty: str | None = None
    all_null: tuple[str, str] | None = None
    check: Callable[[pl.DataFrame], str | None] | None = None  # rows in, why not available (None: available)


# the report's results: frames by catalog name, failures and not-available reasons in the results layer's format
Fetched = Results


def fetch(con, queries: list[Query], more: Callable[[Fetched], list[Query]] | None = None) -> Fetched:
    """Run the report's queries as one batch of the results layer (:func:`nsys2comm.results.run_batch`), each
    frame narrowed to the columns the report's consumers declare (:data:`CONSUMERS`). ``more(fetched)``, given the
    results so far, names further queries for the same batch (the timeline's step, chosen from the iterations)."""
    return run_batch(con, queries, _columns(queries), more)


def _columns(queries: list[Query]) -> dict[str, tuple[str, ...]]:
    """The columns the report reads of each object: its consumers' declarations, and a query's ``all_null``."""
    cols = declared(CONSUMERS)
    for q in queries:
        if q.all_null and q.name in cols:
            cols[q.name] = tuple(dict.fromkeys((*cols[q.name], q.all_null[0])))
    return cols
