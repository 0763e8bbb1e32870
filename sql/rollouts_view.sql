-- The one view users query: every live rollout of this buffer, whichever tier holds it.
-- Hot, warm and cold_rows are complementary (a row's batch is in exactly one tier), so UNION ALL is exact.
-- sample_count comes from `meta`, which counts every replay (payload tiers keep the value at push).
-- The lake keeps a copy of every snapshotted row (views `cold`, `lake`); only the rows no local tier
-- holds any more (cold_rows) are part of this view.
CREATE OR REPLACE VIEW rollouts AS
SELECT d.* REPLACE (m.sample_count AS sample_count)
FROM (
    SELECT * FROM hot
    UNION ALL BY NAME
    SELECT * FROM warm
    UNION ALL BY NAME
    SELECT * FROM cold_rows
) d
JOIN meta m ON m.key = d.key;
