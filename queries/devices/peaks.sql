-- @include prelude/schema.sql
-- Physical peaks of the devices a job ran on (interface stub: filled in by the bandwidth work; see docs).

-- @macro _devices_peak_busbw_gbps
-- Highest bus bandwidth any communicator of this job can physically reach (GB/s = 1e9 B/s): the larger of the
-- intra-node link peak of the job's devices and the network peak, after the --link-gbps / --nic-gbps overrides
-- (DuckDB variables nsys2comm_link_gbps / nsys2comm_nic_gbps). NULL when no peak is known.
CREATE OR REPLACE MACRO _devices_peak_busbw_gbps() AS
  (getvariable('nsys2comm_link_gbps'))::DOUBLE;
