-- The population of weighted sampling (rows matching {where} with a positive weight): its size, its
-- smallest and largest log-weight and sum(exp(logw - max)), for importance weights and P(i).
WITH v AS (
    SELECT logw FROM (SELECT {logw} AS logw FROM {source} WHERE {where}) WHERE isfinite(logw)
)
SELECT count(*) AS n, min(logw) AS lmin, max(logw) AS lmax,
       sum(exp(logw - (SELECT max(logw) FROM v))) AS total
FROM v
