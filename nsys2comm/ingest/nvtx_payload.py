"""NVTX extended payloads in Nsight Systems SQLite exports (``NVTX_EVENTS.binaryData``), decoded with the
export's schema tables into the NCCL fields nsys2comm uses.

What was verified, and against what
    Schema tables (nsys export DDL 3.25.0, ``NVTX_PAYLOAD_*`` in the Post-Collection Analysis Guide; absent in
    2.9.1/3.0.0 exports; lazy exports create them only when they hold rows):
      * ``NVTX_PAYLOAD_SCHEMA_ENTRIES(domainId, schemaId, idx, flags, type, name, description, arrayOrUnionDetail,
        offset)`` mirrors ``nvtxPayloadSchemaEntry_t`` of NVIDIA/NVTX ``c/include/nvtx3/nvToolsExtPayload.h``
        (fields flags, type, name, description, arrayOrUnionDetail, offset). The header says an entry without an
        offset is placed "from natural alignment rules"; real exports store NULL for offset 0 and NCCL sets every
        other offset, so a NULL offset is taken as the next naturally aligned position.
      * ``type`` is ``NVTX_PAYLOAD_ENTRY_TYPE_*`` (same header): 1..10 C char/short/int/long/long long (signed,
        unsigned), 11..18 int8..uint64, 19 float, 20 double, 22 size_t, 23 address, 24..27 wchar/char8/16/32,
        68/69 uint32 category/colour, 70 uint64 scope, 71..74 pid/tid u32/u64. Sizes of 1..27 are platform
        dependent; they are read as on LP64 Linux (long, size_t, pointers 8 bytes), where NCCL runs. A type
        >= ``NVTX_PAYLOAD_SCHEMA_ID_STATIC_START`` (1 << 24) names another schema: an enum registered with
        ``nvtxPayloadEnumRegister`` (``nvtxPayloadEnumAttr_t.sizeOfEnum`` -> ``NVTX_PAYLOAD_ENUMS.size``; 4 bytes
        when that table is absent, as ``sizeof(ncclRedOp_t)``) or a nested struct schema (skipped).
      * ``NVTX_PAYLOAD_ENUM_ENTRIES(domainId, schemaId, idx, name, value, isFlag)`` mirrors ``nvtxPayloadEnum_t``
        (name, value, isFlag); NCCL registers ``NvtxEnumRedSchema`` (src/init_nvtx.cc): Sum, Product, Max, Min,
        Avg with ``ncclRedOp_t`` values; decoded to those names when the table is present, else kept as numbers.
      * The tables have no process column: one copy per process; rows are de-duplicated on (domainId, schemaId,
        idx) (observed on the 2-process fastvideo export).
    NCCL's layouts (NVIDIA/nccl ``src/include/nvtx_payload_schemas.h``, NCCL >= 2.25; ``commHash`` first):
      CommInitRank/Config/Scalable/Destroy/Abort {u64 comm @0, int nranks @8, int rank @12, int cudaDev @16};
      CommSplit {u64 comm @0, u64 parent @8, int nranks @16, rank @20, cudaDev @24, color @28, key @32};
      AllGather {u64 comm @0, size_t bytes @8}; AllReduce, ReduceScatter {comm, bytes, ncclRedOp_t op @16};
      Broadcast {comm, bytes, int root @16}; Reduce {comm, bytes, int root @16, op @20};
      Send/Recv {comm, bytes, int peer @16}. Labels: 'NCCL communicator ID', 'No. of ranks', 'Rank',
      'CUDA device', 'Message size [bytes]', 'Reduction operation', 'Root', 'Peer rank', 'Parent NCCL
      communicator ID', 'Color', 'Key'. NCCL 2.16-2.24 lack the communicator and label p2p sizes 'Bytes'.
      The schema rows of the real 2026.2 export (fastvideo-train) match these offsets and types field by field.
    The blob (not documented by NVIDIA): NVTX hands the tool ``nvtxPayloadData_t {u64 schemaId; size_t size;
      const void* payload}``; nsys stores a 32-byte little-endian header then the payload bytes. Two public
      reverse-engineered readings (GindaChen/nsys-ai ``nccl_communicator.py`` and ``nccl_payload_breakdown.py``)
      agree on bytes 8..15 = schema id, 16..23 = payload size, payload at byte 32, and disagree on bytes 24..31
      (payload offset vs total size): those are not relied upon. The payload size bounds every field read.
    No real blob was available (the shared exports were made without ``--include-blobs=true``): the fixtures in
    ``fixtures/nsys_writer.py`` are built from the layouts above and the decoder is tested on them.
"""

from __future__ import annotations

import struct

import orjson

HEADER_BYTES = 32
SCHEMA_ID_STATIC_START = 1 << 24
ENUM_DEFAULT_BYTES = 4  # sizeof(ncclRedOp_t), a C enum
# NVTX_PAYLOAD_ENTRY_TYPE_* -> struct format, LP64 little endian
ENTRY_FORMAT = {1: "b", 2: "B", 3: "h", 4: "H", 5: "i", 6: "I", 7: "q", 8: "Q", 9: "q", 10: "Q",
                11: "b", 12: "B", 13: "h", 14: "H", 15: "i", 16: "I", 17: "q", 18: "Q",
                19: "f", 20: "d", 22: "Q", 23: "Q", 24: "i", 25: "B", 26: "H", 27: "I",
                68: "I", 69: "I", 70: "Q", 71: "I", 72: "Q", 73: "I", 74: "Q"}
# NCCL's entry labels -> cpu_ranges.args keys ('Bytes' is the p2p label of NCCL 2.16-2.24)
ENTRY_KEYS = {"message size [bytes]": "msg_bytes", "bytes": "msg_bytes", "peer rank": "peer",
              "nccl communicator id": "comm_id", "no. of ranks": "nranks", "rank": "rank", "root": "root",
              "cuda device": "cuda_device", "reduction operation": "redop",
              "parent nccl communicator id": "parent_comm_id", "color": "color", "key": "key"}
_ID_KEYS = ("comm_id", "parent_comm_id")  # 64-bit hashes: kept as text (JSON numbers lose them)


class PayloadDecoder:
    """Plans per (domainId, schemaId): the NCCL fields to read, their formats and offsets."""

    def __init__(self, con, tables: set[str], cols):
        self.plans: dict[tuple[int, int], tuple[list[str], struct.Struct, dict]] = {}
        self._by_sid: dict[int, tuple] = {}
        self._cache: dict[tuple[int, bytes], str | None] = {}
        t = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
        if t not in tables or not {"domainId", "schemaId", "idx", "name", "type"} <= cols(t):
            return
        enum_size, enum_names = _enums(con, tables, cols)
        structs = set()
        if "NVTX_PAYLOAD_SCHEMAS" in tables and {"domainId", "schemaId"} <= cols("NVTX_PAYLOAD_SCHEMAS"):
            structs = set(con.execute("SELECT DISTINCT domainId, schemaId FROM NVTX_PAYLOAD_SCHEMAS").fetchall())
        off = '"offset"' if "offset" in cols(t) else "NULL"
        entries: dict[tuple[int, int], dict[int, tuple]] = {}
        for dom, sid, idx, name, typ, o in con.execute(
                f'SELECT domainId, schemaId, idx, name, "type", {off} FROM {t} ORDER BY domainId, schemaId, idx'):
            entries.setdefault((dom, sid), {}).setdefault(idx, (name, typ, o))  # first copy of each entry
        for key, ents in entries.items():
            plan = _plan(key[0], [ents[i] for i in sorted(ents)], enum_size, enum_names, structs)
            if plan:
                self.plans[key] = plan
                self._by_sid.setdefault(key[1], plan)

    @property
    def entries(self) -> bool:
        return bool(self.plans)

    def decode(self, domain_id, blob) -> dict | None:
        if not self.plans or not isinstance(blob, bytes) or len(blob) < HEADER_BYTES:
            return None
        sid = int.from_bytes(blob[8:16], "little")
        size = int.from_bytes(blob[16:24], "little")
        plan = self.plans.get((domain_id, sid)) or self._by_sid.get(sid)
        if plan is None:
            return None
        keys, st, names = plan
        if st.size > size or len(blob) < HEADER_BYTES + st.size:
            return None  # fields beyond the payload the blob says it holds: not this layout
        out = dict(zip(keys, st.unpack_from(blob, HEADER_BYTES), strict=False))
        for k in _ID_KEYS:
            if k in out:
                out[k] = str(out[k])
        for k, m in names.items():
            out[k] = m.get(out[k], out[k])
        return out

    def decode_json(self, domain_id, blob) -> str | None:
        key = (domain_id, blob)
        got = self._cache.get(key, False)
        if got is False:
            d = self.decode(domain_id, blob)
            got = orjson.dumps(d).decode() if d else None
            if len(self._cache) > 200_000:
                self._cache.clear()
            self._cache[key] = got
        return got


def _enums(con, tables, cols) -> tuple[dict, dict]:
    sizes: dict[tuple[int, int], int] = {}
    names: dict[tuple[int, int], dict[int, str]] = {}
    t = "NVTX_PAYLOAD_ENUMS"
    if t in tables and {"domainId", "schemaId", "size"} <= cols(t):
        for dom, sid, size in con.execute(f'SELECT DISTINCT domainId, schemaId, "size" FROM {t}'):
            if size in (1, 2, 4, 8):
                sizes[(dom, sid)] = size
    t = "NVTX_PAYLOAD_ENUM_ENTRIES"
    if t in tables and {"domainId", "schemaId", "name", "value"} <= cols(t):
        for dom, sid, name, value in con.execute(f"SELECT DISTINCT domainId, schemaId, name, value FROM {t}"):
            if isinstance(value, int) and name:
                names.setdefault((dom, sid), {}).setdefault(value, name)
    return sizes, names


def _plan(dom, ents, enum_size, enum_names, structs):
    """struct layout of the known NCCL fields of one schema; None when it has none."""
    keys, fmt, pos, end, names = [], "<", 0, 0, {}
    for i, (name, typ, off) in enumerate(ents):
        if typ is None:
            return _finish(keys, fmt, names)  # unknown size: later offsets cannot be trusted without offsets
        if typ >= SCHEMA_ID_STATIC_START:
            if (dom, typ) in structs and (dom, typ) not in enum_size:
                return _finish(keys, fmt, names)  # nested struct: its size is not in this table
            size = enum_size.get((dom, typ), ENUM_DEFAULT_BYTES)
            f = {1: "b", 2: "h", 4: "i", 8: "q"}[size]
        else:
            f = ENTRY_FORMAT.get(typ)
            if f is None:
                return _finish(keys, fmt, names)
            size = struct.calcsize("<" + f)
        if off is None:
            off = 0 if i == 0 else -(-end // size) * size  # natural alignment after the previous entry
        end = off + size
        key = ENTRY_KEYS.get((name or "").strip().lower())
        if key is None or key in keys or off < pos:
            continue
        fmt += (f"{off - pos}x" if off > pos else "") + f
        pos = end
        keys.append(key)
        if typ >= SCHEMA_ID_STATIC_START and (dom, typ) in enum_names:
            names[key] = enum_names[(dom, typ)]
    return _finish(keys, fmt, names)


def _finish(keys, fmt, names):
    return (keys, struct.Struct(fmt), names) if keys else None
