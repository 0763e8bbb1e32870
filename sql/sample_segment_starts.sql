-- Candidate segment starts: rows matching {where} that could begin a segment (they belong to an
-- episode, have a step divisible by {stride}), with their seeded key hash {h}; only those with a
-- hash at most {t}, the {n} smallest. Whether a start really begins a segment is checked next.
SELECT key, episode_id AS e, agent_id AS a, step, {h} AS h
FROM {source}
WHERE {where} AND episode_id IS NOT NULL AND step IS NOT NULL AND step % {stride} = 0
  AND {h} <= {t}::UBIGINT
ORDER BY h, key
LIMIT {n}
