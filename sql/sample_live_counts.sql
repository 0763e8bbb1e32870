-- Replay counts of the keys in `wanted` (max_reuse checks a batch that repeats a key).
SELECT key, sample_count FROM meta WHERE key IN (SELECT key FROM wanted)
