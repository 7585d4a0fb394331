"""One rank rule for every importer.

A trace file holds one or more GPU processes (a Kineto file: one; an nsys export: one per GPU process). Their ranks
come from, in this order:

1. ``--rank`` (``ReadOptions.rank``): the first process gets it, the next ones the following ranks ('cli');
2. the ranks the trace records for every process, when they are distinct (the importer names the source:
   'distributedInfo' for Kineto, 'nccl_comm_init' for nsys);
3. the file name, for a file with one process: ``rank-3``, ``rank3``, ``rank_3``, ``worker3_...`` ('file_name');
4. process order: 0, 1, ... ('process_order').

The world size is the one the trace records, else ``--world-size`` (``ReadOptions.world_size``), else unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import ReadOptions

_RANK_IN_NAME = [re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)", re.I), re.compile(r"^worker[-_]?(\d+)(?:[^0-9]|$)", re.I)]
_INT32_MAX = 2**31 - 1


def rank_from_file_name(name: str) -> int | None:
    for rx in _RANK_IN_NAME:
        m = rx.search(name)
        if m and int(m.group(1)) <= _INT32_MAX:
            return int(m.group(1))
    return None


@dataclass
class Ranks:
    ranks: list[int]  # one per process, in the importer's process order
    source: str  # ranks.rank_source
    world_sizes: list[int | None]
    world_from_cli: bool  # the world size came from --world-size (the importer notes it)


def resolve_ranks(file_name: str, options: ReadOptions, recorded: list[int | None], recorded_source: str,
                  recorded_world: list[int | None]) -> Ranks:
    """Ranks of a file's processes. ``recorded``/``recorded_world``: what the trace says per process (None: nothing,
    or a value outside int32, which the caller may refuse first)."""
    n = len(recorded)
    worlds = [w if w is not None and 0 < w <= _INT32_MAX else None for w in recorded_world]
    from_cli = False
    if options.world_size is not None and any(w is None for w in worlds):
        worlds = [options.world_size if w is None else w for w in worlds]
        from_cli = True
    if options.rank is not None:
        return Ranks([options.rank + i for i in range(n)], "cli", worlds, from_cli)
    if n and all(r is not None and 0 <= r <= _INT32_MAX for r in recorded) and len(set(recorded)) == n:
        return Ranks(list(recorded), recorded_source, worlds, from_cli)
    r = rank_from_file_name(file_name) if n == 1 else None
    if r is not None:
        return Ranks([r], "file_name", worlds, from_cli)
    return Ranks(list(range(n)), "process_order", worlds, from_cli)
