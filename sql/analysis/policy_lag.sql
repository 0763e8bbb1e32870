-- Version gap over a lake: the newest version of each run minus each rollout's version, weighted by
-- how often it was sampled. This is NOT the lag at replay (a rollout replayed early had a smaller
-- lag than this says): for that, run policy_lag_at_replay.sql on a run directory, whose `replays`
-- table records the replaying version of every sample (ReplayBuffer.set_policy_version).
WITH newest AS (SELECT run_id, max(policy_version) AS v FROM rollouts GROUP BY run_id)
SELECT r.run_id, newest.v - r.policy_version AS lag,
       count(*) AS rollouts, sum(r.sample_count)::BIGINT AS samples
FROM rollouts r JOIN newest USING (run_id)
GROUP BY ALL
ORDER BY r.run_id, lag;
