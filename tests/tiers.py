"""Example counts of the property tests per tier.

CI's full run (the default Hypothesis profile) runs each property test with the examples its @settings asks for; the
inner loop (``make test-fast``: ``--hypothesis-profile=fast``, registered in tests/conftest.py) runs at most
``FAST_EXAMPLES`` of each, so that every property still runs there, on fewer cases."""

from __future__ import annotations

from hypothesis import settings

FAST_EXAMPLES = 8


def examples(n: int) -> int:
    """``n`` examples in the full run, at most FAST_EXAMPLES under the 'fast' profile (read at import, after pytest
    loaded the profile)."""
    return min(n, FAST_EXAMPLES) if settings.get_current_profile_name() == "fast" else n
