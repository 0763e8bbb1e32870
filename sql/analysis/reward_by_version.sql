-- Reward distribution by policy version (per run): mean, quartiles, share verified.
SELECT run_id, policy_version, count(*) AS n,
       avg(reward) AS mean_reward,
       quantile_cont(reward, 0.25) AS q25, median(reward) AS q50, quantile_cont(reward, 0.75) AS q75,
       avg(CASE WHEN verified THEN 1 ELSE 0 END) AS verified_share
FROM rollouts
GROUP BY ALL
ORDER BY run_id, policy_version;
