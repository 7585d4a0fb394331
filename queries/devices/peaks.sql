-- @include prelude/schema.sql
-- @include skew/skew.sql
-- Physical peaks of the devices and networks a job ran on, as a bus bandwidth (nccl-tests busbw, GB/s = 1e9 B/s).
-- The peak of a link is its bandwidth per direction per GPU: without reduction inside the network, every collective
-- has each rank send (or receive) at least busbw × time bytes (Patarasuk & Yuan's bound for all-reduce, the
-- (n−1)/n share for the others), so busbw never exceeds it. Exceptions, applied as an allowance (a factor on the
-- per-direction figure) so that a peak stays an upper bound:
--   * in-network reduction: an all_reduce can reach 2(n−1)/n × the per-direction figure, since each rank then sends
--     its S and receives the S result once (NVLink SHARP / NVLS on NVLink4+ switches, e.g. 482 GB/s measured on 8×H200
--     against 450 GB/s NVLink4; SHARP on networks: assumed possible for every group that spans hosts);
--   * groups spanning hosts: the network figure is per host (all its NICs); hierarchical algorithms move only the
--     data that leaves a host, so all_gather / reduce_scatter can reach (n−1)/(n−g) × it, with g the fewest ranks of
--     the group on one host, and all_to_all (n−1)/(g(n−g)) with g(n−g) the largest over hosts.
-- Sources and the per-model figures: docs/device-peaks.md. Overrides: --link-gbps (DuckDB variable
-- nsys2comm_link_gbps, per GPU per direction) and --nic-gbps (nsys2comm_nic_gbps, per host per direction). These
-- read session variables: no stored sweep may use them.

-- @macro device_link_peaks
-- The peak table: per GPU model, its interconnect and bandwidth per direction per GPU (GB/s), matched on devices.name
-- by name_pattern (RE2, case-insensitive; the first matching row in ord order wins, so PCIe variants come before
-- the SXM part of the same name). PCIe cards that accept an NVLink (or Infinity Fabric) bridge carry the bridge's
-- figure for groups of at most bridge_ranks GPUs: a trace cannot tell whether a bridge was fitted, and a peak must
-- stay an upper bound. Figures are the vendors' (half of the bidirectional totals they quote); see docs/device-peaks.md.
-- @column ord: Match order (lower first).
-- @column model [key]: Model family (e.g. 'H100 SXM').
-- @column name_pattern: RE2 pattern matched against devices.name.
-- @column interconnect [key]: GPU-to-GPU link ('NVLink4', 'PCIe 4.0', 'xGMI', ...).
-- @column link_gbps [key]: Link bandwidth per direction per GPU (GB/s): the highest busbw the link allows without in-network reduction.
-- @column bridge_gbps: Bridge bandwidth per direction per GPU of a PCIe card's optional NVLink / Infinity Fabric bridge (GB/s), else NULL.
-- @column bridge_ranks: Most GPUs one bridge connects (groups up to this size may use bridge_gbps), else NULL.
-- @column in_network_reduction: True when the GPUs' switch can reduce in the network (NVLink SHARP / NVLS), so an all_reduce may exceed link_gbps.
CREATE OR REPLACE MACRO device_link_peaks() AS TABLE
SELECT * FROM (VALUES
  (10, 'B300 / GB300', '(?i)\bG?B300\b', 'NVLink5', 900.0, NULL::DOUBLE, NULL::INTEGER, true),
  (11, 'B200 / GB200 / B100', '(?i)\b(?:G?B200|B100)\b', 'NVLink5', 900.0, NULL, NULL, true),
  (20, 'H200 NVL', '(?i)H200 NVL', 'PCIe 5.0', 63.0, 450.0, 4, false),
  (21, 'H200 SXM', '(?i)H200', 'NVLink4', 450.0, NULL, NULL, true),
  (22, 'H100 NVL', '(?i)H100 NVL', 'PCIe 5.0', 63.0, 300.0, 2, false),
  (23, 'H100 PCIe', '(?i)H100.*PCIe', 'PCIe 5.0', 63.0, 300.0, 2, false),
  (24, 'GH200', '(?i)GH200', 'NVLink4', 450.0, NULL, NULL, true),
  (25, 'H100 SXM', '(?i)H100', 'NVLink4', 450.0, NULL, NULL, true),
  (26, 'H800 PCIe', '(?i)H800.*PCIe', 'PCIe 5.0', 63.0, 200.0, 2, false),
  (27, 'H800 SXM', '(?i)H800', 'NVLink4', 200.0, NULL, NULL, true),
  (28, 'H20', '(?i)\bH20\b', 'NVLink4', 450.0, NULL, NULL, true),
  (30, 'A800 PCIe', '(?i)A800.*PCIe', 'PCIe 4.0', 31.5, 200.0, 2, false),
  (31, 'A800 SXM', '(?i)A800', 'NVLink3', 200.0, NULL, NULL, false),
  (32, 'A100 PCIe', '(?i)A100.*PCIe', 'PCIe 4.0', 31.5, 300.0, 2, false),
  (33, 'A100 SXM', '(?i)A100', 'NVLink3', 300.0, NULL, NULL, false),
  (34, 'A30', '(?i)\bA30\b', 'PCIe 4.0', 31.5, 100.0, 2, false),
  (35, 'A40 / RTX A6000', '(?i)\bA40\b|RTX A6000', 'PCIe 4.0', 31.5, 56.25, 2, false),
  (36, 'L40S / L40 / L4 / A10 / A16 / A2 / RTX 6000 Ada', '(?i)\b(?:L40S|L40|L4|A10G?|A16|A2)\b|RTX 6000 Ada', 'PCIe 4.0', 31.5, NULL, NULL, false),
  (40, 'V100 PCIe', '(?i)V100.*PCIe|V100S', 'PCIe 3.0', 15.75, NULL, NULL, false),
  (41, 'V100 SXM2 / SXM3', '(?i)V100', 'NVLink2', 150.0, NULL, NULL, false),
  (42, 'P100 PCIe', '(?i)P100.*PCIe', 'PCIe 3.0', 15.75, NULL, NULL, false),
  (43, 'P100 SXM2', '(?i)P100', 'NVLink1', 80.0, NULL, NULL, false),
  (44, 'T4', '(?i)\bT4\b', 'PCIe 3.0', 15.75, NULL, NULL, false),
  (50, 'MI355X / MI350X', '(?i)MI35[05]X', 'xGMI', 537.6, NULL, NULL, false),
  (51, 'MI325X', '(?i)MI325X', 'xGMI', 448.0, NULL, NULL, false),
  (52, 'MI300X', '(?i)MI300X', 'xGMI', 448.0, NULL, NULL, false),
  (53, 'MI250X / MI250', '(?i)MI250', 'xGMI', 400.0, NULL, NULL, false),
  (54, 'MI210', '(?i)MI210', 'PCIe 4.0', 31.5, 150.0, 4, false),
  (55, 'MI100', '(?i)MI100', 'PCIe 4.0', 31.5, 138.0, 4, false)
) t(ord, model, name_pattern, interconnect, link_gbps, bridge_gbps, bridge_ranks, in_network_reduction)
ORDER BY ord;

-- @macro _devices_model_peak
-- The first device_link_peaks row whose pattern matches a device name, as a struct {model, interconnect, link_gbps,
-- bridge_gbps, bridge_ranks, in_network_reduction}; NULL for an unknown or NULL name.
-- @param name: Device name (devices.name, e.g. 'NVIDIA H100 80GB HBM3').
CREATE OR REPLACE MACRO _devices_model_peak(name) AS
  (SELECT arg_min({'model': p.model, 'interconnect': p.interconnect, 'link_gbps': p.link_gbps,
                   'bridge_gbps': p.bridge_gbps, 'bridge_ranks': p.bridge_ranks,
                   'in_network_reduction': p.in_network_reduction}, p.ord)
   FROM device_link_peaks() p WHERE regexp_matches(name, p.name_pattern));

-- @macro device_peaks
-- Per device of the job (devices table): the matched peak-table row, and the link figure in force: --link-gbps
-- (nsys2comm_link_gbps) when set, else the table's. Unknown models have NULL figures.
-- @column rank [key]: Rank.
-- @column device_id: Device.
-- @column name: Device name as the trace lists it, NULL when unlisted.
-- @column model [key]: Matched model family (device_link_peaks.model), NULL when none matches.
-- @column interconnect: Matched interconnect, NULL when unknown.
-- @column link_gbps [key]: Link bandwidth per direction per GPU in force (GB/s): --link-gbps, else the table's; NULL when unknown.
-- @column bridge_gbps: Optional bridge bandwidth per direction (GB/s) of a PCIe card, NULL when none or when --link-gbps is set.
-- @column bridge_ranks: Most GPUs one bridge connects, else NULL.
-- @column in_network_reduction: True when the model's switch can reduce in the network (NVLS); false when unknown.
-- @column link_source [key]: 'link_gbps' (the --link-gbps option), 'device_table' or NULL (unknown).
CREATE OR REPLACE MACRO device_peaks() AS TABLE
WITH d AS (SELECT rank, device_id, name, _devices_model_peak(name) AS p FROM devices)
SELECT rank, device_id, name, p.model AS model, p.interconnect AS interconnect,
       coalesce(getvariable('nsys2comm_link_gbps')::DOUBLE, p.link_gbps)::DOUBLE AS link_gbps,
       CASE WHEN getvariable('nsys2comm_link_gbps') IS NULL THEN p.bridge_gbps END::DOUBLE AS bridge_gbps,
       CASE WHEN getvariable('nsys2comm_link_gbps') IS NULL THEN p.bridge_ranks END::INTEGER AS bridge_ranks,
       coalesce(p.in_network_reduction, false) AS in_network_reduction,
       CASE WHEN getvariable('nsys2comm_link_gbps') IS NOT NULL THEN 'link_gbps'
            WHEN p.link_gbps IS NOT NULL THEN 'device_table' END AS link_source
FROM d
ORDER BY rank, device_id;

-- @macro _devices_op_groups
-- Each communication operation's group: its member ranks (a send/recv: itself and its peer; a collective: the
-- recorded pg_ranks, else the ranks that ran its matched instance, else itself) and its size n (2 for send/recv,
-- else group_size, else the members seen).
-- @column kernel_id: Kernel id.
-- @column collective: Canonical collective.
-- @column members: Sorted member ranks known.
-- @column n_p2p: 2 for send/recv, else NULL.
-- @column group_size: Recorded (or assumed) group size, when known.
CREATE OR REPLACE MACRO _devices_op_groups() AS TABLE
WITH inst AS (SELECT instance_key, list(DISTINCT rank ORDER BY rank) AS seen FROM _skew_ops GROUP BY instance_key)
SELECT o.kernel_id, o.collective,
       CASE WHEN o.collective IN ('send', 'recv') AND o.peer_rank IS NOT NULL
              THEN list_sort(list_distinct([o.rank, o.peer_rank]))
            WHEN len(o.pg_ranks) > 0 THEN list_sort(list_distinct(o.pg_ranks))
            ELSE coalesce(i.seen, [o.rank]) END AS members,
       CASE WHEN o.collective IN ('send', 'recv') THEN 2 END AS n_p2p, o.group_size
FROM comm_ops o LEFT JOIN _skew_ops s USING (kernel_id) LEFT JOIN inst i USING (instance_key);

-- @macro _devices_peak_allowance
-- Factor on the per-direction figure that the highest busbw of a collective may reach (see this file's header).
-- @param collective: Canonical collective.
-- @param n: Ranks in the group.
-- @param in_network: True when in-network reduction is possible.
-- @param spans_hosts: True when the group spans hosts (the figure is the network's, per host).
-- @param g_min: Fewest ranks of the group on one host.
-- @param g_a2a: Largest g(n−g) over the group's hosts.
CREATE OR REPLACE MACRO _devices_peak_allowance(collective, n, in_network, spans_hosts, g_min, g_a2a) AS
  (CASE WHEN n < 2 THEN 1.0
        WHEN collective = 'all_reduce' AND (in_network OR spans_hosts) THEN 2.0 * (n - 1) / n
        WHEN spans_hosts AND collective IN ('all_gather', 'reduce_scatter', 'gather', 'scatter')
          THEN (n - 1.0) / nullif(n - g_min, 0)
        WHEN spans_hosts AND collective = 'all_to_all' THEN (n - 1.0) / nullif(g_a2a, 0)
        ELSE 1.0 END)::DOUBLE;

-- @macro comm_group_links
-- Per communication group and collective: the hosts its members ran on (ranks.host), whether it spans hosts, and
-- its peak bus bandwidth. A group spanning one host gets its link peak: the slowest member GPU's link_gbps
-- (device_peaks; a PCIe card's bridge figure when the group is no larger than its bridge), times the collective's
-- allowance; a group spanning hosts gets the network's (--nic-gbps, per host; the nsys export records no NIC
-- speed: TARGET_INFO_NIC_INFO holds name, device and vendor ids and link layer only), times its allowance; NULL
-- when unknown. When the hosts of some members are unknown (single-rank traces, traces without host names) and the
-- known ones share one host, the group is taken to span one host: peak_assumes_one_host says so.
-- @column collective [key]: Canonical collective.
-- @column members: Sorted member ranks known (pg_ranks, else the ranks that ran its instances).
-- @column group_size [key]: Ranks in the group.
-- @column ops: Operations (kernels) of this collective in the group, all ranks.
-- @column hosts: Distinct known hosts of the members.
-- @column members_unknown_host: Members whose host is unknown (not traced, or no host name) plus members not listed.
-- @column spans_hosts [key]: True when the members ran on two or more hosts, false on one, NULL when unknown.
-- @column link_gbps: Per-direction link figure of the slowest member GPU (GB/s), bridge included; NULL when unknown.
-- @column nic_gbps: Per-host network figure per direction (GB/s, --nic-gbps), NULL when not given.
-- @column allowance: Factor on the per-direction figure for this collective (in-network reduction, hierarchy).
-- @column peak_busbw_gbps [key]: Highest busbw the group can physically reach for this collective (GB/s); NULL when unknown.
-- @column peak_source [key]: 'device_table', 'link_gbps' (option), 'nic_gbps' (option) or NULL (unknown).
-- @column peak_assumes_one_host: True when the peak is the link's although some members' hosts are unknown.
CREATE OR REPLACE MACRO comm_group_links() AS TABLE
WITH g AS (
  SELECT collective, members, coalesce(any_value(n_p2p), max(group_size), len(members))::INTEGER AS n, count(*) AS ops
  FROM _devices_op_groups() GROUP BY collective, members
), rk AS (
  SELECT r.rank, r.host, max(d.link_gbps) AS link_gbps, max(d.bridge_gbps) AS bridge_gbps,
         max(d.bridge_ranks) AS bridge_ranks, bool_or(d.in_network_reduction) AS in_net,
         any_value(d.link_source) AS link_source
  FROM ranks r LEFT JOIN device_peaks() d USING (rank) GROUP BY r.rank, r.host
), m AS (
  SELECT g.collective, g.members, g.n, unnest(g.members) AS member FROM g
), per_host AS (
  SELECT m.collective, m.members, m.n, rk.host, count(*) AS c
  FROM m JOIN rk ON rk.rank = m.member WHERE rk.host IS NOT NULL GROUP BY ALL
), hs AS (
  SELECT collective, members, count(*) AS hosts, min(c) AS g_min, max(c * (n - c)) AS g_a2a
  FROM per_host GROUP BY collective, members
), lk AS (
  SELECT m.collective, m.members,
         count(*) FILTER (WHERE rk.rank IS NULL OR rk.host IS NULL) AS unknown_host,
         min(CASE WHEN m.n <= rk.bridge_ranks THEN greatest(rk.link_gbps, rk.bridge_gbps) ELSE rk.link_gbps END)
           AS link_gbps,
         bool_and(rk.in_net) AS in_net, min(rk.link_source) AS link_source
  FROM m LEFT JOIN rk ON rk.rank = m.member GROUP BY m.collective, m.members
), j AS (
  SELECT g.*, coalesce(hs.hosts, 0) AS hosts, hs.g_min, hs.g_a2a,
         lk.unknown_host + greatest(g.n - len(g.members), 0) AS unknown_host, lk.link_gbps, coalesce(lk.in_net, false) AS in_net,
         lk.link_source, getvariable('nsys2comm_nic_gbps')::DOUBLE AS nic_gbps,
         CASE WHEN coalesce(hs.hosts, 0) >= 2 THEN true
              WHEN hs.hosts = 1 AND lk.unknown_host + greatest(g.n - len(g.members), 0) = 0 THEN false END AS spans_hosts
  FROM g LEFT JOIN hs USING (collective, members) LEFT JOIN lk USING (collective, members)
), p AS (
  SELECT *, _devices_peak_allowance(collective, n, in_net, coalesce(spans_hosts, false), g_min, g_a2a) AS allowance,
         CASE WHEN spans_hosts THEN CASE WHEN unknown_host = 0 THEN nic_gbps END ELSE link_gbps END AS base_gbps
  FROM j
)
SELECT collective, members, n AS group_size, ops, hosts, CAST(unknown_host AS BIGINT) AS members_unknown_host,
       spans_hosts, link_gbps, nic_gbps, allowance, (base_gbps * allowance)::DOUBLE AS peak_busbw_gbps,
       CASE WHEN base_gbps IS NULL THEN NULL WHEN spans_hosts THEN 'nic_gbps' ELSE link_source END AS peak_source,
       (spans_hosts IS NULL AND base_gbps IS NOT NULL) AS peak_assumes_one_host
FROM p
ORDER BY collective, members;

-- @macro _devices_op_peaks
-- Each communication operation's group link facts (comm_group_links joined back to its kernel).
-- @column kernel_id: Kernel id.
-- @column spans_hosts: True when its group spans hosts, NULL when unknown.
-- @column peak_busbw_gbps: Its group's peak busbw for its collective (GB/s), NULL when unknown.
-- @column peak_source: Where the peak came from (comm_group_links.peak_source).
-- @column peak_assumes_one_host: True when the peak assumes one host (comm_group_links).
CREATE OR REPLACE MACRO _devices_op_peaks() AS TABLE
SELECT o.kernel_id, l.spans_hosts, l.peak_busbw_gbps, l.peak_source, l.peak_assumes_one_host
FROM _devices_op_groups() o JOIN comm_group_links() l USING (collective, members);

-- @macro _devices_peak_busbw_gbps
-- Highest bus bandwidth any communicator of this job can physically reach (GB/s = 1e9 B/s): the largest
-- comm_group_links.peak_busbw_gbps (allowances included), after the --link-gbps / --nic-gbps overrides (DuckDB
-- variables nsys2comm_link_gbps / nsys2comm_nic_gbps); without communication, twice the largest figure of the
-- devices and options (2 bounds every allowance). NULL when no peak is known.
CREATE OR REPLACE MACRO _devices_peak_busbw_gbps() AS
  (coalesce((SELECT max(peak_busbw_gbps) FROM comm_group_links()),
            (SELECT greatest(max(greatest(link_gbps, coalesce(bridge_gbps, 0))) * 2,
                             getvariable('nsys2comm_link_gbps')::DOUBLE * 2, getvariable('nsys2comm_nic_gbps')::DOUBLE * 2)
             FROM device_peaks())))::DOUBLE;
