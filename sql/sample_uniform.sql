-- Uniform sampling without replacement, deterministic given {seed}: a random permutation by a
-- seeded hash of the key, top-{n} kept. DuckDB runs this as a parallel top-N, no full sort.
SELECT key FROM {source}
WHERE {where}
ORDER BY hash(key, {seed}::UBIGINT)
LIMIT {n}
