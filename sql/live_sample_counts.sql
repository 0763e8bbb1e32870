-- Live replay counts (meta is updated on every sample; payload tiers keep the value at push).
SELECT key, sample_count FROM meta WHERE key IN (SELECT key FROM wanted)
