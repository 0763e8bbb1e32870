-- Every candidate of weighted sampling with replacement: its seeded key hash (a content-derived
-- canonical order) and log-weight; the caller draws from the cumulative weights with its RNG.
SELECT h, logw
FROM (
    SELECT {h} AS h, {logw} AS logw
    FROM {source}
    WHERE {where}
)
WHERE isfinite(logw)
