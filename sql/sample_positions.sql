-- Keys at given positions of the rows matching {where}, in key order (sampling with replacement):
-- the positions come from the caller's seeded RNG, the key order makes them deterministic.
WITH matching AS (
    SELECT key, row_number() OVER (ORDER BY key) - 1 AS pos FROM {source} WHERE {where}
)
SELECT matching.key, wanted.pos FROM matching JOIN wanted USING (pos)
