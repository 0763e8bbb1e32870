-- Candidate groups (or episodes): distinct {gid} values with at least one row matching {where},
-- each with its seeded hash {gh}; only those with a hash at most {t} (sized for the request), the
-- caller keeps the smallest. Uniform over groups: a group's size does not change its chance.
SELECT DISTINCT {gid} AS gid, {gh} AS h
FROM {source}
WHERE {where} AND {gid} IS NOT NULL AND {gh} <= {t}::UBIGINT
ORDER BY h, gid
LIMIT {n}
