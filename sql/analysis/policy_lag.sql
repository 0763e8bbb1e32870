-- How stale replayed data was: policy lag (newest version of the run minus the rollout's version),
-- weighted by how often each rollout was sampled.
WITH newest AS (SELECT run_id, max(policy_version) AS v FROM rollouts GROUP BY run_id)
SELECT r.run_id, newest.v - r.policy_version AS lag,
       count(*) AS rollouts, sum(r.sample_count) AS samples
FROM rollouts r JOIN newest USING (run_id)
GROUP BY ALL
ORDER BY r.run_id, lag;
