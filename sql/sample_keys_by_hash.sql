-- The keys of the rows whose seeded key hash is in `wanted` (weighted sampling with replacement).
SELECT key, {h} AS h
FROM {source}
WHERE {where} AND {h} IN (SELECT h FROM wanted)
