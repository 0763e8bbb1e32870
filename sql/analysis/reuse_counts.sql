-- Reuse per rollout: how many rollouts were replayed 0, 1, 2, ... times, per run (sample_count
-- as of the snapshot on a lake; live on a run directory).
SELECT run_id, sample_count, count(*) AS rollouts
FROM meta
GROUP BY ALL
ORDER BY run_id, sample_count;
