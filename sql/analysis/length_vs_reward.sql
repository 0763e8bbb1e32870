-- Response length against reward, per run: mean reward and share verified by length bucket (8 tokens).
SELECT run_id, (len(response_ids) // 8) * 8 AS length_bucket, count(*) AS rollouts,
       avg(reward) AS mean_reward, avg(verified::INTEGER) AS verified_share
FROM rollouts
GROUP BY ALL
ORDER BY run_id, length_bucket;
