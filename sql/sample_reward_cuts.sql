-- Reward cut points among the rows matching {where}: the top-fraction cut {hi} = 1 - f and the
-- bottom-fraction cut {lo} (PF-PPO filtering keeps reward >= hi, optionally also <= lo).
SELECT quantile_disc(reward, {hi}) AS hi, quantile_disc(reward, {lo}) AS lo
FROM {source}
WHERE {where}
