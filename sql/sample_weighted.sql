-- Weighted sampling without replacement (Efraimidis-Spirakis), deterministic given the seed in {h}:
-- row i gets key u_i^(1/w_i) with u_i in (0, 1) from its seeded key hash {h}, the n largest win.
-- In log space that is the n smallest ln(-ln u_i) - ln w_i, which never under- or overflows, so
-- {logw} (the log-weight) may be any finite DOUBLE; rows whose log-weight is NULL, NaN or -inf
-- (weight 0) are never chosen.
SELECT key
FROM (
    SELECT key, {logw} AS logw, {h} AS h
    FROM {source}
    WHERE {where}
)
WHERE isfinite(logw)
ORDER BY ln(-ln({u})) - logw, key
LIMIT {n}
