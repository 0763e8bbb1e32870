-- Fixed-length segments: windows of {length} consecutive steps of one track (episode_id, agent_id)
-- whose rows all match {where}. A row starts a segment when the {length} rows of its track in
-- the step range [step, step + {length} - 1] are {length} distinct steps (no gap, no duplicate)
-- and step % {stride} = 0. The {n} starts of smallest seeded hash are sampled; every row of each
-- chosen segment is returned with its segment's rank, in step order.
WITH r AS (
    SELECT key, episode_id AS e, agent_id AS a, step
    FROM {source}
    WHERE {where} AND episode_id IS NOT NULL AND step IS NOT NULL
),
w AS (
    SELECT key, e, a, step,
           count(*) OVER win AS cnt,
           count(DISTINCT step) OVER win AS steps
    FROM r
    WINDOW win AS (PARTITION BY e, a ORDER BY step RANGE BETWEEN CURRENT ROW AND {last} FOLLOWING)
),
starts AS (
    SELECT e, a, step, {h} AS h, key
    FROM w
    WHERE cnt = {length} AND steps = {length} AND step % {stride} = 0
    ORDER BY h, key
    LIMIT {n}
),
ranked AS (
    SELECT e, a, step, row_number() OVER (ORDER BY h, key) AS seg FROM starts
)
SELECT r.key, ranked.seg, r.step
FROM ranked
JOIN r ON r.e = ranked.e AND r.a IS NOT DISTINCT FROM ranked.a
      AND r.step BETWEEN ranked.step AND ranked.step + {last}
ORDER BY ranked.seg, r.step
