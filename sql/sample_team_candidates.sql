-- Candidate teams: distinct (episode_id, team_id) with a row matching {where}, with their seeded
-- hash {th}; only those with a hash at most {t}, the {n} smallest. Completeness is checked next.
SELECT DISTINCT episode_id AS e, team_id AS tm, {th} AS h
FROM {source}
WHERE {where} AND episode_id IS NOT NULL AND step IS NOT NULL AND {th} <= {t}::UBIGINT
ORDER BY h, e, tm
LIMIT {n}
