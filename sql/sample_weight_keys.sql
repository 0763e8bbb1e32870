-- The log-weight of each key in `wanted` (the keys a weighted sampler just drew).
SELECT key, {logw} AS logw FROM {source} WHERE key IN (SELECT key FROM wanted)
