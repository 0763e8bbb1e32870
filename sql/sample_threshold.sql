-- Uniform sampling without replacement, exact and deterministic given the seed inside {h}: the
-- sample is the rows with the smallest seeded key hash. Only rows whose hash is at most {t} are
-- returned (a threshold holding ~1.5 n rows), so DuckDB runs a filtered scan, not a top-N over
-- every matching row; the caller keeps the n smallest and raises {t} if fewer than n came back.
SELECT key, {h} AS h
FROM {source}
WHERE {where} AND {h} <= {t}::UBIGINT
