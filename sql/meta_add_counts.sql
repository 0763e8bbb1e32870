-- Replays: add each sampled key's count (summed over the queued samples) to its sample_count.
UPDATE meta SET sample_count = meta.sample_count + c.n::INTEGER
FROM (SELECT key, sum(n) AS n FROM meta_counts GROUP BY key) c
WHERE meta.key = c.key
