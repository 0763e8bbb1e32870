-- A shard's part of a weighted draw without replacement (Efraimidis-Spirakis, as sample_weighted):
-- its {n} rows of smallest ln(-ln u) - logw, with that key as `h`, so the coordinator merges the
-- shards' lists into exactly the n one buffer holding every row would choose ({u} reads `hh`).
SELECT key, ln(-ln({u})) - logw AS h
FROM (
    SELECT key, {logw} AS logw, {h} AS hh
    FROM {source}
    WHERE {where}
)
WHERE isfinite(logw)
ORDER BY ln(-ln({u})) - logw, key
LIMIT {n}
