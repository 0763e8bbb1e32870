-- The rows matching {where} in the step range [step, step + {last}] of each candidate start's
-- track (episode_id, agent_id). A start begins a segment when these are {length} rows with
-- {length} distinct steps (consecutive, no gap, no duplicate); the caller checks that.
WITH r AS (
    SELECT key, episode_id AS e, agent_id AS a, step
    FROM {source}
    WHERE {where} AND step IS NOT NULL AND episode_id IN (SELECT e FROM sample_starts)
)
SELECT s.key AS start, r.key, r.step
FROM sample_starts AS s
JOIN r ON r.e = s.e AND r.a IS NOT DISTINCT FROM s.a AND r.step BETWEEN s.step AND s.step + {last}
