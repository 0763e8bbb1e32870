-- The cold tier as one DuckDB view (Lake.register).
-- {source} is a pyarrow dataset registered on the connection: the Parquet files listed in the latest
-- committed manifest of each run, with the runs' tombstoned keys already filtered out. DuckDB pushes
-- projections and filters into it, so `run_id = 'x'` and `policy_version >= v` skip the files of other
-- partitions without opening them (the fragments carry run_id / policy_bucket / policy_version ranges).
-- The view is temporary because the registered dataset lives only as long as the connection.
CREATE OR REPLACE TEMP VIEW {view} AS
SELECT * FROM {source}
