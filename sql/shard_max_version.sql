-- A shard's partial result for the `freshness` sampler: its newest policy version (one row); the
-- newest over the union of these is the newest of all rows (as sample_max_version over one buffer).
SELECT max(policy_version) AS policy_version FROM meta
