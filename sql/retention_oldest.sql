-- The {n} oldest live rollouts by push order (batch id, then key): what a max_rows bound drops.
SELECT key FROM meta ORDER BY _batch, key LIMIT {n}
