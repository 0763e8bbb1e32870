-- The one view users query: every live rollout of this buffer, whichever tier holds it.
-- Hot and warm are complementary (a row lives in exactly one of them), so UNION ALL is exact.
-- sample_count comes from `meta`, which counts every replay (payload tiers keep the value at push).
-- The lake keeps a copy of snapshotted rows (views `cold`, `lake`); every row of this run is also
-- local (restore is eager), so the lake is not part of this view.
CREATE OR REPLACE VIEW rollouts AS
SELECT d.* REPLACE (m.sample_count AS sample_count)
FROM (
    SELECT * FROM hot
    UNION ALL BY NAME
    SELECT * FROM warm
) d
JOIN meta m ON m.key = d.key;
