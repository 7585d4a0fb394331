"""The prelude's small SQL helpers on inline values, against a brute-force count in Python."""

from __future__ import annotations

import random
from collections import Counter

import pytest


def _most_common(con, values: list) -> object:
    con.execute("CREATE OR REPLACE TEMP TABLE v (x VARCHAR)")
    if values:
        con.executemany("INSERT INTO v VALUES (?)", [(x,) for x in values])
    return con.execute("SELECT _prelude_most_common(histogram(x)) FROM v").fetchall()[0][0]


@pytest.mark.parametrize("seed", range(20))
def test_most_common_is_the_most_frequent_value_and_the_smaller_on_ties(con, seed):
    rng = random.Random(seed)
    values = [rng.choice(["bfloat16", "float32", "float16", None]) for _ in range(rng.randint(0, 30))]
    counts = Counter(x for x in values if x is not None)
    expected = min((-n, x) for x, n in counts.items())[1] if counts else None
    assert _most_common(con, values) == expected
    rng.shuffle(values)  # the order rows arrive in does not matter
    assert _most_common(con, values) == expected


def test_most_common_ties_and_nothing(con):
    assert _most_common(con, ["send", "recv"]) == "recv"
    assert _most_common(con, ["recv", "send"]) == "recv"
    assert _most_common(con, ["send", "send", "recv"]) == "send"
    assert _most_common(con, [None, None]) is None
    assert _most_common(con, []) is None
    assert con.execute("SELECT _prelude_most_common(histogram(x)) FROM (VALUES (8), (4), (4), (8), (2)) t(x)"
                       ).fetchall()[0][0] == 4
