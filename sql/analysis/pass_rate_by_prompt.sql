-- Per-prompt pass rate (share verified) per run and policy version: which prompts a run learns.
SELECT run_id, prompt_id, policy_version, count(*) AS attempts,
       count(*) FILTER (WHERE verified) AS passes, avg(verified::INTEGER) AS pass_rate
FROM rollouts
GROUP BY ALL
ORDER BY run_id, prompt_id, policy_version;
