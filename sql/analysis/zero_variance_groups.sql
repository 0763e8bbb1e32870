-- GRPO groups whose rewards are all equal: their advantages are zero, so they teach nothing.
-- Per run and policy version: groups, zero-variance groups, and their share.
WITH g AS (
    SELECT run_id, policy_version, group_id, count(*) AS n, min(reward) = max(reward) AS flat
    FROM rollouts GROUP BY ALL HAVING count(*) > 1
)
SELECT run_id, policy_version, count(*) AS groups,
       count(*) FILTER (WHERE flat) AS zero_variance_groups,
       avg(flat::INTEGER) AS zero_variance_share
FROM g
GROUP BY ALL
ORDER BY run_id, policy_version;
