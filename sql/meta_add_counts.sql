-- Replays: add each sampled key's count to its sample_count.
UPDATE meta SET sample_count = meta.sample_count + meta_counts.n::INTEGER
FROM meta_counts WHERE meta.key = meta_counts.key
