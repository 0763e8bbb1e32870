-- Reuse: how many rollouts were replayed 0, 1, 2, ... times, per run.
SELECT run_id, sample_count, count(*) AS rollouts
FROM meta
GROUP BY ALL
ORDER BY run_id, sample_count;
