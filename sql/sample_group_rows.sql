-- Every row of the candidate groups in `sample_groups` (matching {where} or not: a sampled group is
-- returned whole), with whether each row matches, so the caller can require all rows to match.
SELECT key, {gid} AS gid, step, team_id, agent_id, COALESCE({where}, FALSE) AS m
FROM {source}
WHERE {gid} IN (SELECT gid FROM sample_groups)
