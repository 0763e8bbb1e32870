-- Uniform sampling without replacement, exact and deterministic given the seed inside {h}: the
-- sample is the rows with the smallest seeded key hash. Only rows whose hash is at most {t} are
-- returned (a threshold holding ~1.5 n rows), so DuckDB runs a filtered scan, not a top-N over
-- every matching row; if fewer than {n} come back the caller raises {t} and asks again.
SELECT key, {h} AS h
FROM {source}
WHERE {where} AND {h} <= {t}::UBIGINT
ORDER BY h, key
LIMIT {n}
