-- Policy lag at replay (run directory, not lake: replay events live in the buffer's `replays`):
-- for every replayed rollout, the replaying policy version minus the rollout's policy version.
-- Replays made before any set_policy_version have no replaying version and are left out.
SELECT m.run_id, r.replay_version - m.policy_version AS lag, count(*) AS replays
FROM replays r JOIN meta m USING (key)
WHERE r.replay_version IS NOT NULL
GROUP BY ALL
ORDER BY m.run_id, lag;
