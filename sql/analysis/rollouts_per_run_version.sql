-- Rollouts per run and policy version, with their token volume.
SELECT run_id, policy_version, count(*) AS rollouts,
       sum(len(response_ids))::BIGINT AS response_tokens
FROM rollouts
GROUP BY ALL
ORDER BY run_id, policy_version;
